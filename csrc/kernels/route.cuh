// The routing shared by every protocol's dispatch (csrc/common/routing.cuh does the per-chunk
// work): its scratch, route_ticketed (one chunk a block, in one launch) with the end its last
// block runs, the count kernel of get_dispatch_layout, and the hand-over of the exchanged
// counts to the host. Each protocol's kernel publishes the counts row in its own way.
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/layout.cuh"
#include "../common/ptx.cuh"
#include "../common/routing.cuh"

namespace symmoe {

constexpr int kRouteThreads = 256;  // the fewest a routing block runs, and the block of global tables
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kRouteMaxThreads = 1024;

// Threads of a routing block: the most, up to 1024, whose place-pass tables ([C] + [warps][C]
// int32) fit in `smem` bytes. A chunk is 128 tokens or more, so at top-8 a block of 256 walked
// 4 pairs a thread, each behind a dependent global load (count 12 µs + place 15 µs at W=1).
inline int route_threads(int64_t C, int64_t smem) {
  for (int t = kRouteMaxThreads; t > kRouteThreads; t /= 2)
    if (int64_t(t / 32 + 1) * C * 4 <= smem) return t;
  return kRouteThreads;
}

// What the host reads after its wait instead of reducing the counts matrix itself (the numpy of
// symmoe/protocol/counts.py's received_rows, whose `summary_of` specifies these words):
// [0] 1 when some rank's ids were bad, [1] this rank's rank-major rows, [2] the most rows any
// receiver gets rank-major, [3] / [4] the same expert-major (groups padded to `alignment`),
// then, from kSummaryHead on, this rank's unpadded rows per local expert.
constexpr int kSummaryHead = 8;
struct CountsSummary {
  int32_t* host = nullptr;  // host-mapped [kSummaryHead + E / W]; nullptr: the host reduces the matrix
  int rank = 0;
  int alignment = 1;
};

struct RouteScratch {  // global scratch of the routing kernels (sized by the host)
  int32_t* part;    // [blocks][C] each chunk's column counts
  int32_t* totals;  // [C] this rank's column totals
  int32_t* big;     // nullptr, or [blocks][kRouteWarps + 1][C] when C is too large for shared memory
  int32_t* counts_host;  // host-mapped copy of the whole counts matrix after the barrier (or nullptr)
  int32_t* counts_snap;  // device copy of it, for kernels that run after peers moved on (or nullptr)
  int64_t* counts_ready;  // host-mapped: the dispatch's epoch once counts_host is complete (or nullptr)
  CountsSummary summary;  // written with counts_host, before the epoch (summary.host nullptr: none)
  int64_t* counted = nullptr;  // [blocks] route_kernel: the epoch once chunk i's part is written (zeroed once)
  unsigned int* ticket = nullptr;  // route_kernel: chunks taken so far (zero between launches)
  // [blocks] the epoch once chunk i's positions are published (zeroed once; nullptr: no marks):
  // a data kernel alone may start on them instead of on the routing grid's end.
  int64_t* placed = nullptr;
};

// The exchanged counts matrix m ([W][1 + W + E], W <= kMaxSlots) into host-mapped memory
// and the device snapshot (each may be nullptr) with its summary (when summary.host is set),
// then the epoch into the host-mapped `ready` word. The host spins on that word: waiting for
// an event after the routing kernels took tens of µs to wake. Whole block calls.
// Thread j takes column j of every row: it copies them and sums them (expert columns are
// padded into their receiver's total; rank columns are the rank-major rows; column 0 holds
// -1 for a rank whose ids were bad), so the matrix is read once, in one round trip. Copying
// first and summing after read it twice and took 2.3 µs of the routing kernel at W = 1.
__device__ __forceinline__ void hand_counts(const int32_t* m, int W, int E, int32_t* host, int32_t* snap,
                                            int64_t* ready, int64_t epoch, const CountsSummary& s) {
  __shared__ int32_t rank_rows[kMaxSlots], expert_rows[kMaxSlots];
  const int L = E / W, cols = 1 + W + E, lane = threadIdx.x & 31;
  if (s.host)
    for (int d = threadIdx.x; d < W; d += blockDim.x) expert_rows[d] = 0;
  __syncthreads();
  bool bad = false;
  // Warp-uniform trips: the expert columns' padded sums are reduced per receiver in the warp.
  for (int j0 = threadIdx.x - lane; j0 < cols; j0 += blockDim.x) {
    const int j = j0 + lane;
    int32_t sum = 0;
    if (j < cols) {
#pragma unroll 4
      for (int src = 0; src < W; ++src) {
        const int32_t v = __ldcg(m + int64_t(src) * cols + j);
        if (host) host[int64_t(src) * cols + j] = v;
        if (snap) snap[int64_t(src) * cols + j] = v;
        sum += v;
        bad = bad || (j == 0 && v < 0);
      }
    }
    if (s.host == nullptr) continue;
    const int d = (j > W && j < cols) ? (j - 1 - W) / L : -1;  // the expert's receiver
    if (d == s.rank) s.host[kSummaryHead + j - 1 - W - d * L] = sum;
    if (j >= 1 && j <= W) rank_rows[j - 1] = sum;
    const uint32_t same = __match_any_sync(0xffffffffu, d);
    const int32_t padded = __reduce_add_sync(same, d >= 0 ? (sum + s.alignment - 1) / s.alignment * s.alignment : 0);
    if (d >= 0 && lane == __ffs(same) - 1) atomicAdd(&expert_rows[d], padded);
  }
  if (s.host) {
    bad = __syncthreads_or(bad);  // also orders every thread's sums before thread 0 reads them
    if (threadIdx.x == 0) {
      int32_t most_r = 0, most_e = 0;
      for (int d = 0; d < W; ++d) {
        most_r = max(most_r, rank_rows[d]);
        most_e = max(most_e, expert_rows[d]);
      }
      s.host[0] = bad ? 1 : 0;
      s.host[1] = rank_rows[s.rank];
      s.host[2] = most_r;
      s.host[3] = expert_rows[s.rank];
      s.host[4] = most_e;
    }
  }
  if (ready == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_sys();  // cumulative: every thread's part of the matrix reaches the host first
    *reinterpret_cast<volatile int64_t*>(ready) = epoch;
  }
}

// Whole block: base[c] = pairs of column c in the chunks before chunk b (b = every chunk: the
// column totals). The chunks' rows lie one after another: every thread loads its share of
// them at once (coalesced) and adds into base with atomics. One column a thread, summing its
// chunks in turn, took 2 µs for the last of 32 chunks.
__device__ __forceinline__ void chunk_base(const RouteScratch& sc, int C, int32_t* base, int b) {
  for (int c = threadIdx.x; c < C; c += blockDim.x) base[c] = 0;
  __syncthreads();
  constexpr int kLoads = 8;
  const int n = b * C, step = blockDim.x;  // b * C is the scratch's size: an int
  for (int f0 = threadIdx.x; f0 < n; f0 += kLoads * step) {
    int32_t v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) v[u] = f0 + u * step < n ? __ldcg(sc.part + f0 + u * step) : 0;
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (v[u] != 0) atomicAdd(base + (f0 + u * step) % C, v[u]);
  }
  __syncthreads();
}

