// The phased fan-out (the fan-phases mode) of a world-size-1 expert-major dispatch: whole rows
// loaded into shared memory, then bulk-stored to every destination row, block by block or with
// the whole grid meeting between phases. Shared by the CUDA protocols' pull and push kernels
// and kernels/alone.cuh's alone_fan_kernel (nvshmem alone), with the host's geometry for them.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include <algorithm>

#include "barrier.cuh"
#include "mover.cuh"
#include "ptx.cuh"
#include "stamps.cuh"

namespace symmoe {

// Shared bytes after the phases' rows: one mbarrier per warp (fan_in_phases).
constexpr int64_t kPhaseBarBytes = 8 * kMaxMoverWarps;

// A warp's row for the phased fan-out: lanes < n hold its destination rows' addresses.
struct RowDsts {
  uint8_t* dst;
  int n;
};

// Round r's tokens of block blockIdx.x in fan_in_phases: [b0, b1), rounds shared evenly.
struct PhaseSplit {
  int64_t per_round, rounds, even;
  __device__ PhaseSplit(int64_t T, int rows) {
    per_round = int64_t(gridDim.x) * rows;
    rounds = (T + per_round - 1) / per_round;
    even = rounds ? (T + rounds - 1) / rounds : 0;
  }
  __device__ void block_range(int64_t T, int64_t r, int64_t& b0, int64_t& b1) const {
    const int64_t G = gridDim.x, lo = r * even, hi = min(T, lo + even);
    b0 = lo + (hi - lo) * blockIdx.x / G;
    b1 = lo + (hi - lo) * (blockIdx.x + 1) / G;
  }
};

// Group g's tokens [b0, b1) under mc.phase_steal: phase_rows tokens a group.
__device__ __forceinline__ void phase_group(int64_t T, int rows, int64_t g, int64_t& b0, int64_t& b1) {
  b0 = min(T, g * rows);
  b1 = min(T, b0 + rows);
}

// Block blockIdx.x's round 0 tokens [b0, b1): its share of the even split, or with
// mc.phase_steal group blockIdx.x (the later groups go to whichever block asks first:
// phase_steal_next).
__device__ __forceinline__ void phase_round0(int64_t T, const MoveCfg& mc, int64_t& b0, int64_t& b1) {
  if (mc.phase_steal) {
    phase_group(T, mc.phase_rows, blockIdx.x, b0, b1);
  } else {
    PhaseSplit(T, mc.phase_rows).block_range(T, 0, b0, b1);
  }
}

// One thread of a block: the next group of `rows` tokens nobody has taken (>= the groups of T:
// none left). Every block asks until it is refused, so a launch asks max(groups - blocks, 0) +
// blocks times; the last ask zeroes the counter for the next launch. The callers' exits before
// the phases are taken by every block or none (they read the same words), and a block leaves
// the phases early only after a device wait expired, when the Buffer is unusable anyway.
__device__ __forceinline__ int64_t phase_steal_next(unsigned int* counter, int64_t T, int rows) {
  const int64_t G = gridDim.x, groups = (T + rows - 1) / rows;
  const unsigned int v = atomicAdd(counter, 1u);
  if (int64_t(v) == max(groups - G, int64_t(0)) + G - 1) *counter = 0u;
  return G + v;
}

// Every row is read once and written once: evict-first keeps the streamed rows from pushing the
// outputs' metadata (small scattered stores) and the routing out of L2.
__device__ __forceinline__ void phase_load(uint8_t* tile, const uint8_t* row, int64_t rb, uint64_t* bar) {
  mbar_arrive_expect_tx(bar, uint32_t(rb));
  bulk_load_evict_first(tile, row, uint32_t(rb), bar, evict_first_policy());
}

// fan_in_phases' mbarriers and its round 0's loads, issued ahead: a kernel that follows its own
// routing grid calls this before it waits for that grid (x was final before the routing kernel
// started), then fan_in_phases<.., true> with the same T waits for those loads. The rows must
// not lie over a table the caller still builds (mc.phase_base past them). Whole block.
__device__ __forceinline__ void fan_begin(const uint8_t* x, int64_t T, int64_t rb, const MoveCfg& mc, uint8_t* smem_raw,
                                          int warp, int lane) {
  uint8_t* tile = smem_raw + mc.phase_base + int64_t(warp) * rb;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem_raw + mc.phase_base + int64_t(mc.phase_rows) * rb) + warp;
  if (lane == 0) {
    fence_proxy_async_shared();
    mbar_init(bar, 1);
    mbar_init_fence();
    int64_t b0, b1;
    phase_round0(T, mc, b0, b1);
    if (b0 + warp < b1) phase_load(tile, x + (b0 + warp) * rb, rb, bar);
  }
  __syncwarp();
}

