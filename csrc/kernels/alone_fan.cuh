// The world-size-1 expert-major dispatch (alone_fan_kernel): the phased fan-out
// (common/phases.cuh), whole rows loaded into shared memory, then bulk-stored to every slot's
// row.
#pragma once
#include <cstdint>

#include "../common/fanout.cuh"
#include "../common/phases.cuh"
#include "../common/scan.cuh"
#include "alone_args.cuh"

namespace symmoe {

// Shared tables before the phases' rows: goff [E + 1] (read by the phases), then gcnt [E] and
// the scan's scratch, which only the build and the padding read.
struct FanPlan {
  int32_t *goff, *gcnt, *tmp;
  static constexpr int kScanTmp = kMaxMoverWarps + 1;
  __host__ __device__ static int64_t kept_bytes(int64_t E) { return 4 * (E + 1); }
  __host__ __device__ static int64_t bytes(int64_t E) { return 4 * (2 * E + 1 + kScanTmp); }
};

// The expert-major fan-out from a routing (alone_fan_kernel), whole block, dyn smem `smem`.
// kEarly: a.routed names the routing chunks' placed marks and their totals, and the rows lie
// past all of FanPlan with round 0's already loading (fan_begin); `leave` runs on every early
// exit.
// Bad ids are then not known yet: the kernel keeps inside the outputs and the ids' range, and the
// host raises and drops these outputs as it does when nothing moved.
template <bool kEarly, class Leave>
__device__ __forceinline__ void alone_fan(const AloneArgs& a, uint8_t* smem, int warp, int lane, Leave leave) {
  const int E = static_cast<int>(a.lay.num_experts), K = static_cast<int>(a.lay.topk);
  const int S = static_cast<int>(a.lay.combine_slots);
  const int64_t rb = a.lay.row_bytes();
  FanPlan pl{reinterpret_cast<int32_t*>(smem), nullptr, nullptr};
  pl.gcnt = pl.goff + E + 1;
  pl.tmp = pl.gcnt + E;
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(a.sy.err);
  __syncthreads();
  if (dead) return leave();  // an earlier wait failed: the host raises
  const int32_t* totals = nullptr;
  if (kEarly) {
    if (!routing_placed(a.routed, a.sy, warp, lane)) return leave();  // recorded: the host raises
    totals = a.routed.totals;
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int32_t g = kEarly ? __ldcg(totals + 1 + e) : __ldg(a.counts + 2 + e);
    pl.gcnt[e] = g;
    pl.goff[e] = (g + a.alignment - 1) / a.alignment * a.alignment;
  }
  __syncthreads();
  const int32_t rows = block_exclusive_scan(pl.goff, E, pl.tmp);
  const int64_t T = kEarly ? a.routed.tokens : __ldg(a.counts);
  // Bad ids or over capacity: every block, the host raises.
  if (T < 0 || rows > a.o.capacity) return leave();
  if (threadIdx.x == 0) pl.goff[E] = rows;
  __syncthreads();
  fill_padding(pl.goff, [&](int j) { return pl.gcnt[j]; }, E, a.o, rb);
  const int64_t PC = 1 + K;
  fan_in_phases<false, kEarly, true>(a.x, T, rb, a.mc, smem, a.sy,
                       [&](int64_t t) {
                         int e = -1;
                         float w = 0.f;
                         int p = 0;
                         if (lane < K) {  // early, the routing wrote them in this launch: past L1
                           e = kEarly ? __ldcg(a.idx + t * K + lane) : a.idx[t * K + lane];
                           w = kEarly ? __ldcg(a.w + t * K + lane) : a.w[t * K + lane];
                           p = kEarly ? __ldcg(a.pos + t * PC + 1 + lane) : a.pos[t * PC + 1 + lane];
                         }
                         // Early, a bad id may still be here: never read past goff.
                         int64_t o = e >= 0 && (!kEarly || e < E) ? int64_t(pl.goff[e]) + p : -1;
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

// kEarly: right behind this dispatch's route_kernel (a.routed; the host put the rows past all of
// FanPlan): round 0's rows load while the routing runs, from x, which was final before the
// routing kernel started, and the plan and the stores start on the routing chunks' placed marks.
template <bool kEarly>
__global__ void __launch_bounds__(kMaxMoverWarps * 32, 1) alone_fan_kernel(AloneArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* smem = dyn_smem();
  if (kEarly)
    fan_begin(a.x, a.routed.tokens, a.lay.row_bytes(), a.mc, smem, warp, lane);
  else
    wait_prior_grid();  // launched to follow the routing (or republish) kernel, which may still run
  start_following_grid();  // alone, nothing waits on a peer: a num_worst_tokens tail may be scheduled now
  // Started on the marks, this grid still ends after the routing's (whatever follows in the
  // stream, the tail or the host's counts event, sees its last writes), and after round 0's loads.
  alone_fan<kEarly>(a, smem, warp, lane, [&] {
    if (kEarly) {
      fan_abandon(a.routed.tokens, a.mc, smem, a.sy, warp, lane, a.lay.row_bytes());
      wait_prior_grid();
    }
  });
  if (kEarly) wait_prior_grid();  // this grid ends after the routing's (see leave)
}

}  // namespace symmoe
