// The combine kernel of the NVSHMEM push protocol: rows back to their sources, then the
// reduction in the fixed order.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdint>

#include "../common/elem.cuh"
#include "device.cuh"

namespace symmoe {
namespace nv {

// ---- combine ---------------------------------------------------------------------------
struct CombineArgs {
  uint8_t* base;
  Layout lay;
  int me, C, expert_major, num_tokens;
  int64_t rows;              // rows this rank received (padding included)
  int64_t epoch;
  uint64_t timeout_ns;
  const uint8_t* y;          // [rows, H] expert outputs (or a symmetric staging copy)
  const float* rw;           // [rows, K] weights to combine (rank-major) or nullptr
  const int32_t* src_rank;   // [rows], -1 on padding
  const int32_t* src_tok;    // [rows]
  const int32_t* src_slot;   // [rows]
  int32_t* selfmap;          // [T * S] y row of each (token, slot) this rank kept, written here
  const int64_t* topk_idx;   // [T, K] as dispatched
  const float* topk_w;       // [T, K] as dispatched
  uint8_t* out_x;            // [T, H]
  float* out_w;              // [T, K] or nullptr
  ErrorWord* err;
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) combine_kernel(CombineArgs a) {
  const int W = static_cast<int>(a.lay.world_size), C = a.C, me = a.me;
  const int K = static_cast<int>(a.lay.topk), S = static_cast<int>(a.lay.combine_slots);
  const int L = static_cast<int>(a.lay.local_experts());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rb = a.lay.row_bytes();
  uint64_t* head = reinterpret_cast<uint64_t*>(a.base + a.lay.head);
  uint8_t* cx = a.base + a.lay.combine_x;
  float* cw = reinterpret_cast<float*>(a.base + a.lay.combine_w);

  // 1. Block c < C sends channel c of the received rows (in output order, whatever their
  // source) back to their sources' combine slots t * S + slot, and notes where the rows this
  // rank kept lie in y; then it signals head[c][me] at every rank, itself included.
  if (blockIdx.x < C) {
    const int c = blockIdx.x;
    for (int64_t r = chan_begin(a.rows, c, C) + warp; r < chan_begin(a.rows, c + 1, C); r += kWarps) {
      const int s = a.src_rank[r];
      if (s < 0) continue;  // padding
      const int64_t slot = int64_t(a.src_tok[r]) * S + a.src_slot[r];
      if (s == me) {
        if (lane == 0) a.selfmap[slot] = static_cast<int32_t>(r);
        continue;
      }
      nvshmemx_putmem_nbi_warp(cx + slot * rb, a.y + r * rb, rb, s);
      if (a.rw && lane < K) nvshmem_float_p(cw + slot * K + lane, a.rw[r * K + lane], s);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();  // the selfmap entries, for this rank's own reducing blocks
      nvshmem_fence();  // every put of the block before the signals
      for (int p = 0; p < W; ++p)
        nvshmemx_signal_op(head + int64_t(c) * W + me, sig_value(a.epoch, 0), NVSHMEM_SIGNAL_SET, p);
      nvshmem_quiet();
    }
  }

  // 2. Every block waits until every rank's channels arrived here, then reduces its tokens.
  // One warp per block polls: thousands of threads spinning on system-scope loads slowed
  // the peers' incoming NVLink writes several-fold (combine 855 us at W=2 vs 56 us at W=1).
  __shared__ int s_ok;
  if (threadIdx.x == 0) s_ok = 1;
  __syncthreads();
  for (int u = threadIdx.x; threadIdx.x < 32 && u < C * W; u += 32) {
    const int r = u % W;
    if (!wait_signal(head + u, sig_value(a.epoch, 0), a.timeout_ns, a.err, kStageCombineData, r, a.epoch)) {
      s_ok = 0;
      break;
    }
  }
  __syncthreads();
  if (!s_ok) return;

  __shared__ const uint8_t* s_src[kWarps][32];
  __shared__ float s_wt[kWarps][32];
  __shared__ const float* s_wsrc[kWarps][32];
  const int nvec = static_cast<int>(rb / 16);
  for (int64_t t = int64_t(blockIdx.x) * kWarps + warp; t < a.num_tokens; t += int64_t(gridDim.x) * kWarps) {
    // Contributions in the fixed order, one per lane slot j (at most K of them).
    int n = 0;
    if (!a.expert_major) {
      // Ranks holding one of the token's experts, ascending.
      uint64_t mask = 0;
      for (int k = 0; k < K; ++k) {
        const int64_t e = a.topk_idx[t * K + k];
        if (e >= 0) mask |= 1ull << (e / L);
      }
      for (int r = 0; r < W; ++r) {
        if (!(mask >> r & 1ull)) continue;
        if (lane == n) {
          if (r == me) {
            const int64_t row = a.selfmap[t * S + r];
            s_src[warp][n] = a.y + row * rb;
            s_wsrc[warp][n] = a.rw ? a.rw + row * K : nullptr;
          } else {
            s_src[warp][n] = cx + (t * S + r) * rb;
            s_wsrc[warp][n] = cw + (t * S + r) * K;
          }
          s_wt[warp][n] = 1.f;
        }
        ++n;
      }
    } else {
      for (int k = 0; k < K; ++k) {
        const int64_t e = a.topk_idx[t * K + k];
        if (e < 0) continue;
        if (lane == n) {
          const int r = static_cast<int>(e / L);
          s_src[warp][n] = r == me ? a.y + int64_t(a.selfmap[t * S + k]) * rb : cx + (t * S + k) * rb;
          s_wt[warp][n] = a.topk_w[t * K + k];
          s_wsrc[warp][n] = nullptr;
        }
        ++n;
      }
    }
    __syncwarp();
    for (int v = lane; v < nvec; v += 32) {
      float acc[Vec<T>::N];
#pragma unroll
      for (int i = 0; i < Vec<T>::N; ++i) acc[i] = 0.f;
      for (int j = 0; j < n; ++j) {
        float f[Vec<T>::N];
        Vec<T>::load(reinterpret_cast<const int4*>(s_src[warp][j])[v], f);
        if (!a.expert_major) {
#pragma unroll
          for (int i = 0; i < Vec<T>::N; ++i) acc[i] = __fadd_rn(acc[i], f[i]);
        } else {
          const float wt = s_wt[warp][j];
#pragma unroll
          for (int i = 0; i < Vec<T>::N; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(wt, f[i]));
        }
      }
      reinterpret_cast<int4*>(a.out_x + t * rb)[v] = Vec<T>::store(acc);
    }
    if (a.out_w && lane < K) {
      float acc = 0.f;
      for (int j = 0; j < n; ++j) acc = __fadd_rn(acc, s_wsrc[warp][j][lane]);
      a.out_w[t * K + lane] = acc;
    }
    __syncwarp();
  }
}

}  // namespace nv
}  // namespace symmoe
