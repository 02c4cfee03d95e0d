// Dispatch kernels, templates on the device transport (csrc/common/transport.cuh):
//
//   route_kernel    routing counts and positions of this rank's tokens (csrc/common/routing.cuh),
//                   one chunk of tokens per block, each walked once; publishes topk
//                   (int32) / weights / positions in the input region, stores this rank's counts
//                   row into every peer, and runs the barrier "dispatch.counts". The layout
//                   alone (get_dispatch_layout) runs the count pass, route.cuh's
//                   route_count_kernel, shared with the NVSHMEM protocol.
//   pull_kernel     receivers fetch the rows meant for them from every source's input region
//                   with bulk copies (peer global -> shared -> local output), the sources'
//                   tokens visited round-robin (RecvPlan::visit), write metadata and zero
//                   padding; barrier "dispatch.done" (sources may overwrite their inputs).
//   push_kernel     senders store rows into the receivers' recv pools (their own rows straight
//                   into the outputs); barrier "dispatch.data".
//   unpack_kernel   receivers copy what peers pushed from the pool into the outputs, one copy
//                   per slot for expert-major (reading a private snapshot of the counts matrix).
//
// Row order is the reference's: rank-major by (source, token); expert-major by (local expert,
// source, token) with each group padded to `alignment` rows of zeros.
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/fanout.cuh"
#include "../common/layout.cuh"
#include "../common/mover.cuh"
#include "../common/outputs.cuh"
#include "../common/phases.cuh"
#include "../common/stamps.cuh"
#include "plan.cuh"
#include "route.cuh"

namespace symmoe {

static_assert(kStampWarps >= kMaxMoverWarps);  // a timeline holds every warp of a data kernel

// The closing barrier of a data kernel: its last block waits for every rank. Alone there is
// no one to wait for, and the ticket and system fences would only lengthen the kernel's tail
// (the next launch on the stream is ordered behind it anyway).
template <class Transport>
__device__ __forceinline__ void grid_barrier(const Transport& tp, const Layout& L, const Sync& sy, bool dead,
                                             int stage) {
  if (L.world_size > 1 && grid_last_block(sy.done) && !dead)
    block_barrier(tp, sy.rank, int(L.world_size), L.barrier, sy.epoch, sy.timeout_ns, sy.err, sy.err_host, stage);
}

// The routing of a dispatch in one launch: each block routes a chunk (route.cuh's
// route_ticketed: one walk over its ids, then its positions after the earlier chunks'); the
// last block to finish stores this rank's counts row into every peer and runs
// "dispatch.counts", so peers pull only once every position is written.
// One walk over the ids (count and first place pass in one), the totals summed once and no
// barrier alone: about 16 µs at W=1, DeepSeek shape (a two-pass form took 22.7). Its phases,
// stamped (last block, µs): ticket 0.8, walk 3.7, is_token_in_rank 1.0, scan 0.9, wait 1.5-2,
// base 2, place 0.6, last-block ticket 1, counts row 1.1, hand-over 2.8.
template <class Transport, typename Idx>
__global__ void __launch_bounds__(kRouteMaxThreads) route_kernel(Transport tp, Layout L, RoutingArgs<Idx> a,
                                                             RouteScratch sc, int32_t* out_per_rank,
                                                             int32_t* out_per_expert, Sync sy) {
  // The data kernel's blocks may take the SMs this grid leaves free (launch_following) once
  // every block got here: alone at once; with peers only past the barrier, as its blocks hold
  // their SMs until this grid ends, and ranks sharing a GPU need SMs for the routing kernels
  // this one waits for.
  if (a.W == 1) start_following_grid();
  const int C = a.columns();
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(sy.err);  // set before the launch: the same for every block
  __syncthreads();
  if (dead) return;
  a.pos = reinterpret_cast<int32_t*>(tp.local + L.in_pos);
  route_ticketed(a, sc, sy.epoch, sy.timeout_ns, sy.err, sy.err_host);
  if (!grid_last_block(sy.done)) return;
  const bool bad = route_ticketed_end(a, sc);
  const int64_t row = 1 + C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int32_t sum = __ldcg(sc.totals + c);
    keep_total(a.W, c, sum, out_per_rank, out_per_expert);
    for (int p = 0; p < a.W; ++p)
      reinterpret_cast<int32_t*>(tp.map(p, L.counts))[int64_t(sy.rank) * row + 1 + c] = sum;
  }
  for (int p = threadIdx.x; p < a.W; p += blockDim.x)
    reinterpret_cast<int32_t*>(tp.map(p, L.counts))[int64_t(sy.rank) * row] = bad ? -1 : a.T;
  block_barrier(tp, sy.rank, a.W, L.barrier, sy.epoch, sy.timeout_ns, sy.err, sy.err_host, kStageDispatchCounts);
  start_following_grid();  // every other block is done (grid_last_block)
  // Every row has arrived: hand the matrix to the host (mapped memory: no copy launch) and
  // to the snapshot, before a peer's next dispatch can overwrite it.
  hand_counts(reinterpret_cast<const int32_t*>(tp.local + L.counts), a.W, a.E, sc.counts_host, sc.counts_snap,
              sc.counts_ready, sy.epoch, sc.summary);
}

