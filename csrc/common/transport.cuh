// Device transport: how a kernel reaches a peer's segment. The kernels are templates on a
// Transport type; this file holds the plain load/store one (LSA: peers' segments are mapped
// into this process, as torch symmetric memory, CUDA IPC or NCCL LSA windows give). Other
// backends add their own type with the same members:
//
//   uint8_t* local                            this rank's segment
//   uint8_t* map(int peer, int64_t off)       a load/store pointer into peer's segment, or
//                                             nullptr when the peer is not mappable
//   void put_from_smem(int peer, int64_t off, const void* smem, uint32_t bytes)
//                                             one elected thread; completion tracked by
//                                             put_commit()/put_wait_all() (bulk groups here)
//   void signal(int peer, int64_t off, int64_t v)   release-store an int64 flag at peer
//   int64_t* local_flag(int64_t off)          this rank's flag to spin on
//   static constexpr bool kCanPull            peers' memory can be read (TMA loads)
#pragma once
#include <cstdint>

#include "ptx.cuh"

namespace symmoe {

struct LsaTransport {
  uint8_t* local;
  const int64_t* peer_bases;  // device array [world]: base address of each rank's segment
  static constexpr bool kCanPull = true;

  __device__ __forceinline__ uint8_t* map(int peer, int64_t off) const {
    return reinterpret_cast<uint8_t*>(__ldg(peer_bases + peer)) + off;
  }
  __device__ __forceinline__ void put_from_smem(int peer, int64_t off, const void* smem, uint32_t bytes) const {
    bulk_store(map(peer, off), smem, bytes);
  }
  __device__ __forceinline__ void signal(int peer, int64_t off, int64_t v) const {
    st_release_sys(reinterpret_cast<int64_t*>(map(peer, off)), v);
  }
  __device__ __forceinline__ int64_t* local_flag(int64_t off) const {
    return reinterpret_cast<int64_t*>(local + off);
  }
};

}  // namespace symmoe
