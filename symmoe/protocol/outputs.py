"""A GPU dispatch's outputs: the tensors its data kernels fill and one int32 block of its small
state (``Int32Block``), from which tensors are made only where a caller sees them."""
from __future__ import annotations

from typing import Any

import torch

from ..layout import BufferLayout


class Int32Block:
    """int32 pieces of ``sizes`` elements in one allocation, each starting 128-byte aligned.
    On a GPU machine's host a CUDA torch.empty costs about 6 µs, mostly the caching allocator,
    and every tensor made from another (a slice, a split piece, a view) 3-5 µs: a dispatch
    allocates its small int32 state once and makes tensors only of the pieces its caller sees
    (``piece``), passing the others to its kernels as pointers (``ptr``)."""

    __slots__ = ("base", "offsets", "_ptr")

    def __init__(self, device: torch.device, sizes: "tuple[int, ...]"):
        self.offsets: list[int] = []
        n = 0
        for size in sizes:
            self.offsets.append(n)
            n += size + (-size % 32)
        self.base = torch.empty(max(n, 1), dtype=torch.int32, device=device)
        self._ptr = self.base.data_ptr()

    def ptr(self, i: int) -> int:
        """Device address of piece ``i``."""
        return self._ptr + 4 * self.offsets[i]

    def piece(self, i: int, n: int) -> torch.Tensor:
        """The first ``n`` elements of piece ``i`` as a tensor (one slice)."""
        o = self.offsets[i]
        return self.base[o:o + n]


SRC_RANK, SRC_TOKEN, SRC_SLOT = 0, 1, 2  # the source columns' pieces of a dispatch's Int32Block


def dispatch_outputs(lay: BufferLayout, cap: int, output_layout: str, dtype: torch.dtype, device: torch.device,
                     *extra: int, cols: int = 0) -> dict[str, Any]:
    """``Protocol._outputs``: the output tensors of ``cap`` rows (x rows of ``cols`` elements,
    0: hidden) and the int32 block."""
    shape = (cap, lay.topk) if output_layout == "rank" else (cap,)
    return {
        "x": torch.empty((cap, cols or lay.hidden), dtype=dtype, device=device),
        "idx": torch.empty(shape, dtype=torch.int64, device=device),
        "w": torch.empty(shape, dtype=torch.float32, device=device),
        "expert_offsets": (torch.empty(lay.local_experts + 1, dtype=torch.int64, device=device)
                           if output_layout == "expert" else None),
        "block": Int32Block(device, (cap, cap, cap, *extra)),
    }