// Cached dispatch (dispatch(x, handle=...)): the routing a handle kept goes back where the
// routing kernels leave it (published ids, weights, positions; the counts matrix), then the
// barrier "dispatch.counts" as at the end of route_kernel. One launch: no routing, and
// no copies through torch (which block the host on symmetric memory).
template <class Transport>
__global__ void __launch_bounds__(kRouteThreads) republish_kernel(Transport tp, Layout L, const int4* routing,
                                                                int64_t routing_vecs, const int32_t* counts, Sync sy) {
  if (L.world_size == 1) start_following_grid();  // with peers past the barrier, as route_kernel
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(sy.err);
  __syncthreads();
  if (dead) return;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(gridDim.x) * blockDim.x;
  int4* pub = reinterpret_cast<int4*>(tp.local + L.in_idx);
  for (int64_t i = first; i < routing_vecs; i += step) pub[i] = __ldg(routing + i);
  int32_t* m = reinterpret_cast<int32_t*>(tp.local + L.counts);
  for (int64_t i = first; i < L.world_size * L.counts_cols(); i += step) m[i] = __ldg(counts + i);
  if (!grid_last_block(sy.done)) return;
  block_barrier(tp, sy.rank, int(L.world_size), L.barrier, sy.epoch, sy.timeout_ns, sy.err, sy.err_host,
                kStageDispatchCounts);
  start_following_grid();
}


