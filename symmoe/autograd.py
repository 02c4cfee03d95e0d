"""dispatch and combine as ``torch.autograd.Function``s over a ``symmoe.Buffer``.

The gradients follow from the semantics ``symmoe.reference`` defines (row ``row(t, r)`` is
where token ``t`` landed on rank ``r``, rank-major; ``row(t, k)`` where its slot ``k``
landed, expert-major):

* dispatch, rank-major: ``recv_x[row(t, r)] = x[t]`` and ``recv_w[row(t, r), k] = w[t, k]``
  where slot ``k``'s expert lives on ``r`` (0 elsewhere). So ``grad_x[t]`` is the sum of the
  row gradients over ``r`` -- exactly ``combine(grad_recv_x, handle)``, ascending ``r`` in
  fp32 with one cast -- and ``grad_w[t, k]`` is the gradient at the owner's row, which the
  combine's weights channel brings back once the slots of other ranks (constants 0) are
  masked on the receiver.
* dispatch, expert-major: ``recv_x[row(t, k)] = x[t]``, so ``grad_x[t] = sum_k
  grad[row(t, k)]``: the expert-major combine with unit weights (``1 * g`` is exact).
  ``grad_w[t, k] = grad_recv_w[row(t, k)]`` comes back through ``return_to_slots``.
* combine, rank-major: ``out[t] = sum_r y[row(t, r)]``: ``grad_y`` is the cached dispatch
  of ``grad_out`` (``buf.dispatch(grad, handle=handle)``).
* combine, expert-major: ``out[t] = sum_k w[t, k] * y[row(t, k)]``: ``grad_y[row(t, k)] =
  w[t, k] * grad_out[t]`` (the cached dispatch, times the row's weight in fp32, one cast,
  as autograd differentiates the reference) and ``grad_w[t, k] = <grad_out[t], y[row(t, k)]>``,
  a dot product on the receiver brought back by ``return_to_slots``.

What is saved for backward: the handle (and the Buffer). Besides it, only where a weight
gradient needs it: the received expert ids (rank-major dispatch, a mask) and the expert
outputs ``y`` (expert-major combine, whose weight gradient is a dot product with them).

``dispatch_backward`` and ``combine_backward`` are public so that a framework's own
``autograd.Function`` (a token dispatcher adapter) can call them; they check the gradients
they are given and raise ``InputError`` naming the bad value.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from .buffer import Buffer
from .errors import InputError
from .handle import DispatchHandle
from .validate import _check_handle


class Dispatched(NamedTuple):
    """What ``dispatch`` returns: the received rows (differentiable ``x`` and
    ``topk_weights``), the local expert ids, the per-expert counts (a list, or an int32 tensor
    with ``num_worst_tokens``) and the handle for ``combine``."""

    x: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    num_recv_tokens_per_expert: "list[int] | torch.Tensor"
    handle: DispatchHandle


def dispatch(buf: Buffer, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, *,
             output_layout: str | None = None, expert_alignment: int | None = None,
             num_worst_tokens: int = 0) -> Dispatched:
    """``buf.dispatch`` with gradients for ``x`` and ``topk_weights`` (see the module doc)."""
    rx, ri, rw, per_expert, handle = _Dispatch.apply(buf, x, topk_idx, topk_weights, output_layout,
                                                     expert_alignment, num_worst_tokens)
    return Dispatched(rx, ri, rw, per_expert, handle)


def combine(buf: Buffer, y: torch.Tensor, handle: DispatchHandle,
            topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """``buf.combine`` with gradients for ``y`` and, expert-major, ``topk_weights``.

    Rank-major combine sums rows (the experts applied the weights): ``topk_weights`` must be
    None. Expert-major combine weights each row by the weights given to dispatch: pass that
    same tensor (same values) as ``topk_weights`` for it to receive a gradient; None uses the
    handle's copy, with no gradient."""
    return _Combine.apply(buf, y, handle, topk_weights)


