"""A GPU dispatch's outputs: the tensors its data kernels fill and one int32 block of its small
state (``Int32Block``), from which tensors are made only where a caller sees them."""
from __future__ import annotations

import functools
from typing import Any

import torch

from .. import build
from ..layout import BufferLayout


class Int32Block:
    """int32 pieces of ``sizes`` elements in one allocation, each starting 128-byte aligned.
    On a GPU machine's host a CUDA torch.empty costs about 6 µs, mostly the caching allocator,
    and every tensor made from another (a slice, a split piece, a view) 3-5 µs: a dispatch
    allocates its small int32 state once and makes tensors only of the pieces its caller sees
    (``piece``), passing the others to its kernels as pointers (``ptr``). ``base``: the
    allocation of ``words(sizes)`` int32 (made with the outputs), else one is made here."""

    __slots__ = ("base", "offsets", "_ptr")

    def __init__(self, device: torch.device, sizes: "tuple[int, ...]", base: torch.Tensor | None = None,
                 offsets: "list[int] | None" = None):
        n = 0
        if offsets is None:  # else the caller planned the block (plan) and made ``base``
            offsets, n = self.plan(sizes)
        self.offsets = offsets
        self.base = torch.empty(max(n, 1), dtype=torch.int32, device=device) if base is None else base
        self._ptr = self.base.data_ptr()

    @staticmethod
    @functools.lru_cache(maxsize=256)  # a dispatch's sizes repeat with its token count
    def plan(sizes: "tuple[int, ...]") -> "tuple[list[int], int]":
        """(each piece's word offset, the words of the whole block); the list is shared: read it,
        never change it."""
        offsets: list[int] = []
        n = 0
        for size in sizes:
            offsets.append(n)
            n += size + (-size % 32)
        return offsets, n

    def ptr(self, i: int) -> int:
        """Device address of piece ``i``."""
        return self._ptr + 4 * self.offsets[i]

    def piece(self, i: int, n: int) -> torch.Tensor:
        """The first ``n`` elements of piece ``i`` as a tensor (one slice)."""
        o = self.offsets[i]
        return self.base[o:o + n]


SRC_RANK, SRC_TOKEN, SRC_SLOT = 0, 1, 2  # the source columns' pieces of a dispatch's Int32Block


def dispatch_outputs(lay: BufferLayout, cap: int, output_layout: str, dtype: torch.dtype, device: torch.device,
                     *extra: int, cols: int = 0, in_rank_tokens: int = -1) -> dict[str, Any]:
    """``Protocol._outputs``: the output tensors of ``cap`` rows (x rows of ``cols`` elements,
    0: hidden), the int32 block and, for ``in_rank_tokens`` >= 0, the dispatch's
    is_token_in_rank [in_rank_tokens, W] ("in_rank"), all made in one call of the C++ host
    module (``csrc/host/tensors.cpp``: about 1 µs a tensor where Python takes 6)."""
    sizes = (cap, cap, cap, *extra)
    offsets, words = Int32Block.plan(sizes)
    rank_major = output_layout == "rank"
    x, idx, w, offs, base, in_rank = build.load("symmoe_host").outputs(
        cap, cols or lay.hidden, dtype, lay.topk if rank_major else 0, 0 if rank_major else lay.local_experts + 1,
        words, in_rank_tokens, lay.world_size, device)
    return {"x": x, "idx": idx, "w": w, "expert_offsets": offs, "block": Int32Block(device, sizes, base, offsets),
            "in_rank": in_rank}


def cut(out: dict[str, Any], n: int) -> "tuple[torch.Tensor, ...]":
    """The first ``n`` rows of a dispatch's outputs ``out``: x, idx, w and the source rank, token
    and slot columns, in one call of the C++ host module."""
    block = out["block"]
    o = block.offsets
    return build.load("symmoe_host").cut(n, out["x"], out["idx"], out["w"], block.base, o[SRC_RANK], o[SRC_TOKEN],
                                         o[SRC_SLOT])
