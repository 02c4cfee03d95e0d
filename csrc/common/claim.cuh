// Items of a data kernel handed out at run time. With a fixed stride (warp w: items w, w + n,
// ...) the warps on SMs that get less bandwidth finish last: a W=1 cached rank dispatch's
// warps ended between 26 and 35 µs (scripts/timeline_probe.py, session 21). Here each warp's
// first item is still its own index (no atomic before the first copy), and every later item
// comes from a grid-wide counter, claimed one item ahead so the atomic's round trip overlaps
// a copy instead of preceding it.
//
// The counter needs no reset at the end of a launch (which would cost every block an atomic
// round trip at its tail): launches of one kernel alternate between two counters, and each
// launch zeroes the one its successor uses. Stream order makes that safe: the successor
// starts after this launch ends, and the predecessor that used the zeroed counter has ended.
#pragma once
#include <cstdint>

namespace symmoe {

struct WorkQueue {
  unsigned int* ctr;   // this launch's counter (zero at launch)
  unsigned int* next;  // the next launch's counter: zeroed by this one
};

// Per warp, every lane: `cur` is the item being worked on, `ahead` the next one (its inputs
// can be loaded now); a claim for the one after is in flight.
struct ItemClaim {
  WorkQueue q;
  int64_t base;      // dynamic items start after the static first ones (one per warp)
  int64_t items;     // items < this exist
  unsigned int got;  // lane 0: the claim in flight (read only when `ahead` moves on)
  bool pending;

  // At kernel entry, before any early return: zero the successor's counter and claim the
  // warp's second item while the prologue runs.
  __device__ __forceinline__ void start(WorkQueue wq, int64_t nwarps) {
    q = wq;
    base = nwarps;
    if (blockIdx.x == 0 && threadIdx.x == 0) *q.next = 0u;
    if ((threadIdx.x & 31) == 0) got = atomicAdd(q.ctr, 1u);
    pending = true;
  }
  // The first item (the warp's index) and the next; `items` known now (after the plan).
  __device__ __forceinline__ void first(int64_t warp_index, int64_t n, int64_t& cur, int64_t& ahead) {
    items = n;
    cur = warp_index;
    ahead = cur < items ? take() : items;
  }
  // cur <- ahead, ahead <- the claim in flight; issue the next claim while ahead is real.
  __device__ __forceinline__ void advance(int64_t& cur, int64_t& ahead) {
    cur = ahead;
    ahead = cur < items ? take() : items;
  }
  // Issue the claim of the item after `ahead` (call once `ahead`'s inputs are in flight).
  __device__ __forceinline__ void claim(int64_t ahead) {
    if (ahead >= items || pending) return;
    if ((threadIdx.x & 31) == 0) got = atomicAdd(q.ctr, 1u);
    pending = true;
  }

 private:
  __device__ __forceinline__ int64_t take() {
    if (!pending) return items;
    pending = false;
    const int64_t v = base + int64_t(__shfl_sync(0xffffffffu, got, 0));
    return v < items ? v : items;
  }
};

}  // namespace symmoe
