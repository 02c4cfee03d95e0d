// Device pieces every NVSHMEM kernel uses: block shape, signal words (common/channel.cuh:
// epoch << 32 | count), the error record with its device mirror, waits with a timeout, peer addresses for plain
// stores, and a warp row copy.
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdint>

#include "../common/channel.cuh"
#include "../common/layout.cuh"
#include "../common/ptx.cuh"

namespace symmoe {
namespace nv {

constexpr int kThreads = 768;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroups = 8;     // warp groups per sender block (named barriers 1..8)
constexpr int kMaxWorld = 64;     // receiver bookkeeping lives in shared memory
constexpr int kRowsPerWarp = 2;   // rows each warp puts between two tail signals

// ---- small device helpers --------------------------------------------------------------
// Rows the signal says have arrived for this epoch (all of them if a later epoch wrote it).
__device__ __forceinline__ int64_t delivered(uint64_t v, int64_t epoch, int64_t total) {
  const uint64_t e = v >> 32;
  if (e == static_cast<uint64_t>(epoch)) return min(total, static_cast<int64_t>(v & 0xffffffffull));
  return e > static_cast<uint64_t>(epoch) ? total : 0;
}

// The host reads the host-mapped ErrorWord; kernels poll this device mirror of it (a read of
// host memory per check would cost a PCIe round trip in every block).
__device__ ErrorWord g_err;

__device__ __forceinline__ void report(ErrorWord* err, int stage, int peer, int64_t epoch) {
  if (ld_volatile(&g_err.stage) != 0) return;  // keep the first failure
  volatile int64_t* words[2] = {reinterpret_cast<volatile int64_t*>(err), reinterpret_cast<volatile int64_t*>(&g_err)};
  for (volatile int64_t* e : words) {
    e[1] = peer;
    e[2] = epoch;
    __threadfence_system();
    e[0] = stage;
  }
  __threadfence_system();
}

__device__ __forceinline__ bool failed() { return ld_volatile(&g_err.stage) != 0; }

// Wait until the local signal word reaches `want`; false (and an error record) on timeout.
__device__ bool wait_signal(const uint64_t* sig, uint64_t want, uint64_t timeout_ns, ErrorWord* err, int stage,
                            int peer, int64_t epoch) {
  const uint64_t start = global_timer_ns();
  uint32_t spins = 0;
  while (static_cast<uint64_t>(ld_acquire_sys(reinterpret_cast<const int64_t*>(sig))) < want) {
    __nanosleep(64);  // leave the memory system to the data on its way here
    if ((++spins & 255) == 0) {
      if (global_timer_ns() - start > timeout_ns) {
        report(err, stage, peer, epoch);
        return false;
      }
      if (failed()) return false;
    }
  }
  return true;
}

// `local` (an address in this PE's symmetric segment at `base`) as seen by the PE whose
// segment nvshmem_ptr(base, pe) returned: plain stores reach it (NVLink, or the same GPU under
// MPS). Where nvshmem_ptr returns nullptr the kernels use the put path (IBGDA) instead.
template <typename T>
__device__ __forceinline__ T* at_peer(uint8_t* peer_base, const uint8_t* base, T* local) {
  return reinterpret_cast<T*>(peer_base + (reinterpret_cast<const uint8_t*>(local) - base));
}

// Warp copy of one row between local addresses; bytes % 16 == 0. kImmutable: the source does
// not change during the kernel (user inputs), so the read-only path may cache it; rows that
// peers write while the kernel runs (the pool) use plain loads.
template <bool kImmutable>
__device__ __forceinline__ int4 load16(const int4* p) {
  if constexpr (kImmutable) return __ldg(p);
  return *p;
}
template <bool kImmutable>
__device__ __forceinline__ void warp_copy_row(uint8_t* dst, const uint8_t* src, int64_t bytes, int lane) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  const int n = static_cast<int>(bytes / 16);
  constexpr int U = 7;  // a 7168-wide bf16 row is 28 vectors per lane: 4 steps (microbenchmark: warprow U=7)
  int i = lane;
  for (; i + 32 * (U - 1) < n; i += 32 * U) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = load16<kImmutable>(s + i + 32 * u);
#pragma unroll
    for (int u = 0; u < U; ++u) d[i + 32 * u] = v[u];
  }
  for (; i < n; i += 32) d[i] = load16<kImmutable>(s + i);
}

}  // namespace nv
}  // namespace symmoe