// Column c's total over every chunk into the layout's per-rank / per-expert counts where
// asked for (nullptr: not).
__device__ __forceinline__ void keep_total(int W, int c, int32_t sum, int32_t* per_rank, int32_t* per_expert) {
  if (c < W) {
    if (per_rank) per_rank[c] = sum;
  } else if (per_expert) {
    per_expert[c - W] = sum;
  }
}

// Pass 1 (grid of blocks, one chunk of tokens each): column counts per chunk, the published
// int32 ids / weights, is_token_in_rank; the last block to finish sums the chunks' counts.
template <typename Idx>
__global__ void __launch_bounds__(kRouteMaxThreads) route_count_kernel(RoutingArgs<Idx> a, RouteScratch sc,
                                                                   int32_t* out_per_rank, int32_t* out_per_expert,
                                                                   ErrorWord* err, unsigned int* done) {
  const int C = a.columns();
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(err);
  __syncthreads();
  if (dead) return;  // an earlier wait failed (the same for every block): the host raises
  int32_t* part = sc.part + int64_t(blockIdx.x) * C;
  int32_t* cnt = sc.big ? part : reinterpret_cast<int32_t*>(dyn_smem());
  route_count_chunk(a, cnt, blockIdx.x);
  if (!sc.big)
    for (int c = threadIdx.x; c < C; c += blockDim.x) part[c] = cnt[c];
  if (!grid_last_block(done)) return;
  chunk_base(sc, C, sc.totals, int(gridDim.x));  // every chunk's: the totals
  for (int c = threadIdx.x; c < C; c += blockDim.x) keep_total(a.W, c, sc.totals[c], out_per_rank, out_per_expert);
}

