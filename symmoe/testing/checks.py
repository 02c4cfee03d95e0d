"""Per-rank checks shared by the test suites (host and GPU) and ``scripts/gpu_check.sh``.

Each function runs inside one rank (``symmoe.launch.spawn`` or torchrun), builds every
rank's inputs from the seed, runs the Buffer, and compares its own results bitwise with
``symmoe.reference`` computed from the same global inputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import reference
from ..buffer import Buffer
from ..config import Config, from_dict
from ..layout import DTYPES
from ..workload import Routing, make_inputs
from .compare import first_bit_difference

# The routings every backend is checked on: masked slots, ranks that receive nothing,
# heavy skew, and every token on one expert.
CHECK_ROUTINGS = (
    Routing("uniform"),
    Routing("masked", mask_prob=0.3, masked_tokens=0.1),
    Routing("empty_ranks", empty_ranks=(1, 3)),
    Routing("zipf", zipf_s=2.0),
    Routing("one_expert", expert=1),
    Routing("group_limited", num_groups=4, topk_groups=2),
)


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """'' when bitwise equal, else where and how the two first differ."""
    d = first_bit_difference(a, b)
    if d is None:
        return ""
    where = "" if d["row"] is None else f" at row {d['row']}" + ("" if d["col"] is None else f", column {d['col']}")
    return f"first difference{where}: {d['detail']}"


def assert_bitwise(name: str, got: torch.Tensor, want: torch.Tensor, ctx: str) -> None:
    diff = first_difference(got.detach().cpu(), want.detach().cpu())
    if diff:
        raise AssertionError(f"{ctx}: {name} differs from the reference: {diff}")


def _tokens_per_rank(world_size: int, max_tokens: int, seed: int, full: bool = False) -> list[int]:
    """Different token counts per rank (one rank with none when there are several); ``full``:
    max_tokens on every rank."""
    if full:
        return [max_tokens] * world_size
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(max_tokens // 2, max_tokens + 1, (world_size,), generator=g).tolist()
    if world_size > 2:
        counts[world_size - 1] = 0
    return counts


def check_dispatch_combine(rank: int, world_size: int, config: dict[str, Any], seed: int,
                           routings: tuple[Routing, ...] = CHECK_ROUTINGS, layouts: tuple[str, ...] = ("rank", "expert"),
                           device: str = "cpu", repeats: int = 1, combines: int = 1, x_in_buffer: bool = False,
                           full_ranks: bool = False) -> int:
    """Run dispatch + combine for each routing and layout; raise on any bitwise difference.
    ``combines`` > 1: that many combines in a row on one handle, each with other expert
    outputs (a backward pass reuses a handle). ``x_in_buffer``: x is built in
    ``Buffer.input_view`` and dispatched from there. ``full_ranks``: every rank dispatches
    max_tokens tokens. Returns the number of (routing, layout) cases."""
    cfg: Config = from_dict(config)
    dev = torch.device(device)
    checked = 0
    with Buffer(None, cfg) as buf:
        for i, routing in enumerate(routings):
            for layout in layouts:
                for rep in range(repeats):
                    case_seed = seed + 7919 * i + 31 * rep
                    inputs = _case_inputs(routing, world_size, cfg, case_seed, full_ranks)
                    ctx = (f"rank {rank}/{world_size} {cfg.backend}/{buf.protocol} routing={routing.kind} "
                           f"layout={layout} seed={case_seed}")
                    _check_one(buf, inputs, rank, world_size, cfg, layout, dev, ctx, case_seed, combines, x_in_buffer)
                    checked += 1
    return checked


def _case_inputs(routing: Routing, world_size: int, cfg: Config, case_seed: int, full: bool = False):
    """Every rank's inputs of one case (different token counts per rank, one rank with none;
    ``full``: max_tokens each)."""
    b = cfg.buffer
    counts = _tokens_per_rank(world_size, b.max_tokens_per_rank, case_seed, full)
    return make_inputs(routing, num_tokens=counts, hidden=b.hidden, topk=b.topk, num_experts=b.num_experts,
                       world_size=world_size, dtype=DTYPES[b.dtype], seed=case_seed)


def _check_recv(rx, ri, rw, per_expert: list[int], want, ctx: str) -> None:
    assert_bitwise("recv_x", rx, want.x, ctx)
    assert_bitwise("recv_topk_idx", ri, want.topk_idx, ctx)
    assert_bitwise("recv_topk_weights", rw, want.topk_weights, ctx)
    if per_expert != want.num_recv_tokens_per_expert.tolist():
        raise AssertionError(f"{ctx}: num_recv_tokens_per_expert {per_expert} != {want.num_recv_tokens_per_expert.tolist()}")


def _check_one(buf: Buffer, inputs, rank: int, world_size: int, cfg: Config, layout: str, dev: torch.device,
               ctx: str, seed: int, combines: int = 1, x_in_buffer: bool = False) -> None:
    b = cfg.buffer
    align = b.expert_alignment
    mine = inputs[rank]
    ref = reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                             b.num_experts, layout, align)
    want = ref.recv[rank]
    # DeepEP's first call, from the same ids: the backend's routing kernel against the reference.
    per_rank, _, tokens_per_expert, in_rank, _ = buf.get_dispatch_layout(mine.topk_idx.to(dev))
    lay = reference.get_dispatch_layout(mine.topk_idx, b.num_experts, world_size)
    assert_bitwise("get_dispatch_layout num_tokens_per_rank", per_rank, lay.num_tokens_per_rank, ctx)
    assert_bitwise("get_dispatch_layout num_tokens_per_expert", tokens_per_expert, lay.num_tokens_per_expert, ctx)
    assert_bitwise("get_dispatch_layout is_token_in_rank", in_rank, lay.is_token_in_rank, ctx)
    x = mine.x.to(dev)
    if x_in_buffer:
        x = buf.input_view(x.shape[0]).copy_(x)
    rx, ri, rw, per_expert, handle, event = buf.dispatch(x, mine.topk_idx.to(dev), mine.topk_weights.to(dev),
                                                         output_layout=layout, expert_alignment=align)
    event.synchronize()
    if x_in_buffer:
        assert_bitwise("x in the input view after its dispatch", x, mine.x, ctx)
    _check_recv(rx, ri, rw, per_expert, want, ctx)
    assert_bitwise("handle.recv_src_rank", handle.recv_src_rank, want.src_rank, ctx)
    assert_bitwise("handle.recv_src_token", handle.recv_src_token, want.src_token, ctx)
    _check_combines(buf, handle, ref, inputs, rank, world_size, cfg, layout, dev, ctx, seed, combines)


def check_cached_dispatch(rank: int, world_size: int, config: dict[str, Any], seed: int,
                          routings: tuple[Routing, ...] = CHECK_ROUTINGS, layouts: tuple[str, ...] = ("rank", "expert"),
                          device: str = "cpu", x_in_buffer: bool = False) -> int:
    """``dispatch(x, handle=...)``: every routing is dispatched first (each one overwrites
    what the one before left in the buffer), then new x moves along each routing in turn
    with its handle. The rows must equal the reference's for the new x (and the routing of
    the handle), the same handle must come back, and a combine on it must still be exact.
    Returns the number of cached dispatches checked."""
    cfg: Config = from_dict(config)
    b = cfg.buffer
    dtype = DTYPES[b.dtype]
    dev = torch.device(device)
    checked = 0
    with Buffer(None, cfg) as buf:
        for layout in layouts:
            cases = []
            for i, routing in enumerate(routings):
                case_seed = seed + 7919 * i
                inputs = _case_inputs(routing, world_size, cfg, case_seed)
                mine = inputs[rank]
                *_, handle, event = buf.dispatch(mine.x.to(dev), mine.topk_idx.to(dev), mine.topk_weights.to(dev),
                                                 output_layout=layout, expert_alignment=b.expert_alignment)
                cases.append((routing, case_seed, inputs, handle))
            event.synchronize()
            for routing, case_seed, inputs, handle in cases:
                ctx = (f"rank {rank}/{world_size} {cfg.backend}/{buf.protocol} cached dispatch routing={routing.kind} "
                       f"layout={layout} seed={case_seed}")
                # New rows along the old routing (what a backward pass sends).
                xs = [torch.randn(i.x.shape, generator=torch.Generator().manual_seed(case_seed * 13 + r)).to(dtype)
                      for r, i in enumerate(inputs)]
                ref = reference.dispatch(xs, [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                                         b.num_experts, layout, b.expert_alignment)
                want = ref.recv[rank]
                x = xs[rank].to(dev)
                if x_in_buffer:
                    x = buf.input_view(x.shape[0]).copy_(x)
                rx, ri, rw, per_expert, same, event = buf.dispatch(x, handle=handle)
                event.synchronize()
                if same is not handle:
                    raise AssertionError(f"{ctx}: a cached dispatch must return the handle it was given")
                _check_recv(rx, ri, rw, per_expert, want, ctx)
                _check_combines(buf, handle, ref, inputs, rank, world_size, cfg, layout, dev, ctx, case_seed, 1)
                checked += 1
    return checked


def check_counts_summary(rank: int, world_size: int, config: dict[str, Any], seed: int) -> int:
    """After every exact-size dispatch of a GPU protocol, the words its routing kernel left for
    the host (``host_counts()``) equal ``counts.summary_of`` of the matrix it left beside them:
    every check routing, both layouts, alignment 1 and 4. Returns the number of dispatches."""
    from ..protocol.counts import summary_of

    cfg: Config = from_dict(config)
    b = cfg.buffer
    checked = 0
    with Buffer(None, cfg) as buf:
        proto, L = buf._protocol, b.num_experts // world_size
        for i, routing in enumerate(CHECK_ROUTINGS):
            mine = _case_inputs(routing, world_size, cfg, seed + 7919 * i)[rank]
            for layout, align in (("rank", 1), ("expert", 1), ("expert", 4)):
                buf.dispatch(mine.x.cuda(), mine.topk_idx.cuda(), mine.topk_weights.cuda(), output_layout=layout,
                             expert_alignment=align)
                matrix, summary = proto.host_counts()
                want = summary_of(matrix, rank, align, L)
                if not np.array_equal(summary, want):
                    raise AssertionError(f"rank {rank}/{world_size} {cfg.backend} routing={routing.kind} {layout} "
                                         f"alignment {align}: summary {summary.tolist()} != {want.tolist()}")
                checked += 1
    return checked


def check_num_worst_tokens(rank: int, world_size: int, config: dict[str, Any], seed: int,
                           routings: tuple[Routing, ...] = CHECK_ROUTINGS, layouts: tuple[str, ...] = ("rank", "expert"),
                           device: str = "cpu") -> int:
    """``dispatch(..., num_worst_tokens=N)``, DeepEP's worst-case-sized outputs: N rows, the
    reference's rows first, then x 0, expert ids -1 and weights 0 (``reference.pad_recv``),
    for a dispatch, its cached dispatch and the cached dispatch of an exact handle asked for N
    rows; the per-expert counts come as a tensor; the handle
    covers the N rows (sources -1 past the received ones) and combine takes N rows, ignores
    the tail's values and stays exact. N one short of the most rows any rank receives raises
    CapacityError on every rank (by ``synchronize()`` at the latest: a dispatch may return
    before the device has counted), and the buffer stays usable. Returns the number of
    cases checked."""
    from ..errors import CapacityError

    cfg: Config = from_dict(config)
    b = cfg.buffer
    dev = torch.device(device)
    checked = 0
    with Buffer(None, cfg) as buf:
        for layout in layouts:
            for i, routing in enumerate(routings):
                case_seed = seed + 7919 * i
                inputs = _case_inputs(routing, world_size, cfg, case_seed)
                mine = inputs[rank]
                ref = reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs],
                                         [i.topk_weights for i in inputs], b.num_experts, layout, b.expert_alignment)
                want = ref.recv[rank]
                most = max(r.x.shape[0] for r in ref.recv)
                ctx = (f"rank {rank}/{world_size} {cfg.backend}/{buf.protocol} num_worst_tokens routing={routing.kind} "
                       f"layout={layout} seed={case_seed}")
                args = (mine.x.to(dev), mine.topk_idx.to(dev), mine.topk_weights.to(dev))
                if most > 0:
                    try:
                        buf.dispatch(*args, output_layout=layout, expert_alignment=b.expert_alignment,
                                     num_worst_tokens=most - 1)
                        buf.synchronize()
                    except CapacityError as e:
                        if "num_worst_tokens" not in str(e):
                            raise AssertionError(f"{ctx}: the CapacityError does not name num_worst_tokens: {e}")
                    else:
                        raise AssertionError(f"{ctx}: num_worst_tokens={most - 1} < {most} rows did not raise")
                worst = most + 3
                padded = reference.pad_recv(want, worst)
                rx, ri, rw, per_expert, handle, event = buf.dispatch(
                    *args, output_layout=layout, expert_alignment=b.expert_alignment, num_worst_tokens=worst)
                event.synchronize()
                _check_recv(rx, ri, rw, _per_expert_tensor(per_expert, rx, ctx), padded, ctx)
                n = want.x.shape[0]
                if not (bool((rx[n:] == 0).all()) and bool((ri[n:] == -1).all()) and bool((rw[n:] == 0).all())):
                    raise AssertionError(f"{ctx}: rows past the {n} received are not x 0, ids -1, weights 0")
                if handle.num_recv_rows != worst or handle.num_worst_tokens != worst:
                    raise AssertionError(f"{ctx}: the handle covers {handle.num_recv_rows} rows "
                                         f"(num_worst_tokens {handle.num_worst_tokens}), not {worst}")
                assert_bitwise("handle.recv_src_rank", handle.recv_src_rank, padded.src_rank, ctx)
                assert_bitwise("handle.recv_src_token", handle.recv_src_token, padded.src_token, ctx)
                xs = [torch.randn(i.x.shape, generator=torch.Generator().manual_seed(case_seed * 13 + r)).to(i.x.dtype)
                      for r, i in enumerate(inputs)]
                ref2 = reference.dispatch(xs, [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                                          b.num_experts, layout, b.expert_alignment)
                # A cached dispatch of a worst-case handle is worst-case sized without being asked.
                rx, ri, rw, per_expert, _, event = buf.dispatch(xs[rank].to(dev), handle=handle)
                event.synchronize()
                _check_recv(rx, ri, rw, _per_expert_tensor(per_expert, rx, ctx), reference.pad_recv(ref2.recv[rank], worst),
                            f"{ctx} cached")
                _check_combines(buf, handle, ref, inputs, rank, world_size, cfg, layout, dev, ctx, case_seed, 1,
                                rows=worst)
                # An exact handle (counted on the host) asked for worst-case sizes when cached.
                *_, exact, event = buf.dispatch(*args, output_layout=layout, expert_alignment=b.expert_alignment)
                rx, ri, rw, per_expert, _, event = buf.dispatch(xs[rank].to(dev), handle=exact, num_worst_tokens=worst)
                event.synchronize()
                _check_recv(rx, ri, rw, _per_expert_tensor(per_expert, rx, ctx), reference.pad_recv(ref2.recv[rank], worst),
                            f"{ctx} cached from an exact handle")
                checked += 1
    return checked


def _per_expert_tensor(per_expert, rx: torch.Tensor, ctx: str) -> list[int]:
    """With worst-case sizes the per-expert counts are a tensor beside the outputs (a list
    would need the host to wait for the device)."""
    if not isinstance(per_expert, torch.Tensor) or per_expert.device != rx.device or per_expert.dtype != torch.int32:
        raise AssertionError(f"{ctx}: num_recv_tokens_per_expert is {per_expert!r}; expected an int32 tensor on "
                             f"{rx.device}")
    return per_expert.tolist()


def _check_combines(buf: Buffer, handle, ref, inputs, rank: int, world_size: int, cfg: Config, layout: str,
                    dev: torch.device, ctx: str, seed: int, combines: int, rows: int = 0) -> None:
    """``rows`` > 0: y has that many rows (a worst-case handle), the received rows' values
    first, then rows combine must ignore (random too)."""
    b = cfg.buffer
    # Expert outputs: fresh values per receiving rank (and per combine), derived from the seed
    # so that every rank can compute every rank's y for the reference combine.
    for c in range(combines):
        cseed = seed + 104729 * c
        ys = []
        for r in range(world_size):
            g = torch.Generator().manual_seed(cseed * 7 + r)
            # FP8 dispatches (x a pair) combine rows of buffer.dtype
            ys.append(torch.randn((ref.recv[r].topk_idx.shape[0], b.hidden), generator=g).to(DTYPES[b.dtype]))
        rws = [torch.rand(ref.recv[r].topk_weights.shape, generator=torch.Generator().manual_seed(cseed * 11 + r))
               for r in range(world_size)] if layout == "rank" else None
        want_c = reference.combine(ys, ref, [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                                   b.num_experts, layout, rws)
        y, rw = ys[rank], rws[rank] if rws else None
        if rows:
            g = torch.Generator().manual_seed(cseed * 17 + rank)
            y = torch.cat([y, torch.randn((rows - y.shape[0], y.shape[1]), generator=g).to(y.dtype)])
            if rw is not None:
                rw = torch.cat([rw, torch.rand((rows - rw.shape[0], rw.shape[1]), generator=g)])
        out, out_w, event = buf.combine(y.to(dev), handle, rw.to(dev) if rw is not None else None)
        event.synchronize()
        cctx = f"{ctx} combine {c + 1} of {combines}" if combines > 1 else ctx
        assert_bitwise("combined_x", out, want_c[rank][0], cctx)
        if rws is not None:
            assert_bitwise("combined_topk_weights", out_w, want_c[rank][1], cctx)


def fp8_case(inputs, seed: int, scale_format: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every rank's FP8 x for one case: random bytes as e4m3 (NaN and negative zero among
    them: dispatch must move bytes, not values) and random scales of ``scale_format``."""
    from ..fp8 import FP8_DTYPE, formats

    out = []
    for r, i in enumerate(inputs):
        g = torch.Generator().manual_seed(seed * 29 + r)
        T, H = i.x.shape
        data = torch.randint(0, 256, (T, H), dtype=torch.uint8, generator=g).view(FP8_DTYPE)
        cols = formats(H)[scale_format].scale_cols
        if scale_format == "float32":
            scales = torch.rand((T, cols), generator=g) + 0.5
        else:
            scales = torch.randint(-(1 << 31), 1 << 31, (T, cols), dtype=torch.int64, generator=g).to(torch.int32)
        out.append((data, scales))
    return out


