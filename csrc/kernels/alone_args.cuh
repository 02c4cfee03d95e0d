// The arguments of the world-size-1 dispatch kernels (alone_fan.cuh, alone_rows.cuh), which the
// bindings fill (csrc/bindings/alone_launch.cuh), and the wait both make for a routing that
// still runs when they start.
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/layout.cuh"
#include "../common/mover.cuh"
#include "../common/outputs.cuh"

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

}  // namespace symmoe
