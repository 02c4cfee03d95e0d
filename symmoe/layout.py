"""Where each named region lies in the symmetric buffer.

One allocation per rank, cut into regions whose offsets are identical on every rank, so a
kernel reaches a peer's region as ``peer_base[r] + offset``. ``csrc/common/layout.cuh``
holds the same fields, in the same order, as a struct the kernels take by value
(``BufferLayout.kernel_args()`` fills it); the arithmetic lives only here.

    signals  int64 flags: barrier[W], ready[W], tail[C][W], head[C][W], ack[C][W] (nvshmem:
             rows of channel c that receiver d consumed, at the sender: its ring's head)
    counts   int32 [W][1 + W + E]: row s = rank s's token count, then tokens it sends per
             rank, then (token, slot) pairs per expert; every rank writes its row into every peer
    input    x [T, H] | topk_idx int32 [T, K] | topk_weights f32 [T, K]   (published for pull)
             | pos int32 [T, W + K]: the sender's row of each (token, rank) among the tokens it
             sends that rank, then of each (token, slot) among its tokens of that expert; with
             the counts matrix this gives every row's destination (the CUDA kernels use it)
    recv     x [P, H] | idx int32 [P, K] | weights f32 [P, K] | src int32 [P]: the receive
             pool, one row per (source, token) whatever the output layout (nvshmem: a ring per
             (source, channel)); per slot the local expert id (rank-major output) or the slot's
             row in the expert-major output, and the weight (-1 / 0 for slots of other ranks):
             receivers copy a row once per slot of theirs. P = ``pool_rows``: W * T for push
             (one row per source token at most; nvshmem W * (T + C), whole rings), none for
             the CUDA pull (receivers read the sources' input regions); never more than
             ``buffer.recv_capacity`` when set, the most rows a receiver may get (its
             outputs, plain tensors outside this buffer)
    combine  x [T * S, H] | topk_weights f32 [T * S, K], S = max(W, K): one slot per
             (token, destination rank) for rank-major, per (token, k) for expert-major

    recv_src holds, for each received row, its combine slot on the source: ``t * S + slot``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Sequence

import torch

from .errors import CapacityError

ALIGN = 1024  # region alignment: a multiple of TMA's 16 bytes and of a cache line
MAX_CHANNELS = 64  # kernel.num_channels: nvshmem's channels
STREAM_CHANNELS = 128  # tail words of the streamed push (torch, nccl): its sender blocks at most

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


def _up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def check_row_bytes(row_bytes: int, full: int) -> None:
    """A dispatch's row bytes: 0 (full rows) or a multiple of 16 (bulk copies) up to ``full``."""
    if row_bytes and not (0 < row_bytes <= full and row_bytes % 16 == 0):
        raise ValueError(f"row_bytes={row_bytes}: must be 0 (full rows) or a multiple of 16 in 16..{full}")


