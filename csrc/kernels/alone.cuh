// A dispatch alone (one rank), from plain routing tables: no peer, no pool, so every row goes
// from x straight to its output rows. The NVSHMEM protocol launches these alone in place of
// its dispatch_kernel (alone_fan_routed_kernel also of its plan kernel). They need no
// transport, so they are built into symmoe_cuda, compiled whole as the CUDA protocols' data
// kernels are: built into the NVSHMEM module (relocatable device code), the fan-out ran 205 µs
// against 142 here, and that module's dispatch_kernel spills registers.
//   alone_fan_kernel   expert-major: the phased fan-out (common/phases.cuh, kernel.fan_phases),
//                      whole rows loaded into shared memory, then bulk-stored to every slot's row;
//   alone_rows_kernel  rank-major: each routed token's row to its output row by the bulk-copy
//                      mover (common/mover.cuh), as push's own rows move;
//   alone_fan_routed_kernel  expert-major, a dispatch that routes: the routing in the first blocks
//                      to take a ticket, then the fan-out in phases;
//   alone_rows_routed_kernel  rank-major, a dispatch that routes: the same routing, the rows by the
//                      mover to row t at once, and alone_rows_repair_kernel behind it for the rows
//                      a token without one moves elsewhere (and num_worst_tokens' tail).
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/fanout.cuh"
#include "../common/outputs.cuh"
#include "../common/phases.cuh"
#include "../common/routing.cuh"
#include "../common/scan.cuh"
#include "route.cuh"
#include "tail.cuh"

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
// The error word is read only while the mark is missing (the wait's yield): a placed chunk's rows
// are right whatever failed elsewhere, and round 0's rows wait on this load alone.
__device__ __forceinline__ bool token_placed(const AloneArgs& a, int64_t t, int lane) {
  const AloneArgs::Routed& r = a.routed;
  const int64_t per = (r.tokens + r.chunks - 1) / r.chunks;  // RoutingArgs::chunk_begin's split
  int placed = 1;
  if (lane == 0)
    placed = wait_at_least_gpu(r.placed + t / per, r.epoch, a.sy.timeout_ns, a.sy.err, a.sy.err_host,
                               kStageRouteChunk, int(t / per), r.epoch, true);
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
  // Rank-major: a routing block's mover warps route its chunk too before they move rows, so the
  // counts reach the host early (the host waits for them: exact-size outputs); else they move
  // rows from the start beside the routing warps (alone_rows_routed_kernel).
  bool route_first = false;
};

// The routed kernel's timeline has no loop end of its own (its rounds end on their stores'
// completion, flushed); that mark holds its routing chunk's counted mark instead
// (timeline.ROUTED_MARKS).
constexpr int kStampRoutedCounted = kStampLoopEnd;

// The routed kernels' start, whole block: this block's ticket (the last to take one zeroes the
// word for the next launch), and whether an earlier wait failed (then nothing runs: the host
// raises). kStamps: the block's timeline rows go in ticket order from here on.
template <bool kStamps>
__device__ __forceinline__ int routed_ticket(AloneArgs& a, unsigned int* word, StampTime entered, bool& dead) {
  __shared__ int ticket;
  __shared__ bool failed;
  if (threadIdx.x == 0) {
    failed = error_set(a.sy.err);
    ticket = int(atomicAdd(word, 1u));
    if (ticket == int(gridDim.x) - 1) *word = 0u;  // every block has its ticket: zero for the next launch
  }
  __syncthreads();
  dead = failed;
  if constexpr (kStamps) {
    a.mc.stamps = stamp_rows_as(a.mc.stamps, ticket);
    stamp_at(a.mc.stamps, blockIdx.x, kStampEnter, entered);
  }
  stamp<kStamps>(a.mc.stamps, kStampChecked);
  return ticket;
}

// Chunk b of the routed kernels' own routing (route_chunk_marked), whole team (the block, or the
// WarpTeam that routes in it), its tables at `tables`, with the timeline's walked / scanned /
// counted marks. False: a wait expired (recorded).
template <bool kStamps, typename Idx, class Team = WholeBlock>
__device__ __forceinline__ bool route_own_chunk(const AloneArgs& a, const OwnRouting<Idx>& f, int b, int32_t* tables,
                                                Team team = {}) {
  return route_chunk_marked<true>(f.a, f.sc, b, f.stride, tables, f.epoch, a.sy.timeout_ns, a.sy.err, a.sy.err_host,
                                  [&](RouteStep step) {
                                    stamp<kStamps>(a.mc.stamps, step == RouteStep::kWalked    ? kStampWalked
                                                                : step == RouteStep::kScanned ? kStampScanned
                                                                                              : kStampRoutedCounted);
                                  },
                                  team);
}