// ---------------------------------------------------------------------------------------
// kStamps: the timeline build (stamps.cuh), allowed 16 warps' worth of registers so its stamps
// do not spill; the normal build keeps the 1024-thread bound (0: no minimum of blocks).
template <class Transport, bool kStamps = false>
__global__ void __launch_bounds__(kStamps ? kMaxMoverWarps * 32 : 1024, kStamps ? 1 : 0)
    pull_kernel(Transport tp, Layout L, const uint8_t* self_x, Outputs o, bool expert_major, int alignment,
                MoveCfg mc, Sync sy) {
  wait_prior_grid();  // first: launched to follow the routing (or republish) kernel, which may still run
  uint8_t* smem_raw = dyn_smem();
  const int W = int(L.world_size), K = int(L.topk), Le = int(L.local_experts()), r = sy.rank;
  const int PC = int(L.pos_cols()), S = int(L.combine_slots);
  const int64_t rb = L.row_bytes();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  stamp<kStamps>(mc.stamps, kStampEnter);
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(sy.err);
  __syncthreads();
  stamp<kStamps>(mc.stamps, kStampChecked);
  const int32_t* counts = reinterpret_cast<const int32_t*>(tp.local + L.counts);
  // Warp w's first item belongs to visit w / P (RecvPlan::visit: token v / W of source v % W,
  // whatever the counts say): its routing is in flight while the plan is built, as push does.
  // The input regions hold max_tokens rows; a token past the source's count is read, not used.
  const int64_t P = expert_major ? 1 : (rb + mc.slot_bytes - 1) / mc.slot_bytes;
  const int64_t gw = int64_t(blockIdx.x) * mc.warps + warp, nwt = int64_t(gridDim.x) * mc.warps;
  const int s0 = int((gw / P) % W);
  const int64_t t0 = gw / P / W;
  const TokenRoute first = TokenRoute::load(reinterpret_cast<const int32_t*>(tp.map(s0, L.in_idx)),
                                            reinterpret_cast<const float*>(tp.map(s0, L.in_w)),
                                            reinterpret_cast<const int32_t*>(tp.map(s0, L.in_pos)), t0, K, PC, lane,
                                            !dead && t0 < L.max_tokens);
  RecvPlan pl;
  pl.carve(smem_raw, W, Le);
  int64_t rows = 0;
  if (!dead) rows = pl.build(counts, L, r, expert_major, alignment);
  stamp<kStamps>(mc.stamps, kStampTables);
  const bool run = !dead && rows <= o.capacity && counts_valid(counts, L);
  stamp<kStamps>(mc.stamps, kStampBuilt);

  if (run && expert_major) fill_padding(pl.goff, [&](int j) { return pl.gcnt[j]; }, Le, o, rb);

  // The phased fan-out keeps whole rows where the mover's slots would be: no mover then (an
  // mbarrier's memory is not reused without invalidating it).
  WarpMover mv;
  if (mc.phase_rows == 0)
    mv.init(smem_raw + mc.plan_bytes + int64_t(warp) * WarpMoverSmem::per_warp_bytes(mc.slot_bytes, mc.depth),
            mc.slot_bytes, mc.depth, MoverWatch{sy.timeout_ns, sy.err, sy.err_host, sy.epoch});
  stamp<kStamps>(mc.stamps, kStampPlanned);
  bool pushed = false;  // the timeline's first push (kStamps only)

  // Warp w owns items w, w + nwt, ...; item it of `items` (P per visit) is piece it % P of
  // visit it / P (RecvPlan::visit: the sources round-robin). A token's routing is read across
  // the lanes in one round (TokenRoute, as push reads it), one item ahead of the copy: with
  // peers it is a round trip over the link, and no copy waits on it.
  auto it_route = [&](int64_t it, int64_t items) {
    int s;
    int64_t t;
    if (it >= items || !pl.visit(it / P, W, s, t)) return TokenRoute{-1, 0.f, 0};
    return TokenRoute::load(reinterpret_cast<const int32_t*>(tp.map(s, L.in_idx)),
                            reinterpret_cast<const float*>(tp.map(s, L.in_w)),
                            reinterpret_cast<const int32_t*>(tp.map(s, L.in_pos)), t, K, PC, lane, true);
  };

  if (run && !expert_major) {
    // Rank-major: one output row per token, moved in P pieces (pieces spread the tail over
    // more warps).
    const int64_t items = pl.visits(W) * P;
    TokenRoute next = first;
    for (int64_t it = gw; it < items; it += nwt) {
      const TokenRoute cur = next;
      next = it_route(it + nwt, items);
      int s;
      int64_t t;
      if (!pl.visit(it / P, W, s, t)) continue;  // warp-uniform
      const int64_t off = (it % P) * mc.slot_bytes;
      const bool own = cur.e >= 0 && cur.e / Le == r;  // lanes < K: this slot's expert is here
      const bool mine = __ballot_sync(0xffffffffu, own) != 0;
      const int p = cur.pos_of(reinterpret_cast<const int32_t*>(tp.map(s, L.in_pos)), t, PC, r);
      int64_t row = mine ? pl.rbase[s] + p : -1;
      if (row >= rows) row = -1;  // only with corrupt inputs; never write out of bounds
      if (row < 0) continue;      // warp-uniform
      if (off == 0) {
        if (lane < K) {
          o.idx[row * K + lane] = own ? int64_t(cur.e - r * Le) : -1;
          o.w[row * K + lane] = own ? cur.w : 0.f;
        }
        if (lane == 0) {
          o.src_rank[row] = s;
          o.src_token[row] = int32_t(t);
          o.src_slot[row] = r;
          if (s == r && o.selfmap != nullptr) o.selfmap[t * S + r] = int32_t(row);
        }
      }
      const uint8_t* src = (s == r ? self_x : tp.map(s, L.in_x)) + t * rb + off;
      if (!pushed) stamp<kStamps>(mc.stamps, kStampRouted);
      if (lane == 0) mv.next_dsts()[0] = o.x + row * rb + off;
      __syncwarp();
      mv.push(src, 1, uint32_t(min(int64_t(mc.slot_bytes), rb - off)));
      if (!pushed) {
        stamp<kStamps>(mc.stamps, kStampFirstPush);
        pushed = true;
      }
    }
  }
  // Expert-major: visit (s, t)'s destination rows (lanes < n), its slots' metadata written.
  auto expert_rows = [&](const TokenRoute& cur, int s, int64_t t) {
    const int e = cur.e;  // -1 on lanes >= K
    const bool mine = e >= 0 && e / Le == r;
    if (__ballot_sync(0xffffffffu, mine) == 0) return RowDsts{nullptr, 0};
    const int slot_pos = cur.pos_of(reinterpret_cast<const int32_t*>(tp.map(s, L.in_pos)), t, PC, W + lane);
    int64_t my_row = -1;  // lane k: destination row of slot k
    if (mine) {
      const int j = e - r * Le;
      my_row = pl.src_offset(counts, L, r, s, j) + slot_pos;
      if (my_row >= rows) my_row = -1;
    }
    if (my_row >= 0) {
      o.idx[my_row] = e - r * Le;
      o.w[my_row] = cur.w;
      o.src_rank[my_row] = s;
      o.src_token[my_row] = int32_t(t);
      o.src_slot[my_row] = lane;
      if (s == r && o.selfmap != nullptr) o.selfmap[t * S + lane] = int32_t(my_row);
    }
    int n;
    my_row = compact_lanes(my_row >= 0, my_row, lane, n);
    return RowDsts{lane < n ? o.x + my_row * rb : nullptr, n};
  };
  if (run && expert_major && mc.phase_rows > 0) {
    // World size 1 (the host sets phase_rows only there): visit v is this rank's token v.
    fan_in_phases<kStamps>(self_x, pl.visits(W), rb, mc, smem_raw, sy,
                  [&](int64_t v) {
                    int s;
                    int64_t t;
                    if (!pl.visit(v, W, s, t)) return RowDsts{nullptr, 0};  // warp-uniform
                    return expert_rows(it_route(v, pl.visits(W)), s, t);
                  },
                  warp, lane);
  } else if (run && expert_major) {
    // One item per visit; its routing is read one visit ahead, as in the rank-major path.
    const int64_t items = pl.visits(W);
    TokenRoute next = first;
    for (int64_t v = gw; v < items; v += nwt) {
      const TokenRoute cur = next;
      next = it_route(v + nwt, items);
      int s;
      int64_t t;
      if (!pl.visit(v, W, s, t)) continue;  // warp-uniform
      const RowDsts d = expert_rows(cur, s, t);
      if (d.n == 0) continue;
      const uint8_t* src = (s == r ? self_x : tp.map(s, L.in_x)) + t * rb;
      if (!pushed) stamp<kStamps>(mc.stamps, kStampRouted);
      for (int64_t off = 0; off < rb; off += mc.slot_bytes) {
        const uint32_t bytes = uint32_t(min(int64_t(mc.slot_bytes), rb - off));
        if (lane < d.n) mv.next_dsts()[lane] = d.dst + off;
        __syncwarp();
        mv.push(src + off, d.n, bytes);
      }
      if (!pushed) {
        stamp<kStamps>(mc.stamps, kStampFirstPush);
        pushed = true;
      }
    }
  }
  stamp<kStamps>(mc.stamps, kStampLoopEnd);
  if (mc.phase_rows == 0) mv.flush();
  stamp<kStamps>(mc.stamps, kStampFlushed);
  grid_barrier(tp, L, sy, dead, kStageDispatchDone);
}

