// A warp copies one row into several rows, reading each 16-byte piece once: an expert-major
// output gets one copy of a received row per slot that names one of the receiver's experts.
#pragma once
#include <cstdint>

namespace symmoe {

// Lane m < n holds destination m (the other lanes' `dst` is ignored); bytes % 16 == 0. The
// source is read with ld.global.cg (L2, not L1): rows that peers stored may still sit stale
// in L1 otherwise. Whole warp calls.
__device__ __forceinline__ void warp_fanout_row(uint8_t* dst, int n, const uint8_t* src, int64_t bytes, int lane) {
  const int4* s = reinterpret_cast<const int4*>(src);
  const int64_t nv = bytes / 16;
  constexpr int U = 4;  // pieces in flight per lane
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

}  // namespace symmoe