def _check_pair(name: str, got, want, scale_layout: str, ctx: str) -> None:
    from ..fp8 import tma_aligned_rows

    if not isinstance(got, tuple) or len(got) != 2:
        raise AssertionError(f"{ctx}: {name} of an FP8 dispatch is {type(got).__name__}, not (x_e4m3, scales)")
    assert_bitwise(f"{name} e4m3 bytes", got[0].view(torch.uint8), want[0].view(torch.uint8), ctx)
    assert_bitwise(f"{name} scales", got[1], want[1], ctx)
    if not got[0].is_contiguous():
        raise AssertionError(f"{ctx}: {name} e4m3 is not contiguous: strides {got[0].stride()}")
    M = got[1].shape[0]
    strides = (got[1].shape[1], 1) if scale_layout == "row" else (1, tma_aligned_rows(M))
    if M and got[1].shape[1] > 1 and got[1].stride() != strides:
        raise AssertionError(f"{ctx}: {name} scales have strides {got[1].stride()}; {scale_layout} wants {strides}")


def check_fp8_dispatch(rank: int, world_size: int, config: dict[str, Any], seed: int,
                       routings: tuple[Routing, ...] = CHECK_ROUTINGS, layouts: tuple[str, ...] = ("rank", "expert"),
                       device: str = "cpu", scale_formats: tuple[str, ...] = ("float32", "ue8m0")) -> int:
    """FP8 x = (e4m3, scales) in both layouts, with float32 and UE8M0 scales, row-major and
    DeepGEMM's MN-major scales out: recv bitwise equal to the reference's, the grouped layout
    (both forms) equal to ``reference.grouped_layout``, then a cached FP8 dispatch of new x, a
    worst-case-sized one (``num_worst_tokens``), a bfloat16 combine on the handle, exact, and
    a bfloat16 dispatch between FP8 ones (full rows after narrow ones, on one Buffer).
    Returns the number of cases."""
    cfg: Config = from_dict(config)
    b = cfg.buffer
    dev = torch.device(device)
    checked = 0
    with Buffer(None, cfg) as buf:
        for i, routing in enumerate(routings):
            for layout in layouts:
                for f, fmt in enumerate(scale_formats):
                    case_seed = seed + 7919 * i + 101 * f
                    scale_layout = ("row", "mn_major")[(i + f) % 2]
                    inputs = _case_inputs(routing, world_size, cfg, case_seed)
                    xs = fp8_case(inputs, case_seed, fmt)
                    idxs, ws = [i.topk_idx for i in inputs], [i.topk_weights for i in inputs]
                    ref = reference.dispatch(xs, idxs, ws, b.num_experts, layout, b.expert_alignment)
                    want = ref.recv[rank]
                    ctx = (f"rank {rank}/{world_size} {cfg.backend}/{buf.protocol} FP8 {fmt} scales {scale_layout} "
                           f"routing={routing.kind} layout={layout} seed={case_seed}")
                    mine = (xs[rank][0].to(dev), xs[rank][1].to(dev))
                    idx, w = idxs[rank].to(dev), ws[rank].to(dev)
                    rx, ri, rw, per_expert, handle, event = buf.dispatch(
                        mine, idx, w, output_layout=layout, expert_alignment=b.expert_alignment,
                        scale_layout=scale_layout)
                    event.synchronize()
                    _check_pair("recv_x", rx, want.x, scale_layout, ctx)
                    assert_bitwise("recv_topk_idx", ri, want.topk_idx, ctx)
                    assert_bitwise("recv_topk_weights", rw, want.topk_weights, ctx)
                    if per_expert != want.num_recv_tokens_per_expert.tolist():
                        raise AssertionError(f"{ctx}: num_recv_tokens_per_expert {per_expert}")
                    if layout == "expert":
                        for psum in (False, True):
                            assert_bitwise(f"grouped_layout(psum={psum})", buf.grouped_layout(handle, psum=psum),
                                           reference.grouped_layout(want, psum=psum), ctx)
                    _check_combines(buf, handle, ref, inputs, rank, world_size, cfg, layout, dev, ctx, case_seed, 1)
                    # new FP8 rows along the same routing
                    xs2 = fp8_case(inputs, case_seed + 1, fmt)
                    ref2 = reference.dispatch(xs2, idxs, ws, b.num_experts, layout, b.expert_alignment)
                    rx, *_, same, event = buf.dispatch((xs2[rank][0].to(dev), xs2[rank][1].to(dev)), handle=handle,
                                                       scale_layout=scale_layout)
                    event.synchronize()
                    _check_pair("cached recv_x", rx, ref2.recv[rank].x, scale_layout, ctx)
                    # worst-case-sized outputs: zero bytes past the received rows
                    worst = max(r.topk_idx.shape[0] for r in ref.recv) + 3
                    padded = reference.pad_recv(want, worst)
                    rx, ri, rw, per_expert, wh, event = buf.dispatch(
                        mine, idx, w, output_layout=layout, expert_alignment=b.expert_alignment,
                        num_worst_tokens=worst, scale_layout=scale_layout)
                    event.synchronize()
                    _check_pair("worst-case recv_x", rx, padded.x, scale_layout, ctx)
                    assert_bitwise("worst-case recv_topk_idx", ri, padded.topk_idx, ctx)
                    if layout == "expert":
                        for psum in (False, True):
                            assert_bitwise(f"worst-case grouped_layout(psum={psum})",
                                           buf.grouped_layout(wh, psum=psum),
                                           reference.grouped_layout(padded, psum=psum), ctx)
                    _check_bf16_between(buf, inputs, xs2, ref2, rank, layout, b.num_experts, b.expert_alignment,
                                        dev, scale_layout, ctx)
                    checked += 1
    return checked