// ---------------------------------------------------------------------------------------
// One token of a push sender (every lane; cur: its routing, read one token ahead). Writes the
// metadata of every row it sends, own rows' straight into the outputs (unless !own: this
// rank's outputs are too small, the peers still get theirs) and peers' into their pools, and
// returns the destination rows: lanes < n hold their addresses. Rank-major: one row per
// destination rank (the lanes of each rank's first slot, `firsts`). Expert-major: own slots
// one row each, straight into the output; peers one row per destination rank into its pool
// (rank-major position) with the output row of each of its slots: the receiver fans it out
// locally, so a row crosses the link once however many of the receiver's experts it goes to.
struct PushDsts {
  uint8_t* dst;     // lane i < n: destination row address
  int n;
  int owner;        // this lane's slot's rank (-1: none)
  uint32_t firsts;  // lanes of each destination rank's first slot
};

template <class Transport>
__device__ __forceinline__ PushDsts push_token(const Transport& tp, const Layout& L, const SendPlan& pl,
                                               const int32_t* counts, const int32_t* ppos, const Outputs& o,
                                               const TokenRoute& cur, int64_t t, bool expert_major, int me, bool own,
                                               int lane) {
  const int W = int(L.world_size), K = int(L.topk), Le = int(L.local_experts());
  const int PC = int(L.pos_cols()), S = int(L.combine_slots);
  const int64_t rb = L.row_bytes();
  const int e = cur.e;
  const float wt = cur.w;
  const int owner = e >= 0 ? e / Le : -1;
  uint8_t* dst_x = nullptr;
  int n = 0;
  bool first = owner >= 0;
  for (int kk = 0; kk < K; ++kk) {
    const int okk = __shfl_sync(0xffffffffu, owner, kk);
    if (kk < lane && okk == owner) first = false;
  }
  const uint32_t firsts = __ballot_sync(0xffffffffu, first);
  if (!expert_major) {
    const int nf = __popc(firsts);
    for (int i = 0; i < nf; ++i) {
      const int fl = __fns(firsts, 0, i + 1);
      const int q = __shfl_sync(0xffffffffu, owner, fl);
      const int64_t row = pl.rbase[q] + cur.pos_of(ppos, t, PC, q);
      const bool mine = owner == q;
      if (q == me && !own) continue;
      if (q == me && !o.split()) {
        if (lane < K) {
          o.idx[row * K + lane] = mine ? int64_t(e - q * Le) : -1;
          o.w[row * K + lane] = mine ? wt : 0.f;
        }
        if (lane == 0) {
          o.src_rank[row] = me;
          o.src_token[row] = int32_t(t);
          o.src_slot[row] = q;
          if (o.selfmap != nullptr) o.selfmap[t * S + q] = int32_t(row);
        }
      } else {
        if (lane < K) {
          reinterpret_cast<int32_t*>(tp.map(q, L.recv_idx))[row * K + lane] = mine ? e - q * Le : -1;
          reinterpret_cast<float*>(tp.map(q, L.recv_w))[row * K + lane] = mine ? wt : 0.f;
        }
        if (lane == 0) reinterpret_cast<int32_t*>(tp.map(q, L.recv_src))[row] = int32_t(t * S + q);
        // Split outputs: own rows go through the own pool as a peer's (the unpack splits them),
        // at the output row they take directly (the pool's rows are the rank-major outputs').
        if (q == me && lane == 0 && o.selfmap != nullptr) o.selfmap[t * S + q] = int32_t(row);
      }
      uint8_t* d = (q == me && !o.split() ? o.x : tp.map(q, L.recv_x)) + row * rb;
      if (lane == n) dst_x = d;
      ++n;
    }
    return PushDsts{dst_x, n, owner, firsts};
  }
  uint8_t* d = nullptr;
  int64_t out_row = -1;  // this slot's expert-major row in its owner's output
  const int slot_pos = cur.pos_of(ppos, t, PC, W + lane);
  if (owner >= 0) {
    const int j = e - owner * Le;
    out_row = pl.goff[int64_t(owner) * (Le + 1) + j] + slot_pos;
    for (int q = 0; q < me; ++q) out_row += count_at(counts, L, q, 1 + W + e);
  }
  if (owner == me && own && o.split()) {  // through the own pool below; combine's map still here
    if (o.selfmap != nullptr) o.selfmap[t * S + lane] = int32_t(out_row);
  } else if (owner == me && own) {
    o.idx[out_row] = e - me * Le;
    o.w[out_row] = wt;
    o.src_rank[out_row] = me;
    o.src_token[out_row] = int32_t(t);
    o.src_slot[out_row] = lane;
    if (o.selfmap != nullptr) o.selfmap[t * S + lane] = int32_t(out_row);
    d = o.x + out_row * rb;
  }
  // Split outputs: this rank among the "peers" (its pool, then the unpack), when `own`.
  const uint32_t peers = firsts & ~__ballot_sync(0xffffffffu, owner == me && !(o.split() && own));
  for (int i = 0; i < __popc(peers); ++i) {
    const int fl = __fns(peers, 0, i + 1);
    const int q = __shfl_sync(0xffffffffu, owner, fl);
    const int64_t prow = pl.rbase[q] + cur.pos_of(ppos, t, PC, q);
    if (lane < K) {
      reinterpret_cast<int32_t*>(tp.map(q, L.recv_idx))[prow * K + lane] = owner == q ? int32_t(out_row) : -1;
      reinterpret_cast<float*>(tp.map(q, L.recv_w))[prow * K + lane] = owner == q ? wt : 0.f;
    }
    if (lane == 0) reinterpret_cast<int32_t*>(tp.map(q, L.recv_src))[prow] = int32_t(t * S);
    if (lane == fl) d = tp.map(q, L.recv_x) + prow * rb;
  }
  dst_x = reinterpret_cast<uint8_t*>(compact_lanes(d != nullptr, reinterpret_cast<uint64_t>(d), lane, n));
  return PushDsts{dst_x, n, owner, firsts};
}

