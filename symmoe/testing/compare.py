"""Bitwise comparison of tensors: what "identical" means for tests and A/B runs.

Floats are compared by bit pattern, so -0.0 vs 0.0 and NaN payloads count as differences.
"""
from __future__ import annotations

from typing import Any

import torch

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (so -0.0 != 0.0 and NaN payloads count)."""
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_floating_point():
        return t.view(_INT_OF_SIZE[t.element_size()])
    return t


def _value(t: torch.Tensor, pos: tuple[int, ...]) -> str:
    v = t[pos].item()
    return repr(v)


def first_bit_difference(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any] | None:
    """None when ``a`` and ``b`` are bitwise identical, else where they first differ:
    ``{"row", "col", "got", "want", "detail"}`` (col None for 1-D tensors)."""
    if a.dtype != b.dtype:
        return {"row": None, "col": None, "got": str(a.dtype), "want": str(b.dtype),
                "detail": f"dtype {a.dtype} vs {b.dtype}"}
    if b.device != a.device:
        a = a.to(b.device)
    if a.shape == b.shape and torch.equal(bits(a), bits(b)):
        return None
    if a.dim() != b.dim() or a.shape[1:] != b.shape[1:]:
        return {"row": None, "col": None, "got": tuple(a.shape), "want": tuple(b.shape),
                "detail": f"shape {tuple(a.shape)} vs {tuple(b.shape)}"}
    n = min(a.shape[0], b.shape[0])
    ne = bits(a[:n]) != bits(b[:n])
    where = ne.nonzero()
    if where.numel() == 0:  # equal over the common rows: the shorter one ends first
        return {"row": n, "col": None, "got": tuple(a.shape), "want": tuple(b.shape),
                "detail": f"shape {tuple(a.shape)} vs {tuple(b.shape)}; equal over the first {n} rows"}
    pos = tuple(where[0].tolist())
    row, col = pos[0], (pos[1] if len(pos) > 1 else None)
    got, want = _value(a, pos), _value(b, pos)
    pattern = ""
    if a.is_floating_point():
        pattern = f" (bits {int(bits(a)[pos]) & ((1 << 8 * a.element_size()) - 1):#x} vs " \
               f"{int(bits(b)[pos]) & ((1 << 8 * b.element_size()) - 1):#x})"
    return {"row": row, "col": col, "got": got, "want": want,
            "detail": f"{got} vs {want}{pattern}; {int(ne.sum())} of {ne.numel()} elements differ"}
