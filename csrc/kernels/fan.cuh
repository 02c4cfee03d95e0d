// A dispatch alone (one rank) into the expert-major layout, from plain routing tables: no peer,
// no pool, so every row goes from x straight to the output row of each slot, by the phased
// fan-out (common/phases.cuh, kernel.fan_phases): whole rows loaded into shared memory, then
// bulk-stored to their rows. The NVSHMEM protocol launches it alone in place of its
// dispatch_kernel (whose warps copy a row once per slot), with its plan kernel's tables. It
// needs no transport, so it is built into symmoe_cuda, compiled whole as push's phases are (built
// into the NVSHMEM module, relocatable device code, it ran 30 % slower than push's phases in
// session 28, cause unknown).
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/outputs.cuh"
#include "../common/phases.cuh"
#include "../common/scan.cuh"

namespace symmoe {

struct FanArgs {
  Layout lay;
  int alignment;
  const uint8_t* x;       // [T, H]
  const int32_t* idx;     // [T, K] int32 copy made by the routing
  const float* w;         // [T, K]
  const int32_t* pos;     // [T, 1 + K] each slot's position in its expert's rows
  const int32_t* counts;  // [1][2 + E] this dispatch's counts row
  Outputs o;
  MoveCfg mc;
  Sync sy;  // err: the device word kernels poll, err_host: the host-mapped one
};

// Shared tables before the phases' rows: goff [E + 1] (read by the phases), then gcnt [E] and
// the scan's scratch, which only the build and the padding read.
struct FanPlan {
  int32_t *goff, *gcnt, *tmp;
  static constexpr int kScanTmp = kMaxMoverWarps + 1;
  __host__ __device__ static int64_t kept_bytes(int64_t E) { return 4 * (E + 1); }
  __host__ __device__ static int64_t bytes(int64_t E) { return 4 * (2 * E + 1 + kScanTmp); }
};

__global__ void __launch_bounds__(kMaxMoverWarps * 32, 1) fan_kernel(FanArgs a) {
  const int E = static_cast<int>(a.lay.num_experts), K = static_cast<int>(a.lay.topk);
  const int S = static_cast<int>(a.lay.combine_slots);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rb = a.lay.row_bytes();
  uint8_t* smem = dyn_smem();
  FanPlan pl{reinterpret_cast<int32_t*>(smem), nullptr, nullptr};
  pl.gcnt = pl.goff + E + 1;
  pl.tmp = pl.gcnt + E;
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(a.sy.err);
  __syncthreads();
  if (dead) return;  // an earlier wait failed: the host raises
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int32_t g = __ldg(a.counts + 2 + e);
    pl.gcnt[e] = g;
    pl.goff[e] = (g + a.alignment - 1) / a.alignment * a.alignment;
  }
  __syncthreads();
  const int32_t rows = block_exclusive_scan(pl.goff, E, pl.tmp);
  const int64_t T = __ldg(a.counts);
  if (T < 0 || rows > a.o.capacity) return;  // bad ids or over capacity: every block, the host raises
  if (threadIdx.x == 0) pl.goff[E] = rows;
  __syncthreads();
  fill_padding(pl.goff, [&](int j) { return pl.gcnt[j]; }, E, a.o, rb);
  const int64_t PC = 1 + K;
  fan_in_phases<false>(a.x, T, rb, a.mc, smem, a.sy,
                       [&](int64_t t) {
                         int e = -1;
                         float w = 0.f;
                         int p = 0;
                         if (lane < K) {
                           e = a.idx[t * K + lane];
                           w = a.w[t * K + lane];
                           p = a.pos[t * PC + 1 + lane];
                         }
                         int64_t o = e >= 0 ? int64_t(pl.goff[e]) + p : -1;
                         if (o >= rows) o = -1;  // only with corrupt inputs; never write out of bounds
                         if (o >= 0) {
                           a.o.idx[o] = e;
                           a.o.w[o] = w;
                           a.o.src_rank[o] = 0;
                           a.o.src_token[o] = static_cast<int32_t>(t);
                           a.o.src_slot[o] = lane;
                           if (a.o.selfmap != nullptr) a.o.selfmap[t * S + lane] = static_cast<int32_t>(o);
                         }
                         int n;
                         o = compact_lanes(o >= 0, o, lane, n);
                         return RowDsts{a.o.x + max(o, int64_t(0)) * rb, n};
                       },
                       warp, lane);
}

}  // namespace symmoe