// ---------------------------------------------------------------------------------------
// The recv pool is rank-major in both layouts: one row per (source, token), the source's
// block at its rank-major offset. Per row: recv_src = t * S (+ this rank, rank-major) and K
// int32 / f32 entries: rank-major the local expert ids and weights of the row's slots (-1 / 0
// for other ranks' slots); expert-major each slot's row in the output (-1: not this rank's).
// kStamps: the timeline build (stamps.cuh), allowed 16 warps' worth of registers so its stamps
// do not spill; the normal build keeps the 1024-thread bound (0: no minimum of blocks).
template <class Transport, bool kStamps = false>
__global__ void __launch_bounds__(kStamps ? kMaxMoverWarps * 32 : 1024, kStamps ? 1 : 0)
    push_kernel(Transport tp, Layout L, const uint8_t* x, Outputs o, bool expert_major, int alignment,
                MoveCfg mc, Sync sy) {
  wait_prior_grid();  // first: launched to follow the routing (or republish) kernel, which may still run
  uint8_t* smem_raw = dyn_smem();
  const int W = int(L.world_size), K = int(L.topk), Le = int(L.local_experts()), me = sy.rank;
  const int PC = int(L.pos_cols());
  const int64_t rb = L.row_bytes();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  stamp<kStamps>(mc.stamps, kStampEnter);
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(sy.err);
  __syncthreads();
  stamp<kStamps>(mc.stamps, kStampChecked);
  const int32_t* counts = reinterpret_cast<const int32_t*>(tp.local + L.counts);
  const int32_t* pidx = reinterpret_cast<const int32_t*>(tp.local + L.in_idx);
  const float* pw = reinterpret_cast<const float*>(tp.local + L.in_w);
  const int32_t* ppos = reinterpret_cast<const int32_t*>(tp.local + L.in_pos);
  const int64_t gw = int64_t(blockIdx.x) * mc.warps + warp, nwt = int64_t(gridDim.x) * mc.warps;
  // The first token's routing is in flight while the plan is built (the input region holds
  // max_tokens rows; a row past this dispatch's tokens is never used).
  TokenRoute next = TokenRoute::load(pidx, pw, ppos, gw, K, PC, lane, !dead && gw < L.max_tokens);
  SendPlan pl;
  pl.carve(smem_raw, W, Le);
  bool run = !dead && counts_valid(counts, L);
  if (run) {
    pl.build(counts, L, me, expert_major, alignment);
    stamp<kStamps>(mc.stamps, kStampTables);
    for (int q = 0; q < W; ++q) run = run && pl.rows[q] <= L.recv_rows && (q != me || pl.rows[q] <= o.capacity);
  }
  stamp<kStamps>(mc.stamps, kStampBuilt);
  // Alone, no unpack follows (nothing was pushed to a pool): the group starts and the
  // padding rows of the expert-major output are written here.
  if (run && expert_major && W == 1)
    fill_padding(pl.goff, [&](int j) { return count_at(counts, L, 0, 2 + j); }, Le, o, rb);
  WarpMover mv;  // not with the phased fan-out (its rows use the slots' memory)
  if (mc.phase_rows == 0)
    mv.init(smem_raw + mc.plan_bytes + int64_t(warp) * WarpMoverSmem::per_warp_bytes(mc.slot_bytes, mc.depth),
            mc.slot_bytes, mc.depth, MoverWatch{sy.timeout_ns, sy.err, sy.err_host, sy.epoch});
  stamp<kStamps>(mc.stamps, kStampPlanned);

  if (run && mc.phase_rows > 0) {
    // World size 1 expert-major (the host sets phase_rows only there): every token is own.
    fan_in_phases<kStamps>(x, counts[int64_t(me) * L.counts_cols()], rb, mc, smem_raw, sy,
                  [&](int64_t t) {
                    const TokenRoute cur = TokenRoute::load(pidx, pw, ppos, t, K, PC, lane, true);
                    const PushDsts d = push_token(tp, L, pl, counts, ppos, o, cur, t, expert_major, me, true, lane);
                    return RowDsts{d.dst, d.n};
                  },
                  warp, lane);
  } else if (run) {
    const int64_t T = counts[int64_t(me) * L.counts_cols()];
    const int64_t head = mc.x_tail != nullptr ? mc.x_head : rb;  // MoveCfg::x_tail
    for (int64_t t = gw; t < T; t += nwt) {
      const TokenRoute cur = next;
      next = TokenRoute::load(pidx, pw, ppos, t + nwt, K, PC, lane, t + nwt < T);
      const PushDsts d = push_token(tp, L, pl, counts, ppos, o, cur, t, expert_major, me, true, lane);
      if (t == gw) stamp<kStamps>(mc.stamps, kStampRouted);
      if (d.n)
        move_row(mv, x + t * head, d.dst, d.n, rb, mc.slot_bytes, lane, head,
                 mc.x_tail == nullptr ? nullptr : mc.x_tail + t * (rb - head));
      if (t == gw) stamp<kStamps>(mc.stamps, kStampFirstPush);
    }
  }
  stamp<kStamps>(mc.stamps, kStampLoopEnd);
  if (mc.phase_rows == 0) mv.flush();
  stamp<kStamps>(mc.stamps, kStampFlushed);
  grid_barrier(tp, L, sy, dead, kStageDispatchData);
}

