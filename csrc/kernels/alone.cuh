// A dispatch alone (one rank), from plain routing tables: no peer, no pool, so every row goes
// from x straight to its output rows. The NVSHMEM protocol launches these alone in place of
// its dispatch_kernel (alone_fan_routed_kernel also of its plan kernel). They need no
// transport, so they are built into symmoe_cuda, compiled whole as the CUDA protocols' data
// kernels are: built into the NVSHMEM module (relocatable device code), the fan-out ran 205 µs
// against 142 here (sessions 28-29), and that module's dispatch_kernel spills registers.
//   alone_fan_kernel   expert-major: the phased fan-out (common/phases.cuh, kernel.fan_phases),
//                      whole rows loaded into shared memory, then bulk-stored to every slot's row;
//   alone_rows_kernel  rank-major: each routed token's row to its output row by the bulk-copy
//                      mover (common/mover.cuh), as push's own rows move;
//   alone_fan_routed_kernel  a dispatch that routes: the routing in the first blocks to take a
//                      ticket, then either fan-out in phases (rank-major one row a token).
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/outputs.cuh"
#include "../common/phases.cuh"
#include "../common/routing.cuh"
#include "../common/scan.cuh"
#include "route.cuh"

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
  // chunk writes before its mark, and round 0's rows load before the marks. summed (where the
  // routing keeps RouteScratch::sums): the plan is built from `sums` once every chunk added its
  // counts (summed == chunks), and each token's row waits for its own chunk's mark (nullptr:
  // from `totals` once every chunk is placed). The last block to read sums zeroes them, summed
  // and `readers` (RouteScratch::sums_readers) for the next launch.
  struct Routed {
    const int64_t* placed;
    int chunks;
    int64_t epoch, tokens;
    const int32_t* totals;
    int32_t* sums;
    unsigned int *summed, *readers;
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

// Whole block, expert-major behind its routing: waits for what the plan reads (with sums, every
// chunk's counts added there; else every chunk placed) and returns those column totals (expert
// e at 1 + e); nullptr when a wait expired (recorded: the host raises).
__device__ __forceinline__ const int32_t* routing_totals(const AloneArgs::Routed& r, const Sync& sy, int warp,
                                                         int lane) {
  if (r.summed == nullptr) return routing_placed(r, sy, warp, lane) ? r.totals : nullptr;
  const bool ok = __syncthreads_and(threadIdx.x != 0 || wait_at_least_gpu(r.summed, unsigned(r.chunks), sy.timeout_ns,
                                                                         sy.err, sy.err_host, kStageRouteChunk,
                                                                         r.chunks - 1, r.epoch)) != 0;
  return ok ? r.sums : nullptr;
}

// Whole block, once every thread of it has read r's sums (after a barrier): the last block of
// the grid to do so zeroes sums[0, n), summed and readers for the next launch.
__device__ __forceinline__ void release_sums(const AloneArgs::Routed& r, int n) {
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(r.readers, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  for (int c = threadIdx.x; c < n; c += blockDim.x) r.sums[c] = 0;
  if (threadIdx.x == 0) *r.summed = 0u, *r.readers = 0u;
}

// Whole warp: token t's chunk of the routing a.routed names is marked placed (lane 0 waits; its
// acquire is ordered before the other lanes' reads, which must bypass L1: lines of other chunks
// may lie there). False when the wait expired or an earlier one did (recorded: the host raises).
__device__ __forceinline__ bool token_placed(const AloneArgs& a, int64_t t, int lane) {
  const AloneArgs::Routed& r = a.routed;
  const int64_t per = (r.tokens + r.chunks - 1) / r.chunks;  // RoutingArgs::chunk_begin's split
  int placed = 1;
  if (lane == 0)
    placed = !error_set(a.sy.err) && wait_at_least_gpu(r.placed + t / per, r.epoch, a.sy.timeout_ns, a.sy.err,
                                                        a.sy.err_host, kStageRouteChunk, int(t / per), r.epoch);
  __syncwarp();
  return __shfl_sync(0xffffffffu, placed, 0) != 0;
}

// Shared tables before the phases' rows: goff [E + 1] (read by the phases), then gcnt [E] and
// the scan's scratch, which only the build and the padding read.
struct FanPlan {
  int32_t *goff, *gcnt, *tmp;
  static constexpr int kScanTmp = kMaxMoverWarps + 1;
  __host__ __device__ static int64_t kept_bytes(int64_t E) { return 4 * (E + 1); }
  __host__ __device__ static int64_t bytes(int64_t E) { return 4 * (2 * E + 1 + kScanTmp); }
};

// The expert-major fan-out from a routing (alone_fan_kernel, alone_fan_routed_kernel), whole
// block, dyn smem `smem`. kEarly: a.routed names the routing chunks' placed marks and their
// totals, and the rows lie past all of FanPlan with round 0's already loading (fan_begin);
// `leave` runs on every early exit.
// Bad ids are then not known yet: the kernel keeps inside the outputs and the ids' range, and the
// host raises and drops these outputs as it does when nothing moved.
template <bool kEarly, class Leave, bool kStamps = false>
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
  if (kEarly && (totals = routing_totals(a.routed, a.sy, warp, lane)) == nullptr) return leave();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int32_t g = kEarly ? __ldcg(totals + 1 + e) : __ldg(a.counts + 2 + e);
    pl.gcnt[e] = g;
    pl.goff[e] = (g + a.alignment - 1) / a.alignment * a.alignment;
  }
  __syncthreads();
  if (kEarly && a.routed.summed != nullptr) release_sums(a.routed, E + 1);
  const int32_t rows = block_exclusive_scan(pl.goff, E, pl.tmp);
  const int64_t T = kEarly ? a.routed.tokens : __ldg(a.counts);
  // Bad ids or over capacity: every block, the host raises.
  if (T < 0 || rows > a.o.capacity) return leave();
  if (threadIdx.x == 0) pl.goff[E] = rows;
  __syncthreads();
  fill_padding(pl.goff, [&](int j) { return pl.gcnt[j]; }, E, a.o, rb);
  stamp<kStamps>(a.mc.stamps, kStampPlanned);
  const int64_t PC = 1 + K;
  fan_in_phases<kStamps, kEarly, true>(a.x, T, rb, a.mc, smem, a.sy,
                       [&](int64_t t) {
                         if (kEarly && a.routed.summed != nullptr && !token_placed(a, t, lane))
                           return RowDsts{nullptr, 0};  // recorded: the host raises
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

// Rank-major in phases, on the routing (a.routed; round 0's rows already loading, fan_begin):
// token t's row to its one output row pos[t][0] when one of its slots names an expert, with the
// slots' ids and weights (-1 / 0 for masked slots), source rank 0, token t and slot 0, as
// alone_rows writes it. pos[t][0] is final once t's own chunk is placed, so each warp waits for
// that one mark, not for every chunk (token_placed).
// The rows are not known yet (the routing's end may still run): the kernel keeps inside the
// outputs' capacity, and the host raises and drops these outputs on bad ids or over capacity.
template <class Leave, bool kStamps = false>
__device__ __forceinline__ void alone_rows_fan(const AloneArgs& a, uint8_t* smem, int warp, int lane, Leave leave) {
  const int K = static_cast<int>(a.lay.topk), PC = 1 + K;
  const int64_t rb = a.lay.row_bytes(), rows = a.o.capacity, T = a.routed.tokens;
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(a.sy.err);
  __syncthreads();
  if (dead) return leave();  // an earlier wait failed: the host raises
  stamp<kStamps>(a.mc.stamps, kStampPlanned);
  fan_in_phases<kStamps, true, true>(a.x, T, rb, a.mc, smem, a.sy,
                             [&](int64_t t) {
                               if (!token_placed(a, t, lane)) return RowDsts{nullptr, 0};  // recorded
                               int e = -1;
                               float w = 0.f;
                               if (lane < K) {
                                 e = __ldcg(a.idx + t * K + lane);
                                 w = __ldcg(a.w + t * K + lane);
                               }
                               int64_t o = __any_sync(0xffffffffu, lane < K && e >= 0) ? int64_t(__ldcg(a.pos + t * PC)) : -1;
                               if (o >= rows) o = -1;  // only with corrupt inputs; never write out of bounds
                               if (o >= 0) rank_row_meta(a, o, t, e, w, lane);
                               return RowDsts{a.o.x + max(o, int64_t(0)) * rb, o >= 0 ? 1 : 0};
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

// The routing that alone_fan_routed_kernel does itself: route_kernel's arguments (a.chunks
// chunks, fewer than the grid's blocks; sc.part at `stride` int32 a chunk, a multiple of 4), its
// epoch, the shared tables of a routing block at smem + tables_off ([stride] + [warps][C] int32,
// over the tiles of warps >= delayed, which load their round 0 rows once the routing is done),
// and this rank's counts row ([1 + C], row 0 of the counts matrix) that its end writes.
template <typename Idx>
struct OwnRouting {
  RoutingArgs<Idx> a;
  RouteScratch sc;
  int stride;
  int64_t epoch;
  int64_t tables_off;
  int delayed;
  int32_t* counts_row;
};

// The routed kernel's timeline has no loop end of its own (its rounds end on their stores'
// completion, flushed); that mark holds its routing chunk's counted mark instead
// (timeline.ROUTED_MARKS).
constexpr int kStampRoutedCounted = kStampLoopEnd;

// World size 1, a dispatch that routes: the routing and the fan-out in one launch, so no
// routing grid comes first; expert-major (kExpert) each row to its slots' rows, rank-major to its
// one row (alone_rows_fan). Each block takes a ticket: tickets < f.a.chunks route that chunk
// (route_chunk_marked; kOwnChunkTokens a chunk, so its walk and the sums are short) and issue
// round 0's row loads after it; the other blocks issue theirs at once (but for the rows where a
// routing block's tables lie, after its routing would be done), and the last ticket (never a
// routing one) does the routing's end: the bad-id flag, the counts row and the hand-over to the
// host (hand_counts). A routing chunk's global round trips queue behind the loads in flight, and
// its own add to them (session 36: expert-major kernel 147 -> 145 µs, rank-major within 1 µs,
// the ticket before any load 7 -> 0.4 µs). Then expert-major every block builds its plan on the
// column totals the chunks add as they are counted (RouteScratch::sums) and each row waits for
// its own chunk's placed mark (rank-major only the latter), and fans out. Launched after the stream's
// earlier work ended (x, topk_idx and topk_weights are read at once).
// kStamps: the timeline's build (a.mc.stamps; timeline.ROUTED_PHASES says what its marks mean),
// its rows in ticket order (row b: the block that took ticket b; timeline.rows_at reads them).
template <bool kExpert, typename Idx, bool kStamps = false>
__global__ void __launch_bounds__(kMaxMoverWarps * 32, 1) alone_fan_routed_kernel(AloneArgs a, OwnRouting<Idx> f) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, C = f.a.columns();
  const int64_t rb = a.lay.row_bytes();
  uint8_t* smem = dyn_smem();
  [[maybe_unused]] StampTime entered;
  if constexpr (kStamps) entered = StampTime::now();
  start_following_grid();  // alone, nothing waits on a peer: a num_worst_tokens tail may be scheduled now
  __shared__ int ticket;
  __shared__ bool dead;
  if (threadIdx.x == 0) {
    dead = error_set(a.sy.err);
    ticket = int(atomicAdd(f.sc.ticket, 1u));
    if (ticket == int(gridDim.x) - 1) *f.sc.ticket = 0u;  // every block has its ticket: zero for the next launch
  }
  __syncthreads();
  const int b = ticket;
  if constexpr (kStamps) {
    a.mc.stamps = stamp_rows_as(a.mc.stamps, b);
    stamp_at(a.mc.stamps, blockIdx.x, kStampEnter, entered);
  }
  stamp<kStamps>(a.mc.stamps, kStampChecked);
  const bool routes = b < f.a.chunks;
  if (!routes) fan_begin(a.x, a.routed.tokens, rb, a.mc, smem, warp, lane, f.delayed);
  bool ok = !dead;
  if (ok && routes)
    ok = route_chunk_marked<true>(f.a, f.sc, b, f.stride, reinterpret_cast<int32_t*>(smem + f.tables_off), f.epoch,
                                  a.sy.timeout_ns, a.sy.err, a.sy.err_host,
                                  [&](RouteStep step) {
                                    stamp<kStamps>(a.mc.stamps, step == RouteStep::kWalked    ? kStampWalked
                                                                : step == RouteStep::kScanned ? kStampScanned
                                                                                              : kStampRoutedCounted);
                                  });
  if (!routes) stamp<kStamps>(a.mc.stamps, kStampRoutedCounted);  // no chunk: at once
  stamp<kStamps>(a.mc.stamps, kStampTables);
  if (routes) {
    __syncthreads();  // the tables are done: every warp's row may load
    fan_begin(a.x, a.routed.tokens, rb, a.mc, smem, warp, lane);
  } else {
    fan_begin_rest(a.x, a.routed.tokens, rb, a.mc, smem, warp, lane, f.delayed);
  }
  if (ok && b == int(gridDim.x) - 1) {
    // Every chunk counted: the bad-id flag is final, and the totals are the chunks' sums.
    for (int i = threadIdx.x; i < f.a.chunks && ok; i += blockDim.x)
      ok = wait_at_least_gpu(f.sc.counted + i, f.epoch, a.sy.timeout_ns, a.sy.err, a.sy.err_host, kStageRouteChunk,
                             i, f.epoch);
    ok = __syncthreads_and(ok) != 0;
    if (ok) {
      int32_t* totals = reinterpret_cast<int32_t*>(smem);  // FanPlan's tables, built after this
      chunk_sum_vec(f.sc.part, f.stride, f.a.chunks, totals);
      const bool bad = route_ticketed_end(f.a, f.sc);
      for (int c = threadIdx.x; c < C; c += blockDim.x) f.counts_row[1 + c] = totals[c];
      if (threadIdx.x == 0) f.counts_row[0] = bad ? -1 : f.a.T;
      __syncthreads();
      hand_counts(f.counts_row, 1, f.a.E, f.sc.counts_host, f.sc.counts_snap, f.sc.counts_ready, f.epoch,
                  f.sc.summary);
    }
  }
  stamp<kStamps>(a.mc.stamps, kStampBuilt);
  if (!ok) {
    fan_abandon(a.routed.tokens, a.mc, smem, a.sy, warp, lane, rb);
    return;
  }
  const auto leave = [&] { fan_abandon(a.routed.tokens, a.mc, smem, a.sy, warp, lane, rb); };
  if constexpr (kExpert)
    alone_fan<true, decltype(leave), kStamps>(a, smem, warp, lane, leave);
  else
    alone_rows_fan<decltype(leave), kStamps>(a, smem, warp, lane, leave);
  stamp<kStamps>(a.mc.stamps, kStampFlushed);  // fan_in_phases ends on its stores' completion
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