@dataclass(frozen=True)
class Region:
    name: str
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class BufferLayout:
    world_size: int
    max_tokens: int  # per rank
    hidden: int
    topk: int
    num_experts: int
    elem_size: int  # bytes per element of x
    alignment: int = 1  # expert-major group padding
    num_channels: int = 1
    recv_capacity: int = 0  # most rows a receiver may get (its outputs); 0: the worst case for either layout
    # Rows of the receive pool (``recv`` region): this many, or recv_capacity when that is set
    # and less; -1: recv_rows (Config.layout sets it per protocol, ``pool_limit``).
    pool_limit: int = -1
    regions: dict[str, Region] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        W, T, H, K, E = self.world_size, self.max_tokens, self.hidden, self.topk, self.num_experts
        R = self.pool_rows
        C = self.num_channels
        sizes = [
            ("signals", 8 * W * (2 + 3 * C)),
            ("counts", 4 * W * (1 + W + E)),
            ("input", _up(T * H * self.elem_size) + 2 * _up(4 * T * K) + _up(4 * T * (W + K))),
            ("recv", _up(R * H * self.elem_size) + 2 * _up(4 * R * K) + _up(4 * R)),
            ("combine", _up(T * self.combine_slots * H * self.elem_size) + 4 * T * self.combine_slots * K),
        ]
        regions, off = {}, 0
        for name, n in sizes:
            regions[name] = Region(name, off, _up(max(n, 1)))
            off += regions[name].nbytes
        object.__setattr__(self, "regions", regions)

    # -- sizes ---------------------------------------------------------------------------
    @cached_property  # read on every dispatch's host path; the layout never changes
    def local_experts(self) -> int:
        return self.num_experts // self.world_size

    @cached_property
    def combine_slots(self) -> int:
        return max(self.world_size, self.topk)

    @cached_property
    def recv_rows(self) -> int:
        if self.recv_capacity:
            return self.recv_capacity
        return self.worst_case_rows("expert")

    @cached_property
    def x_row_bytes(self) -> int:
        """Bytes of one row of x (``buffer.dtype``), as the regions are sized for."""
        return self.hidden * self.elem_size

    @property
    def stage_bytes(self) -> int:
        """Bytes of a copy of ``recv_rows`` rows of x and of their K fp32 weights: where
        nvshmem's combine stages its input for peers reached only by puts (IBGDA reads
        registered sources), in symmetric memory outside this layout."""
        return self.recv_rows * (self.hidden * self.elem_size + 4 * self.topk)

    @property
    def pool_rows(self) -> int:
        if self.pool_limit < 0:
            return self.recv_rows
        return min(self.pool_limit, self.recv_capacity) if self.recv_capacity else self.pool_limit

    def worst_case_rows(self, output_layout: str) -> int:
        W, T = self.world_size, self.max_tokens
        if output_layout == "rank":
            return W * T
        slots = min(self.topk, self.local_experts)
        return max(W * T, W * T * slots + self.local_experts * (self.alignment - 1))

    @property
    def total_bytes(self) -> int:
        return self.regions["combine"].end

    # -- sub-array offsets the kernels use -----------------------------------------------
    def offsets(self) -> Mapping[str, int]:
        """Byte offsets of the sub-arrays, made once (dispatches read them): read, never change them."""
        return self._offsets

    @cached_property
    def _offsets(self) -> Mapping[str, int]:
        W, T, H, K, R, C = self.world_size, self.max_tokens, self.hidden, self.topk, self.pool_rows, self.num_channels
        g = self.regions
        sig = g["signals"].offset
        inp = g["input"].offset
        rcv = g["recv"].offset
        return {
            "barrier": sig,
            "ready": sig + 8 * W,
            "tail": sig + 16 * W,
            "head": sig + 16 * W + 8 * C * W,
            "ack": sig + 16 * W + 16 * C * W,
            "counts": g["counts"].offset,
            "in_x": inp,
            "in_idx": inp + _up(T * H * self.elem_size),
            "in_w": inp + _up(T * H * self.elem_size) + _up(4 * T * K),
            "in_pos": inp + _up(T * H * self.elem_size) + 2 * _up(4 * T * K),
            "recv_x": rcv,
            "recv_idx": rcv + _up(R * H * self.elem_size),
            "recv_w": rcv + _up(R * H * self.elem_size) + _up(4 * R * K),
            "recv_src": rcv + _up(R * H * self.elem_size) + 2 * _up(4 * R * K),
            "combine_x": g["combine"].offset,
            "combine_w": g["combine"].offset + _up(T * self.combine_slots * H * self.elem_size),
        }

    # Order must match `struct Layout` in csrc/common/layout.cuh.
    KERNEL_FIELDS = ("world_size", "max_tokens", "hidden", "topk", "num_experts", "elem_size",
                     "recv_rows", "pool_rows", "num_channels", "combine_slots", "x_row_bytes")
    KERNEL_OFFSETS = ("barrier", "ready", "tail", "head", "ack", "counts", "in_x", "in_idx", "in_w", "in_pos",
                      "recv_x", "recv_idx", "recv_w", "recv_src", "combine_x", "combine_w")

    def kernel_args(self, row_bytes: int = 0) -> list[int]:
        """The layout as ``struct Layout`` reads it. ``row_bytes``: the bytes of each x row a
        dispatch moves, also their stride in the input region, the pool and the outputs (0: the
        full ``x_row_bytes``); an FP8 dispatch's rows (``Fp8Format.row_bytes``) are narrower.
        Every rank of one dispatch must pass the same."""
        check_row_bytes(row_bytes, self.x_row_bytes)
        offs = self.offsets()
        args = [int(getattr(self, f)) for f in self.KERNEL_FIELDS] + [offs[k] for k in self.KERNEL_OFFSETS]
        if row_bytes:
            args[self.KERNEL_FIELDS.index("x_row_bytes")] = row_bytes
        return args

    def fits(self, most: int, worst: int = 0) -> bool:
        """Whether a dispatch whose receivers get at most ``most`` rows fits ``recv_rows`` and the
        ``worst`` rows the call asked for (num_worst_tokens; 0: exact outputs)."""
        return most <= self.recv_rows and not (worst and most > worst)

    def check_capacity(self, totals: Sequence[int], output_layout: str, worst: int = 0) -> None:
        """Raise CapacityError if a receiver's rows (``totals[r]``, from the exchanged counts
        matrix, so every rank raises together) exceed ``recv_rows``, or the outputs of
        ``worst`` rows the call asked for (num_worst_tokens; 0: exact outputs). A GPU dispatch
        calls this after its host wait, so the common case (nobody over) is one comparison."""
        if self.fits(max((int(t) for t in totals), default=0), worst):
            return
        cap = self.recv_rows
        for r, n in enumerate(int(t) for t in totals):
            if n > cap:
                raise CapacityError(
                    f"rank {r} would receive {n} rows ({output_layout}-major) but buffer.recv_capacity allows "
                    f"{cap}: raise buffer.recv_capacity (0 = worst case)")
            if worst and n > worst:
                raise CapacityError(f"num_worst_tokens={worst} but rank {r} receives {n} rows: num_worst_tokens must "
                                    "be at least the most rows any rank receives")

    def describe(self) -> list[tuple[str, int, int]]:
        """(region, offset, bytes) rows for ``symmoe size``."""
        return [(r.name, r.offset, r.nbytes) for r in self.regions.values()]