# -- the backward passes, public for adapters ------------------------------------------------------
def dispatch_backward(buf: Buffer, handle: DispatchHandle, grad_recv_x: torch.Tensor,
                      grad_recv_topk_weights: torch.Tensor | None = None,
                      recv_topk_idx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(grad_x, grad_topk_weights)`` of the dispatch that returned ``handle``, from the
    gradients of its received rows (and of its received weights, else None comes back).
    Rank-major, ``recv_topk_idx`` (the dispatch's received ids) masks the slots of other ranks'
    experts, whose received weights were constants; collective, like a combine."""
    _check_backward(buf, handle, "dispatch")
    rows, H, K = handle.num_recv_rows, buf.layout.hidden, buf.layout.topk
    _check_grad("grad_recv_x", grad_recv_x, (rows, H), buf.dtype, buf.device, "dispatch")
    expert = handle.output_layout == "expert"
    if expert:  # each received row is one slot of its token: the unweighted sum over slots
        grad_x, _, _ = buf.combine(grad_recv_x.contiguous(), _with_weights(handle, torch.ones_like(handle.topk_weights)))
    if grad_recv_topk_weights is None:
        if not expert:
            grad_x, _, _ = buf.combine(grad_recv_x.contiguous(), handle)
        return grad_x, None
    w_shape = (rows,) if expert else (rows, K)
    _check_grad("grad_recv_topk_weights", grad_recv_topk_weights, w_shape, torch.float32, buf.device, "dispatch")
    if expert:
        return grad_x, return_to_slots(buf, handle, grad_recv_topk_weights)
    if recv_topk_idx is None or tuple(recv_topk_idx.shape) != (rows, K):
        got = None if recv_topk_idx is None else tuple(recv_topk_idx.shape)
        raise InputError(f"dispatch backward: recv_topk_idx has shape {got}; the weight gradient of a rank-major "
                         f"dispatch needs the dispatch's received ids ({rows}, {K}) to mask other ranks' slots")
    gw = torch.where(recv_topk_idx >= 0, grad_recv_topk_weights, 0.0).contiguous()
    grad_x, grad_w, _ = buf.combine(grad_recv_x.contiguous(), handle, gw)
    return grad_x, grad_w


def combine_backward(buf: Buffer, handle: DispatchHandle, grad_x: torch.Tensor,
                     y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(grad_y, grad_topk_weights)`` of ``combine(y, handle)`` from the gradient of its
    output: the cached dispatch of ``grad_x`` (expert-major, times each row's weight).
    ``y`` (expert-major only) asks for the weights' gradient too; else None comes back.
    Collective, like a dispatch."""
    _check_backward(buf, handle, "combine")
    _check_grad("grad_x", grad_x, (handle.num_tokens, buf.layout.hidden), buf.dtype, buf.device, "combine")
    g, _, rw, _, _, _ = buf.dispatch(grad_x.contiguous(), handle=handle)
    if handle.output_layout == "rank":
        if y is not None:
            raise InputError("combine backward: y was given, but a rank-major combine has no weights to "
                             "differentiate (the experts applied them)")
        return g, None
    grad_y = (rw.unsqueeze(1) * g.float()).to(g.dtype)
    if y is None:
        return grad_y, None
    _check_grad("y", y, (handle.num_recv_rows, buf.layout.hidden), buf.dtype, buf.device, "combine")
    dots = (g.float() * y.float()).sum(-1)
    return grad_y, return_to_slots(buf, handle, dots)


def return_to_slots(buf: Buffer, handle: DispatchHandle, values: torch.Tensor) -> torch.Tensor:
    """One fp32 value per received row of an expert-major dispatch, brought back to its source
    as ``[T, K]`` (0 on masked slots), bit for bit. Collective: one combine with unit weights
    whose rows carry each value in columns ``slot * P ... slot * P + P - 1``; every other row of
    the token is 0 there, so the fp32 sum is the value itself. In bfloat16/float16 rows a value
    travels as P = 4 pieces (frexp's mantissa split in three, each exact in 8 or 11 bits, and
    its exponent), exact for every finite value."""
    rows, H, K = handle.num_recv_rows, buf.layout.hidden, buf.layout.topk
    if handle.output_layout != "expert":
        raise InputError("return_to_slots: the handle is rank-major; rank-major weights come back through "
                         "combine's topk_weights")
    P = 1 if buf.dtype == torch.float32 else 4
    if K * P > H:
        raise InputError(f"the weight gradient of an expert-major dispatch travels in {P} columns per slot: "
                         f"topk={K} x {P} > hidden={H} ({buf.dtype}); use rank-major output_layout")
    pieces = _encode(values.float(), buf.dtype)  # [rows, P]
    slot = handle.recv_src_slot.long().to(values.device)
    cols = slot.clamp(min=0).unsqueeze(1) * P + torch.arange(P, device=values.device)
    carrier = torch.zeros((rows, H), dtype=buf.dtype, device=values.device)
    carrier.scatter_(1, cols, torch.where((slot >= 0).unsqueeze(1), pieces, torch.zeros_like(pieces)))
    out, _, _ = buf.combine(carrier, _with_weights(handle, torch.ones_like(handle.topk_weights)))
    got = _decode(out[:, :K * P].reshape(-1, K, P))
    return torch.where(handle.topk_idx.to(got.device) >= 0, got, 0.0)


# -- autograd functions ---------------------------------------------------------------------------
class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, buf, x, topk_idx, topk_weights, output_layout, expert_alignment, num_worst_tokens):
        rx, ri, rw, per_expert, handle, _ = buf.dispatch(
            x.detach(), topk_idx, topk_weights.detach(), output_layout=output_layout,
            expert_alignment=expert_alignment, num_worst_tokens=num_worst_tokens)
        ctx.buf, ctx.handle = buf, handle
        ctx.weights_grad = ctx.needs_input_grad[3]
        if ctx.weights_grad and handle.output_layout == "rank":
            ctx.save_for_backward(ri)
        ctx.mark_non_differentiable(ri)
        if isinstance(per_expert, torch.Tensor):
            ctx.mark_non_differentiable(per_expert)
        return rx, ri, rw, per_expert, handle

    @staticmethod
    def backward(ctx, g_rx, _g_ri, g_rw, *_):
        ri = ctx.saved_tensors[0] if ctx.saved_tensors else None
        grad_x, grad_w = dispatch_backward(ctx.buf, ctx.handle, g_rx, g_rw if ctx.weights_grad else None, ri)
        return (None, grad_x if ctx.needs_input_grad[1] else None, None, grad_w, None, None, None)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, buf, y, handle, topk_weights):
        _check_handle(handle, id(buf), "combine")
        if topk_weights is not None:
            if handle.output_layout == "rank":
                raise InputError("combine: topk_weights given for a rank-major handle; rank-major combine sums the "
                                 "rows (apply the weights in the experts) and takes no weights to differentiate")
            if tuple(topk_weights.shape) != tuple(handle.topk_weights.shape):
                raise InputError(f"combine: topk_weights has shape {tuple(topk_weights.shape)}; expected the "
                                 f"dispatch's {tuple(handle.topk_weights.shape)}")
        used = handle if topk_weights is None else _with_weights(handle, topk_weights.detach())
        out, _, _ = buf.combine(y.detach(), used)
        ctx.buf, ctx.handle = buf, handle
        ctx.weights_grad = topk_weights is not None and ctx.needs_input_grad[3]
        if ctx.weights_grad:
            ctx.save_for_backward(y.detach())
        return out

    @staticmethod
    def backward(ctx, grad):
        y = ctx.saved_tensors[0] if ctx.weights_grad else None
        grad_y, grad_w = combine_backward(ctx.buf, ctx.handle, grad, y)
        return None, grad_y, None, grad_w


