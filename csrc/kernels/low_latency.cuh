// Low-latency dispatch and combine (DeepEP V1's low_latency_* form) over load/store peers.
// symmoe/protocol/low_latency.py describes the flow and symmoe/low_latency.py the layout.
//
// Sequence numbers live on the device: state[0] counts dispatches, state[1] combines. A send
// kernel reads its call's seq as state + 1 and its last block stores it back; the receive
// kernel behind it in the stream reads state as is. So nothing comes from the host per call,
// and a captured CUDA graph replays with fresh numbers. Flags are compared for equality with
// seq; each region exists twice (parity seq & 1), which is safe because a rank sends call n + 2
// only after receiving call n + 1, which every peer sent only after receiving call n.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/ptx.cuh"

namespace symmoe {
namespace ll {

enum : int { kStageDispatchRecv = 101, kStageCombineRecv = 102, kStageBadExpert = 103 };
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxWorld = 64;
constexpr int kMaxTopk = 64;

struct Geometry {
  int rank, W, L, E, K, T_max, H;             // H in bf16 elements, a multiple of 8
  int64_t dflag, cflag, dmeta, dx, cx;        // offsets of the regions (parity 0)
  int64_t dflag_p, cflag_p, dmeta_p, dx_p, cx_p;  // bytes of one parity of each
};

struct Device {
  uint8_t* local;
  const int64_t* peer_bases;
  int* state;  // [0] dispatch seq, [1] combine seq, [2] [3] grid tickets of the two send kernels
  ErrorWord* err;
  ErrorWord* err_host;
  uint64_t timeout_ns;

