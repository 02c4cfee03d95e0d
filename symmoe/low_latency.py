"""The low-latency mode's shapes: its symmetric buffer, its handle and its argument checks.

The mode mirrors DeepEP V1's ``low_latency_dispatch`` / ``low_latency_combine``: a masked
expert-major ``recv_x [L, W * T_max, H]`` and the rows each local expert received
(``recv_count``, DeepGEMM's ``masked_m``), with no host wait anywhere, so that a step can be
captured in a CUDA graph. Its buffer is a second symmetric allocation, separate from the
normal mode's, sized by ``num_max_dispatch_tokens_per_rank`` (T_max): every sender owns one
slot region per (local expert, source rank) at each receiver, so no counts are exchanged
before the rows move. Each region exists twice (parity of the call's sequence number), so a
call may start while a peer still unpacks the previous one.

Per rank, in this order (each piece 256-byte aligned)::

    barrier   W int64                  host backend's barrier flags
    dflag     [2, L, W] int64          (seq << 32) | rows, stored by each source per local expert
    cflag     [2, W] int64             seq, stored by each rank once all its experts' rows are back
    dmeta     [2, L, W, T_max] int32   t * K + k of each row in a slot region
    dx        [2, L, W, T_max, H]      the slot regions (rows as sent)
    cx        [2, T_max, K, H]         combine: expert outputs by (source token, top-k slot)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .errors import CapacityError, InputError

ALIGN = 256
LL_DTYPE = torch.bfloat16  # DeepEP's low-latency rows
MAX_WORLD = 64  # the receive kernels keep per-source counts in shared memory
MAX_TOPK = 64


def _up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class LowLatencyLayout:
    max_tokens: int    # num_max_dispatch_tokens_per_rank (T_max)
    hidden: int
    num_experts: int
    world_size: int
    topk: int
    elem: int = 2      # bytes of one element (bfloat16)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.world_size

    def parity_bytes(self) -> dict[str, int]:
        """Bytes of one parity of each region."""
        W, L, T, H, K = self.world_size, self.local_experts, self.max_tokens, self.hidden, self.topk
        return {"dflag": 8 * L * W, "cflag": 8 * W, "dmeta": 4 * L * W * T, "dx": self.elem * L * W * T * H,
                "cx": self.elem * T * K * H}

    def offsets(self) -> dict[str, int]:
        off = {"barrier": 0}
        at = _up(8 * self.world_size)
        for name, size in self.parity_bytes().items():
            off[name] = at
            at += 2 * _up(size)
        off["total"] = at
        return off

    @property
    def total_bytes(self) -> int:
        return self.offsets()["total"]

    def kernel_geometry(self, rank: int) -> list[int]:
        """What csrc/kernels/low_latency.cuh's Geometry takes, in its order."""
        off, par = self.offsets(), self.parity_bytes()
        names = ("dflag", "cflag", "dmeta", "dx", "cx")
        return ([rank, self.world_size, self.local_experts, self.num_experts, self.topk, self.max_tokens, self.hidden]
                + [off[n] for n in names] + [_up(par[n]) for n in names])


def size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int,
              num_topk: int = 8) -> int:
    """Bytes of symmetric memory per rank that the low-latency mode allocates (DeepEP's
    ``get_low_latency_rdma_size_hint``; ``num_topk``, which DeepEP's hint does not take, sizes
    the combine region and defaults to DeepSeek-V3's 8)."""
    return LowLatencyLayout(num_max_dispatch_tokens_per_rank, hidden, num_experts, num_ranks, num_topk).total_bytes


@dataclass
class LowLatencyHandle:
    """What ``low_latency_combine`` needs from its dispatch. ``src_info`` and ``layout_range``
    hold DeepEP's values (the source token of each row; ``(first row << 32) | rows`` per
    (local expert, source rank)); ``src_slot`` the top-k slot each row came from."""

    src_info: torch.Tensor      # [L, W * T_max] int32
    layout_range: torch.Tensor  # [L, W] int64
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int
    src_slot: torch.Tensor      # [L, W * T_max] int32
    num_tokens: int
    topk: int
    owner: int                  # id() of the engine that dispatched

    def as_deep_ep(self) -> tuple:
        """DeepEP V1's 5-tuple ``(src_info, layout_range, T_max, hidden, num_experts)``."""
        return (self.src_info, self.layout_range, self.num_max_dispatch_tokens_per_rank, self.hidden,
                self.num_experts)


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__