// After fan_begin, a block that leaves without fan_in_phases waits for its round 0's loads first
// (shared memory must not be written after the block exits). Whole block.
__device__ __forceinline__ void fan_abandon(int64_t T, const MoveCfg& mc, uint8_t* smem_raw, const Sync& sy, int warp,
                                            int lane, int64_t rb) {
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem_raw + mc.phase_base + int64_t(mc.phase_rows) * rb) + warp;
  int64_t b0, b1;
  phase_round0(T, mc, b0, b1);
  if (lane == 0 && b0 + warp < b1 && !mbar_try_wait(bar, 0))
    mbar_wait_bounded(bar, 0, MoverWatch{sy.timeout_ns, sy.err, sy.err_host, sy.epoch});
  __syncthreads();
}

// The world-size-1 expert-major dispatch in phases (the fan-phases mode): tokens [0, T) in
// rounds shared evenly, block b's part of each round loaded whole into shared memory (warp w:
// one token's row, one bulk load), then each row bulk-stored to the rows dests(t) names (it
// writes their metadata too, while the load is in flight). With phase_grid every block meets the
// others after its loads and after its stores, so HBM serves the round's reads, then its
// writes: a microbenchmark moved the fan-out's traffic in 137.7 µs that way against
// 142.5-146.8 interleaved. Block phases gain only with two rounds (16 rows a block at the
// DeepSeek shape on 132 SMs: 137.0 µs against 141.9 at 15 rows). With phase_steal
// (block phases) the rounds after the first are groups of phase_rows tokens handed to whichever
// block asks first: a block whose rounds run slow takes fewer. The rows' smem starts at
// mc.phase_base; sy.done is the phases' counter, or the steal's (zero between launches; at world
// size 1 no cross-rank barrier uses it). Whole block calls; false: a wait expired (recorded in
// the ErrorWord).
// kBegun: fan_begin issued the mbarriers and round 0's loads (with the same T and geometry).
// kMaySteal: mc.phase_steal is honoured (the alone kernels; the push / pull kernels' instances
// leave the steal out, which kept their registers from spilling).
template <bool kStamps, bool kBegun = false, bool kMaySteal = false, class Dests>
__device__ bool fan_in_phases(const uint8_t* x, int64_t T, int64_t rb, const MoveCfg& mc, uint8_t* smem_raw,
                              const Sync& sy, Dests dests, int warp, int lane) {
  uint8_t* tile = smem_raw + mc.phase_base + int64_t(warp) * rb;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem_raw + mc.phase_base + int64_t(mc.phase_rows) * rb) + warp;
  // The rows and their mbarriers may lie over plan tables that the build and fill_padding
  // read (RecvPlan::kept_bytes): every warp is past them before the first is overwritten.
  __syncthreads();
  if (!kBegun && lane == 0) {
    fence_proxy_async_shared();
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncwarp();
  const MoverWatch watch{sy.timeout_ns, sy.err, sy.err_host, sy.epoch};
  GridPhases gp{sy.done, 0};
  // Block-uniform: a block whose load or meeting failed stops moving rows but keeps meeting,
  // so the other blocks' waits end on time and record nothing over its error.
  bool ok = true;
  auto meet = [&](int fine) {
    ok = __syncthreads_and(ok && fine) != 0;
    if (mc.phase_grid) ok = gp.sync(sy.timeout_ns, sy.err, sy.err_host, sy.epoch) && ok;
  };
  const PhaseSplit split(T, mc.phase_rows);
  // Steal: round 0 is group blockIdx.x (phase_round0), then whatever group the block is given;
  // every block runs round 0, so that each asks (and is refused) at least once.
  const bool steal = kMaySteal && mc.phase_steal && !mc.phase_grid;
  __shared__ int64_t given;
  int64_t g = blockIdx.x;
  uint32_t parity = 0;
  for (int64_t r = 0; steal ? (r == 0 || g * mc.phase_rows < T) : r < split.rounds; ++r) {
    int64_t b0, b1;
    if (steal) {
      phase_group(T, mc.phase_rows, g, b0, b1);
    } else {
      split.block_range(T, r, b0, b1);
    }
    const int64_t t = b0 + warp;
    const bool mine = ok && t < b1;  // warp-uniform
    RowDsts d{nullptr, 0};
    int landed = 1;
    if (mine) {
      // This tile's previous stores finished reading it before the last meeting.
      if (lane == 0 && !(kBegun && r == 0)) phase_load(tile, x + t * rb, rb, bar);
      d = dests(t);  // routing and metadata while the row loads
      if (lane == 0) landed = mbar_try_wait(bar, parity) || mbar_wait_bounded(bar, parity, watch);
      landed = __shfl_sync(0xffffffffu, landed, 0);
      parity ^= 1u;
    }
    meet(landed);
    // Past the meeting every thread has read the last round's `given`; the ask's round trip
    // runs under this round's stores.
    if (steal && threadIdx.x == 0) given = phase_steal_next(sy.done, T, mc.phase_rows);
    if (r == 0) stamp<kStamps>(mc.stamps, kStampRouted);  // the timeline's marks: round 0's loads, then its stores
    if (mine && ok) {
      const uint64_t policy = evict_first_policy();
      for (int i = 0; i < d.n; ++i) {
        uint8_t* dst = reinterpret_cast<uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uint64_t>(d.dst), i));
        if (lane == 0) bulk_store_evict_first(dst, tile, uint32_t(rb), policy);
      }
      if (lane == 0) {
        bulk_commit();
        bulk_wait_read_all();
      }
      __syncwarp();
    }
    meet(1);
    if (r == 0) stamp<kStamps>(mc.stamps, kStampFirstPush);
    if (steal) g = given;
  }
  if (lane == 0) {
    bulk_wait_all();
    fence_proxy_async_global();
  }
  __syncwarp();
  if (mc.phase_grid) gp.finish();
  return ok;
}

