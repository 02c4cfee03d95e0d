// Warp pieces of the expert-major fan-out: a received row goes to one output row per slot
// that names one of the receiver's experts.
#pragma once
#include <cstdint>

#include "outputs.cuh"

namespace symmoe {

// The values `v` of the lanes with `keep` set, in lane order, moved to lanes 0..n-1; `n` is
// their number. Whole warp calls.
template <typename T>
__device__ __forceinline__ T compact_lanes(bool keep, T v, int lane, int& n) {
  const uint32_t has = __ballot_sync(0xffffffffu, keep);
  n = __popc(has);
  return __shfl_sync(0xffffffffu, v, lane < n ? int(__fns(has, 0, lane + 1)) : 0);
}

// The local expert whose group holds output row o: the last j < L with goff[j] <= o (an empty
// group starts where the next one does and is passed over).
template <typename T>
__device__ __forceinline__ int group_of(const T* goff, int L, int64_t o) {
  int lo = 0, hi = L - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (goff[mid] <= o) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// A warp copies one row into n rows, reading each 16-byte piece once, U pieces in flight per
// lane. Lane m < n holds destination m (the other lanes' `dst` is ignored); bytes % 16 == 0.
// The source is read with ld.global.cg (L2, not L1): rows that peers stored may still sit stale
// in L1 otherwise. Row-copy microbenchmark's warp-row fan-out (non-coherent loads there), each
// of 4096 rows of 14336 B to 8 rows: 146 µs with U = 7, 174 µs with U = 4. Whole
// warp calls.
template <int U = 7>
__device__ __forceinline__ void warp_fanout_row(uint8_t* dst, int n, const uint8_t* src, int64_t bytes, int lane) {
  const int4* s = reinterpret_cast<const int4*>(src);
  const int64_t nv = bytes / 16;
  for (int64_t i0 = 0; i0 < nv; i0 += 32 * U) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = i0 + 32 * u + lane;
      if (i < nv) v[u] = __ldcg(s + i);
    }
    for (int m = 0; m < n; ++m) {
      int4* d = reinterpret_cast<int4*>(__shfl_sync(0xffffffffu, reinterpret_cast<uint64_t>(dst), m));
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = i0 + 32 * u + lane;
        if (i < nv) d[i] = v[u];
      }
    }
  }
}

// An FP8 row (o.fp8_h e4m3 bytes, then o.fp8_s scale words) into n rows of the split outputs
// (Outputs::split): lane m < n holds output row m. The data as warp_fanout_row copies it, the
// scale words one a lane. Whole warp calls.
__device__ __forceinline__ void warp_fanout_fp8_row(const Outputs& o, int64_t row, int n, const uint8_t* src,
                                                    int lane) {
  warp_fanout_row(o.fp8_data + row * o.fp8_h, n, src, o.fp8_h, lane);
  const int32_t* s = reinterpret_cast<const int32_t*>(src + o.fp8_h);
  for (int m = 0; m < n; ++m) {
    const int64_t r = __shfl_sync(0xffffffffu, row, m);
    for (int j = lane; j < o.fp8_s; j += 32) o.fp8_scales[r * o.fp8_s + j] = __ldcg(s + j);
  }
}

}  // namespace symmoe
