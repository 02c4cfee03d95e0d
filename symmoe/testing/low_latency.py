"""Per-rank checks of the low-latency mode, shared by the host tests, the GPU tests and
``scripts/gpu_check.sh``: every rank builds every rank's inputs from the seed, runs the
Buffer, and compares its own results bitwise with ``symmoe.reference``'s low-latency
functions."""
from __future__ import annotations

from typing import Any

import torch

from .. import reference
from ..buffer import Buffer
from ..config import Config, from_dict
from ..workload import Routing, make_inputs
from .checks import CHECK_ROUTINGS, _tokens_per_rank, assert_bitwise


def expert_op(recv_x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A simple per-expert op (row j scaled by ``scale[j]``, in bfloat16), exact on every device."""
    return recv_x * scale.view(-1, 1, 1)


def masked_expert_op(recv_x: torch.Tensor, recv_count: torch.Tensor, scale: torch.Tensor,
                     blocks_per_expert: int = 0) -> torch.Tensor:
    """``expert_op`` over the received rows only (``q < recv_count[j]``; the rows past them are
    left undefined, as a masked grouped GEMM leaves them), with no host sync on a GPU: one
    kernel (``symmoe_ll.masked_scale``), bitwise equal to ``expert_op`` on those rows.
    ``scale``: bfloat16 ``[L]``. The benchmark's step uses it, so its time is the rows moved."""
    L, rows, H = recv_x.shape
    out = torch.empty_like(recv_x)
    if recv_x.device.type != "cuda":
        for j, n in enumerate(recv_count.tolist()):
            out[j, :n] = recv_x[j, :n] * scale[j]
        return out
    from .. import build
    from ..launch_shape import gpu_sms
    from ..protocol.base import stream_handle
    if scale.dtype != torch.bfloat16 or scale.numel() != L or not scale.is_contiguous() or not recv_x.is_contiguous():
        raise ValueError("masked_expert_op: contiguous bfloat16 recv_x [L, rows, H] and scale [L] expected")
    blocks = blocks_per_expert or max(1, 4 * gpu_sms(recv_x.device).held // max(1, L))
    build.load("symmoe_ll").masked_scale(recv_x.data_ptr(), recv_count.data_ptr(), scale.data_ptr(), out.data_ptr(),
                                         L, rows, H, blocks, stream_handle(recv_x.device))
    return out


def _inputs(routing: Routing, world_size: int, cfg: Config, T_max: int, seed: int, full: bool = False):
    b = cfg.buffer
    counts = _tokens_per_rank(world_size, T_max, seed, full)
    ins = make_inputs(routing, num_tokens=counts, hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                      world_size=world_size, dtype=torch.bfloat16, seed=seed)
    if routing.kind == "masked" and ins[0].topk_idx.shape[0] > 1 and b.topk > 1:
        # a token that names one expert twice: it travels once and both slots add its row
        ins[0].topk_idx[0, 1] = ins[0].topk_idx[0, 0]
    return ins


def check_recv(recv_x, count, handle, want: reference.LowLatencyRecv, ctx: str) -> None:
    assert_bitwise("recv_count", count, want.recv_count, ctx)
    assert_bitwise("layout_range", handle.layout_range, want.layout_range, ctx)
    for j, n in enumerate(want.recv_count.tolist()):
        assert_bitwise(f"recv_x[{j}][:{n}]", recv_x[j, :n], want.recv_x[j, :n], ctx)
        assert_bitwise(f"src_info[{j}][:{n}]", handle.src_info[j, :n], want.src_info[j, :n], ctx)


def _combine_and_compare(buf: Buffer, y: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, handle: Any, hook: bool,
                         what: str, want: torch.Tensor, ctx: str) -> None:
    """low_latency_combine (its hook run when ``hook``), the device waits checked, the result
    bitwise against ``want``."""
    out, _, hk = buf.low_latency_combine(y, idx, w, handle, return_recv_hook=hook)
    if hook:
        hk()
    buf.check_low_latency(synchronize=y.device.type == "cuda")
    assert_bitwise(what, out, want, ctx)


def check_low_latency(rank: int, world_size: int, config: dict[str, Any], seed: int, T_max: int,
                      routings: tuple[Routing, ...] = CHECK_ROUTINGS, device: str = "cpu",
                      hooks: tuple[bool, ...] = (False, True), repeats: int = 1) -> int:
    """Dispatch -> expert op -> combine for each routing, with and without receive hooks, each
    compared bitwise with the reference. Returns the number of cases."""
    cfg = from_dict(config)
    dev = torch.device(device)
    b = cfg.buffer
    checked = 0
    with Buffer(None, cfg) as buf:
        for i, routing in enumerate(routings):
            for hook in hooks:
                for rep in range(repeats):
                    case_seed = seed + 7919 * i + 31 * rep + (17 if hook else 0)
                    ins = _inputs(routing, world_size, cfg, T_max, case_seed)
                    ctx = (f"rank {rank}/{world_size} {cfg.backend} low-latency routing={routing.kind} hook={hook} "
                           f"seed={case_seed}")
                    ref = reference.low_latency_dispatch([r.x for r in ins], [r.topk_idx for r in ins],
                                                         b.num_experts, T_max)
                    mine = ins[rank]
                    x, idx, w = mine.x.to(dev), mine.topk_idx.to(dev), mine.topk_weights.to(dev)
                    recv_x, count, handle, event, hk = buf.low_latency_dispatch(
                        x, idx, T_max, b.num_experts, return_recv_hook=hook)
                    assert (hk is not None) == hook, ctx
                    if hook:
                        hk()
                    check_recv(recv_x.cpu(), count.cpu(), _cpu(handle), ref.recv[rank], ctx)
                    L = b.num_experts // world_size
                    scales = [torch.linspace(0.5, 2.0, L).to(torch.bfloat16) + r for r in range(world_size)]
                    y = expert_op(recv_x, scales[rank].to(dev))
                    if dev.type == "cuda":  # the benchmark's op: the received rows only, the rest undefined
                        y_rows = masked_expert_op(recv_x, count, scales[rank].to(dev))
                        for j, n in enumerate(count.tolist()):
                            assert_bitwise(f"masked_expert_op[{j}][:{n}]", y_rows[j, :n], y[j, :n], ctx)
                        y = y_rows
                    ys = [expert_op(ref.recv[r].recv_x, scales[r]) for r in range(world_size)]
                    want = reference.low_latency_combine(ys, ref, [r.topk_idx for r in ins],
                                                         [r.topk_weights for r in ins], b.num_experts)[rank]
                    _combine_and_compare(buf, y, idx, w, handle, hook, "combined_x", want, ctx)
                    checked += 1
    return checked


def check_low_latency_fp8(rank: int, world_size: int, config: dict[str, Any], seed: int, T_max: int,
                          device: str = "cpu", modes: tuple[tuple[bool, bool], ...] = ((False, False), (True, False),
                                                                                       (True, True)),
                          hooks: tuple[bool, ...] = (False, True)) -> int:
    """``use_fp8=True`` for each (round_scale, use_ue8m0) in ``modes``, with and without hooks:
    the received e4m3 bytes and scales of every received row, bitwise against the reference
    dispatch of the rows ``symmoe.fp8.quantize`` makes (cast on this rank's device, as the
    Buffer casts), the scales column-major as DeepEP returns them; then the combine of bfloat16
    expert outputs after it, bitwise. Returns the number of cases."""
    from .. import fp8
    cfg = from_dict(config)
    dev = torch.device(device)
    b = cfg.buffer
    L, S = b.num_experts // world_size, b.hidden // 128
    checked = 0
    with Buffer(None, cfg) as buf:
        for m, (round_scale, ue8m0) in enumerate(modes):
            for hook in hooks:
                case_seed = seed + 101 * m + (17 if hook else 0)
                ins = _inputs(Routing("masked", mask_prob=0.2, masked_tokens=0.05), world_size, cfg, T_max, case_seed)
                ctx = (f"rank {rank}/{world_size} {cfg.backend} low-latency FP8 round_scale={round_scale} "
                       f"use_ue8m0={ue8m0} hook={hook} seed={case_seed}")
                casts = [fp8.quantize(r.x.to(dev), "float32", round_scale) for r in ins]
                packed = [fp8.pack(d, sc, torch.empty_like(r.x.to(dev))).cpu() for (d, sc), r in zip(casts, ins)]
                ref = reference.low_latency_dispatch(packed, [r.topk_idx for r in ins], b.num_experts, T_max)
                want = ref.recv[rank]
                mine = ins[rank]
                x, idx, w = mine.x.to(dev), mine.topk_idx.to(dev), mine.topk_weights.to(dev)
                (data, scales), count, handle, _, hk = buf.low_latency_dispatch(
                    x, idx, T_max, b.num_experts, use_fp8=True, round_scale=round_scale, use_ue8m0=ue8m0,
                    return_recv_hook=hook)
                if hook:
                    hk()
                buf.check_low_latency(synchronize=dev.type == "cuda")
                cols = -(-S // 4) if ue8m0 else S
                assert data.dtype == fp8.FP8_DTYPE and tuple(data.shape) == (L, world_size * T_max, b.hidden), ctx
                assert scales.dtype == (torch.int32 if ue8m0 else torch.float32), ctx
                assert tuple(scales.shape) == (L, world_size * T_max, cols) and scales.stride(1) == 1, ctx
                assert_bitwise("recv_count", count.cpu(), want.recv_count, ctx)
                for j, n in enumerate(want.recv_count.tolist()):
                    rows = want.recv_x[j, :n]
                    want_data = rows.view(torch.uint8)[:, :b.hidden]
                    want_scales = rows.view(torch.int32)[:, b.hidden // 4:b.hidden // 4 + S].view(torch.float32)
                    if ue8m0:
                        want_scales = fp8.ue8m0(want_scales)
                    assert_bitwise(f"data[{j}][:{n}]", data[j, :n].cpu().view(torch.uint8), want_data, ctx)
                    assert_bitwise(f"scales[{j}][:{n}]", scales[j, :n].cpu(), want_scales, ctx)
                # the combine after an FP8 dispatch: bfloat16 rows of the same shape
                scale_l = [torch.linspace(0.5, 2.0, L).to(torch.bfloat16) + r for r in range(world_size)]
                y = expert_op(data.to(torch.bfloat16), scale_l[rank].to(dev))  # e4m3 values are exact in bfloat16
                ys = [expert_op(ref.recv[r].recv_x.view(torch.uint8)[..., :b.hidden].view(fp8.FP8_DTYPE)
                                .to(torch.bfloat16), scale_l[r]) for r in range(world_size)]
                want_out = reference.low_latency_combine(ys, ref, [r.topk_idx for r in ins],
                                                         [r.topk_weights for r in ins], b.num_experts)[rank]
                _combine_and_compare(buf, y, idx, w, handle, hook, "combined_x after an FP8 dispatch", want_out, ctx)
                checked += 1
    return checked


def _cpu(handle):
    from dataclasses import replace
    return replace(handle, src_info=handle.src_info.cpu(), layout_range=handle.layout_range.cpu())


def check_deep_ep_v1_low_latency(rank: int, world_size: int, config: dict[str, Any], seed: int, T_max: int,
                                 device: str = "cpu") -> int:
    """DeepEP V1's low-latency calls through the shim (``low_latency_mode=True``), with and
    without hooks: outputs, DeepEP's handle tuple and the cumulative receive statistics,
    bitwise against the reference."""
    import symmoe.compat.deep_ep_v1 as deep_ep
    cfg = from_dict(config)
    b = cfg.buffer
    dev = torch.device(device)
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T_max, b.hidden, world_size, b.num_experts)
    buf = deep_ep.Buffer(None, 0, hint, low_latency_mode=True, num_qps_per_rank=b.num_experts // world_size,
                         symmoe_config=cfg)
    L = b.num_experts // world_size
    stats = torch.zeros(L, dtype=torch.int32, device=dev)
    want_stats = torch.zeros(L, dtype=torch.int32)
    checked = 0
    try:
        for i, routing in enumerate(CHECK_ROUTINGS[:3]):
            for hook in (False, True):
                case_seed = seed + 101 * i + (7 if hook else 0)
                ins = _inputs(routing, world_size, cfg, T_max, case_seed)
                ctx = f"rank {rank}/{world_size} deep_ep_v1 low-latency routing={routing.kind} hook={hook}"
                ref = reference.low_latency_dispatch([r.x for r in ins], [r.topk_idx for r in ins], b.num_experts,
                                                     T_max)
                mine = ins[rank]
                idx, w = mine.topk_idx.to(dev), mine.topk_weights.to(dev)
                recv_x, count, handle, event, hk = buf.low_latency_dispatch(
                    mine.x.to(dev), idx, T_max, b.num_experts, cumulative_local_expert_recv_stats=stats,
                    use_fp8=False, return_recv_hook=hook)
                if hook:
                    hk()
                src_info, layout_range, t_max, hidden, num_experts = handle
                assert (t_max, hidden, num_experts) == (T_max, b.hidden, b.num_experts), ctx
                check_recv(recv_x.cpu(), count.cpu(), _cpu(handle.symmoe), ref.recv[rank], ctx)
                assert_bitwise("handle[1] layout_range", layout_range, ref.recv[rank].layout_range, ctx)
                want_stats += ref.recv[rank].recv_count
                assert_bitwise("cumulative_local_expert_recv_stats", stats, want_stats, ctx)
                ys = [r.recv_x * 3 for r in ref.recv]
                want = reference.low_latency_combine(ys, ref, [r.topk_idx for r in ins], [r.topk_weights for r in ins],
                                                     b.num_experts)[rank]
                out = torch.full_like(want, 7.0).to(dev)
                combined, event, hk = buf.low_latency_combine(recv_x * 3, idx, w, handle, return_recv_hook=hook,
                                                              out=out)
                if hook:
                    hk()
                assert combined is out, ctx
                assert_bitwise("combined_x", combined, want, ctx)
                checked += 1
    finally:
        buf.destroy()
    return checked


def _replays(graph: "torch.cuda.CUDAGraph", replays: int, every: int, inputs, captured: tuple[torch.Tensor, ...],
              rank: int, eager):
    """Replay ``graph`` ``replays`` times; before every ``every``-th replay, fresh inputs
    (``inputs(case)``: every rank's) are copied into the ``captured`` (x, topk_idx, topk_weights)
    and ``eager()`` runs the step on them. Yields (replay, inputs, eager output) after those
    replays."""
    x, idx, w = captured
    for i in range(replays):
        if i % every == 0:
            ins = inputs(i // every + 1)
            x.copy_(ins[rank].x)
            idx.copy_(ins[rank].topk_idx)
            w.copy_(ins[rank].topk_weights)
            want = eager().clone()
        graph.replay()
        if i % every == 0:
            yield i, ins, want


def check_graph_replay(rank: int, world_size: int, config: dict[str, Any], seed: int, T_max: int,
                       replays: int = 1000, every: int = 100, hooks: bool = False) -> int:
    """Capture dispatch -> expert op -> combine in one CUDA graph and replay it ``replays``
    times; every ``every``-th replay runs on fresh inputs (new x, routing and weights copied
    into the captured tensors), and its output must equal, bitwise, an eager step on the
    same inputs and the reference. ``hooks``: the step uses receive hooks inside the graph.
    Returns the number of replays checked."""
    cfg = from_dict(config)
    b = cfg.buffer
    dev = torch.device("cuda", torch.cuda.current_device())
    L = b.num_experts // world_size
    scale = (torch.linspace(0.5, 2.0, L) + rank).to(torch.bfloat16).to(dev)
    routing = Routing("masked", mask_prob=0.2, masked_tokens=0.05)
    T = T_max - 3  # the graph's token count is fixed; fewer than T_max

    def inputs(case: int):
        ins = make_inputs(routing, num_tokens=T, hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                          world_size=world_size, dtype=torch.bfloat16, seed=seed + 1009 * case)
        return ins

    ins = inputs(0)
    x, idx, w = (t.to(dev).clone() for t in (ins[rank].x, ins[rank].topk_idx, ins[rank].topk_weights))
    checked = 0
    with Buffer(None, cfg) as buf:
        def step() -> torch.Tensor:
            recv_x, _, handle, _, hook = buf.low_latency_dispatch(x, idx, T_max, b.num_experts,
                                                                  return_recv_hook=hooks)
            if hooks:
                hook()
            out, _, hook = buf.low_latency_combine(expert_op(recv_x, scale), idx, w, handle, return_recv_hook=hooks)
            if hooks:
                hook()
            return out

        step()  # allocates the low-latency buffer: not allowed inside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for i, ins, eager in _replays(graph, replays, every, inputs, (x, idx, w), rank, step):
            buf.check_low_latency(synchronize=True)
            ctx = f"rank {rank}/{world_size} graph replay {i} hooks={hooks}"
            assert_bitwise("graph replay vs eager", out, eager, ctx)
            ref = reference.low_latency_dispatch([r.x for r in ins], [r.topk_idx for r in ins], b.num_experts,
                                                 T_max)
            scales = [(torch.linspace(0.5, 2.0, L) + r).to(torch.bfloat16) for r in range(world_size)]
            ys = [expert_op(ref.recv[r].recv_x, scales[r]) for r in range(world_size)]
            want = reference.low_latency_combine(ys, ref, [r.topk_idx for r in ins], [r.topk_weights for r in ins],
                                                 b.num_experts)[rank]
            assert_bitwise("graph replay vs reference", out, want, ctx)
            checked += 1
        torch.cuda.synchronize()
        buf.check_low_latency()
    return checked


def absent_rank_low_latency(rank: int, world_size: int, config: dict[str, Any], seed: int, T_max: int) -> str:
    """Rank 1 never dispatches: the others' receive must raise StallError naming the stage."""
    import torch.distributed as dist
    cfg = from_dict(config)
    b = cfg.buffer
    dev = torch.device("cuda", torch.cuda.current_device())
    ins = make_inputs(Routing("uniform"), num_tokens=T_max, hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                      world_size=world_size, dtype=torch.bfloat16, seed=seed)
    message = "absent"
    with Buffer(None, cfg) as buf:
        mine = ins[rank]
        buf.low_latency_dispatch(mine.x.to(dev), mine.topk_idx.to(dev), T_max, b.num_experts)  # allocates
        buf.check_low_latency(synchronize=True)
        dist.barrier()
        if rank != 1:
            buf.low_latency_dispatch(mine.x.to(dev), mine.topk_idx.to(dev), T_max, b.num_experts)
            try:
                buf.check_low_latency(synchronize=True)
                message = "no error"
            except Exception as e:  # the StallError under test
                message = f"{type(e).__name__}: {e}"
        dist.barrier()
    return message


def check_layer_low_latency(rank: int, world_size: int, config: dict[str, Any], seed: int,
                            layer_kwargs: dict[str, Any], T_max: int, device: str = "cpu",
                            replays: int = 0) -> int:
    """``MoELayer.forward_low_latency`` against the same layer's ``forward`` (normal mode) on
    the same tokens. The router and the combine's fp32 sum in ascending slot order are shared,
    so the only difference is the expert GEMMs: one batched GEMM over the masked rows here, a
    grouped GEMM (or a loop) over the received rows there, whose bfloat16 outputs may round
    differently in the last bit; the tolerance is bfloat16's (rtol 1.6e-2, atol 1e-2 of the
    output's largest magnitude). ``replays`` > 0 (CUDA): the forward captured once in a CUDA
    graph and replayed, each replay on new tokens copied into the captured input, must equal
    an eager call bitwise. Returns the number of comparisons made."""
    from ..nn import MoELayer

    cfg = from_dict(config)
    b = cfg.buffer
    dev = torch.device(device)
    ctx = f"rank {rank}/{world_size} {cfg.backend} forward_low_latency T_max={T_max} seed={seed}"
    T = T_max - rank % 3  # ranks with fewer tokens than T_max

    def tokens(case: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 7919 + 31 * case + rank)
        return torch.randn((T, b.hidden), generator=g).to(torch.bfloat16).to(dev)

    checked = 0
    with Buffer(None, cfg) as buf:
        layer = MoELayer(buf, **layer_kwargs).to(dev)
        x = tokens(0)
        got = layer.forward_low_latency(x, T_max)
        with torch.no_grad():
            want = layer(x)
        scale = max(1.0, float(want.abs().max()))
        try:
            torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2 * scale)
        except AssertionError as e:
            raise AssertionError(f"{ctx}: differs from the normal-mode forward: {e}") from None
        checked += 1
        if replays:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = layer.forward_low_latency(x, T_max)
            for i in range(replays):
                x.copy_(tokens(i + 1))
                eager = layer.forward_low_latency(x, T_max).clone()
                graph.replay()
                buf.check_low_latency(synchronize=True)
                assert_bitwise("graph replay vs eager forward_low_latency", out, eager, f"{ctx} replay {i}")
                checked += 1
    return checked


def check_elastic_graph_replay(rank: int, world_size: int, config: dict[str, Any], seed: int, T_max: int,
                               replays: int = 200, every: int = 50) -> int:
    """DeepEP V2's decode step through ``ElasticBuffer(symmoe_low_latency=True)`` -- the expanded
    dispatch without CPU sync, an expert op on its rows and weights, the combine -- captured in
    one CUDA graph and replayed; every ``every``-th replay on fresh inputs must equal, bitwise,
    the same step run eagerly by a normal-mode ElasticBuffer. That buffer's dispatch must refuse
    capture, naming why. Returns the number of replays checked."""
    import symmoe.compat.deep_ep_v2 as deep_ep_v2
    from ..errors import InputError
    cfg = from_dict(config)
    b = cfg.buffer
    dev = torch.device("cuda", torch.cuda.current_device())
    routing = Routing("masked", mask_prob=0.2, masked_tokens=0.05)
    T, a = T_max - 3, b.expert_alignment

    def inputs(case: int):
        return make_inputs(routing, num_tokens=T, hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                           world_size=world_size, dtype=torch.bfloat16, seed=seed + 1009 * case)

    ins = inputs(0)
    x, idx, w = (t.to(dev).clone() for t in (ins[rank].x, ins[rank].topk_idx, ins[rank].topk_weights))
    kw = dict(num_max_tokens_per_rank=T_max, expert_alignment=a, do_cpu_sync=False, do_expand=True)
    fast = deep_ep_v2.ElasticBuffer(None, symmoe_config=cfg, allow_multiple_reduction=False, symmoe_low_latency=True)
    normal = deep_ep_v2.ElasticBuffer(None, symmoe_config=cfg, allow_multiple_reduction=False)
    checked = 0
    try:
        def step(buf) -> torch.Tensor:
            recv_x, _, recv_w, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, **kw)
            y = (recv_x.float() * (1 + recv_w).unsqueeze(1)).to(torch.bfloat16)
            return buf.combine(y, handle)[0]

        step(fast)  # allocates the low-latency buffer: not allowed inside capture
        torch.cuda.synchronize()
        refused = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(refused):
                step(normal)
        except Exception as e:  # the refusal, possibly chained under the capture's end
            chain = [e, e.__context__, e.__cause__]
            assert any(isinstance(c, InputError) and "CUDA graph capture" in str(c) for c in chain), repr(e)
        else:
            raise AssertionError("the normal mode's dispatch was captured instead of refused")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(fast)
        for i, _, eager in _replays(graph, replays, every, inputs, (x, idx, w), rank, lambda: step(normal)):
            fast.symmoe.check_low_latency(synchronize=True)
            assert_bitwise("graph replay vs normal mode", out, eager, f"rank {rank}/{world_size} replay {i}")
            checked += 1
        torch.cuda.synchronize()
    finally:
        fast.destroy()
        normal.destroy()
    return checked