// The routed kernels' routing end, by the block of the last ticket (never a routing one), whole
// block: once every chunk is counted the bad-id flag is final and the totals are the chunks'
// sums (summed into `totals`, [f.stride] int32 of shared memory); the counts row, its
// hand-over to the host (hand_counts), then the epoch into f.sc.ended (where kept). False: a
// wait expired (recorded).
template <typename Idx>
__device__ __forceinline__ bool routed_end(const AloneArgs& a, const OwnRouting<Idx>& f, int32_t* totals) {
  bool ok = true;
  for (int i = threadIdx.x; i < f.a.chunks && ok; i += blockDim.x)
    ok = wait_at_least_gpu(f.sc.counted + i, f.epoch, a.sy.timeout_ns, a.sy.err, a.sy.err_host, kStageRouteChunk, i,
                           f.epoch);
  if (!__syncthreads_and(ok)) return false;
  chunk_sum_vec(f.sc.part, f.stride, f.a.chunks, totals);
  const bool bad = route_ticketed_end(f.a, f.sc);
  for (int c = threadIdx.x; c < f.a.columns(); c += blockDim.x) f.counts_row[1 + c] = totals[c];
  if (threadIdx.x == 0) f.counts_row[0] = bad ? -1 : f.a.T;
  __syncthreads();
  hand_counts(f.counts_row, 1, f.a.E, f.sc.counts_host, f.sc.counts_snap, f.sc.counts_ready, f.epoch, f.sc.summary);
  if (f.sc.ended != nullptr) {
    __syncthreads();  // every thread's part of the counts row first (the release is cumulative)
    if (threadIdx.x == 0) st_release_gpu(f.sc.ended, f.epoch);
  }
  return true;
}

// World size 1, expert-major, a dispatch that routes: the routing and the fan-out in one launch,
// so no routing grid comes first. Each block takes a ticket: tickets < f.a.chunks route that chunk
// (route_chunk_marked; kOwnChunkTokens a chunk, so its walk and the sums are short) and issue
// round 0's row loads after it; the other blocks issue theirs at once (but for the rows where a
// routing block's tables lie, after its routing would be done), and the last ticket (never a
// routing one) does the routing's end (routed_end). A routing chunk's global round trips queue
// behind the loads in flight, and its own add to them (so the ticket comes before any load:
// 0.4 µs rather than 7, the kernel 2 µs faster). Then every block builds its plan on the column totals
// the chunks add as they are counted (RouteScratch::sums), each row waits for its own chunk's
// placed mark, and fans out. Launched after the stream's earlier work ended (x, topk_idx and
// topk_weights are read at once).
// kStamps: the timeline's build (a.mc.stamps; timeline.ROUTED_PHASES says what its marks mean),
// its rows in ticket order (row b: the block that took ticket b; timeline.rows_at reads them).
template <typename Idx, bool kStamps = false>
__global__ void __launch_bounds__(kMaxMoverWarps * 32, 1) alone_fan_routed_kernel(AloneArgs a, OwnRouting<Idx> f) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rb = a.lay.row_bytes();
  uint8_t* smem = dyn_smem();
  [[maybe_unused]] StampTime entered;
  if constexpr (kStamps) entered = StampTime::now();
  start_following_grid();  // alone, nothing waits on a peer: a num_worst_tokens tail may be scheduled now
  bool dead;
  const int b = routed_ticket<kStamps>(a, f.sc.ticket, entered, dead);
  const bool routes = b < f.a.chunks;
  if (!routes) fan_begin(a.x, a.routed.tokens, rb, a.mc, smem, warp, lane, f.delayed);
  bool ok = !dead;
  if (ok && routes) ok = route_own_chunk<kStamps>(a, f, b, reinterpret_cast<int32_t*>(smem + f.tables_off));
  if (!routes) stamp<kStamps>(a.mc.stamps, kStampRoutedCounted);  // no chunk: at once
  stamp<kStamps>(a.mc.stamps, kStampTables);
  if (routes) {
    __syncthreads();  // the tables are done: every warp's row may load
    fan_begin(a.x, a.routed.tokens, rb, a.mc, smem, warp, lane);
  } else {
    fan_begin_rest(a.x, a.routed.tokens, rb, a.mc, smem, warp, lane, f.delayed);
  }
  // FanPlan's tables hold the totals: the plan is built after this.
  if (ok && b == int(gridDim.x) - 1) ok = routed_end(a, f, reinterpret_cast<int32_t*>(smem));
  stamp<kStamps>(a.mc.stamps, kStampBuilt);
  const auto leave = [&] { fan_abandon(a.routed.tokens, a.mc, smem, a.sy, warp, lane, rb); };
  if (!ok) return leave();
  alone_fan<true, decltype(leave), kStamps>(a, smem, warp, lane, leave);
  stamp<kStamps>(a.mc.stamps, kStampFlushed);  // fan_in_phases ends on its stores' completion
}

