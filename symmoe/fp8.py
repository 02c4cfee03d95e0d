"""FP8 rows: e4m3 data with per-128-channel scales, dispatched as bytes.

``x = (x_e4m3 [T, H], scales)``, DeepEP's and DeepGEMM's form, with ``scales`` either
float32 ``[T, H / 128]`` (one per 128 channels, SM90) or UE8M0 exponents packed four to an
int32 ``[T, ceil(H / 512)]`` (SM100). Dispatch moves both unchanged: each token's e4m3 bytes
and its scale bytes travel as one byte row (``pack``) of ``Fp8Format.row_bytes(H)`` = H + scale
bytes rounded up to 16 (7392 bytes at H = 7168 with float32 scales, 0.52x a bfloat16 row), so
every protocol and backend moves them with the kernels that move bfloat16 rows, told the
narrower row size, and the receiver splits them again (``unpack``). Combine stays in
``buffer.dtype``.

The receiver's scales come row-major, or with ``scale_layout="mn_major"`` in DeepGEMM's
MN-major TMA-aligned layout (``deep_gemm.get_mn_major_tma_aligned_tensor``): shape
``[rows, S]``, strides ``(1, align(rows, 4))``. With ``buffer.expert_alignment`` set to
DeepGEMM's ``get_mk_alignment_for_contiguous_layout()`` (128), an expert-major dispatch then
gives what ``deep_gemm.m_grouped_fp8_gemm_nt_contiguous`` takes as it is, with
``Buffer.grouped_layout(handle)`` (or its ``psum`` form) as the grouped layout.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .errors import InputError

FP8_DTYPE = torch.float8_e4m3fn
BLOCK = 128  # channels per scale
FP8_MAX = 448.0  # largest finite e4m3
SCALE_LAYOUTS = ("row", "mn_major")
TMA_ALIGN_BYTES = 16  # DeepGEMM's get_tma_aligned_size: MN padded to 16 bytes of scales


@dataclass(frozen=True)
class Fp8Format:
    """How one token's scales look: float32 per 128 channels, or UE8M0 packed four to an int32."""

    scale_dtype: torch.dtype
    scale_cols: int

    @property
    def scale_bytes(self) -> int:
        return 4 * self.scale_cols

    @property
    def name(self) -> str:
        return "float32" if self.scale_dtype == torch.float32 else "ue8m0"

    def row_bytes(self, hidden: int) -> int:
        """Bytes of one packed row at ``hidden`` channels: the e4m3 bytes, then the scale bytes,
        rounded up to 16 (bulk copies move 16-byte multiples)."""
        return -(-(hidden + self.scale_bytes) // 16) * 16


class Fp8Rows(NamedTuple):
    """An FP8 dispatch's x for a protocol that packs and splits its rows itself
    (``Protocol.fp8_split``): their format, and the e4m3 rows and scales as the caller passed them."""

    format: Fp8Format
    data: torch.Tensor
    scales: torch.Tensor

    def two_sources(self) -> bool:
        """The rows can be read where they lie, e4m3 bytes and scale bytes apart (no packing
        pass): both tensors contiguous and 16-byte aligned, and a row's scale bytes a multiple of
        16 (float32 scales of H a multiple of 512: the packed row is exactly H + scale bytes)."""
        return (self.format.scale_bytes % 16 == 0 and self.scales.is_contiguous()
                and self.data.data_ptr() % 16 == 0 and self.scales.data_ptr() % 16 == 0)


@functools.lru_cache(maxsize=None)
def formats(hidden: int) -> dict[str, Fp8Format]:
    """The two scale formats at ``hidden`` channels, by name (made once per width: every FP8
    dispatch checks its scales against them; read them, never change them)."""
    return {"float32": Fp8Format(torch.float32, hidden // BLOCK),
            "ue8m0": Fp8Format(torch.int32, -(-hidden // (4 * BLOCK)))}


def is_fp8(x: Any) -> bool:
    """x is a tuple: DeepEP's FP8 form ``(data, scales)`` (any other tuple is refused by ``check``)."""
    return isinstance(x, tuple)


def check(x: Any, hidden: int, dtype: torch.dtype, device: torch.device, scale_layout: str) -> tuple[
        torch.Tensor, torch.Tensor, Fp8Format]:
    """Validate an FP8 ``x`` against a Buffer of ``hidden`` channels of ``dtype`` rows on
    ``device``; return ``(data, scales, format)``. Raises InputError naming the value."""
    check_scale_layout(scale_layout)
    if len(x) != 2:
        raise InputError(f"x is a {type(x).__name__} of {len(x)} items; FP8 x is (x_e4m3 [T, H], scales)")
    data, scales = x
    for name, t in (("x[0] (FP8 data)", data), ("x[1] (scales)", scales)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != device:
            raise InputError(f"{name} is on {t.device}; this Buffer's memory is on {device}")
        if t.dim() != 2:
            raise InputError(f"{name} must have 2 dimensions, got shape {tuple(t.shape)}")
    if data.dtype != FP8_DTYPE:
        raise InputError(f"x[0] (FP8 data) has dtype {data.dtype}; allowed: {FP8_DTYPE}")
    if not data.is_contiguous():
        raise InputError(f"x[0] (FP8 data) must be contiguous (call .contiguous()), got strides {data.stride()}")
    T, H = data.shape
    if H != hidden:
        raise InputError(f"x[0] (FP8 data) has hidden size {H}; this Buffer was sized for hidden={hidden}")
    if H % BLOCK:
        raise InputError(f"FP8 x has hidden size {H}; FP8 dispatch needs a multiple of {BLOCK} (one scale per "
                         f"{BLOCK} channels)")
    if dtype != torch.bfloat16:
        raise InputError(f"x is FP8 (e4m3, scales) but this Buffer has buffer.dtype={str(dtype).split('.')[-1]}; "
                         "FP8 dispatch needs buffer.dtype bfloat16 (its combine stays in bfloat16, as DeepEP's)")
    f32, ue8m0 = formats(H)["float32"], formats(H)["ue8m0"]
    shape = tuple(scales.shape)
    if scales.dtype == torch.float32:
        fmt = f32
        if shape == (T, ue8m0.scale_cols) and ue8m0.scale_cols != f32.scale_cols:
            raise InputError(f"x[1] (scales) is float32 of shape {shape}, the shape of UE8M0 scales packed four to "
                             f"an int32; float32 scales take one per {BLOCK} channels: ({T}, {f32.scale_cols}) "
                             "(packed UE8M0 scales must be torch.int32)")
    elif scales.dtype == torch.int32:
        fmt = ue8m0
        if shape == (T, f32.scale_cols) and ue8m0.scale_cols != f32.scale_cols:
            raise InputError(f"x[1] (scales) is int32 of shape {shape}: int32 scales are UE8M0 packed four to an "
                             f"int32, ({T}, {ue8m0.scale_cols}); one scale per {BLOCK} channels must be "
                             "torch.float32")
    else:
        raise InputError(f"x[1] (scales) has dtype {scales.dtype}; allowed: torch.float32 (one per {BLOCK} channels) "
                         "or torch.int32 (UE8M0 packed four to an int32)")
    if shape != (T, fmt.scale_cols):
        raise InputError(f"x[1] (scales) has shape {shape}; {fmt.name} scales of x [{T}, {H}] must be "
                         f"({T}, {fmt.scale_cols})")
    return data, scales, fmt


def check_scale_layout(scale_layout: object) -> None:
    if scale_layout not in SCALE_LAYOUTS:
        raise InputError(f"scale_layout={scale_layout!r}; allowed: 'row' (contiguous [rows, S]) or 'mn_major' "
                         "(DeepGEMM's TMA-aligned MN-major scales)")


_GPU: tuple = ()  # (symmoe_cuda, symmoe_host, stream_handle) once the GPU path first runs


def _gpu() -> tuple:
    """symmoe_cuda (the fp8_pack_rows / fp8_unpack_rows kernels), symmoe_host (the split's
    outputs) and the current stream's handle, imported once (every FP8 dispatch packs and splits)."""
    global _GPU
    if not _GPU:
        from . import build
        from .protocol.base import stream_handle
        _GPU = (build.load("symmoe_cuda"), build.load("symmoe_host"), stream_handle)
    return _GPU


def _aligned(*rows: torch.Tensor) -> bool:
    """Each tensor starts, and each of its rows starts, 16 bytes aligned: the row kernels' vectors."""
    return all(t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0 for t in rows)


def pack(data: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Write each token's e4m3 bytes, then its scale bytes, into ``out`` [T, C] (rows of at least
    H + 4S bytes, a multiple of 8: ``Fp8Format.row_bytes`` uint8 columns, or bfloat16 rows of 2H
    bytes); return ``out``. Bytes past them are left as they are: they travel but no one reads
    them. On the GPU one kernel copies both (16 bytes a thread for the data; torch's two strided
    copies took 80 µs at 4096 tokens of H = 7168 on an H100, and ~15 µs of host time) where the
    rows are 16-byte aligned; elsewhere torch copies them in 8- and 4-byte words (H is a multiple
    of 128)."""
    H = data.shape[1]
    if data.is_cuda and _aligned(data, out) and scales.data_ptr() % 4 == 0:
        mod, _, stream_handle = _gpu()
        mod.fp8_pack_rows(data.data_ptr(), scales.contiguous().data_ptr(), out.data_ptr(), data.shape[0], H,
                          scales.shape[1], out.stride(0) * out.element_size(), stream_handle(data.device))
        return out
    out.view(torch.int64)[:, :H // 8].copy_(data.view(torch.int64))
    out.view(torch.int32)[:, H // 4:H // 4 + scales.shape[1]].copy_(scales.view(torch.int32))
    return out


def unpack(rows: torch.Tensor, hidden: int, fmt: Fp8Format, scale_layout: str = "row") -> tuple[
        torch.Tensor, torch.Tensor]:
    """Received rows [M, C] as ``pack`` wrote them (any dtype, at least H + 4S bytes) ->
    (x_e4m3 [M, H] contiguous, scales [M, S], row-major or ``mn_major``: ``mn_major_like``'s
    layout). On the GPU one kernel writes both."""
    if rows.is_cuda and _aligned(rows):
        mod, host, stream_handle = _gpu()
        M, S = rows.shape[0], fmt.scale_cols
        data, scales, *strides = host.fp8_split_outputs(M, hidden, S, fmt.scale_dtype, scale_layout != "row",
                                                        rows.device)
        mod.fp8_unpack_rows(rows.data_ptr(), M, hidden, S, rows.stride(0) * rows.element_size(), data.data_ptr(),
                            scales.data_ptr(), *strides, stream_handle(rows.device))
        return data, scales
    data = rows.view(torch.int64)[:, :hidden // 8].contiguous().view(FP8_DTYPE)
    src = rows.view(torch.int32)[:, hidden // 4:hidden // 4 + fmt.scale_cols].view(fmt.scale_dtype)  # no copy
    if scale_layout == "row":
        return data, src.contiguous()
    return data, mn_major_like(src)


def tma_aligned_rows(rows: int, element_size: int = 4) -> int:
    """DeepGEMM's ``get_tma_aligned_size(rows, element_size)``."""
    a = TMA_ALIGN_BYTES // element_size
    return -(-rows // a) * a


def mn_major_like(scales: torch.Tensor) -> torch.Tensor:
    """``scales`` [M, S] copied into DeepGEMM's MN-major TMA-aligned layout: shape [M, S],
    strides (1, align(M, 4)) (``deep_gemm.get_mn_major_tma_aligned_tensor``)."""
    M, S = scales.shape
    store = torch.empty((S, tma_aligned_rows(M, scales.element_size())), dtype=scales.dtype, device=scales.device)
    out = store[:, :M]
    out.copy_(scales.t())
    return out.t()


def grouped_layout(expert_offsets: torch.Tensor, src_rank: torch.Tensor, psum: bool = False) -> torch.Tensor:
    """DeepGEMM's grouped layout of expert-major rows (``m_grouped_fp8_gemm_nt_contiguous``):
    per row the local expert, -1 on padding (``psum=False``, int32 [rows]); or per expert
    the end of its real rows, ``group start + count`` (``psum=True``, int32 [L]).
    ``expert_offsets`` [L + 1] padded group starts, ``src_rank`` [rows] (-1 on padding).
    No host sync: usable with worst-case-sized outputs."""
    rows = src_rank.shape[0]
    L = expert_offsets.shape[0] - 1
    offsets = expert_offsets.to(src_rank.device, torch.int64)
    at = torch.arange(rows, device=src_rank.device)
    expert = torch.bucketize(at, offsets[1:], right=True)  # the group a row lies in (L past the last)
    real = (src_rank >= 0) & (expert < L)
    if not psum:
        return torch.where(real, expert, torch.full_like(expert, -1)).to(torch.int32)
    counts = torch.zeros(L + 1, dtype=torch.int64, device=src_rank.device)
    counts.scatter_add_(0, torch.where(real, expert, torch.full_like(expert, L)), torch.ones_like(expert))
    return (offsets[:-1] + counts[:L]).to(torch.int32)


def quantize(x: torch.Tensor, scale_format: str = "float32", round_scale: bool = False) -> tuple[
        torch.Tensor, torch.Tensor]:
    """``x`` [T, H] -> ``(x_e4m3, scales)`` per token and 128 channels, as DeepGEMM's
    ``per_token_cast_to_fp8``: scale = amax / 448 (``float32``; ``round_scale``: rounded up to
    a power of two, as DeepEP's low-latency ``round_scale``), or a power of two packed as UE8M0
    exponents four to an int32 (``ue8m0``). The low-latency dispatch's ``use_fp8`` casts with it."""
    if scale_format not in ("float32", "ue8m0"):
        raise InputError(f"scale_format={scale_format!r}; allowed: 'float32', 'ue8m0'")
    T, H = x.shape
    if H % BLOCK:
        raise InputError(f"x has hidden size {H}; FP8 needs a multiple of {BLOCK}")
    blocks = x.float().view(T, H // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=2).clamp(min=1e-4)
    # A tensor divisor: torch divides a CUDA tensor by a Python number as a multiply by its
    # rounded reciprocal, so amax / 448.0 would differ between devices (and from the kernels).
    fp8_max = torch.full_like(amax, FP8_MAX)
    if scale_format == "float32" and not round_scale:
        scale, mul = amax / fp8_max, fp8_max / amax
    else:
        # 2^ceil(log2(amax / 448)) from the exponent (frexp: v = m * 2^e, m in [0.5, 1)), exact
        # on every device where a rounded log2 might not be.
        m, e = torch.frexp(amax / fp8_max)
        scale = torch.ldexp(torch.ones_like(m), torch.where(m == 0.5, e - 1, e))
        mul = 1.0 / scale
    data = (blocks * mul.unsqueeze(2)).to(FP8_DTYPE).view(T, H)
    if scale_format == "float32":
        return data, scale.contiguous()
    return data, ue8m0(scale)


def ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two float32 scales ``[..., H / 128]`` -> their exponent bytes packed four to an
    int32 ``[..., ceil(H / 512)]`` (the low byte holds the first)."""
    n = scale.shape[-1]
    exps = torch.zeros((*scale.shape[:-1], -(-n // 4) * 4), dtype=torch.uint8, device=scale.device)
    exps[..., :n] = (scale.contiguous().view(torch.int32) >> 23).to(torch.uint8)
    return exps.view(torch.int32)
