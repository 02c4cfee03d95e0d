// A warp moves row pieces with bulk copies: load a piece global->shared (completing on an
// mbarrier), then store it shared->global to up to kMaxDst destinations. `depth` shared slots
// per warp (2..kMaxDepth): the loads of the depth - 1 newest items are in flight while the
// oldest is being stored. Depth 2 is the original mover (item n loads while n - 1 stores).
//
// Usage (all lanes of the warp, uniformly):
//   uint8_t** d = mv.next_dsts(); lanes write d[0..n); __syncwarp(); mv.push(src, n, bytes);
//   ... mv.flush();   // all stores complete and ordered before later fences
// Lane 0 issues the copies; the bookkeeping is replicated in every lane so it stays uniform.
//
// Waits are bounded like every other device wait: a load that has not landed after the
// kernel's timeout records stage "bulk copy" in the ErrorWord (peer = the warp's global
// index, epoch = the kernel's barrier epoch) and the mover stops issuing copies; the host
// raises StallError. Without a watch (err == nullptr) the wait is unbounded, as before.
#pragma once
#include <cstdint>

#include <algorithm>

#include "barrier.cuh"
#include "ptx.cuh"

namespace symmoe {

constexpr int kMaxDst = 32;  // topk <= 32 (config) bounds the destinations of one row
constexpr int kMaxDepth = 16;  // slots per warp (phase bits of one uint32)
constexpr int kRowDepth = 4;   // the automatic copy depth: slots per warp for whole rows
constexpr uint32_t kSlotAlign = 128;
constexpr int kMaxMoverWarps = 16;  // warps per block of the data kernels (as many as their slots fit)
constexpr uint32_t kMaxSlotBytes = 16384;  // default piece of whole-row copies (copy bytes 0)

struct WarpMoverSmem {
  // Per slot: the piece, its mbarrier, its destinations, its (ndst, bytes).
  static __host__ __device__ uint32_t per_warp_bytes(uint32_t slot_bytes, int depth = 2) {
    const uint32_t n = uint32_t(depth) * (slot_bytes + 8 + kMaxDst * 8 + 8);
    return (n + kSlotAlign - 1) / kSlotAlign * kSlotAlign;  // next warp's slots stay aligned
  }
};

// A data kernel's block: the mover's geometry, or the phased fan-out's (common/phases.cuh).
struct MoveCfg {
  uint32_t slot_bytes;  // bulk piece size (multiple of 16)
  int warps;            // warps per block (each with `depth` slots)
  int64_t plan_bytes;   // shared bytes before the warps' areas
  int depth;            // the mover's slots per warp (WarpMover)
  uint64_t* stamps = nullptr;  // timeline of the call (stamps.cuh): the kStamps kernels' only
  // The phased fan-out (W = 1 expert-major only; 0: the mover): rows a block holds per phase
  // (one per warp; warps == phase_rows), and whether all blocks meet between phases.
  int phase_rows = 0;
  bool phase_grid = false;
  // The steal mode (alone kernels, block phases): after round 0 a block takes the next
  // group of phase_rows tokens from a grid counter instead of its fixed share of each round.
  bool phase_steal = false;
  int64_t phase_base = 0;  // where those rows start: the end of the plan tables the phases still read
  // The push's rows not packed at their source (an FP8 dispatch's x as e4m3 rows and scale rows,
  // x_tail != nullptr): row t's first x_head bytes at x + t * x_head, the rest at
  // x_tail + t * (row_bytes - x_head). The pull reads packed rows only (peers read its input).
  const uint8_t* x_tail = nullptr;
  int64_t x_head = 0;
};

struct MoverWatch {  // what a bounded wait needs (from the kernel's Sync)
  uint64_t timeout_ns;
  ErrorWord* err;       // device copy (nullptr: unbounded waits)
  ErrorWord* err_host;  // host-mapped copy
  int64_t epoch;        // reported with the error
};

// Slow path of a slot wait (lane 0, after a first try failed): spin until the phase with
// parity `par` completes; after w.timeout_ns record the error and return false. Out of line
// so the fast path stays small; scalars only, so the mover stays in registers.
static __device__ __noinline__ bool mbar_wait_bounded(uint64_t* bar, uint32_t par, MoverWatch w) {
  const uint64_t start = global_timer_ns();
  uint32_t spins = 0;
  while (!mbar_try_wait(bar, par)) {
    if (w.err != nullptr && (++spins & 15) == 0 && global_timer_ns() - start > w.timeout_ns) {
      const int64_t gwarp = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
      report_error(w.err, w.err_host, kStageBulkCopy, int(gwarp), w.epoch);
      return false;
    }
  }
  return true;
}

struct WarpMover {
  uint8_t* slots;     // [depth][slot_bytes]
  uint32_t slot_bytes;
  uint64_t* bar;      // [depth]
  uint8_t** dsts;     // [depth][kMaxDst]
  uint32_t* meta;     // [depth][2]: ndst, bytes
  uint32_t phase;     // parity bit per slot
  int depth;
  int cur;            // slot of the next item
  int oldest;         // slot of the oldest item loaded and not yet stored
  int inflight;       // items loaded and not yet stored
  bool failed;        // a load timed out: issue nothing more (uniform across the warp)
  MoverWatch watch;