// Whole warp, token t at W = 1: lanes < K read their slot's id and weight from the dispatch's
// inputs (not the routing's copy, which may not be written yet); true when some slot names an
// expert of [0, E): the token has an output row (the routing's rank column counts it).
template <typename Idx>
__device__ __forceinline__ bool token_in_rank(const RoutingArgs<Idx>& ra, int64_t t, int lane, int& e, float& w) {
  e = -1;
  w = 0.f;
  if (lane < ra.K) {
    e = static_cast<int>(__ldg(ra.idx + t * ra.K + lane));
    w = __ldg(ra.w + t * ra.K + lane);
  }
  return __any_sync(0xffffffffu, lane < ra.K && e >= 0 && e < ra.E);
}

// World size 1, rank-major, a dispatch that routes: the routing and the rows in one launch, the
// rows by the bulk-copy mover (as the cached dispatch's alone_rows_kernel moves them) instead of
// in phases. A token's row is the count of tokens with a row before it, which only the whole
// routing knows; but when every token has one (the usual case) it is t. So each row is stored
// at once to row t, as if every token had a row (token_in_rank: the inputs' ids), with its ids
// and weights, and alone_rows_repair_kernel, which follows, moves again the rows the routing's
// positions put elsewhere (those moves wait for this grid's end: no row is overwritten by a
// stale one). Blocks take tickets as alone_fan_routed_kernel's: in a block of a ticket <
// f.a.chunks the warps past the mover's route that chunk (a WarpTeam on a named barrier: the
// mover's few warps alone would walk its pairs slowly) while its mover warps move rows from the
// start (with the whole block routing first, 64 of 132 SMs would move nothing for ~9 µs;
// beside the movers the routing ends late, near 29 µs of a 33 µs kernel, so it must stay
// short). Where the host waits for the counts (exact-size outputs: f.route_first) the whole
// block routes first after all: the counts then come early (at 12 µs, not 29), and the host's work after its wait runs under the rows' copy instead of
// after the kernel. The last ticket does the routing's end, and every mover warp takes tokens
// one at a time from a grid counter (a.routed.summed; a.routed.readers counts the blocks done,
// and the last zeroes both). Rows past the outputs' capacity are left to the repair (the
// routing's rows are not known yet; the host raises on bad ids or over capacity).
// kStamps: the timeline's build, with alone_fan_routed_kernel's marks (planned: the mover set up).
template <typename Idx, bool kStamps = false>
__global__ void __launch_bounds__(kMaxMoverWarps * 32, 1) alone_rows_routed_kernel(AloneArgs a, OwnRouting<Idx> f) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rb = a.lay.row_bytes(), cap = a.o.capacity, T = a.routed.tokens;
  uint8_t* smem = dyn_smem();
  [[maybe_unused]] StampTime entered;
  if constexpr (kStamps) entered = StampTime::now();
  start_following_grid();  // the repair kernel's blocks may be scheduled now: they poll f.sc.ended
  bool dead;
  const int b = routed_ticket<kStamps>(a, f.sc.ticket, entered, dead);
  int32_t* tables = reinterpret_cast<int32_t*>(smem + f.tables_off);  // past the mover's slots
  if (dead) return;  // the same for the whole block: the host raises
  const bool routes = b < f.a.chunks, mover = warp < a.mc.warps;
  // A failed wait there is recorded (the host raises); the team's warps then only go to the end.
  if (routes && (f.route_first || !mover)) {
    const int first = f.route_first ? 0 : a.mc.warps;
    route_own_chunk<kStamps>(a, f, b, tables, WarpTeam{first, int(blockDim.x) / 32 - first, 1});
  } else
    stamp<kStamps>(a.mc.stamps, kStampRoutedCounted);  // no chunk: at once
  stamp<kStamps>(a.mc.stamps, kStampTables);
  // Never a routing block: its warps are all at this call.
  if (b == int(gridDim.x) - 1 && !routed_end(a, f, tables)) return;  // recorded: the host raises
  stamp<kStamps>(a.mc.stamps, kStampBuilt);
  if (mover) {
    WarpMover mv;
    mv.init(smem + int64_t(warp) * WarpMoverSmem::per_warp_bytes(a.mc.slot_bytes, a.mc.depth), a.mc.slot_bytes,
            a.mc.depth, MoverWatch{a.sy.timeout_ns, a.sy.err, a.sy.err_host, a.sy.epoch});
    stamp<kStamps>(a.mc.stamps, kStampPlanned);
    [[maybe_unused]] bool first = true;
    // The next token is taken while this one moves (lane 0 holds it): the atomic's round trip hides.
    unsigned int taken = lane == 0 ? atomicAdd(a.routed.summed, 1u) : 0u;
    for (;;) {
      const int64_t t = __shfl_sync(0xffffffffu, taken, 0);
      if (t >= T) break;
      if (lane == 0) taken = t + 1 < T ? atomicAdd(a.routed.summed, 1u) : unsigned(T);
      int e;
      float w;
      if (!token_in_rank(f.a, t, lane, e, w) || t >= cap) continue;
      if constexpr (kStamps)
        if (first) stamp<kStamps>(a.mc.stamps, kStampRouted);
      move_row(mv, a.x + t * rb, a.o.x + t * rb, 1, rb, a.mc.slot_bytes, lane);
      rank_row_meta(a, t, t, e, w, lane);
      if constexpr (kStamps)
        if (first) stamp<kStamps>(a.mc.stamps, kStampFirstPush), first = false;
    }
    mv.flush();
    if constexpr (kStamps)
      if (first) stamp<kStamps>(a.mc.stamps, kStampRouted), stamp<kStamps>(a.mc.stamps, kStampFirstPush);
  } else if constexpr (kStamps) {  // a routing warp without a mover: its marks at once
    stamp<kStamps>(a.mc.stamps, kStampPlanned);
    stamp<kStamps>(a.mc.stamps, kStampRouted);
    stamp<kStamps>(a.mc.stamps, kStampFirstPush);
  }
  stamp<kStamps>(a.mc.stamps, kStampFlushed);
  __syncthreads();  // every warp of the block is past the counter
  if (threadIdx.x == 0 && atomicAdd(a.routed.readers, 1u) == gridDim.x - 1) {
    *a.routed.summed = 0u;  // every block is past it: zero for the next launch
    *a.routed.readers = 0u;
  }
}