  __device__ __forceinline__ uint8_t* map(int peer, int64_t off) const {
    return reinterpret_cast<uint8_t*>(__ldg(peer_bases + peer)) + off;
  }
};

__device__ __forceinline__ int ld_volatile_i32(const int* p) {
  int v;
  asm volatile("ld.volatile.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One warp copies a row of n16 16-byte pieces. kReadOnly: the source was not written during
// this kernel (the caller's x or y), so the non-coherent path may read it.
template <bool kReadOnly>
__device__ __forceinline__ void warp_copy_row(int4* dst, const int4* src, int n16, int lane) {
#pragma unroll 4
  for (int v = lane; v < n16; v += 32) dst[v] = kReadOnly ? __ldg(src + v) : src[v];
}

// Spin (system scope) until pred(*p); past the timeout record (stage, peer, seq) and return false.
template <class Pred>
__device__ bool wait_flag(const int64_t* p, Pred pred, const Device& d, int stage, int peer, int64_t seq) {
  const uint64_t start = global_timer_ns();
  uint32_t spins = 0;
  while (!pred(ld_acquire_sys(p))) {
    if ((++spins & 63) != 0) continue;
    if (error_set(d.err)) return false;  // another wait already failed
    if (global_timer_ns() - start > d.timeout_ns) {
      report_error(d.err, d.err_host, stage, peer, seq);
      return false;
    }
  }
  return true;
}

// The send kernel's last block advances the device sequence number (all blocks read it first).
__device__ __forceinline__ void advance_seq(const Device& d, int which, int seq) {
  if (grid_last_block(reinterpret_cast<unsigned int*>(d.state + 2 + which)) && threadIdx.x == 0) {
    d.state[which] = seq;
    __threadfence();
  }
}

// Dispatch, send: one warp per destination expert; a warp scans the tokens in order (ballot),
// so the rows of each (expert, source) region are in token order.
__global__ void __launch_bounds__(kThreads) dispatch_send_kernel(Geometry g, Device d, const int4* x,
                                                                 const int64_t* topk_idx, int T) {
  extern __shared__ int s_idx[];  // [T, K] expert ids, -1 where none
  __shared__ int s_seq;
  if (threadIdx.x == 0) s_seq = ld_volatile_i32(d.state) + 1;
  for (int i = threadIdx.x; i < T * g.K; i += blockDim.x) {
    const int64_t e = topk_idx[i];
    const bool ok = e >= 0 && e < g.E;
    // Reported beside the error word (err_host[1]), not in it: receive waits stop at an error.
    if (!ok && e != -1 && blockIdx.x == 0) report_error(nullptr, d.err_host + 1, kStageBadExpert, i / g.K, e);
    s_idx[i] = ok ? int(e) : -1;
  }
  __syncthreads();
  const int seq = s_seq, par = seq & 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n16 = g.H / 8;
  for (int e = blockIdx.x * kWarps + warp; e < g.E; e += gridDim.x * kWarps) {
    const int dst = e / g.L, j = e % g.L;
    uint8_t* base = d.map(dst, 0);
    const int64_t region = int64_t(j) * g.W + g.rank;
    int4* slot_x = reinterpret_cast<int4*>(base + g.dx + par * g.dx_p) + region * g.T_max * n16;
    int* slot_meta = reinterpret_cast<int*>(base + g.dmeta + par * g.dmeta_p) + region * g.T_max;
    int count = 0;
    for (int c = 0; c < T; c += 32) {
      const int t = c + lane;
      int hit = -1;
      if (t < T)
        for (int k = 0; k < g.K; ++k)
          if (s_idx[t * g.K + k] == e) {
            hit = k;
            break;
          }
      unsigned mask = __ballot_sync(0xffffffffu, hit >= 0);
      if (hit >= 0) slot_meta[count + __popc(mask & lanemask_lt())] = t * g.K + hit;
      while (mask) {
        const int b = __ffs(mask) - 1;
        mask &= mask - 1;
        warp_copy_row<true>(slot_x + int64_t(count) * n16, x + int64_t(c + b) * n16, n16, lane);
        ++count;
      }
    }
    __threadfence_system();
    __syncwarp();
    if (lane == 0)
      st_release_sys(reinterpret_cast<int64_t*>(base + g.dflag + par * g.dflag_p) + region,
                     (int64_t(seq) << 32) | int64_t(count));
  }
  advance_seq(d, 0, seq);
}

// Dispatch, receive: one block per local expert waits for every source's flag, then packs the
// regions in source order into recv_x[j].
__global__ void __launch_bounds__(kThreads) dispatch_recv_kernel(Geometry g, Device d, int4* recv_x,
                                                                 int* recv_count, int* src_info, int* src_slot,
                                                                 int64_t* layout_range) {
  __shared__ int s_cnt[kMaxWorld], s_begin[kMaxWorld + 1];
  const int seq = ld_volatile_i32(d.state), par = seq & 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n16 = g.H / 8;
  const int64_t rows = int64_t(g.W) * g.T_max;
  const int64_t* flags = reinterpret_cast<const int64_t*>(d.local + g.dflag + par * g.dflag_p);
  const int4* dx = reinterpret_cast<const int4*>(d.local + g.dx + par * g.dx_p);
  const int* meta = reinterpret_cast<const int*>(d.local + g.dmeta + par * g.dmeta_p);
  for (int j = blockIdx.x; j < g.L; j += gridDim.x) {
    for (int s = threadIdx.x; s < g.W; s += blockDim.x) {
      const int64_t* f = flags + int64_t(j) * g.W + s;
      const bool ok = wait_flag(f, [seq](int64_t v) { return (v >> 32) == seq; }, d, kStageDispatchRecv, s, seq);
      s_cnt[s] = ok ? int(ld_acquire_sys(f) & 0xffffffff) : 0;
      fence_sys();  // the rows behind the flag, for every thread of the block past the barrier
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int at = 0;
      for (int s = 0; s < g.W; ++s) {
        s_begin[s] = at;
        layout_range[int64_t(j) * g.W + s] = (int64_t(at) << 32) | int64_t(s_cnt[s]);
        at += s_cnt[s];
      }
      s_begin[g.W] = at;
      recv_count[j] = at;
    }
    __syncthreads();
    const int total = s_begin[g.W];
    for (int q = warp; q < total; q += kWarps) {
      int s = 0;
      while (q >= s_begin[s + 1]) ++s;
      const int i = q - s_begin[s];
      const int64_t from = (int64_t(j) * g.W + s) * g.T_max + i;
      warp_copy_row<false>(recv_x + (int64_t(j) * rows + q) * n16, dx + from * n16, n16, lane);
      if (lane == 0) {
        const int m = meta[from];
        src_info[int64_t(j) * rows + q] = m / g.K;
        src_slot[int64_t(j) * rows + q] = m % g.K;
      }
    }
    __syncthreads();
  }
}

// Combine, send: one block per local expert stores each row back into its source's cx[t, k],
// then seq into every source's flag of this expert (rows or not).
__global__ void __launch_bounds__(kThreads) combine_send_kernel(Geometry g, Device d, const int4* y,
                                                                const int* src_info, const int* src_slot,
                                                                const int64_t* layout_range) {
  __shared__ int s_begin[kMaxWorld + 1];
  __shared__ int s_seq;
  if (threadIdx.x == 0) s_seq = ld_volatile_i32(d.state + 1) + 1;
  __syncthreads();
  const int seq = s_seq, par = seq & 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n16 = g.H / 8;
  const int64_t rows = int64_t(g.W) * g.T_max;
  for (int j = blockIdx.x; j < g.L; j += gridDim.x) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < g.W; ++s) s_begin[s] = int(layout_range[int64_t(j) * g.W + s] >> 32);
      const int64_t last = layout_range[int64_t(j) * g.W + g.W - 1];
      s_begin[g.W] = int(last >> 32) + int(last & 0xffffffff);
    }
    __syncthreads();
    const int total = s_begin[g.W];
    for (int q = warp; q < total; q += kWarps) {
      int s = 0;
      while (q >= s_begin[s + 1]) ++s;
      const int64_t r = int64_t(j) * rows + q;
      const int t = src_info[r], k = src_slot[r];
      int4* dst = reinterpret_cast<int4*>(d.map(s, g.cx + par * g.cx_p)) + (int64_t(t) * g.K + k) * n16;
      warp_copy_row<true>(dst, y + r * n16, n16, lane);
    }
    __threadfence_system();
    __syncthreads();
    for (int s = threadIdx.x; s < g.W; s += blockDim.x)
      st_release_sys(reinterpret_cast<int64_t*>(d.map(s, g.cflag + par * g.cflag_p)) + int64_t(g.rank) * g.L + j,
                     int64_t(seq));
    __syncthreads();
  }
  advance_seq(d, 1, seq);
}

__device__ __forceinline__ void add_weighted(float (&acc)[8], float w, int4 v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] = __fadd_rn(acc[2 * i], __fmul_rn(w, f.x));
    acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], __fmul_rn(w, f.y));
  }
}