// Chunk b of a dispatch's routing, whole block (the caller checked its error word): its pairs
// numbered inside the chunk (route_chunk's first walk, which also publishes and checks the ids),
// its counts marked ready (sc.counted), then, once every earlier chunk's are, its positions
// published after theirs (chunk_base sums the earlier chunks' counts, C int32 a chunk in
// sc.part) and the chunk marked placed (sc.placed, where kept). tables: base [C], then the
// block's warps' [warps][C]. The block of the last chunk also leaves the column totals in
// sc.totals. False: a wait expired (recorded in the ErrorWord); no position was written.
template <typename Idx>
__device__ bool route_chunk_marked(const RoutingArgs<Idx>& a, const RouteScratch& sc, int b, int32_t* tables,
                                   int64_t epoch, uint64_t timeout_ns, ErrorWord* err, ErrorWord* err_host) {
  const int C = a.columns(), last = int(gridDim.x) - 1, tid = int(threadIdx.x), nt = int(blockDim.x);
  int32_t* part = sc.part + int64_t(b) * C;
  bool placing = false;
  route_chunk<true>(a, tables, tables + C, part, b, [&] {
    if (tid == 0) {
      __threadfence();  // cumulative: the block's counts in `part` before the marks
      st_release_gpu(sc.counted + b, epoch);
    }
    // Chunks before b belong to blocks that took their tickets first: each is running.
    bool ok = true;
    for (int i = tid; i < b && ok; i += nt)
      ok = wait_at_least_gpu(sc.counted + i, epoch, timeout_ns, err, err_host, kStageRouteChunk, i, epoch);
    if (!__syncthreads_and(ok)) return false;
    chunk_base(sc, C, tables, b);
    if (b == last)
      for (int c = tid; c < C; c += nt) sc.totals[c] = tables[c] + part[c];
    placing = true;
    return true;
  });
  // route_chunk's last barrier ordered every thread's positions before this fence.
  if (placing && sc.placed != nullptr && tid == 0) {
    __threadfence();
    st_release_gpu(sc.placed + b, epoch);
  }
  return placing;
}

// The routing of one dispatch in one launch, for a block (route_kernel, the NVSHMEM plan_kernel):
// the block takes the next chunk of tokens (a ticket, so it waits only for chunks that running
// blocks hold) and routes it (route_chunk_marked). Returns the chunk.
// Whole block; the caller checked its error word.
template <typename Idx>
__device__ int route_ticketed(const RoutingArgs<Idx>& a, const RouteScratch& sc, int64_t epoch, uint64_t timeout_ns,
                              ErrorWord* err, ErrorWord* err_host) {
  __shared__ int chunk;
  if (threadIdx.x == 0) chunk = int(atomicAdd(sc.ticket, 1u));
  __syncthreads();
  const int b = chunk, C = a.columns();
  int32_t* tables = sc.big ? sc.big + int64_t(b) * (kRouteWarps + 1) * C : reinterpret_cast<int32_t*>(dyn_smem());
  route_chunk_marked(a, sc, b, tables, epoch, timeout_ns, err, err_host);
  return b;
}

// The block that finishes a route_ticketed grid last (grid_last_block), whole block: every
// block has counted, so the bad-id flag is final. Leaves the ticket and the flag zero for the
// next launch and returns whether some id of this rank was bad.
template <typename Idx>
__device__ bool route_ticketed_end(const RoutingArgs<Idx>& a, const RouteScratch& sc) {
  const bool bad = a.bad.flag != nullptr && __ldcg(a.bad.flag) != 0;
  __syncthreads();  // every thread read the flag before it is cleared
  if (threadIdx.x == 0) {
    if (bad) *a.bad.flag = 0;
    *sc.ticket = 0u;
  }
  return bad;
}

}  // namespace symmoe
