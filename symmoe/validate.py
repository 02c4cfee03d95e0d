"""Argument checks run before any data moves. Each error names the value and what is allowed."""
from __future__ import annotations

import torch

from .errors import CapacityError, InputError
from .handle import DispatchHandle
from .layout import BufferLayout

INDEX_DTYPES = (torch.int64, torch.int32)


def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _common(name: str, t: torch.Tensor, ndim: int, device: torch.device) -> None:
    if t.dim() != ndim:
        raise InputError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.device != device:
        raise InputError(f"{name} is on {t.device}; this Buffer's memory is on {device}")
    if not t.is_contiguous():
        raise InputError(f"{name} must be contiguous (call .contiguous()), got strides {t.stride()}")


def check_topk_idx(topk_idx: object, lay: BufferLayout, device: torch.device, values: bool = True) -> torch.Tensor:
    """Type, shape and device; with ``values`` also the ids themselves (one device sync)."""
    idx = _tensor("topk_idx", topk_idx)
    _common("topk_idx", idx, 2, device)
    if idx.dtype not in INDEX_DTYPES:
        raise InputError(f"topk_idx has dtype {idx.dtype}; allowed: torch.int64, torch.int32")
    if idx.shape[1] != lay.topk:
        raise InputError(f"topk_idx has {idx.shape[1]} columns; this Buffer was sized for topk={lay.topk}")
    if idx.shape[0] > lay.max_tokens:
        raise CapacityError(f"{idx.shape[0]} tokens; this Buffer holds at most max_tokens_per_rank="
                            f"{lay.max_tokens} (raise buffer.max_tokens_per_rank)")
    if values and idx.numel():
        # One device->host sync on the good path; the messages are worked out only on failure.
        out_of_range = (idx < -1) | (idx >= lay.num_experts)
        s = idx.sort(dim=1).values
        dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
        n_range, n_dup = torch.stack([out_of_range.sum(), dup.sum()]).tolist()
        if n_range:
            tok = int(out_of_range.any(1).nonzero()[0])
            bad = int(idx[tok][out_of_range[tok]][0])
            raise InputError(bad_expert_id(bad, tok, lay.num_experts))
        if n_dup:
            tok = int(dup.any(1).nonzero()[0])
            raise InputError(duplicate_expert(int(s[tok, 1:][dup[tok]][0]), tok))
    return idx


def bad_expert_id(value: int, token: int, num_experts: int) -> str:
    return f"topk_idx holds expert id {value} (token {token}); allowed: -1 (no expert) or 0..{num_experts - 1}"


def duplicate_expert(expert: int, token: int) -> str:
    return f"topk_idx row {token} names expert {expert} twice; the experts of one token must be distinct (or -1)"


def check_num_worst_tokens(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"num_worst_tokens={n!r}; allowed: an integer >= 0 (0: outputs of exactly the rows received)")


def check_dispatch(x: object, topk_idx: object, topk_weights: object, lay: BufferLayout,
                   dtype: torch.dtype, device: torch.device, output_layout: str, alignment: int,
                   values: bool = True, cols: int = 0) -> None:
    """x [T, cols] of ``dtype`` (cols 0: hidden; Buffer passes an FP8 dispatch's packed byte
    rows, checked as FP8 already) and the routing."""
    if topk_idx is None or topk_weights is None:
        missing = "topk_idx" if topk_idx is None else "topk_weights"
        raise InputError(f"{missing} is None; dispatch needs topk_idx and topk_weights, or handle= for a cached "
                         "dispatch along an earlier routing")
    x = _check_x(x, lay, dtype, device, cols)
    idx = check_topk_idx(topk_idx, lay, device, values)
    if idx.shape[0] != x.shape[0]:
        raise InputError(f"topk_idx has {idx.shape[0]} rows but x has {x.shape[0]} tokens")
    w = _tensor("topk_weights", topk_weights)
    _common("topk_weights", w, 2, device)
    if w.dtype != torch.float32:
        raise InputError(f"topk_weights has dtype {w.dtype}; allowed: torch.float32")
    if tuple(w.shape) != tuple(idx.shape):
        raise InputError(f"topk_weights has shape {tuple(w.shape)}; it must match topk_idx {tuple(idx.shape)}")
    if output_layout not in ("rank", "expert"):
        raise InputError(f"output_layout={output_layout!r}; allowed: 'rank', 'expert'")
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise InputError(f"expert_alignment={alignment!r}; allowed: an integer >= 1")
    if output_layout == "expert" and lay.recv_capacity == 0 and alignment > lay.alignment:
        raise InputError(f"expert_alignment={alignment} exceeds buffer.expert_alignment={lay.alignment} that the "
                         "outputs' worst case (recv_rows) was sized for")


