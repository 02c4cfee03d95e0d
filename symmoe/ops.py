"""dispatch and combine as ``torch.library`` custom ops, so ``torch.compile`` traces them.

Ops (namespace ``symmoe``):

* ``dispatch(x, topk_idx, topk_weights, buffer, output_layout, expert_alignment,
  num_worst_tokens) -> (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert,
  handle_key)``
* ``combine(y, handle_key, topk_weights?, buffer, num_tokens, release) -> combined_x``
* ``dispatch_backward`` / ``combine_backward``: the backward passes of ``symmoe.autograd``,
  which ``register_autograd`` wires to the two above.

Only the worst-size form (``num_worst_tokens`` > 0) is an op: its output shapes follow from
the arguments, so the fake implementations give static shapes; the exact form's row count is
known only after the ranks exchange counts.

Buffers and handles are Python objects, which an op cannot take. A Buffer is registered once
(``register``) and passed as its int key; a dispatch keeps its ``DispatchHandle`` in a table
and returns its key as a 0-d int64 CPU tensor, which combine and the backward ops take as an
input: that data dependency also orders the collectives in any traced graph. A handle leaves
the table at its last use: the backward of its dispatch, else the backward of its combine
(when the dispatch needs no gradient), else its combine (when nothing needs a gradient); or
when its Buffer closes. At most ``MAX_LIVE_HANDLES`` stay (the oldest go first); a key no
longer in the table raises ``InputError`` saying why.
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from typing import NamedTuple, Optional

import torch

from . import autograd as _ag
from .buffer import Buffer
from .errors import InputError
from .handle import DispatchHandle

MAX_LIVE_HANDLES = 4096

_buffers: "dict[int, weakref.ref[Buffer]]" = {}
_handles: "OrderedDict[int, tuple[int, DispatchHandle]]" = OrderedDict()  # handle key -> (buffer key, handle)
_buffer_keys = itertools.count(1)
_handle_keys = itertools.count(1)


class HandleRef(NamedTuple):
    """What ``ops.dispatch`` returns for ``ops.combine``: the handle's key tensor and the
    static facts the ops' shapes need."""

    key: torch.Tensor  # 0-d int64 on the CPU
    buffer: int  # the Buffer's registered key
    num_tokens: int  # tokens this rank dispatched (combine's rows)
    num_rows: int  # received rows (num_worst_tokens)
    output_layout: str
    dispatch_needs_grad: bool  # the dispatch's backward will run (it releases the handle)


def register(buf: Buffer) -> int:
    """The int key of ``buf`` for the ops (registered on first use; a layer does it at
    construction, outside any compiled region)."""
    key = getattr(buf, "_op_key", None)
    if key is None:
        key = next(_buffer_keys)
        _buffers[key] = weakref.ref(buf)
        buf._op_key = key
        weakref.finalize(buf, _forget_buffer, key)
    return key


def lookup(ref: HandleRef | torch.Tensor, buf: Buffer) -> DispatchHandle:
    """The ``DispatchHandle`` behind a key that ``dispatch`` returned on ``buf``."""
    key = ref.key if isinstance(ref, HandleRef) else ref
    return _handle(register(buf), key, "lookup")


def live_handles(buf: Buffer) -> int:
    """Handles of ``buf`` still in the table."""
    b = register(buf)
    return sum(1 for owner, _ in _handles.values() if owner == b)


def dispatch(buf: Buffer, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, *,
             num_worst_tokens: int, output_layout: str | None = None,
             expert_alignment: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                           HandleRef]:
    """``symmoe.autograd.dispatch`` as the ``symmoe::dispatch`` op: outputs of
    ``num_worst_tokens`` rows (required, > 0), the per-expert counts as an int32 tensor, and a
    ``HandleRef`` instead of the handle."""
    if isinstance(num_worst_tokens, bool) or not isinstance(num_worst_tokens, int) or num_worst_tokens <= 0:
        raise InputError(f"num_worst_tokens={num_worst_tokens!r}: the symmoe ops need worst-case sizes, an integer "
                         "> 0 (use symmoe.autograd.dispatch for outputs of exactly the rows received)")
    layout = output_layout or buf.config.buffer.output_layout
    align = buf.config.buffer.expert_alignment if expert_alignment is None else expert_alignment
    b = register(buf)
    rx, ri, rw, per_expert, key = torch.ops.symmoe.dispatch(x, topk_idx, topk_weights, b, layout, align,
                                                            num_worst_tokens)
    needs = torch.is_grad_enabled() and (x.requires_grad or topk_weights.requires_grad)
    return rx, ri, rw, per_expert, HandleRef(key, b, x.shape[0], num_worst_tokens, layout, needs)


