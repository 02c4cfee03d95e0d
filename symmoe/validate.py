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


def check_dispatch(x: object, topk_idx: object, topk_weights: object, lay: BufferLayout,
                   dtype: torch.dtype, device: torch.device, output_layout: str, alignment: int,
                   values: bool = True) -> None:
    x = _tensor("x", x)
    _common("x", x, 2, device)
    if x.dtype != dtype:
        raise InputError(f"x has dtype {x.dtype}; this Buffer was configured for {dtype} (buffer.dtype)")
    if x.shape[1] != lay.hidden:
        raise InputError(f"x has hidden size {x.shape[1]}; this Buffer was sized for hidden={lay.hidden}")
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
                         "receive pool was sized for")


def check_combine(y: object, handle: object, recv_topk_weights: object, lay: BufferLayout,
                  dtype: torch.dtype, device: torch.device, buffer_id: int) -> None:
    if not isinstance(handle, DispatchHandle):
        raise InputError(f"handle must be the DispatchHandle that dispatch returned, got {type(handle).__name__}")
    if handle.buffer_id != buffer_id:
        raise InputError("handle was made by another Buffer; combine with the Buffer that dispatched")
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