def _check_x(x: object, lay: BufferLayout, dtype: torch.dtype, device: torch.device, cols: int = 0) -> torch.Tensor:
    x = _tensor("x", x)
    _common("x", x, 2, device)
    if x.dtype != dtype:
        raise InputError(f"x has dtype {x.dtype}; this Buffer was configured for {dtype} (buffer.dtype)")
    if cols:  # packed FP8 rows (Buffer built them)
        assert x.shape[1] == cols, (tuple(x.shape), cols)
    elif x.shape[1] != lay.hidden:
        raise InputError(f"x has hidden size {x.shape[1]}; this Buffer was sized for hidden={lay.hidden}")
    return x


def _check_handle(handle: object, buffer_id: int, op: str) -> DispatchHandle:
    if not isinstance(handle, DispatchHandle):
        raise InputError(f"handle must be the DispatchHandle that dispatch returned, got {type(handle).__name__}")
    if handle.buffer_id != buffer_id:
        raise InputError(f"handle was made by another Buffer; {op} with the Buffer that dispatched")
    return handle


def check_cached_dispatch(x: object, handle: object, topk_idx: object, topk_weights: object, lay: BufferLayout,
                          dtype: torch.dtype, device: torch.device, output_layout: str | None,
                          alignment: int | None, buffer_id: int, cols: int = 0) -> None:
    """``dispatch(x, handle=...)``: x of the handle's tokens, nothing that would re-route
    (``cols`` as in check_dispatch)."""
    h = _check_handle(handle, buffer_id, "dispatch")
    if topk_idx is not None or topk_weights is not None:
        raise InputError("a cached dispatch (handle=...) takes no topk_idx/topk_weights: it moves x along the "
                         "routing of the dispatch that made the handle")
    x = _check_x(x, lay, dtype, device, cols)
    if x.shape[0] != h.num_tokens:
        raise InputError(f"x has {x.shape[0]} tokens; the handle's dispatch had {h.num_tokens} "
                         "(a cached dispatch moves the same tokens along the same routing)")
    if output_layout is not None and output_layout != h.output_layout:
        raise InputError(f"output_layout={output_layout!r}; the handle was made with {h.output_layout!r} "
                         "(omit it, or dispatch again without handle=)")
    if alignment is not None and alignment != h.alignment:
        raise InputError(f"expert_alignment={alignment!r}; the handle was made with {h.alignment} "
                         "(omit it, or dispatch again without handle=)")


def check_grouped_layout(handle: object, buffer_id: int) -> None:
    h = _check_handle(handle, buffer_id, "grouped_layout")
    if h.output_layout != "expert" or h.expert_offsets is None:
        raise InputError(f"grouped_layout: the handle's dispatch was {h.output_layout}-major; DeepGEMM's grouped "
                         "layout exists for output_layout='expert' only")


def check_combine(y: object, handle: object, recv_topk_weights: object, lay: BufferLayout,
                  dtype: torch.dtype, device: torch.device, buffer_id: int) -> None:
    handle = _check_handle(handle, buffer_id, "combine")
    y = _tensor("x", y)
    _common("x", y, 2, device)
    if y.dtype != dtype:
        raise InputError(f"x has dtype {y.dtype}; this Buffer was configured for {dtype} (buffer.dtype)")
    if tuple(y.shape) != (handle.num_recv_rows, lay.hidden):
        raise InputError(f"x has shape {tuple(y.shape)}; combine needs one row per received row: "
                         f"({handle.num_recv_rows}, {lay.hidden})")
    if recv_topk_weights is None:
        return
    if handle.output_layout != "rank":
        raise InputError("topk_weights can be combined only for rank-major dispatch; expert-major combine "
                         "weights each row by the topk_weights given to dispatch")
    w = _tensor("topk_weights", recv_topk_weights)
    _common("topk_weights", w, 2, device)
    if w.dtype != torch.float32 or tuple(w.shape) != (handle.num_recv_rows, lay.topk):
        raise InputError(f"topk_weights is {w.dtype} {tuple(w.shape)}; allowed: torch.float32 "
                         f"({handle.num_recv_rows}, {lay.topk})")