// num_worst_tokens at W = 1 in the repair behind alone_rows_routed_kernel: what recv_tail_kernel
// would do after it, so no third kernel runs (worst 0: none, the host waits on the counts).
struct RoutedTail {
  int64_t worst;
  int32_t* per_expert;  // [E] this rank's rows per expert
  DeferredError* df;    // host-mapped
  int64_t epoch;        // the dispatch's, for the record
};

// Whole block (the repair's block 0), once the routing's counts row is final (head, with_rows):
// the per-expert counts and the error record of num_worst_tokens' tail, as recv_tail_kernel
// writes them for one rank.
__device__ __forceinline__ void alone_worst_record(const AloneArgs& a, const int32_t* counts_row, int32_t head,
                                                   int32_t with_rows, const RoutedTail& t) {
  const bool valid = head >= 0;  // bad ids: no row is valid (the host raises)
  for (int j = threadIdx.x; j < int(a.lay.num_experts); j += blockDim.x)
    t.per_expert[j] = valid ? count_at(counts_row, a.lay, 0, 1 + 1 + j) : 0;  // W = 1: [T, rows, experts...]
  if (threadIdx.x == 0) {
    const bool over = valid && (with_rows > t.worst || with_rows > a.lay.recv_rows);
    record_deferred(t.df, !valid ? kDeferredBadIds : over ? kDeferredCapacity : kDeferredNone, 0,
                    over ? with_rows : 0, t.worst, false, t.epoch);
  }
}