// fan_in_phases' geometry in m: one row per warp, at most kMaxMoverWarps, in the `smem` bytes a
// block may take, starting past the first `kept` bytes of the m.plan_bytes tables (the ones the
// phases still read; the rest may be overwritten). False when not one row fits (the caller
// keeps its mover).
inline bool phase_geometry(MoveCfg& m, int64_t kept, int64_t smem, int64_t row_bytes, bool grid) {
  const int64_t base = std::min<int64_t>(m.plan_bytes, (kept + kSlotAlign - 1) / kSlotAlign * kSlotAlign);
  const int64_t rows = std::min<int64_t>(kMaxMoverWarps, (smem - base - kPhaseBarBytes) / row_bytes);
  if (rows < 1) return false;
  m.phase_base = base;
  m.phase_rows = int(rows);
  m.warps = int(rows);
  m.phase_grid = grid;
  return true;
}

// Shared bytes of a block of the phased fan-out.
inline int64_t phase_smem(const MoveCfg& m, int64_t row_bytes) {
  return std::max<int64_t>(m.plan_bytes, m.phase_base + int64_t(m.phase_rows) * row_bytes + kPhaseBarBytes);
}

// Grid-wide phases need every block resident at once: whether `grid` blocks of `kernel` are on a
// GPU of `sms` SMs, and the kernel's blocks per SM (per_sm -1: the occupancy query failed). The
// bindings word a refusal (csrc/bindings/refusals.h).
struct GridFit {
  bool fits;
  int per_sm;
};
template <typename K>
GridFit phase_grid_fit(K kernel, const MoveCfg& m, int64_t row_bytes, int grid, int sms) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, m.warps * 32, size_t(phase_smem(m, row_bytes))) !=
      cudaSuccess)
    return GridFit{false, -1};
  return GridFit{int64_t(per_sm) * sms >= grid, per_sm};
}

}  // namespace symmoe