// One pool row (from source s) into the outputs, every lane: rank-major to the same row;
// expert-major to one output row per slot that names a local expert. rows: the outputs' rows.
// Reads go through L2 (ld.global.cg): the streamed push reads rows while peers still store
// neighbouring ones, and a line cached in L1 earlier could hold their old bytes.
template <class Transport>
__device__ __forceinline__ void unpack_row(const Transport& tp, const Layout& L, const RecvPlan& pl, const Outputs& o,
                                           int64_t row, int s, int64_t rows, bool expert_major, int lane) {
  const int K = int(L.topk), Le = int(L.local_experts()), S = int(L.combine_slots);
  const int64_t rb = L.row_bytes();
  const uint8_t* px = tp.local + L.recv_x;
  const int32_t* pidx = reinterpret_cast<const int32_t*>(tp.local + L.recv_idx);
  const float* pw = reinterpret_cast<const float*>(tp.local + L.recv_w);
  const int32_t src = __ldcg(reinterpret_cast<const int32_t*>(tp.local + L.recv_src) + row);
  if (!expert_major) {
    if (row >= rows) return;  // only with corrupt inputs; never write out of bounds
    // The row's words are loaded before its copy and stored after it (their round trip runs
    // under the copy); the copy keeps 7 loads in flight per lane, where a load-store loop had
    // one: each store may alias the next load, so nothing reordered them.
    const int32_t ri = lane < K ? __ldcg(pidx + row * K + lane) : 0;
    const float rw = lane < K ? __ldcg(pw + row * K + lane) : 0.f;
    if (o.split()) warp_fanout_fp8_row(o, row, 1, px + row * rb, lane);
    else warp_fanout_row(o.x + row * rb, 1, px + row * rb, rb, lane);
    if (lane < K) {
      o.idx[row * K + lane] = ri;
      o.w[row * K + lane] = rw;
    }
    if (lane == 0) {
      o.src_rank[row] = s;
      o.src_token[row] = src / S;
      o.src_slot[row] = src % S;
    }
    return;
  }
  // Each slot's output row (needed before the copy) and weight (after it) load together.
  int64_t mine = lane < K ? __ldcg(pidx + row * K + lane) : -1;
  const float wt = lane < K ? __ldcg(pw + row * K + lane) : 0.f;
  if (mine >= rows) mine = -1;  // only with corrupt inputs; never write out of bounds
  int n;
  const int64_t dst = compact_lanes(mine >= 0, mine, lane, n);
  if (o.split()) warp_fanout_fp8_row(o, max(dst, int64_t(0)), n, px + row * rb, lane);
  else warp_fanout_row(o.x + max(dst, int64_t(0)) * rb, n, px + row * rb, rb, lane);
  if (mine >= 0) {
    o.idx[mine] = group_of(pl.goff, Le, mine);
    o.w[mine] = wt;
    o.src_rank[mine] = s;
    o.src_token[mine] = src / S;
    o.src_slot[mine] = lane;
  }
}

