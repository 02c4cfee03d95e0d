// FP8 rows in one kernel: each token's bfloat16 row -> its e4m3 bytes, then one float32 scale
// per 128 channels, written into the first bytes of that token's row of `out` (rows 2H bytes
// apart): what symmoe/fp8.py's quantize + pack produce with torch ops, bit for bit, in one
// launch instead of a dozen (the low-latency dispatch's use_fp8 is host-bound at decode sizes).
//
// Bitwise agreement with fp8.quantize: the same fp32 operations in the same order (amax of |x|,
// clamped to 1e-4; scale = amax / 448 and mul = 448 / amax as IEEE divisions, or the power of two
// at or above amax / 448 and its exact reciprocal; x * mul), then the round-to-nearest-even cast.
// The cast saturates (satfinite) where torch's gives NaN, but only at |x * mul| >= 464, which
// x * mul never reaches: |x| <= amax.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace symmoe {

constexpr int kFp8Block = 128;      // channels per scale
constexpr float kFp8Max = 448.0f;   // largest finite e4m3
constexpr float kFp8MinAmax = 1e-4f;

// The power of two at or above v (v > 0 and normal): frexp's 2^e, or v itself when its mantissa is 1.
__device__ __forceinline__ float pow2_at_or_above(float v) {
  uint32_t bits = __float_as_uint(v);
  if (bits & 0x7fffffu) bits = (bits & 0xff800000u) + 0x800000u;
  return __uint_as_float(bits);
}

// One warp per (token, 128-channel block): each lane quantizes 4 channels (one 8-byte load, one
// 4-byte store of e4m3 bytes); lane 0 stores the block's scale behind the row's H data bytes.
__global__ void __launch_bounds__(256) fp8_pack_kernel(const __nv_bfloat16* x, uint8_t* out, int64_t T, int H,
                                                       bool round_scale) {
  const int S = H / kFp8Block, lane = threadIdx.x % 32;
  const int64_t unit = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (unit >= T * S) return;
  const int64_t t = unit / S;
  const int b = int(unit - t * S);
  const uint2 raw = *reinterpret_cast<const uint2*>(x + t * H + b * kFp8Block + lane * 4);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  float amax = fmaxf(fmaxf(fabsf(lo.x), fabsf(lo.y)), fmaxf(fabsf(hi.x), fabsf(hi.y)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  amax = fmaxf(amax, kFp8MinAmax);
  float scale, mul;
  if (round_scale) {
    scale = pow2_at_or_above(__fdiv_rn(amax, kFp8Max));
    mul = __fdiv_rn(1.0f, scale);
  } else {
    scale = __fdiv_rn(amax, kFp8Max);
    mul = __fdiv_rn(kFp8Max, amax);
  }
  const __nv_fp8x2_storage_t a =
      __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(lo.x, mul), __fmul_rn(lo.y, mul)), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t c =
      __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(hi.x, mul), __fmul_rn(hi.y, mul)), __NV_SATFINITE, __NV_E4M3);
  uint8_t* row = out + t * 2 * H;
  *reinterpret_cast<uint32_t*>(row + b * kFp8Block + lane * 4) = uint32_t(a) | (uint32_t(c) << 16);
  if (lane == 0) reinterpret_cast<float*>(row + H)[b] = scale;
}

}  // namespace symmoe