def combine(buf: Buffer, y: torch.Tensor, handle: HandleRef, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """``symmoe.autograd.combine`` as the ``symmoe::combine`` op."""
    b = register(buf)
    if not isinstance(handle, HandleRef):
        raise InputError(f"handle must be the HandleRef that symmoe.ops.dispatch returned, got {type(handle).__name__}")
    if handle.buffer != b:
        raise InputError(f"handle was made by Buffer #{handle.buffer}; combine with the Buffer that dispatched "
                         f"(this is Buffer #{b})")
    needs = torch.is_grad_enabled() and (y.requires_grad or (topk_weights is not None and topk_weights.requires_grad))
    release = not (needs or handle.dispatch_needs_grad)
    return torch.ops.symmoe.combine(y, handle.key, topk_weights, b, handle.num_tokens, release,
                                    not handle.dispatch_needs_grad)


# -- the table --------------------------------------------------------------------------------------
def _forget_buffer(b: int) -> None:
    _buffers.pop(b, None)
    for k in [k for k, (owner, _) in _handles.items() if owner == b]:
        del _handles[k]


def _buffer(b: int, op: str) -> Buffer:
    buf = _buffers.get(b, lambda: None)()
    if buf is None:
        raise InputError(f"{op}: Buffer #{b} no longer exists; keep the Buffer alive while its ops run")
    if buf._closed:
        raise InputError(f"{op}: Buffer #{b} was closed; keep it open until the backward pass has finished")
    return buf


def _store(b: int, handle: DispatchHandle) -> int:
    k = next(_handle_keys)
    _handles[k] = (b, handle)
    while len(_handles) > MAX_LIVE_HANDLES:
        _handles.popitem(last=False)
    return k


def _handle(b: int, key: torch.Tensor, op: str) -> DispatchHandle:
    k = int(key)
    if k not in _handles:
        raise InputError(f"{op}: handle key {k} is not live: its dispatch's backward (or its combine, with no "
                         f"backward to follow) released it, its Buffer closed, or more than {MAX_LIVE_HANDLES} "
                         "handles were live")
    owner, handle = _handles[k]
    if owner != b:
        raise InputError(f"{op}: handle key {k} was made by Buffer #{owner}; this call is on Buffer #{b} "
                         "(use the Buffer that dispatched)")
    return handle


def _release(key: torch.Tensor) -> None:
    _handles.pop(int(key), None)


# -- the ops ----------------------------------------------------------------------------------------
@torch.library.custom_op("symmoe::dispatch", mutates_args=())
def _dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, buffer: int, output_layout: str,
              expert_alignment: int, num_worst_tokens: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    buf = _buffer(buffer, "symmoe::dispatch")
    rx, ri, rw, per_expert, handle, _ = buf.dispatch(x, topk_idx, topk_weights, output_layout=output_layout,
                                                     expert_alignment=expert_alignment,
                                                     num_worst_tokens=num_worst_tokens)
    key = torch.tensor(_store(buffer, handle), dtype=torch.int64)
    # The op's outputs must not alias each other or the protocol's state.
    return rx, ri, rw, per_expert.clone(), key


@_dispatch.register_fake
def _(x, topk_idx, topk_weights, buffer, output_layout, expert_alignment, num_worst_tokens):
    lay = _buffers[buffer]().layout
    n, K = num_worst_tokens, topk_idx.shape[1]
    shape = (n, K) if output_layout == "rank" else (n,)
    return (x.new_empty((n, x.shape[1])), topk_idx.new_empty(shape, dtype=torch.int64),
            x.new_empty(shape, dtype=torch.float32), x.new_empty((lay.local_experts,), dtype=torch.int32),
            torch.empty((), dtype=torch.int64, device="cpu"))


@torch.library.custom_op("symmoe::combine", mutates_args=())
def _combine(y: torch.Tensor, handle_key: torch.Tensor, topk_weights: Optional[torch.Tensor], buffer: int,
             num_tokens: int, release: bool, last_use_in_backward: bool) -> torch.Tensor:
    buf = _buffer(buffer, "symmoe::combine")
    handle = _handle(buffer, handle_key, "symmoe::combine")
    with torch.no_grad():
        out = _ag.combine(buf, y, handle, topk_weights)
    if release:
        _release(handle_key)
    return out


@_combine.register_fake
def _(y, handle_key, topk_weights, buffer, num_tokens, release, last_use_in_backward):
    return y.new_empty((num_tokens, y.shape[1]))


@torch.library.custom_op("symmoe::dispatch_backward", mutates_args=())
def _dispatch_backward(grad_recv_x: torch.Tensor, grad_recv_topk_weights: Optional[torch.Tensor],
                       recv_topk_idx: torch.Tensor, handle_key: torch.Tensor, buffer: int,
                       num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    buf = _buffer(buffer, "backward of symmoe::dispatch")
    handle = _handle(buffer, handle_key, "backward of symmoe::dispatch")
    gx, gw = _ag.dispatch_backward(buf, handle, grad_recv_x, grad_recv_topk_weights, recv_topk_idx)
    _release(handle_key)  # the handle's last use
    return gx, (gw if gw is not None else grad_recv_x.new_empty((0,), dtype=torch.float32))


@_dispatch_backward.register_fake
def _(grad_recv_x, grad_recv_topk_weights, recv_topk_idx, handle_key, buffer, num_tokens):
    K = _buffers[buffer]().layout.topk
    gw = (num_tokens, K) if grad_recv_topk_weights is not None else (0,)
    return grad_recv_x.new_empty((num_tokens, grad_recv_x.shape[1])), grad_recv_x.new_empty(gw, dtype=torch.float32)


@torch.library.custom_op("symmoe::combine_backward", mutates_args=())
def _combine_backward(grad_x: torch.Tensor, handle_key: torch.Tensor, y: Optional[torch.Tensor], buffer: int,
                      num_rows: int, release: bool) -> tuple[torch.Tensor, torch.Tensor]:
    buf = _buffer(buffer, "backward of symmoe::combine")
    handle = _handle(buffer, handle_key, "backward of symmoe::combine")
    gy, gw = _ag.combine_backward(buf, handle, grad_x, y)
    if release:
        _release(handle_key)
    return gy, (gw if gw is not None else grad_x.new_empty((0,), dtype=torch.float32))


@_combine_backward.register_fake
def _(grad_x, handle_key, y, buffer, num_rows, release):
    K = _buffers[buffer]().layout.topk
    gw = (grad_x.shape[0], K) if y is not None else (0,)
    return grad_x.new_empty((num_rows, grad_x.shape[1])), grad_x.new_empty(gw, dtype=torch.float32)


# -- autograd ---------------------------------------------------------------------------------------
def _dispatch_setup(ctx, inputs, output):
    x, _, _, buffer, output_layout, _, _ = inputs
    rx, ri, _, _, key = output
    ctx.buffer, ctx.num_tokens = buffer, x.shape[0]
    ctx.rows, ctx.dtype = rx.shape, rx.dtype
    ctx.weights_grad = ctx.needs_input_grad[2]
    ctx.save_for_backward(ri, key)


def _dispatch_bwd(ctx, g_rx, _g_ri, g_rw, _g_per, _g_key):
    ri, key = ctx.saved_tensors
    if g_rx is None:
        g_rx = torch.zeros(ctx.rows, dtype=ctx.dtype, device=ri.device)
    if ctx.weights_grad and g_rw is None:
        g_rw = torch.zeros(ri.shape, dtype=torch.float32, device=ri.device)
    gx, gw = torch.ops.symmoe.dispatch_backward(g_rx, g_rw if ctx.weights_grad else None, ri, key, ctx.buffer,
                                                ctx.num_tokens)
    return gx, None, (gw if ctx.weights_grad else None), None, None, None, None


def _combine_setup(ctx, inputs, output):
    y, key, topk_weights, buffer, _, _, last_use = inputs
    ctx.buffer, ctx.num_rows, ctx.last_use = buffer, y.shape[0], last_use
    ctx.weights_grad = topk_weights is not None and ctx.needs_input_grad[2]
    ctx.save_for_backward(key, y if ctx.weights_grad else None)


def _combine_bwd(ctx, grad):
    key, y = ctx.saved_tensors
    gy, gw = torch.ops.symmoe.combine_backward(grad.contiguous(), key, y, ctx.buffer, ctx.num_rows, ctx.last_use)
    return gy, None, (gw if ctx.weights_grad else None), None, None, None, None


torch.library.register_autograd("symmoe::dispatch", _dispatch_bwd, setup_context=_dispatch_setup)
torch.library.register_autograd("symmoe::combine", _combine_bwd, setup_context=_combine_setup)