// ---------------------------------------------------------------------------------------
// Local: copy the rows peers pushed into this rank's pool to the outputs (expert-major: one
// copy per slot, so each row crossed the link once); padding rows. Split outputs
// (Outputs::split): the own rows too, which the push kernel left in the pool.
constexpr int kUnpackThreads = 512;

template <class Transport>
__global__ void __launch_bounds__(kUnpackThreads, 1) unpack_kernel(Transport tp, Layout L, const int32_t* counts, Outputs o,
                                                      bool expert_major, int alignment, ErrorWord* err, int rank) {
  uint8_t* smem_raw = dyn_smem();
  const int W = int(L.world_size), Le = int(L.local_experts()), r = rank;
  const int64_t rb = L.row_bytes();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(err);
  __syncthreads();
  if (dead) return;
  // `counts` is a private snapshot: once "dispatch.data" passed, peers may already store the
  // next call's rows into the shared matrix.
  if (!counts_valid(counts, L)) return;
  RecvPlan pl;
  pl.carve(smem_raw, W, Le);
  const int64_t rows = pl.build(counts, L, r, expert_major, alignment);
  if (rows > o.capacity || rows > L.recv_rows) return;
  if (expert_major) fill_padding(pl.goff, [&](int j) { return pl.gcnt[j]; }, Le, o, rb);
  const int64_t pool_rows = pl.rbase[W];
  const int64_t gw = int64_t(blockIdx.x) * warps + warp, nwt = int64_t(gridDim.x) * warps;
  for (int64_t row = gw; row < pool_rows; row += nwt) {
    int s = 0;
    while (s + 1 < W && pl.rbase[s + 1] <= row) ++s;
    if (s == r && !o.split()) continue;  // own rows were written straight into the outputs
    unpack_row(tp, L, pl, o, row, s, rows, expert_major, lane);
  }
}

}  // namespace symmoe