  // `base`: this warp's shared area, per_warp_bytes(slot_bytes, depth) long, kSlotAlign aligned.
  __device__ void init(uint8_t* base, uint32_t slot_bytes, int depth = 2,
                       MoverWatch w = MoverWatch{0, nullptr, nullptr, 0}) {
    watch = w;
    failed = false;
    this->depth = depth;
    slots = base;
    this->slot_bytes = slot_bytes;
    bar = reinterpret_cast<uint64_t*>(base + int64_t(depth) * slot_bytes);
    dsts = reinterpret_cast<uint8_t**>(bar + depth);
    meta = reinterpret_cast<uint32_t*>(dsts + int64_t(depth) * kMaxDst);
    phase = 0;
    cur = oldest = inflight = 0;
    if ((threadIdx.x & 31) == 0) {
      for (int s = 0; s < depth; ++s) mbar_init(&bar[s], 1);
      mbar_init_fence();
    }
    __syncwarp();
  }

  __device__ __forceinline__ uint8_t** next_dsts() const { return dsts + cur * kMaxDst; }

  // The oldest item: wait for its load, store it to its destinations (one bulk group).
  __device__ __forceinline__ void drain() {
    const int s = oldest;
    int ok = 1;
    if ((threadIdx.x & 31) == 0) {
      const uint32_t par = (phase >> s) & 1u;
      if (!mbar_try_wait(&bar[s], par)) ok = mbar_wait_bounded(&bar[s], par, watch) ? 1 : 0;
      if (ok) {
        const uint32_t n = meta[2 * s], bytes = meta[2 * s + 1];
        uint8_t** d = dsts + s * kMaxDst;
        // Rows stream through once: evict-first, as the phased fan-out (common/phases.cuh).
        const uint64_t policy = evict_first_policy();
        for (uint32_t i = 0; i < n; ++i) bulk_store_evict_first(d[i], slots + int64_t(s) * slot_bytes, bytes, policy);
        bulk_commit();
      }
    }
    if (!__shfl_sync(0xffffffffu, ok, 0)) failed = true;
    phase ^= 1u << s;
    oldest = oldest + 1 == depth ? 0 : oldest + 1;
    --inflight;
  }