def _int(api: str, name: str, v: object, lo: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise InputError(f"{api}: {name}={v!r}; expected an int >= {lo}")
    return v


def check_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, T_max: int, num_experts: int, world_size: int,
                   device: torch.device) -> None:
    """Shapes, dtypes, device and sizes of a low-latency dispatch (no value reads: no host
    sync). Expert ids outside [-1, num_experts) are reported by the next call (see docs)."""
    api = "low_latency_dispatch"
    _int(api, "num_max_dispatch_tokens_per_rank", T_max, 1)
    _int(api, "num_experts", num_experts, 1)
    if num_experts % world_size:
        raise InputError(f"{api}: num_experts={num_experts} is not a multiple of world_size={world_size}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != LL_DTYPE:
        raise InputError(f"{api}: x is {_describe(x)}; expected a torch.bfloat16 tensor [num_tokens, hidden]")
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.dtype != torch.int64:
        raise InputError(f"{api}: topk_idx is {_describe(topk_idx)}; expected a torch.int64 tensor [num_tokens, topk]")
    T, H = x.shape
    if topk_idx.shape[0] != T:
        raise InputError(f"{api}: topk_idx has {topk_idx.shape[0]} rows and x {T}; one row per token")
    if not 1 <= topk_idx.shape[1] <= MAX_TOPK:
        raise InputError(f"{api}: topk={topk_idx.shape[1]}; expected 1 to {MAX_TOPK}")
    if T > T_max:
        raise CapacityError(f"{api}: {T} tokens but num_max_dispatch_tokens_per_rank={T_max}; dispatch at most "
                            "that many (every rank passes the same T_max)")
    if H % 8:
        raise InputError(f"{api}: hidden={H}; the rows move in 16-byte pieces, so hidden must be a multiple of 8")
    if world_size > MAX_WORLD:
        raise InputError(f"{api}: world_size={world_size}; the low-latency mode handles at most {MAX_WORLD} ranks")
    for name, t in (("x", x), ("topk_idx", topk_idx)):
        if t.device != device:
            raise InputError(f"{api}: {name} is on {t.device}; this Buffer's memory is on {device}")
        if not t.is_contiguous():
            raise InputError(f"{api}: {name} is not contiguous; pass {name}.contiguous()")


def check_combine(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, handle: object,
                  out: torch.Tensor | None, world_size: int, owner: int, device: torch.device) -> LowLatencyHandle:
    api = "low_latency_combine"
    if not isinstance(handle, LowLatencyHandle):
        raise InputError(f"{api}: handle is {_describe(handle)}; pass the handle low_latency_dispatch returned")
    if handle.owner != owner:
        raise InputError(f"{api}: handle was made by another Buffer, or before this one's low-latency "
                         "buffer was resized; use the Buffer that dispatched it, at the same sizes")
    L, T_max, H = handle.num_experts // world_size, handle.num_max_dispatch_tokens_per_rank, handle.hidden
    want = (L, world_size * T_max, H)
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != want or x.dtype != LL_DTYPE:
        raise InputError(f"{api}: x is {_describe(x)}; expected torch.bfloat16 of shape {want} "
                         "(recv_x's shape: [local experts, world_size * T_max, hidden])")
    T = handle.num_tokens
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype != torch.int64 or tuple(topk_idx.shape) != (T, handle.topk):
        raise InputError(f"{api}: topk_idx is {_describe(topk_idx)}; expected the dispatch's torch.int64 "
                         f"[{T}, {handle.topk}]")
    if (not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32
            or tuple(topk_weights.shape) != (T, handle.topk)):
        raise InputError(f"{api}: topk_weights is {_describe(topk_weights)}; expected torch.float32 [{T}, {handle.topk}]")
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (T, H) or out.dtype != LL_DTYPE
                            or not out.is_contiguous() or out.device != device):
        raise InputError(f"{api}: out is {_describe(out)}; expected a contiguous torch.bfloat16 [{T}, {H}] on {device}")
    for name, t in (("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_weights)):
        if t.device != device:
            raise InputError(f"{api}: {name} is on {t.device}; this Buffer's memory is on {device}")
        if not t.is_contiguous():
            raise InputError(f"{api}: {name} is not contiguous; pass {name}.contiguous()")
    return handle


def check_fp8(hidden: int, use_fp8: bool, round_scale: bool, use_ue8m0: bool) -> None:
    """The FP8 options of a low-latency dispatch, as DeepEP allows them."""
    api = "low_latency_dispatch"
    for name, v in (("use_fp8", use_fp8), ("round_scale", round_scale), ("use_ue8m0", use_ue8m0)):
        if not isinstance(v, bool):
            raise InputError(f"{api}: {name}={v!r}; expected True or False")
    if (round_scale or use_ue8m0) and not use_fp8:
        raise InputError(f"{api}: round_scale={round_scale}, use_ue8m0={use_ue8m0} with use_fp8=False; they shape "
                         "the FP8 scales, so pass use_fp8=True or leave them False")
    if use_ue8m0 and not round_scale:
        raise InputError(f"{api}: use_ue8m0=True needs round_scale=True (UE8M0 holds powers of two only)")
    if use_fp8 and hidden % 128:
        raise InputError(f"{api}: hidden={hidden} with use_fp8=True; FP8 rows scale per 128 channels, so hidden "
                         "must be a multiple of 128")


def fp8_row_bytes(hidden: int) -> int:
    """Bytes an FP8 row moves: the e4m3 data, then one float32 scale per 128 channels, in 16-byte pieces."""
    from .fp8 import formats
    return formats(hidden)["float32"].row_bytes(hidden)


def fp8_outputs(recv_x: torch.Tensor, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Views and outputs of FP8 rows received in ``recv_x`` [L, N, H] bfloat16 (data in each
    row's first H bytes, float32 scales behind): ``(data e4m3 [L, N, H], scales, finish)``.
    ``scales`` is DeepEP's: column-major (stride 1 along N) float32 ``[L, N, H / 128]``, or
    UE8M0 exponents packed four to an int32 ``[L, N, ceil(H / 512)]``; ``finish()`` fills it
    once the rows are in (after the receive). ``data`` is a view with rows 2H bytes apart."""
    from . import fp8
    L, N, H = recv_x.shape
    S = H // 128
    # Two tensor ops each (on a GPU machine's host every tensor made costs 3-6 µs).
    data = recv_x.view(fp8.FP8_DTYPE)[..., :H]
    src = recv_x.view(torch.float32)[..., H // 4:H // 4 + S]
    cols = -(-S // 4) if use_ue8m0 else S
    scales = torch.empty_strided((L, N, cols), (cols * N, 1, N), dtype=torch.int32 if use_ue8m0 else torch.float32,
                                 device=recv_x.device)

    def finish() -> None:
        scales.copy_(fp8.ue8m0(src) if use_ue8m0 else src)
    return data, scales, finish