// Whole grid: rows [first, end) of the outputs filled as reference.pad_recv defines.
__device__ __forceinline__ void alone_fill(const AloneArgs& a, int64_t first, int64_t end) {
  fill_past_received(TailOutputs{a.o.x, a.o.idx, a.o.w, a.o.src_rank, a.o.src_token, a.o.src_slot}, first, end,
                     a.lay.row_bytes(), int(a.lay.topk), int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                     int64_t(gridDim.x) * blockDim.x);
}

// Behind alone_rows_routed_kernel (a following launch, resident as that kernel runs): it starts
// when the routing's end wrote the counts row (`ended` reaches the routing's epoch), not when
// that grid ends. With num_worst_tokens (tail.worst) it does the tail's work at once (the
// per-expert counts, the error record, the fill of rows [T, worst), which the routed kernel never
// writes). When every token has its row at t (the usual case) nothing else is left and it ends
// without waiting for the routed kernel's stores: the call ends with the routed grid. Else (a
// token with every slot masked, or bad ids) it waits for that grid's end, moves again from x
// each row whose routing position is not t, with its ids and weights, and fills the rows from
// the valid ones to T. A token without a row early in the batch makes this a second copy of the
// rows after it (warp_fanout_row's unrolled loads keep enough of them in flight). 128 threads: a
// block fits beside the routed kernel's (80 registers x 512) in an SM's 64 K registers.
constexpr int kRepairThreads = 128;
template <typename Idx>
__global__ void __launch_bounds__(kRepairThreads) alone_rows_repair_kernel(AloneArgs a, RoutingArgs<Idx> ra,
                                                                 const int32_t* counts_row, const int64_t* ended,
                                                                 RoutedTail tail) {
  // A kernel launched to follow this one waits for this grid's end; its blocks may be scheduled
  // now, not only once this grid's wait returns.
  start_following_grid();
  __shared__ bool ok;
  if (threadIdx.x == 0)  // peer -1: the routing's end, not a chunk (stall_detail says so)
    ok = wait_at_least_gpu(ended, a.routed.epoch, a.sy.timeout_ns, a.sy.err, a.sy.err_host, kStageRouteChunk, -1,
                           a.routed.epoch, /*yield_to_error=*/true);
  __syncthreads();
  if (!ok) return;  // a wait expired, here or in the routed kernel (recorded): the host raises
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, PC = 1 + ra.K;
  const int64_t rb = a.lay.row_bytes(), cap = a.o.capacity, T = ra.T;
  const int32_t head = __ldcg(counts_row), with_rows = __ldcg(counts_row + 1);
  const int64_t first = head >= 0 ? with_rows : 0;  // the first row past the valid ones (<= T)
  if (tail.worst > 0) {
    if (blockIdx.x == 0) alone_worst_record(a, counts_row, head, with_rows, tail);
    alone_fill(a, T, tail.worst);
  }
  if (first == T) return;  // every row at t: none left to move or fill
  wait_prior_grid();  // rows below T are the routed kernel's until its grid ends
  if (error_set(a.sy.err)) return;  // a failed wait there: the host raises
  if (tail.worst > 0) alone_fill(a, first, min(T, tail.worst));
  if (head < 0) return;  // bad ids: the host raises
  const int nwarps = blockDim.x / 32;
  const int64_t nw = int64_t(gridDim.x) * nwarps;
  for (int64_t t = int64_t(blockIdx.x) * nwarps + warp; t < T; t += nw) {
    int e;
    float w;
    if (!token_in_rank(ra, t, lane, e, w)) continue;
    const int64_t o = __ldcg(a.pos + t * PC);
    if (o == t || o < 0 || o >= cap) continue;  // stored right, or over capacity (the host raises)
    warp_fanout_row(a.o.x + o * rb, 1, a.x + t * rb, rb, lane);
    rank_row_meta(a, o, t, e, w, lane);
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
