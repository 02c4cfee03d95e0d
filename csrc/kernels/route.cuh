// The routing pass shared by every protocol's dispatch (csrc/common/routing.cuh does the
// per-chunk work): the count kernel, its scratch, and each chunk's starting counts for the
// place pass, which each protocol runs with its own way of publishing the counts row.
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/layout.cuh"
#include "../common/ptx.cuh"
#include "../common/routing.cuh"

namespace symmoe {

constexpr int kRouteThreads = 256;
constexpr int kRouteWarps = kRouteThreads / 32;

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

// Whole block, the matrix m ([W][1 + W + E]) complete. Warp w takes receivers w, w + nwarps, ...;
// its lanes take that receiver's experts (each summed over the sources, then padded).
__device__ __forceinline__ void summarize_counts(const int32_t* m, int W, int E, const CountsSummary& s) {
  __shared__ int32_t most[2][32];  // per warp: the most rows of its receivers (rank-, expert-major)
  const int L = E / W, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t row = 1 + W + E;
  int32_t most_r = 0, most_e = 0;
  for (int d = warp; d < W; d += nw) {
    int32_t r = 0, e = 0;
    for (int src = lane; src < W; src += 32) r += __ldcg(m + src * row + 1 + d);
    for (int j = lane; j < L; j += 32) {
      int32_t v = 0;
      for (int src = 0; src < W; ++src) v += __ldcg(m + src * row + 1 + W + int64_t(d) * L + j);
      if (d == s.rank) s.host[kSummaryHead + j] = v;
      e += (v + s.alignment - 1) / s.alignment * s.alignment;
    }
    r = __reduce_add_sync(0xffffffffu, r);
    e = __reduce_add_sync(0xffffffffu, e);
    if (d == s.rank && lane == 0) {
      s.host[1] = r;
      s.host[3] = e;
    }
    most_r = max(most_r, r);
    most_e = max(most_e, e);
  }
  if (lane == 0) {
    most[0][warp] = most_r;
    most[1][warp] = most_e;
  }
  bool bad = false;
  for (int src = threadIdx.x; src < W; src += blockDim.x) bad = bad || __ldcg(m + src * row) < 0;
  bad = __syncthreads_or(bad);  // also orders the warps' `most` before thread 0 reads them
  if (threadIdx.x == 0) {
    for (int w = 1; w < nw; ++w) {
      most_r = max(most_r, most[0][w]);
      most_e = max(most_e, most[1][w]);
    }
    s.host[0] = bad ? 1 : 0;
    s.host[2] = most_r;
    s.host[4] = most_e;
  }
}

struct RouteScratch {  // global scratch of the two routing kernels (sized by the host)
  int32_t* part;    // [blocks][C] each chunk's column counts
  int32_t* totals;  // [C] this rank's column totals
  int32_t* big;     // nullptr, or [blocks][kRouteWarps + 1][C] when C is too large for shared memory
  int32_t* counts_host;  // host-mapped copy of the whole counts matrix after the barrier (or nullptr)
  int32_t* counts_snap;  // device copy of it, for kernels that run after peers moved on (or nullptr)
  int64_t* counts_ready;  // host-mapped: the dispatch's epoch once counts_host is complete (or nullptr)
  CountsSummary summary;  // written with counts_host, before the epoch (summary.host nullptr: none)
};

// The exchanged counts matrix m ([W][1 + W + E]) into host-mapped memory and the device
// snapshot (each may be nullptr) with its summary (when summary.host is set), then the epoch
// into the host-mapped `ready` word. The host spins on that word: waiting for an event after
// the routing kernels took tens of µs to wake. Whole block calls.
__device__ __forceinline__ void hand_counts(const int32_t* m, int W, int E, int32_t* host, int32_t* snap,
                                            int64_t* ready, int64_t epoch, const CountsSummary& summary) {
  const int64_t n = int64_t(W) * (1 + W + E);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t v = __ldcg(m + i);
    if (host) host[i] = v;
    if (snap) snap[i] = v;
  }
  if (summary.host) summarize_counts(m, W, E, summary);
  if (ready == nullptr) return;
  __threadfence_system();  // this thread's part of the matrix is visible to the host first
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile int64_t*>(ready) = epoch;
}

// Pass 1 (grid of blocks, one chunk of tokens each): column counts per chunk, the published
// int32 ids / weights, is_token_in_rank; the last block to finish sums the chunks' counts.
template <typename Idx>
__global__ void __launch_bounds__(kRouteThreads) route_count_kernel(RoutingArgs<Idx> a, RouteScratch sc,
                                                                   int32_t* out_per_rank, int32_t* out_per_expert,
                                                                   ErrorWord* err, unsigned int* done) {
  const int C = a.columns();
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(err);
  __syncthreads();
  if (dead) return;  // an earlier wait failed (the same for every block): the host raises
  int32_t* part = sc.part + int64_t(blockIdx.x) * C;
  int32_t* cnt = sc.big ? part : reinterpret_cast<int32_t*>(dyn_smem());
  route_count_chunk(a, cnt);
  if (!sc.big)
    for (int c = threadIdx.x; c < C; c += blockDim.x) part[c] = cnt[c];
  if (!grid_last_block(done)) return;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    int32_t sum = 0;
#pragma unroll 8
    for (int b = 0; b < int(gridDim.x); ++b) sum += __ldcg(sc.part + int64_t(b) * C + c);
    sc.totals[c] = sum;
    if (c < a.W) {
      if (out_per_rank) out_per_rank[c] = sum;
    } else if (out_per_expert) {
      out_per_expert[c - a.W] = sum;
    }
  }
}

// Place pass prologue, whole block: base[c] = pairs of column c in the chunks before this one.
__device__ __forceinline__ void chunk_base(const RouteScratch& sc, int C, int32_t* base) {
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    int32_t sum = 0;
#pragma unroll 8
    for (int b = 0; b < int(blockIdx.x); ++b) sum += sc.part[int64_t(b) * C + c];
    base[c] = sum;
  }
}

}  // namespace symmoe
