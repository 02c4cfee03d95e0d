// Optional timeline of the data kernels (scripts/timeline_probe.py): lane 0 of every warp
// writes (%globaltimer, clock64) at a few fixed marks, so a probe can split a kernel's time
// into launch skew, prologue, the copy loop and the drain. A template switch: the kernels
// every normal call runs have no stamps at all (even a predicated one cost pull 64 bytes of
// register spills).
#pragma once
#include <cstdint>

#include "ptx.cuh"

namespace symmoe {

enum StampMark : int {
  kStampEnter,      // kernel entry
  kStampChecked,    // the error word read (block barrier)
  kStampTables,     // plan tables built
  kStampBuilt,      // ... and checked (counts, capacity)
  kStampPlanned,    // mover set up: the copies can start
  kStampRouted,     // the warp's first item: routing read, metadata stored, destinations known
  kStampFirstPush,  // ... and its first bulk load issued
  kStampLoopEnd,
  kStampFlushed,    // the warp's stores complete
  kStampMarks
};
constexpr int kStampWarps = 16;  // warps per block a timeline holds room for (kMaxMoverWarps)

// One mark's time: (globaltimer ns, clock64).
struct StampTime {
  uint64_t ns = 0, clk = 0;
  __device__ static StampTime now() { return {global_timer_ns(), uint64_t(clock64())}; }
};

// s: [blocks][kStampWarps][kStampMarks][2] uint64; the calling warp's `mark` in row `row`.
__device__ __forceinline__ void stamp_at(uint64_t* s, int64_t row, int mark, StampTime t) {
  if ((threadIdx.x & 31) != 0) return;
  uint64_t* p = s + ((row * kStampWarps + (threadIdx.x >> 5)) * kStampMarks + mark) * 2;
  p[0] = t.ns;
  p[1] = t.clk;
}

// The calling warp's `mark`, now, in its block's row.
template <bool kOn>
__device__ __forceinline__ void stamp(uint64_t* s, int mark) {
  if constexpr (!kOn) return;
  if ((threadIdx.x & 31) != 0) return;
  stamp_at(s, blockIdx.x, mark, StampTime::now());
}

}  // namespace symmoe