  // A piece of `bytes` from src, or of a + b bytes from two sources (an FP8 row whose e4m3
  // bytes and scale bytes lie in two tensors: one piece in the slot, one store each); n
  // destinations already in next_dsts(); every size % 16 == 0.
  __device__ void push(const void* src, int n, uint32_t bytes) { push(src, bytes, nullptr, 0, n); }
  __device__ void push(const void* src_a, uint32_t a, const void* src_b, uint32_t b, int n) {
    if (failed) return;  // a load never landed: this slot may still be written, leave it
    if ((threadIdx.x & 31) == 0) {
      // The slot's previous stores (depth items back, the latest committed group) must have
      // read it before the new load lands.
      bulk_wait_read_all();
      meta[2 * cur] = uint32_t(n);
      meta[2 * cur + 1] = a + b;
      mbar_arrive_expect_tx(&bar[cur], a + b);
      uint8_t* slot = slots + int64_t(cur) * slot_bytes;
      const uint64_t policy = evict_first_policy();
      if (a) bulk_load_evict_first(slot, src_a, a, &bar[cur], policy);
      if (b) bulk_load_evict_first(slot + a, src_b, b, &bar[cur], policy);
    }
    cur = cur + 1 == depth ? 0 : cur + 1;
    if (++inflight == depth) drain();  // the ring is full: store the oldest
    __syncwarp();
  }

  __device__ void flush() {
    while (inflight > 0 && !failed) drain();
    inflight = 0;
    if ((threadIdx.x & 31) == 0) {
      bulk_wait_all();
      fence_proxy_async_global();  // order the async-proxy writes before generic fences/flags
    }
    __syncwarp();
  }
};

// A token's row of rb bytes to the n destinations whose addresses lanes < n hold in dst, in
// pieces of slot_bytes (all lanes): its first `head` bytes from src, the rest from tail (an FP8
// row not packed at its source: e4m3 bytes, then scale bytes; head = rb: one source).
__device__ __forceinline__ void move_row(WarpMover& mv, const uint8_t* src, uint8_t* dst, int n, int64_t rb,
                                         uint32_t slot_bytes, int lane, int64_t head = -1,
                                         const uint8_t* tail = nullptr) {
  if (head < 0) head = rb;
  for (int64_t off = 0; off < rb; off += slot_bytes) {
    const uint32_t bytes = uint32_t(min(int64_t(slot_bytes), rb - off));
    const uint32_t a = off < head ? uint32_t(min(int64_t(bytes), head - off)) : 0;
    if (lane < n) mv.next_dsts()[lane] = dst + off;
    __syncwarp();
    mv.push(src + min(off, head), a, tail + max(off - head, int64_t(0)), bytes - a, n);
  }
}

// ---- host: the mover's geometry ---------------------------------------------------------
// Rows of rb bytes split into equal pieces of at most `cap` bytes, each rounded up to 128 so
// every warp's slots stay aligned.
inline uint32_t piece_bytes(int64_t rb, int64_t cap) {
  const int64_t pieces = (rb + cap - 1) / cap;
  const int64_t b = ((rb + pieces - 1) / pieces + 15) / 16 * 16;
  return uint32_t((b + kSlotAlign - 1) / kSlotAlign * kSlotAlign);
}

// m (slot_bytes, depth) with its warps per block: as many as fit next to `plan` bytes of
// tables in `limit` bytes of shared memory, at most kMaxMoverWarps. depth_auto: deep slots
// give way to 2 where they would leave one warp a block (one warp costs more than depth wins).
// warps 0: not one slot fits (the bindings refuse it: csrc/bindings/refusals.h).
inline MoveCfg fit_mover(MoveCfg m, int64_t plan, int64_t limit, bool depth_auto) {
  m.plan_bytes = (plan + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  auto fits = [&] { return (limit - m.plan_bytes) / int64_t(WarpMoverSmem::per_warp_bytes(m.slot_bytes, m.depth)); };
  if (depth_auto && m.depth > 2 && fits() < 2) m.depth = 2;
  m.warps = int(std::max<int64_t>(0, std::min<int64_t>(kMaxMoverWarps, fits())));
  return m;
}

// Whole rows of rb bytes by the mover: pieces of at most `piece` bytes, `depth` slots a warp, as
// many warps as fit in `limit` bytes of shared memory (fit_mover, depth_auto as there).
inline MoveCfg row_mover(int64_t rb, int64_t piece, int depth, int64_t limit, bool depth_auto) {
  MoveCfg m{};
  m.slot_bytes = piece_bytes(rb, piece);
  m.depth = depth;
  return fit_mover(m, 0, limit, depth_auto);
}

}  // namespace symmoe
