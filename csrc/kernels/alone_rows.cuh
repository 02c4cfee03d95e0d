// The world-size-1 rank-major dispatch (alone_rows_kernel): each routed token's row to its
// output row by the bulk-copy mover (common/mover.cuh), as push's own rows move.
#pragma once
#include <cstdint>

#include "../common/mover.cuh"
#include "../common/routing.cuh"
#include "alone_args.cuh"

namespace symmoe {

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
