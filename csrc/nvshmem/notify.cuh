// DeepEP V1's notify on the NVSHMEM device API: the routing (route.cuh's), the send list,
// the counts exchange by put-with-signal, and the flag barrier of SymmetricMemory.barrier.
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdint>

#include "../common/scan.cuh"
#include "../kernels/route.cuh"
#include "device.cuh"

namespace symmoe {
namespace nv {

// ---- planning: routing, send list, counts exchange (DeepEP V1's layout + notify) ------
// Whole block. This rank's counts row is in row `me` of its own matrix: put it into every
// peer's matrix with put-with-signal on ready[me] (one thread per peer, so the row and its
// signal travel in order over NVLink and IBGDA alike), then wait for every peer's row.
__device__ void exchange_counts(uint8_t* base, const Layout& lay, int me, int64_t epoch, uint64_t timeout_ns,
                                ErrorWord* err) {
  const int W = static_cast<int>(lay.world_size);
  const int64_t row_bytes = 4 * lay.counts_cols();
  uint8_t* row = base + lay.counts + me * row_bytes;
  uint64_t* ready = reinterpret_cast<uint64_t*>(base + lay.ready);
  __syncthreads();
  for (int p = threadIdx.x; p < W; p += blockDim.x) {
    if (p == me) continue;
    nvshmem_putmem_signal_nbi(row, row, row_bytes, ready + me, static_cast<uint64_t>(epoch), NVSHMEM_SIGNAL_SET, p);
  }
  for (int p = threadIdx.x; p < W; p += blockDim.x) {
    if (p == me) continue;
    if (!wait_signal(ready + p, static_cast<uint64_t>(epoch), timeout_ns, err, kStageDispatchCounts, p, epoch)) break;
  }
  if (threadIdx.x < W) nvshmem_quiet();
  __syncthreads();
}

struct PlanArgs {
  uint8_t* base;
  Layout lay;
  int me;
  int64_t epoch;
  uint64_t timeout_ns;
  int32_t* send_ent;     // [W][T] this rank's rows for each destination, by token, each t * S + destination
  int32_t* counts_snap;  // [W][1 + W + E] device copy of the exchanged matrix (this dispatch's own)
  int32_t* counts_host;  // the same, host-mapped
  int64_t* counts_ready;  // host-mapped: the epoch once counts_host is complete (the host's one wait)
  ErrorWord* err;
  CountsSummary summary;  // what the host reads of the matrix (summary.host nullptr: none)
};

// The whole planning of a dispatch in one launch: each block routes a chunk of tokens
// (route.cuh's route_ticketed, as the CUDA protocols' route_kernel), then scatters its tokens
// into the send list: destination d's rows from d * T on (a fixed stride, so no block waits
// for the other chunks' totals), by token. The last block publishes the counts row and waits
// for the peers' rows (stage dispatch.counts), then leaves the matrix in the snapshot and in
// host-mapped memory. A rank with bad expert ids publishes tokens = -1: nobody moves data.
template <typename Idx>
__global__ void __launch_bounds__(kRouteMaxThreads) plan_kernel(RoutingArgs<Idx> a, RouteScratch sc, PlanArgs p,
                                                             unsigned int* done) {
  // The dispatch kernel's blocks may take the SMs this grid leaves free: alone at once, with
  // peers past the counts exchange (PEs sharing a GPU need SMs for the plans it waits for).
  if (a.W == 1) start_following_grid();
  const int C = a.columns(), W = a.W, K = a.K, S = static_cast<int>(p.lay.combine_slots);
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = failed();
  __syncthreads();
  if (dead) return;
  const int b = route_ticketed(a, sc, p.epoch, p.timeout_ns, &g_err, p.err);
  // Rank-major for both output layouts: a row crosses to each destination rank once
  // (expert-major outputs are filled there). Positions of a failed wait or of bad ids are
  // never used (the host raises); the bound keeps their stores inside the list.
  const int64_t t0 = a.chunk_begin(b), t1 = a.chunk_begin(b + 1), PC = W + K;
  for (int64_t i = t0 * W + threadIdx.x; i < t1 * W; i += blockDim.x) {
    const int64_t t = i / W;
    const int d = static_cast<int>(i % W);
    const int32_t j = a.in_rank[i] ? a.pos[t * PC + d] : -1;
    if (j >= 0 && j < a.T) p.send_ent[int64_t(d) * a.T + j] = static_cast<int32_t>(t * S + d);
  }
  if (!grid_last_block(done)) return;
  const bool bad = route_ticketed_end(a, sc);
  const int64_t row = 1 + C;
  int32_t* m = reinterpret_cast<int32_t*>(p.base + p.lay.counts);
  for (int c = threadIdx.x; c < row; c += blockDim.x)
    m[p.me * row + c] = c == 0 ? (bad ? -1 : a.T) : __ldcg(sc.totals + c - 1);
  exchange_counts(p.base, p.lay, p.me, p.epoch, p.timeout_ns, p.err);
  start_following_grid();  // every other block is done (grid_last_block)
  hand_counts(m, W, a.E, p.counts_host, p.counts_snap, p.counts_ready, p.epoch, p.summary);
}

// Flag barrier over `barrier[W]` with signals (SymmetricMemory.barrier).
__global__ void barrier_kernel(uint8_t* base, Layout lay, int me, int64_t epoch, uint64_t timeout_ns, ErrorWord* err,
                               int stage) {
  const int W = static_cast<int>(lay.world_size);
  uint64_t* flags = reinterpret_cast<uint64_t*>(base + lay.barrier);
  for (int p = threadIdx.x; p < W; p += blockDim.x)
    nvshmemx_signal_op(flags + me, static_cast<uint64_t>(epoch), NVSHMEM_SIGNAL_SET, p);
  for (int p = threadIdx.x; p < W; p += blockDim.x)
    if (!wait_signal(flags + p, static_cast<uint64_t>(epoch), timeout_ns, err, stage, p, epoch)) break;
  nvshmem_quiet();
}

}  // namespace nv
}  // namespace symmoe
