// Block-wide exclusive prefix sum over a shared-memory array (plan tables: group offsets).
#pragma once
#include <cstdint>

namespace symmoe {

// data[0..n) -> exclusive prefix sums in place; returns the total. Whole block calls;
// `tmp` is shared scratch of at least blockDim.x / 32 + 1 entries.
template <typename T>
__device__ T block_exclusive_scan(T* data, int n, T* tmp) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int per = (n + nt - 1) / nt;
  const int lo = min(n, tid * per), hi = min(n, lo + per);
  T local = 0;
  for (int i = lo; i < hi; ++i) local += data[i];
  // inclusive scan of thread sums: warp shuffles, then warp totals
  const int lane = tid & 31, warp = tid >> 5, nw = (nt + 31) >> 5;
  T v = local;
  for (int d = 1; d < 32; d <<= 1) {
    T o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += o;
  }
  if (lane == 31 || tid == nt - 1) tmp[warp] = v;
  __syncthreads();
  if (tid == 0) {
    T run = 0;
    for (int w = 0; w < nw; ++w) {
      T x = tmp[w];
      tmp[w] = run;
      run += x;
    }
    tmp[nw] = run;
  }
  __syncthreads();
  T run = tmp[warp] + v - local;  // exclusive prefix of this thread's chunk
  for (int i = lo; i < hi; ++i) {
    T x = data[i];
    data[i] = run;
    run += x;
  }
  const T total = tmp[nw];
  __syncthreads();
  return total;
}

}  // namespace symmoe