def _check_bf16_between(buf: Buffer, inputs, xs, ref_fp8, rank: int, layout: str, num_experts: int, alignment: int,
                        dev: torch.device, scale_layout: str, ctx: str) -> None:
    """FP8 rows are narrower than bfloat16 ones on the same Buffer: a bfloat16 dispatch right
    after FP8 ones moves full rows again, and an FP8 cached dispatch (of ``xs``, whose reference
    is ``ref_fp8``) on its handle narrow ones."""
    mine = inputs[rank]
    ref = reference.dispatch([i.x for i in inputs], [i.topk_idx for i in inputs], [i.topk_weights for i in inputs],
                             num_experts, layout, alignment)
    rx, *_, handle, event = buf.dispatch(mine.x.to(dev), mine.topk_idx.to(dev), mine.topk_weights.to(dev),
                                         output_layout=layout, expert_alignment=alignment)
    event.synchronize()
    assert_bitwise("bfloat16 recv_x after FP8 dispatches", rx, ref.recv[rank].x, ctx)
    rx, *_, event = buf.dispatch((xs[rank][0].to(dev), xs[rank][1].to(dev)), handle=handle, scale_layout=scale_layout)
    event.synchronize()
    _check_pair("FP8 cached recv_x on a bfloat16 dispatch's handle", rx, ref_fp8.recv[rank].x, scale_layout, ctx)