// Combine, receive: every block waits for all E flags, then reduces its tokens in fp32 in
// ascending k (a slot naming an expert again reads that expert's first slot) and casts once.
__global__ void __launch_bounds__(kThreads) combine_recv_kernel(Geometry g, Device d, const int64_t* topk_idx,
                                                                const float* topk_weights, int T, int4* out) {
  __shared__ int s_src[kMaxTopk];
  __shared__ float s_w[kMaxTopk];
  const int seq = ld_volatile_i32(d.state + 1), par = seq & 1;
  const int64_t* flags = reinterpret_cast<const int64_t*>(d.local + g.cflag + par * g.cflag_p);
  for (int e = threadIdx.x; e < g.E; e += blockDim.x)
    if (wait_flag(flags + e, [seq](int64_t v) { return v == seq; }, d, kStageCombineRecv, e, seq)) fence_sys();
  __syncthreads();
  const int n16 = g.H / 8;
  const int4* cx = reinterpret_cast<const int4*>(d.local + g.cx + par * g.cx_p);
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    for (int k = threadIdx.x; k < g.K; k += blockDim.x) {
      const int64_t e = topk_idx[int64_t(t) * g.K + k];
      int src = -1;
      if (e >= 0 && e < g.E) {
        src = k;
        for (int k2 = 0; k2 < k; ++k2)
          if (topk_idx[int64_t(t) * g.K + k2] == e) {
            src = k2;
            break;
          }
      }
      s_src[k] = src;
      s_w[k] = topk_weights[int64_t(t) * g.K + k];
    }
    __syncthreads();
    for (int v = threadIdx.x; v < n16; v += blockDim.x) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < g.K; ++k) {
        if (s_src[k] < 0) continue;
        add_weighted(acc, s_w[k], cx[(int64_t(t) * g.K + s_src[k]) * n16 + v]);
      }
      int4 r;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
      out[int64_t(t) * n16 + v] = r;
    }
    __syncthreads();
  }
}

}  // namespace ll
}  // namespace symmoe