# -- helpers --------------------------------------------------------------------------------------
def _with_weights(handle: DispatchHandle, weights: torch.Tensor) -> DispatchHandle:
    """The handle with other expert-major combine weights (every protocol's combine reads them
    from the handle)."""
    return dataclasses.replace(handle, topk_weights=weights.to(torch.float32).contiguous())


def _check_backward(buf: Buffer, handle: DispatchHandle, op: str) -> None:
    if buf._closed:
        raise InputError(f"backward of {op}: its Buffer was closed before backward ran; keep the Buffer open "
                         "until the backward pass has finished")
    _check_handle(handle, id(buf), f"run the backward of {op}")


def _check_grad(name: str, g: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                op: str) -> None:
    if not isinstance(g, torch.Tensor):
        raise InputError(f"backward of {op}: {name} must be a torch.Tensor, got {type(g).__name__}")
    if g.dtype != dtype:
        raise InputError(f"backward of {op}: {name} has dtype {g.dtype}; expected {dtype}")
    if tuple(g.shape) != shape:
        raise InputError(f"backward of {op}: {name} has shape {tuple(g.shape)}; expected {shape}")
    if g.device != device:
        raise InputError(f"backward of {op}: {name} is on {g.device}; this Buffer's memory is on {device}")


def _encode(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 values -> [n, P] pieces of ``dtype`` whose fp32 sum (and exponent) restores them."""
    if dtype == torch.float32:
        return v.unsqueeze(1)
    finite = torch.isfinite(v)
    m, e = torch.frexp(torch.where(finite, v, 0.0))  # v = m * 2^e, |m| in [0.5, 1): 24 bits below 2^0
    hi = m.to(dtype)
    r = m - hi.float()  # exact: a multiple of 2^-24 below hi's half ulp
    mid = r.to(dtype)
    lo = (r - mid.float()).to(dtype)  # at most 8 significant bits remain
    hi = torch.where(finite, hi, v.to(dtype))  # inf / nan travel as themselves
    return torch.stack([hi, mid, lo, e.to(dtype)], dim=1)


def _decode(p: torch.Tensor) -> torch.Tensor:
    """[..., P] pieces -> fp32 values (``_encode``'s inverse)."""
    if p.shape[-1] == 1:
        return p[..., 0].float()
    f = p.float()
    m = f[..., 0] + f[..., 1] + f[..., 2]  # exact: all multiples of 2^-24 below 1
    e = f[..., 3].to(torch.int32)
    e1 = torch.div(e, 2, rounding_mode="floor")
    # Two exact scalings by powers of two built from their bits (both stay normal floats).
    return m * _pow2(e1) * _pow2(e - e1)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    return ((e + 127) << 23).to(torch.int32).view(torch.float32)
