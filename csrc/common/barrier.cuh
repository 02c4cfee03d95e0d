// Device barrier across ranks with a timeout. One int64 flag per peer lives in each rank's
// barrier area: rank r stores the epoch into flag[r] of every peer, then waits until all of
// its own flags reach the epoch. Epochs only grow (the host counts them), so a peer already
// one barrier ahead satisfies the wait too. On timeout the block records the stage, peer and
// epoch in the ErrorWord and returns: the host raises StallError, nothing hangs. The word has
// two copies: one in device memory that kernels poll (cheap), one in host-mapped memory the
// host reads without synchronising (a PCIe read per block would cost microseconds each).
#pragma once
#include <cstdint>

#include "layout.cuh"
#include "ptx.cuh"

namespace symmoe {

__device__ __forceinline__ bool error_set(const ErrorWord* err) {
  return ld_volatile(&err->stage) != 0;
}

__device__ __forceinline__ void report_error(ErrorWord* err, ErrorWord* err_host, int stage, int peer, int64_t epoch) {
  // Plain stores (host memory has no device atomics on PCIe hosts); stage last so a reader
  // that sees it also sees the rest.
  ErrorWord* words[2] = {err, err_host};
  for (ErrorWord* w : words) {
    if (w == nullptr) continue;
    volatile int64_t* e = reinterpret_cast<volatile int64_t*>(w);
    e[1] = peer;
    e[2] = epoch;
    __threadfence_system();
    e[0] = stage;
  }
  __threadfence_system();
}

// Whole block calls. Every write of the calling grid that peers must see has to be ordered
// before (see grid_last_block). flags_off: offset of the W-entry flag array in the segment.
template <class Transport>
__device__ void block_barrier(const Transport& tp, int rank, int world, int64_t flags_off, int64_t epoch,
                              uint64_t timeout_ns, ErrorWord* err, ErrorWord* err_host, int stage) {
  __syncthreads();
  if (world == 1) return;  // no one to wait for: the fences and the flag's round trip took 2.5 µs of the routing
  if (threadIdx.x == 0) fence_sys();  // cumulative: orders everything this block observed
  __syncthreads();
  for (int p = threadIdx.x; p < world; p += blockDim.x) tp.signal(p, flags_off + 8 * int64_t(rank), epoch);
  int64_t* flags = tp.local_flag(flags_off);
  for (int p = threadIdx.x; p < world; p += blockDim.x) {
    const uint64_t start = global_timer_ns();
    uint32_t spins = 0;
    while (ld_acquire_sys(flags + p) < epoch) {
      if ((++spins & 63) == 0) {
        if (global_timer_ns() - start > timeout_ns) {
          report_error(err, err_host, stage, p, epoch);
          break;
        }
        if (error_set(err)) break;  // another wait already failed: stop spinning
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) fence_sys();
  __syncthreads();
}

// Last-block-done: returns true in exactly one block, after every block of the grid called
// it; that block then sees all the grid's writes. `counter` is reset for the next launch.
__device__ __forceinline__ bool grid_last_block(unsigned int* counter) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned int ticket = atomicAdd(counter, 1u);
    last = (ticket == gridDim.x - 1);
    if (last) {
      *counter = 0u;
      __threadfence();
    }
  }
  __syncthreads();
  return last;
}

// One thread: spin (gpu-scope acquire) until *p >= target; past timeout_ns record (stage, peer,
// epoch) and return false. For waits on other blocks of the same grid. yield_to_error: a wait
// on another grid, which may have failed and never write *p: false, recording nothing, once the
// error word is set (a second record would overwrite the first one's stage).
template <class T>
__device__ bool wait_at_least_gpu(const T* p, T target, uint64_t timeout_ns, ErrorWord* err, ErrorWord* err_host,
                                  int stage, int peer, int64_t epoch, bool yield_to_error = false) {
  const uint64_t start = global_timer_ns();
  uint32_t spins = 0;
  while (ld_acquire_gpu(p) < target) {
    if ((++spins & 63) != 0) continue;
    if (yield_to_error && error_set(err)) return false;
    if (global_timer_ns() - start > timeout_ns) {
      report_error(err, err_host, stage, peer, epoch);
      return false;
    }
  }
  return true;
}

// Every block of one grid meets at each phase: block-uniform calls, every block resident at
// once (the caller's launch guarantees it, or the wait expires and records kStageFanPhase with
// the phase number as the peer). `counter` is zero at launch; finish() leaves it zero for the
// next one, as grid_last_block does. Phases count up, so the counter only grows until then.
struct GridPhases {
  unsigned int* counter;
  unsigned int phase;

  __device__ bool sync(uint64_t timeout_ns, ErrorWord* err, ErrorWord* err_host, int64_t epoch) {
    __shared__ int ok;
    __syncthreads();
    ++phase;
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      ok = wait_at_least_gpu(counter, phase * gridDim.x, timeout_ns, err, err_host, kStageFanPhase, int(phase), epoch);
    }
    __syncthreads();
    return ok != 0;
  }
  // Whole block, after its last sync(): the grid's last block to get here zeroes the counter.
  __device__ void finish() {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(counter, 1u) == (phase + 1) * gridDim.x - 1) *counter = 0u;
  }
};

template <class Transport>
__global__ void barrier_kernel(Transport tp, int rank, int world, int64_t flags_off, int64_t epoch,
                               uint64_t timeout_ns, ErrorWord* err, ErrorWord* err_host, int stage) {
  block_barrier(tp, rank, world, flags_off, epoch, timeout_ns, err, err_host, stage);
}

// What every kernel that waits with a timeout (and may end with a cross-rank barrier) needs.
struct Sync {
  int rank;
  int64_t epoch;
  uint64_t timeout_ns;
  ErrorWord* err;       // device copy: kernels poll it
  ErrorWord* err_host;  // host-mapped copy: the host reads it
  unsigned int* done;   // grid completion counter (zero between launches)
};

}  // namespace symmoe
