// The combine kernels of the NVSHMEM push protocol: rows back to their sources with puts and
// signals, then the reduction in the fixed order (common/reduce.cuh, shared with the CUDA
// protocols).
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdint>

#include "../common/reduce.cuh"
#include "device.cuh"

namespace symmoe {
namespace nv {

// ---- combine ---------------------------------------------------------------------------
struct CombineArgs {
  uint8_t* base;
  Layout lay;
  int me, C;
  int direct;                // 1: plain stores to load/store-reachable peers; 0: puts to all
  int64_t rows;              // rows this rank received (padding included)
  int64_t epoch;
  uint64_t timeout_ns;
  const uint8_t* y;          // [rows, H] expert outputs (or a symmetric staging copy)
  const float* rw;           // [rows, K] weights to combine (rank-major) or nullptr
  const int32_t* src_rank;   // [rows], -1 on padding
  const int32_t* src_tok;    // [rows]
  const int32_t* src_slot;   // [rows]
  ErrorWord* err;
};

// Block c sends channel c of the received rows (in output order, whatever their source) back
// to their sources' combine slots t * S + slot (the rows this rank kept stay in y: the dispatch
// recorded them in its selfmap); it signals head[c][me] at every rank, itself included, then
// waits until channel c of every rank has arrived here. When the kernel ends, every slot the
// reduction reads is in. Not launched at world size 1.
__global__ void __launch_bounds__(kThreads, 1) combine_send_kernel(CombineArgs a) {
  const int W = static_cast<int>(a.lay.world_size), C = a.C, me = a.me, c = blockIdx.x;
  const int K = static_cast<int>(a.lay.topk), S = static_cast<int>(a.lay.combine_slots);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rb = a.lay.row_bytes();
  uint64_t* head = reinterpret_cast<uint64_t*>(a.base + a.lay.head);
  uint8_t* cx = a.base + a.lay.combine_x;
  float* cw = reinterpret_cast<float*>(a.base + a.lay.combine_w);
  // Peers reachable by load/store get plain vector stores (as the dispatch senders do).
  __shared__ uint8_t* s_peer[kMaxWorld];
  for (int p = threadIdx.x; p < W; p += blockDim.x)
    s_peer[p] = a.direct ? static_cast<uint8_t*>(nvshmem_ptr(a.base, p)) : nullptr;
  __syncthreads();
  // A row's source words are loaded together and one row ahead, and its weights before its
  // copy: no row's copy waits on a metadata round trip.
  const int64_t r0 = chan_begin(a.rows, c, C), r1 = chan_begin(a.rows, c + 1, C);
  auto source_of = [&](int64_t r) { return r < r1 ? int3{a.src_rank[r], a.src_tok[r], a.src_slot[r]} : int3{-1, 0, 0}; };
  int3 next = source_of(r0 + warp);
  for (int64_t r = r0 + warp; r < r1; r += kWarps) {
    const int3 src = next;
    next = source_of(r + kWarps);
    const int s = src.x;
    if (s < 0) continue;  // padding
    if (s == me) continue;
    const int64_t slot = int64_t(src.y) * S + src.z;
    const float wt = a.rw && lane < K ? a.rw[r * K + lane] : 0.f;
    if (uint8_t* ps = s_peer[s]) {
      warp_copy_row<true>(at_peer(ps, a.base, cx + slot * rb), a.y + r * rb, rb, lane);
      if (a.rw && lane < K) at_peer(ps, a.base, cw)[slot * K + lane] = wt;
    } else {
      nvshmemx_putmem_nbi_warp(cx + slot * rb, a.y + r * rb, rb, s);
      if (a.rw && lane < K) nvshmem_float_p(cw + slot * K + lane, wt, s);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // every store of the block before the signals
    nvshmem_fence();         // every put of the block before the signals
    for (int p = 0; p < W; ++p)
      nvshmemx_signal_op(head + int64_t(c) * W + me, sig_value(a.epoch, 0), NVSHMEM_SIGNAL_SET, p);
    nvshmem_quiet();
  }
  // One warp polls: thousands of threads spinning on system-scope loads slowed the peers'
  // incoming NVLink writes several-fold (combine 855 us at W=2 vs 56 us at W=1).
  for (int r = threadIdx.x; threadIdx.x < 32 && r < W; r += 32)
    if (!wait_signal(head + int64_t(c) * W + r, sig_value(a.epoch, 0), a.timeout_ns, a.err, kStageCombineData, r,
                     a.epoch))
      break;
}

// Every slot has arrived (the send kernel ended): the shared reduction, one block per token.
// The minimum of 8 blocks per SM caps registers at 64: built with -rdc (NVSHMEM's device
// library needs it) ptxas gave this kernel 86 registers (5 blocks per SM) where the CUDA
// protocols' copy, built without, has 56 (9 blocks); no spills either way.
template <typename T>
__global__ void __launch_bounds__(kReduceThreads, 8) combine_reduce_kernel(CombineSources cs, T* out, float* out_w) {
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = failed();
  __syncthreads();
  // Whole rows (one part): under -rdc and 64 registers the parts' bookkeeping spills, and
  // its grid (16 blocks a SM held, 8 resident) already divides 4096 tokens evenly; halves ran
  // the W=1 rank combine kernel at 35.6 us against 33.3.
  if (!dead) reduce_tokens<T>(cs, out, out_w, 1);
}

}  // namespace nv
}  // namespace symmoe
