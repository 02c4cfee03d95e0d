// A dispatch alone (one rank), from plain routing tables: no peer, no pool, so every row goes
// from x straight to its output rows. The NVSHMEM protocol launches these alone in place of
// its dispatch_kernel. They need no transport, so they are built into symmoe_cuda, compiled
// whole as the CUDA protocols' data kernels are: built into the NVSHMEM module (relocatable
// device code), the fan-out ran 205 µs against 142 here, and that module's dispatch_kernel
// spills registers.
//   alone_fan_kernel   expert-major: the phased fan-out (common/phases.cuh, kernel.fan_phases),
//                      whole rows loaded into shared memory, then bulk-stored to every slot's row;
//   alone_rows_kernel  rank-major: each routed token's row to its output row by the bulk-copy
//                      mover (common/mover.cuh), as push's own rows move.
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/fanout.cuh"
#include "../common/outputs.cuh"
#include "../common/phases.cuh"
#include "../common/routing.cuh"
#include "../common/scan.cuh"

namespace symmoe {

struct AloneArgs {
  Layout lay;
  int alignment;
  const uint8_t* x;       // [T, H]
  const int32_t* idx;     // [T, K] int32 copy made by the routing
  const float* w;         // [T, K]
  const int32_t* pos;     // [T, 1 + K] the token's row (rank-major), each slot's position in its expert's rows
  const int32_t* counts;  // [1][2 + E] this dispatch's counts row
  Outputs o;
  MoveCfg mc;             // the phases' geometry (expert-major) or the mover's (rank-major)
  Sync sy;  // err: the device word kernels poll, err_host: the host-mapped one
  // Behind this dispatch's route_kernel (placed set), for `tokens` tokens: the kernel starts
  // once each of its `chunks` chunks is marked placed with `epoch`, not on that grid's end
  // (counts is then not read: the routing's last block is still writing it). Expert-major, the
  // experts' counts come from the routing's column totals (expert e at 1 + e), which its last
  // chunk writes before its mark, and round 0's rows load before the marks.
  struct Routed {
    const int64_t* placed;
    int chunks;
    int64_t epoch, tokens;
    const int32_t* totals;
  } routed;
};

// Whole block: every chunk of the routing a.routed names is marked placed (warp 0 waits); false
// when a wait expired (recorded in the ErrorWord, stage kStageRouteChunk).
__device__ __forceinline__ bool routing_placed(const AloneArgs::Routed& r, const Sync& sy, int warp, int lane) {
  bool ok = true;
  if (warp == 0)
    for (int i = lane; i < r.chunks && ok; i += 32)
      ok = wait_at_least_gpu(r.placed + i, r.epoch, sy.timeout_ns, sy.err, sy.err_host, kStageRouteChunk, i, r.epoch);
  return __syncthreads_and(ok) != 0;
}

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

// Rank-major, alone: output row o's metadata for token t, whole warp: lanes < K their slot's id
// e and weight w (0 for a masked slot), lane 0 the source (rank 0, token t, slot 0) and selfmap.
__device__ __forceinline__ void rank_row_meta(const AloneArgs& a, int64_t o, int64_t t, int e, float w, int lane) {
  const int K = static_cast<int>(a.lay.topk), S = static_cast<int>(a.lay.combine_slots);
  if (lane < K) {
    a.o.idx[o * K + lane] = e;
    a.o.w[o * K + lane] = e >= 0 ? w : 0.f;
  }
  if (lane == 0) {
    a.o.src_rank[o] = 0;
    a.o.src_token[o] = static_cast<int32_t>(t);
    a.o.src_slot[o] = 0;
    if (a.o.selfmap != nullptr) a.o.selfmap[t * S] = static_cast<int32_t>(o);
  }
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

// Rank-major: token t's row goes to output row pos[t][0] when one of its slots names an expert
// (alone, every expert is this rank's), with its slots' ids and weights (-1 / 0 for masked
// slots), source rank 0, token t and slot 0. Each warp takes tokens gw, gw + all warps, ...,
// the next token's routing in flight under the current row's copy.
// Behind route_kernel (a.routed.placed) it starts on the chunks' placed marks: the routing's
// last block then still sums the counts and hands them over (3-4 µs at the DeepSeek shape), and
// this kernel, not knowing the rows yet, keeps inside the outputs' capacity instead; with bad ids
// or over capacity the host raises and drops these outputs, as it does when nothing moved.
template <bool kEarly>
__device__ __forceinline__ void alone_rows(const AloneArgs& a) {
  const int K = static_cast<int>(a.lay.topk), PC = 1 + K;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rb = a.lay.row_bytes();
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(a.sy.err);
  __syncthreads();
  if (dead) return;  // an earlier wait failed: the host raises
  int64_t T, rows;
  if constexpr (kEarly) {
    if (!routing_placed(a.routed, a.sy, warp, lane)) return;  // recorded: the host raises
    T = a.routed.tokens;
    rows = a.o.capacity;
  } else {
    T = __ldg(a.counts);
    rows = __ldg(a.counts + 1);
    if (T < 0 || rows > a.o.capacity) return;  // bad ids or over capacity: every block, the host raises
  }
  WarpMover mv;
  mv.init(dyn_smem() + int64_t(warp) * WarpMoverSmem::per_warp_bytes(a.mc.slot_bytes, a.mc.depth), a.mc.slot_bytes,
          a.mc.depth, MoverWatch{a.sy.timeout_ns, a.sy.err, a.sy.err_host, a.sy.epoch});
  const int64_t gw = int64_t(blockIdx.x) * a.mc.warps + warp, nw = int64_t(gridDim.x) * a.mc.warps;
  TokenRoute next = TokenRoute::load(a.idx, a.w, a.pos, gw, K, PC, lane, gw < T);
  for (int64_t t = gw; t < T; t += nw) {
    const TokenRoute cur = next;
    next = TokenRoute::load(a.idx, a.w, a.pos, t + nw, K, PC, lane, t + nw < T);
    if (!__any_sync(0xffffffffu, lane < K && cur.e >= 0)) continue;  // every slot masked: no row
    const int64_t o = cur.pos_of(a.pos, t, PC, 0);
    if (o < 0 || o >= rows) continue;  // only with corrupt inputs; never write out of bounds
    move_row(mv, a.x + t * rb, a.o.x + o * rb, 1, rb, a.mc.slot_bytes, lane);
    rank_row_meta(a, o, t, cur.e, cur.w, lane);
  }
  mv.flush();
}

// kEarly: behind route_kernel with its placed marks (a.routed); a separate instance so that
// every other launch (nvshmem's, the cached and republished dispatches) runs the plain kernel.
template <bool kEarly>
__global__ void __launch_bounds__(kMaxMoverWarps * 32, 1) alone_rows_kernel(AloneArgs a) {
  if (!kEarly) wait_prior_grid();  // launched to follow the routing (or republish) kernel, which may still run
  start_following_grid();  // alone, nothing waits on a peer: a num_worst_tokens tail may be scheduled now
  alone_rows<kEarly>(a);
  // Started on the marks: this grid still ends after the routing's, so whatever follows in the
  // stream (the tail, the host's counts event) sees the routing's last writes.
  if (kEarly) wait_prior_grid();
}

}  // namespace symmoe
