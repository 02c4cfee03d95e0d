"""Per-rank checks of the training surface (``symmoe.autograd``, ``symmoe.ops``, ``symmoe.nn``),
shared by the host tests and the GPU tests.

Like ``checks``, each function runs inside one rank, builds every rank's inputs from the seed
and compares its own results with what a single process computes from the same global inputs:
bitwise where the semantics fix the order (the gradients of dispatch and combine are the
reference's combine and dispatch of the gradients), within a stated tolerance where they do
not (a layer against a plain-torch MoE, whose sums run in another order).
"""
from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import autograd, ops, reference
from ..buffer import Buffer
from ..config import Config, from_dict
from ..layout import DTYPES
from ..workload import Routing, make_inputs
from .checks import CHECK_ROUTINGS, _case_inputs, assert_bitwise

# Masked slots and tokens, ranks that receive nothing, skew: the routings gradients are checked on.
GRAD_ROUTINGS = (CHECK_ROUTINGS[1], CHECK_ROUTINGS[2], CHECK_ROUTINGS[3], Routing("uniform"))


def _randn(shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check_autograd(rank: int, world_size: int, config: dict[str, Any], seed: int,
                   layouts: tuple[str, ...] = ("rank", "expert"), worst: tuple[bool, ...] = (False, True),
                   device: str = "cpu", use_ops: bool = False) -> int:
    """Gradients of ``symmoe.autograd.dispatch``/``combine`` (``use_ops``: of the ``symmoe``
    custom ops, worst-case sizes only) bitwise against the reference, for fresh upstream
    gradients (random in the tail rows of worst-case outputs too, which must be ignored):

    * dispatch: ``grad_x`` = ``reference.combine`` of the received rows' gradients (expert-major
      with unit weights); ``grad_topk_weights[t, k]`` = the gradient of the received weight
      that slot k's owner got (0 on masked slots);
    * combine: ``grad_y`` = ``reference.dispatch`` of the output's gradient (expert-major times
      each row's weight in fp32, one cast); expert-major ``grad_topk_weights[t, k]`` = the fp32
      dot product of the output's gradient with the row slot k's expert produced.

    Returns the number of cases checked."""
    cfg: Config = from_dict(config)
    b = cfg.buffer
    dtype, dev, align, K = DTYPES[b.dtype], torch.device(device), b.expert_alignment, b.topk
    L = b.num_experts // world_size
    checked = 0
    with Buffer(None, cfg) as buf:
        for i, routing in enumerate(GRAD_ROUTINGS):
            for layout in layouts:
                for w_case in worst:
                    s = seed + 7919 * i + (1 if layout == "expert" else 0) * 104729 + w_case * 31
                    inputs = _case_inputs(routing, world_size, cfg, s)
                    ctx = (f"rank {rank}/{world_size} {cfg.backend}/{buf.protocol} autograd{' ops' if use_ops else ''} "
                           f"routing={routing.kind} layout={layout} worst={w_case} seed={s}")
                    xs, idxs, ws = [i.x for i in inputs], [i.topk_idx for i in inputs], [i.topk_weights for i in inputs]
                    ref = reference.dispatch(xs, idxs, ws, b.num_experts, layout, align)
                    rows = [r.x.shape[0] for r in ref.recv]
                    n = max(rows) + 5 if w_case else 0
                    out_rows = [n or r for r in rows]
                    # Upstream gradients of every rank (each rank can draw every rank's).
                    g_rx = [_randn((out_rows[r], b.hidden), s * 7 + r, dtype) for r in range(world_size)]
                    wshape = [(m, K) if layout == "rank" else (m,) for m in out_rows]
                    g_rw = [_randn(wshape[r], s * 11 + r) for r in range(world_size)]
                    ys = [_randn((out_rows[r], b.hidden), s * 13 + r, dtype) for r in range(world_size)]
                    g_out = [_randn((xs[r].shape[0], b.hidden), s * 17 + r, dtype) for r in range(world_size)]

                    x = xs[rank].to(dev).requires_grad_(True)
                    w = ws[rank].to(dev).requires_grad_(True)
                    idx = idxs[rank].to(dev)
                    if use_ops:
                        rx, ri, rw, _, h = ops.dispatch(buf, x, idx, w, num_worst_tokens=n, output_layout=layout,
                                                        expert_alignment=align)
                    else:
                        rx, ri, rw, _, h = autograd.dispatch(buf, x, idx, w, output_layout=layout,
                                                             expert_alignment=align, num_worst_tokens=n)
                    gx, gw = torch.autograd.grad((rx, rw), (x, w), (g_rx[rank].to(dev), g_rw[rank].to(dev)))

                    # Dispatch's gradients from the reference: only the received rows count.
                    live = [g[:m] for g, m in zip(g_rx, rows)]
                    ones = [torch.ones_like(t) for t in ws]
                    want_gx = reference.combine(live, ref, idxs, ones if layout == "expert" else ws, b.num_experts,
                                                layout)[rank][0]
                    want_gw = _slot_gradient(ref, idxs, [g[:m] for g, m in zip(g_rw, rows)], rank, layout, L)
                    assert_bitwise("dispatch grad_x", gx, want_gx, ctx)
                    assert_bitwise("dispatch grad_topk_weights", gw, want_gw, ctx)

                    # Combine's gradients, on a fresh dispatch of the same routing.
                    if use_ops:
                        _, _, _, _, h = ops.dispatch(buf, x.detach(), idx, w.detach(), num_worst_tokens=n,
                                                     output_layout=layout, expert_alignment=align)
                    else:
                        h = autograd.dispatch(buf, x.detach(), idx, w.detach(), output_layout=layout,
                                              expert_alignment=align, num_worst_tokens=n).handle
                    y = ys[rank].to(dev).requires_grad_(True)
                    wc = w.detach().clone().requires_grad_(True)
                    tw = wc if layout == "expert" else None
                    out = (ops.combine(buf, y, h, tw) if use_ops else autograd.combine(buf, y, h, tw))
                    want_out = reference.combine([t[:m] for t, m in zip(ys, rows)], ref, idxs, ws, b.num_experts,
                                                 layout)[rank][0]
                    assert_bitwise("combined_x", out, want_out, ctx)
                    wanted = (y, wc) if layout == "expert" else (y,)
                    grads = torch.autograd.grad(out, wanted, g_out[rank].to(dev))
                    g_ref = reference.dispatch(g_out, idxs, ws, b.num_experts, layout, align).recv[rank]
                    want_gy = g_ref.x
                    if layout == "expert":
                        want_gy = (g_ref.topk_weights.unsqueeze(1) * g_ref.x.float()).to(dtype)
                    want_gy = reference.pad_recv(reference.RecvResult(want_gy, g_ref.topk_idx, g_ref.topk_weights,
                                                                      g_ref.num_recv_tokens_per_expert, g_ref.src_rank,
                                                                      g_ref.src_token, g_ref.expert_offsets), n).x
                    assert_bitwise("combine grad_y", grads[0], want_gy, ctx)
                    if layout == "expert":
                        want = _dot_gradient(ref, idxs, g_out, ys, rank, L, dev)
                        if dev.type == "cpu":
                            assert_bitwise("combine grad_topk_weights", grads[1], want, ctx)
                        else:  # one fp32 dot of H products, summed in the order torch picks for the shape
                            torch.testing.assert_close(grads[1], want, rtol=1e-5, atol=1e-5, msg=lambda m: (
                                f"{ctx}: combine grad_topk_weights differs from the reference beyond a dot "
                                f"product's reordering: {m}"))
                    if use_ops and ops.live_handles(buf):
                        raise AssertionError(f"{ctx}: {ops.live_handles(buf)} handles still live after backward")
                    checked += 1
    return checked


def _slot_gradient(ref, idxs, g_rw, rank: int, layout: str, L: int) -> torch.Tensor:
    """grad_topk_weights[t, k] of a dispatch: the received weight's gradient at the row and
    (rank-major) column where slot k's expert owner got it; 0 on masked slots."""
    idx = idxs[rank].long()
    rows = ref.send_rows[rank]
    out = torch.zeros(idx.shape, dtype=torch.float32)
    for t, k in (idx >= 0).nonzero().tolist():
        owner = int(idx[t, k]) // L
        if layout == "rank":
            out[t, k] = g_rw[owner][rows[t, owner], k]
        else:
            out[t, k] = g_rw[owner][rows[t, k]]
    return out


def _dot_gradient(ref, idxs, g_out, ys, rank: int, L: int, device: torch.device) -> torch.Tensor:
    """grad_topk_weights[t, k] of an expert-major combine: <g_out[t], y[row(t, k)]> in fp32, on
    ``device``. The dot is the one sum whose order symmoe does not fix: torch reduces the H
    products in an order of its choosing per device and shape, so on the GPU it is compared to
    fp32 rounding, not bit for bit (every value that travels is still compared bitwise)."""
    idx = idxs[rank].long()
    rows = ref.send_rows[rank]
    out = torch.zeros(idx.shape, dtype=torch.float32, device=device)
    t, k = (idx >= 0).nonzero(as_tuple=True)
    if t.numel():
        owner = idx[t, k] // L
        y = torch.stack([ys[int(o)][int(r)] for o, r in zip(owner, rows[t, k])])
        out[t.to(device), k.to(device)] = (g_out[rank][t].to(device).float() * y.to(device).float()).sum(-1)
    return out


# -- the layer ------------------------------------------------------------------------------------
def plain_moe(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The MoE every rank's layer computes, in one process over all tokens with every expert's
    weights (``w13`` [E, H, 2F], ``w2`` [E, F, H]): ``shared(x) + sum_k w[t, k] *
    SwiGLU_{idx[t, k]}(x[t])``, summed over the slots in fp32."""
    acc = torch.zeros(x.shape, dtype=torch.float32)
    f = w2.shape[1]
    for k in range(topk_idx.shape[1]):
        for e in topk_idx[:, k].unique().tolist():
            if e < 0:
                continue
            t = (topk_idx[:, k] == e).nonzero().flatten()
            h = x[t] @ w13[e]
            o = (F.silu(h[:, :f]) * h[:, f:]) @ w2[e]
            acc = acc.index_add(0, t, topk_weights[t, k].unsqueeze(1) * o.float())
    out = acc.to(x.dtype)
    if shared is not None:
        h = x @ shared[0]
        out = out + (F.silu(h[:, :shared[1].shape[0]]) * h[:, shared[1].shape[0]:]) @ shared[1]
    return out


def check_layer(rank: int, world_size: int, config: dict[str, Any], seed: int, layer_kwargs: dict[str, Any],
                routing: Routing | None, device: str = "cpu", rtol: float = 1e-5, atol: float = 1e-5) -> str:
    """The W-rank ``MoELayer`` against ``plain_moe`` over every rank's tokens, with the same
    weights: its output and the gradients of x, topk_weights (``routing`` given: that routing,
    fresh random, masked ids included) or of the router (``routing`` None: the layer routes),
    of this rank's experts and of the replicated parameters (summed over ranks).

    Tolerance ``rtol``/``atol``: the layer sums a token's slots by (rank, local expert) and
    runs each expert's GEMM over all rows it received, the plain MoE sums by slot and runs a
    GEMM per (slot, expert); fp32 rounding differs in the last bits (about 1e-7 relative per
    operation), nothing else may. ``atol`` counts in units of the tensor's largest magnitude
    (at least 1): a gradient summed over ranks adds rounded addends, whose error follows their
    size, not the sum's. Returns a digest of this rank's outputs and gradients, which
    must be bitwise equal across backends, protocols and reruns."""
    from ..nn import MoELayer, route_tokens

    cfg: Config = from_dict(config)
    b = cfg.buffer
    dtype, dev = DTYPES[b.dtype], torch.device(device)
    counts = [b.max_tokens_per_rank - (3 * r) % 7 for r in range(world_size)]
    inputs = make_inputs(routing or Routing("uniform"), num_tokens=counts, hidden=b.hidden, topk=b.topk,
                         num_experts=b.num_experts, world_size=world_size, dtype=dtype, seed=seed)
    ctx = f"rank {rank}/{world_size} {cfg.backend} layer {layer_kwargs} routing={routing and routing.kind} seed={seed}"
    with Buffer(None, cfg) as buf:
        layer = MoELayer(buf, **layer_kwargs).to(dev)
        x = inputs[rank].x.to(dev).requires_grad_(True)
        if routing is None:
            out = layer(x)
            idx, w = (t.detach() for t in layer.route(x))
        else:
            idx, w = inputs[rank].topk_idx.to(dev), inputs[rank].topk_weights.to(dev).requires_grad_(True)
            out = layer.moe(x, idx, w)
        g = _randn(out.shape, seed * 3 + rank, dtype).to(dev)
        out.backward(g)
        # Everything the single process needs, from every rank.
        mine = {"x": x.detach(), "idx": idx, "w": w.detach(), "g": g, "w13": layer.w13.detach(),
                "w2": layer.w2.detach()}
        every = _gather({k: v.cpu() for k, v in mine.items()}, world_size)
        rep = {n: p.grad for n, p in layer.named_parameters() if n not in ("w13", "w2") and p.grad is not None}
        rep_sum = {n: _sum_over_ranks(t.cpu(), world_size) for n, t in rep.items()}
        digest = hashlib.sha256()
        for t in (out, x.grad, layer.w13.grad, layer.w2.grad, *(w.grad,) * (routing is not None), *rep.values()):
            digest.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        if layer.num_worst_tokens and ops.live_handles(buf):
            raise AssertionError(f"{ctx}: handles still live after backward")

    # The single process: all tokens, every expert, the same router.
    X = torch.cat([e["x"] for e in every]).requires_grad_(True)
    W13 = torch.cat([e["w13"] for e in every]).requires_grad_(True)
    W2 = torch.cat([e["w2"] for e in every]).requires_grad_(True)
    params = {n: p.detach().cpu().clone().requires_grad_(True) for n, p in layer.named_parameters()
              if n not in ("w13", "w2")}
    shared = (params["shared_w13"], params["shared_w2"]) if "shared_w13" in params else None
    if routing is None:
        IDX, WT = route_tokens(X, params["gate"], topk=layer.topk, score_func=layer.score_func,
                               num_groups=layer.num_groups, topk_groups=layer.topk_groups,
                               route_scale=layer.route_scale)
    else:
        IDX = torch.cat([e["idx"] for e in every])
        WT = torch.cat([e["w"] for e in every]).requires_grad_(True)
    ref_out = plain_moe(X, IDX, WT, W13, W2, shared)
    ref_out.backward(torch.cat([e["g"] for e in every]))
    lo, hi = sum(counts[:rank]), sum(counts[:rank + 1])
    L = layer.local_experts
    close = [("output", out, ref_out[lo:hi]), ("grad x", x.grad, X.grad[lo:hi]),
             ("grad w13", layer.w13.grad, W13.grad[rank * L:(rank + 1) * L]),
             ("grad w2", layer.w2.grad, W2.grad[rank * L:(rank + 1) * L])]
    if routing is not None:
        close.append(("grad topk_weights", w.grad, WT.grad[lo:hi]))
    close += [(f"grad {n} (summed over ranks)", rep_sum[n], params[n].grad) for n in rep_sum]
    for name, got, want in close:
        try:
            scale = max(1.0, float(want.detach().abs().max())) if want.numel() else 1.0
            torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=rtol, atol=atol * scale)
        except AssertionError as e:
            raise AssertionError(f"{ctx}: {name} differs from the single-process MoE: {e}") from None
    return digest.hexdigest()


def _gather(obj: dict, world_size: int) -> list[dict]:
    if world_size == 1:
        return [obj]
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, obj)
    return every


def _sum_over_ranks(t: torch.Tensor, world_size: int) -> torch.Tensor:
    """Sum in rank order (the same bits on every rank and every run)."""
    parts = [x for x in (_gather({"t": t}, world_size))]
    acc = parts[0]["t"].clone()
    for p in parts[1:]:
        acc += p["t"]
    return acc


def check_compiled_layer(rank: int, world_size: int, config: dict[str, Any], seed: int, backend: str,
                         layer_kwargs: dict[str, Any], device: str = "cpu") -> dict[str, Any]:
    """A MoE layer's forward and backward under ``torch.compile(fullgraph=True, backend=...)``:
    it compiles as one graph (``fullgraph`` raises at any graph break; the frame count must be
    1), and its output and gradients equal eager's (bitwise with 'aot_eager', which runs the
    same aten ops; within 1e-5 with 'inductor', which fuses and reorders fp32 sums). Returns the
    frame count and the largest difference from eager."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from ..nn import MoELayer

    cfg: Config = from_dict(config)
    b = cfg.buffer
    dtype, dev = DTYPES[b.dtype], torch.device(device)
    (mine,) = make_inputs(Routing("uniform"), num_tokens=b.max_tokens_per_rank, hidden=b.hidden, topk=b.topk,
                          num_experts=b.num_experts, world_size=world_size, dtype=dtype, seed=seed,
                          ranks=[rank])[rank:rank + 1]
    g = _randn((b.max_tokens_per_rank, b.hidden), seed + rank, dtype).to(dev)
    torch._dynamo.reset()
    with Buffer(None, cfg) as buf:
        layer = MoELayer(buf, num_worst_tokens="auto", **layer_kwargs).to(dev)

        def step(x: torch.Tensor) -> torch.Tensor:
            return (layer(x).float() * g.float()).sum()

        results = []
        counter = CompileCounterWithBackend(backend)
        for fn in (step, torch.compile(step, fullgraph=True, backend=counter)):
            layer.zero_grad(set_to_none=True)
            x = mine.x.to(dev).requires_grad_(True)
            loss = fn(x)
            loss.backward()
            results.append([loss.detach(), x.grad] + [p.grad for p in layer.parameters()])
        if ops.live_handles(buf):
            raise AssertionError(f"rank {rank}: {ops.live_handles(buf)} handles still live after backward")
    worst = 0.0
    for eager, compiled in zip(*results):
        if backend == "aot_eager":
            assert_bitwise("compiled loss/gradient", compiled, eager, f"rank {rank} backend={backend}")
        else:
            torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
        worst = max(worst, float((compiled.float() - eager.float()).abs().max()))
    return {"frames": counter.frame_count, "max_abs_diff": worst}
