// The threads that run a piece of block-wide code: the whole block, meeting at __syncthreads, or
// a run of its warps meeting at a named barrier, so that the block's other warps work meanwhile
// (the W=1 rank-major routed kernel: a routing block's mover warps move rows while the rest of
// it routes its chunk). Code written for a team calls tid() / size() / sync() / all() where
// block code reads threadIdx.x / blockDim.x and calls __syncthreads / __syncthreads_and.
#pragma once

#include "ptx.cuh"

namespace symmoe {

struct WholeBlock {
  __device__ __forceinline__ int tid() const { return int(threadIdx.x); }
  __device__ __forceinline__ int size() const { return int(blockDim.x); }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
  __device__ __forceinline__ bool all(bool p) const { return __syncthreads_and(p) != 0; }
};

// Warps [first, first + warps) of the block on named barrier `id` (1-15; 0 is __syncthreads').
// Every thread of those warps calls sync() / all() alike; the block's other warps never do.
struct WarpTeam {
  int first, warps, id;
  __device__ __forceinline__ int tid() const { return int(threadIdx.x) - 32 * first; }
  __device__ __forceinline__ int size() const { return 32 * warps; }
  __device__ __forceinline__ void sync() const { named_barrier(id, size()); }
  __device__ __forceinline__ bool all(bool p) const { return named_barrier_and(id, size(), p); }
};

}  // namespace symmoe
