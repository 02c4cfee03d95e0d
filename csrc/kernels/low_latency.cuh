// Low-latency dispatch and combine (DeepEP V1's low_latency_* form) over load/store peers.
// symmoe/protocol/low_latency.py describes the flow and symmoe/low_latency.py the layout.
//
// Sequence numbers live on the device: state[0] counts dispatches, state[1] combines. A send
// kernel reads its call's seq as state + 1 and its last block stores it back; the receive
// kernel behind it in the stream reads state as is. So nothing comes from the host per call,
// and a captured CUDA graph replays with fresh numbers. Flags are compared for equality with
// seq; each region exists twice (parity seq & 1), which is safe because a rank sends call n + 2
// only after receiving call n + 1, which every peer sent only after receiving call n.
//
// Work split (the host picks the grid: every SM the rank may use, see make_engine):
// - every copy moves a row in pieces of kPiece 16-byte vectors; a warp issues all kUnroll loads
//   of a piece before its first store, so each lane has kUnroll loads in flight;
// - dispatch send: block b owns experts b, b + grid, ...; for up to `ce` of them at a time one
//   warp each lists the rows (ballot over the flat topk_idx, so in token order), then all warps
//   of the block copy the pieces of all listed rows, then the flags go out;
// - dispatch receive and combine send: units (local expert, part), `parts` blocks per expert
//   when the grid outnumbers the local experts; a unit's warps share its rows' pieces;
// - combine receive: units (token, part of the row); each thread reduces 16-byte columns of
//   one token over its top-k slots, loads first, then the fp32 adds in ascending k.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/ptx.cuh"

namespace symmoe {
namespace ll {

enum : int { kStageDispatchRecv = 101, kStageCombineRecv = 102, kStageBadExpert = 103 };
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// Two blocks fit on an SM (<= 64 registers a thread): the receive kernels of the ranks that
// share a GPU spin while they wait, and together they hold at most one block per SM (the host
// splits the SMs among those ranks), so a sender's block always finds room.
constexpr int kMinBlocksPerSm = 2;
constexpr int kMaxWorld = 64;
constexpr int kMaxTopk = 64;
constexpr int kUnroll = 8;             // 16-byte loads in flight per lane
constexpr int kPiece = 32 * kUnroll;   // 16-byte vectors a warp moves per step (4 KB)

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
  // Phase stamps (nullptr: off): per kernel (kStamp*), the first block's start (atomicMin), the
  // last time a block of a receive kernel finished waiting, and the last block's end (atomicMax),
  // in global-timer ns. The host resets them before a call and reads them after it.
  unsigned long long* stamps;

  __device__ __forceinline__ uint8_t* map(int peer, int64_t off) const {
    return reinterpret_cast<uint8_t*>(__ldg(peer_bases + peer)) + off;
  }
};

enum : int { kStampDispatchSend = 0, kStampDispatchRecv = 1, kStampCombineSend = 2, kStampCombineRecv = 3 };
enum : int { kStampStart = 0, kStampWaited = 1, kStampEnd = 2, kStampsPerKernel = 3 };

// Thread 0 of a block stamps the global timer into `what` of `kernel` (see Device::stamps).
__device__ __forceinline__ void stamp(const Device& d, int kernel, int what) {
  if (d.stamps == nullptr || threadIdx.x != 0) return;
  unsigned long long* at = d.stamps + kernel * kStampsPerKernel + what;
  const unsigned long long t = global_timer_ns();
  if (what == kStampStart) atomicMin(at, t);
  else atomicMax(at, t);
}

__device__ __forceinline__ int ld_volatile_i32(const int* p) {
  int v;
  asm volatile("ld.volatile.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Read-only 16-byte load that skips L1 (the caller's x or y: not written during the kernel).
__device__ __forceinline__ int4 ld_nc_na(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One warp copies n <= kPiece 16-byte vectors: every load of the piece first, then the stores.
// kReadOnly: the source was not written during this kernel, so the non-coherent path may read it.
template <bool kReadOnly>
__device__ __forceinline__ void warp_copy_piece(int4* dst, const int4* src, int n, int lane) {
  int4 v[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int i = lane + 32 * u;
    if (i < n) v[u] = kReadOnly ? ld_nc_na(src + i) : src[i];
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int i = lane + 32 * u;
    if (i < n) dst[i] = v[u];
  }
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

// Source s of row q of a packed expert (begin[s] <= q < begin[s + 1]).
__device__ __forceinline__ int source_of(const int* begin, int q) {
  int s = 0;
  while (q >= begin[s + 1]) ++s;
  return s;
}

// One warp lists the rows of this rank's tokens for expert e: the flat slots i = t * K + k
// naming e (a token naming e twice: its first slot), in ascending i, so in token order. Each
// goes to list[] and to the expert's dmeta; returns the count. `report`: this warp reports
// expert ids outside [-1, E) (each is treated as -1: it never equals an expert).
__device__ __forceinline__ int list_rows(const int64_t* ids, int TK, int K, int E, int e, int* list, int* meta,
                                         bool report, const Device& d, int lane) {
  constexpr int kAhead = 4;  // loads of ids in flight
  int count = 0;
  for (int base = 0; base < TK; base += 32 * kAhead) {
    int64_t v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int i = base + 32 * u + lane;
      v[u] = i < TK ? __ldg(ids + i) : int64_t(-1);
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int i = base + 32 * u + lane;
      bool hit = v[u] == int64_t(e);
      if (hit) {
        const int t = i / K;
        for (int k2 = t * K; k2 < i; ++k2)
          if (__ldg(ids + k2) == int64_t(e)) {
            hit = false;
            break;
          }
      }
      // Reported beside the error word (err_host[1]), not in it: receive waits stop at an error.
      if (report && v[u] != -1 && (v[u] < -1 || v[u] >= E))
        report_error(nullptr, d.err_host + 1, kStageBadExpert, i / K, v[u]);
      const unsigned mask = __ballot_sync(0xffffffffu, hit);
      if (hit) {
        const int pos = count + __popc(mask & lanemask_lt());
        list[pos] = i;
        meta[pos] = i;
      }
      count += __popc(mask);
    }
  }
  return count;
}

// Dispatch, send. Block b owns experts b, b + G, ... (G = gridDim.x <= E); `ce` of them at a
// time: warp w < ce lists expert w's rows into s_list[w] (dynamic shared memory, ce * T ints)
// and its dmeta region, then every warp copies pieces of the listed rows into the experts'
// slot regions, then each expert's flag gets (seq << 32) | rows.
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    dispatch_send_kernel(Geometry g, Device d, const int4* x, const int64_t* topk_idx, int T, int ce, int m16) {
  int* s_list = reinterpret_cast<int*>(dyn_smem());
  __shared__ int s_cnt[kWarps], s_pre[kWarps + 1];
  __shared__ int s_seq;
  stamp(d, kStampDispatchSend, kStampStart);
  if (threadIdx.x == 0) s_seq = ld_volatile_i32(d.state) + 1;
  __syncthreads();
  const int seq = s_seq, par = seq & 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Rows lie n16 int4 apart; the first m16 of each move (FP8 rows: data and scales only).
  const int n16 = g.H / 8, pieces = (m16 + kPiece - 1) / kPiece;
  const int G = gridDim.x, TK = T * g.K;
  const int mine = (g.E - int(blockIdx.x) + G - 1) / G;  // experts this block owns
  for (int c0 = 0; c0 < mine; c0 += ce) {
    const int ne = min(ce, mine - c0);
    if (warp < ne) {
      const int e = blockIdx.x + (c0 + warp) * G;
      const int dst = e / g.L, j = e % g.L;
      const int64_t region = int64_t(j) * g.W + g.rank;
      int* slot_meta = reinterpret_cast<int*>(d.map(dst, g.dmeta + par * g.dmeta_p)) + region * g.T_max;
      const int n = list_rows(topk_idx, TK, g.K, g.E, e, s_list + warp * T, slot_meta,
                              blockIdx.x == 0 && c0 == 0 && warp == 0, d, lane);
      if (lane == 0) s_cnt[warp] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int at = 0;
      for (int w = 0; w < ne; ++w) {
        s_pre[w] = at;
        at += s_cnt[w];
      }
      s_pre[ne] = at;
    }
    __syncthreads();
    const int units = s_pre[ne] * pieces;
    for (int u = warp; u < units; u += kWarps) {
      const int row = u / pieces, pc = u - row * pieces;
      const int w = source_of(s_pre, row), r = row - s_pre[w];
      const int t = s_list[w * T + r] / g.K;
      const int e = blockIdx.x + (c0 + w) * G;
      const int64_t region = int64_t(e % g.L) * g.W + g.rank;
      int4* slot_x = reinterpret_cast<int4*>(d.map(e / g.L, g.dx + par * g.dx_p)) + (region * g.T_max + r) * n16;
      warp_copy_piece<true>(slot_x + pc * kPiece, x + int64_t(t) * n16 + pc * kPiece, min(kPiece, m16 - pc * kPiece),
                            lane);
    }
    __syncthreads();  // every row (and dmeta entry) of these experts is stored
    if (threadIdx.x < ne) {
      const int e = blockIdx.x + (c0 + int(threadIdx.x)) * G;
      const int64_t region = int64_t(e % g.L) * g.W + g.rank;
      fence_sys();  // cumulative: the block's stores, ordered before it by the barrier
      st_release_sys(reinterpret_cast<int64_t*>(d.map(e / g.L, g.dflag + par * g.dflag_p)) + region,
                     (int64_t(seq) << 32) | int64_t(s_cnt[threadIdx.x]));
    }
    __syncthreads();  // s_cnt and s_list are reused by the next group
  }
  advance_seq(d, 0, seq);
  stamp(d, kStampDispatchSend, kStampEnd);
}

// Dispatch, receive: unit (j, p) waits for every source's flag of local expert j, then packs
// part p of its rows (pieces p, p + parts, ... per warp) in source order into recv_x[j].
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    dispatch_recv_kernel(Geometry g, Device d, int4* recv_x, int* recv_count, int* src_info, int* src_slot,
                         int64_t* layout_range, int parts, int m16) {
  __shared__ int s_cnt[kMaxWorld], s_begin[kMaxWorld + 1];
  stamp(d, kStampDispatchRecv, kStampStart);
  const int seq = ld_volatile_i32(d.state), par = seq & 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n16 = g.H / 8, pieces = (m16 + kPiece - 1) / kPiece;  // as the send: m16 of each n16
  const int64_t rows = int64_t(g.W) * g.T_max;
  const int64_t* flags = reinterpret_cast<const int64_t*>(d.local + g.dflag + par * g.dflag_p);
  const int4* dx = reinterpret_cast<const int4*>(d.local + g.dx + par * g.dx_p);
  const int* meta = reinterpret_cast<const int*>(d.local + g.dmeta + par * g.dmeta_p);
  for (int u = blockIdx.x; u < g.L * parts; u += gridDim.x) {
    const int j = u / parts, p = u - j * parts;
    for (int s = threadIdx.x; s < g.W; s += blockDim.x) {
      const int64_t* f = flags + int64_t(j) * g.W + s;
      const bool ok = wait_flag(f, [seq](int64_t v) { return (v >> 32) == seq; }, d, kStageDispatchRecv, s, seq);
      s_cnt[s] = ok ? int(ld_acquire_sys(f) & 0xffffffff) : 0;
      fence_sys();  // the rows behind the flag, for every thread of the block past the barrier
    }
    __syncthreads();
    if (u == int(blockIdx.x)) stamp(d, kStampDispatchRecv, kStampWaited);  // the block's first wait
    if (threadIdx.x == 0) {
      int at = 0;
      for (int s = 0; s < g.W; ++s) {
        s_begin[s] = at;
        if (p == 0) layout_range[int64_t(j) * g.W + s] = (int64_t(at) << 32) | int64_t(s_cnt[s]);
        at += s_cnt[s];
      }
      s_begin[g.W] = at;
      if (p == 0) recv_count[j] = at;
    }
    __syncthreads();
    const int total = s_begin[g.W];
    for (int q = p * blockDim.x + threadIdx.x; q < total; q += parts * blockDim.x) {
      const int s = source_of(s_begin, q);
      const int m = meta[(int64_t(j) * g.W + s) * g.T_max + q - s_begin[s]];
      src_info[int64_t(j) * rows + q] = m / g.K;
      src_slot[int64_t(j) * rows + q] = m % g.K;
    }
    for (int c = p * kWarps + warp; c < total * pieces; c += parts * kWarps) {
      const int q = c / pieces, pc = c - q * pieces;
      const int s = source_of(s_begin, q);
      const int64_t from = (int64_t(j) * g.W + s) * g.T_max + (q - s_begin[s]);
      warp_copy_piece<false>(recv_x + (int64_t(j) * rows + q) * n16 + pc * kPiece, dx + from * n16 + pc * kPiece,
                             min(kPiece, m16 - pc * kPiece), lane);
    }
    __syncthreads();
  }
  stamp(d, kStampDispatchRecv, kStampEnd);
}

// Combine, send: unit (j, p) stores part p of local expert j's rows back into their sources'
// cx[t, k]; then the grid's last block stores seq into cflag[rank] of every source.
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    combine_send_kernel(Geometry g, Device d, const int4* y, const int* src_info, const int* src_slot,
                        const int64_t* layout_range, int parts) {
  __shared__ int s_begin[kMaxWorld + 1];
  __shared__ int s_seq;
  stamp(d, kStampCombineSend, kStampStart);
  if (threadIdx.x == 0) s_seq = ld_volatile_i32(d.state + 1) + 1;
  __syncthreads();
  const int seq = s_seq, par = seq & 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n16 = g.H / 8, pieces = (n16 + kPiece - 1) / kPiece;
  const int64_t rows = int64_t(g.W) * g.T_max;
  for (int u = blockIdx.x; u < g.L * parts; u += gridDim.x) {
    const int j = u / parts, p = u - j * parts;
    for (int s = threadIdx.x; s < g.W; s += blockDim.x) {
      const int64_t v = layout_range[int64_t(j) * g.W + s];
      s_begin[s] = int(v >> 32);
      if (s == g.W - 1) s_begin[g.W] = int(v >> 32) + int(v & 0xffffffff);
    }
    __syncthreads();
    const int total = s_begin[g.W];
    for (int c = p * kWarps + warp; c < total * pieces; c += parts * kWarps) {
      const int q = c / pieces, pc = c - q * pieces;
      const int s = source_of(s_begin, q);
      const int64_t r = int64_t(j) * rows + q;
      const int t = __ldg(src_info + r), k = __ldg(src_slot + r);
      int4* dst = reinterpret_cast<int4*>(d.map(s, g.cx + par * g.cx_p)) + (int64_t(t) * g.K + k) * n16;
      warp_copy_piece<true>(dst + pc * kPiece, y + r * n16 + pc * kPiece, min(kPiece, n16 - pc * kPiece), lane);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) fence_sys();  // cumulative: this block's rows, before its grid ticket
  if (grid_last_block(reinterpret_cast<unsigned int*>(d.state + 3))) {
    for (int s = threadIdx.x; s < g.W; s += blockDim.x) {
      fence_sys();
      st_release_sys(reinterpret_cast<int64_t*>(d.map(s, g.cflag + par * g.cflag_p)) + g.rank, int64_t(seq));
    }
    if (threadIdx.x == 0) {
      d.state[1] = seq;
      __threadfence();
    }
  }
  stamp(d, kStampCombineSend, kStampEnd);
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

// Combine, receive: every block waits for all W flags, then unit (t, p) reduces part p of token
// t's columns in fp32 in ascending k (a slot naming an expert again reads that expert's first
// slot), each thread loading up to kUnroll slots before it adds them, and casts once.
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    combine_recv_kernel(Geometry g, Device d, const int64_t* topk_idx, const float* topk_weights, int T, int4* out,
                        int parts) {
  __shared__ int s_src[kMaxTopk];
  __shared__ float s_w[kMaxTopk];
  stamp(d, kStampCombineRecv, kStampStart);
  const int seq = ld_volatile_i32(d.state + 1), par = seq & 1;
  const int64_t* flags = reinterpret_cast<const int64_t*>(d.local + g.cflag + par * g.cflag_p);
  for (int s = threadIdx.x; s < g.W; s += blockDim.x)
    if (wait_flag(flags + s, [seq](int64_t v) { return v == seq; }, d, kStageCombineRecv, s, seq)) fence_sys();
  __syncthreads();
  stamp(d, kStampCombineRecv, kStampWaited);
  const int n16 = g.H / 8;
  const int4* cx = reinterpret_cast<const int4*>(d.local + g.cx + par * g.cx_p);
  for (int u = blockIdx.x; u < T * parts; u += gridDim.x) {
    const int t = u / parts, p = u - t * parts;
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
    const int4* row = cx + int64_t(t) * g.K * n16;
    for (int v = p * blockDim.x + threadIdx.x; v < n16; v += parts * blockDim.x) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k0 = 0; k0 < g.K; k0 += kUnroll) {
        int4 val[kUnroll];
#pragma unroll
        for (int u2 = 0; u2 < kUnroll; ++u2) {
          const int k = k0 + u2;
          if (k < g.K && s_src[k] >= 0) val[u2] = row[int64_t(s_src[k]) * n16 + v];
        }
#pragma unroll
        for (int u2 = 0; u2 < kUnroll; ++u2) {
          const int k = k0 + u2;
          if (k < g.K && s_src[k] >= 0) add_weighted(acc, s_w[k], val[u2]);
        }
      }
      int4 r;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
      out[int64_t(t) * n16 + v] = r;
    }
    __syncthreads();
  }
  stamp(d, kStampCombineRecv, kStampEnd);
}

// The benchmark's stand-in for an expert op: out[j, q] = x[j, q] * scale[j] for the received
// rows q < count[j] only (bfloat16 product rounded once, as torch's x * scale), rows past them
// untouched. Grid (blocks, L).
__global__ void __launch_bounds__(256) masked_scale_kernel(const int4* x, const int* count,
                                                           const __nv_bfloat16* scale, int4* out, int64_t rows,
                                                           int n16) {
  const int j = blockIdx.y;
  const int64_t n = int64_t(count[j]) * n16;
  const float s = __bfloat162float(scale[j]);
  const int64_t base = int64_t(j) * rows * n16;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int4 v = ld_nc_na(x + base + i);
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      h[k] = __floats2bfloat162_rn(__fmul_rn(f.x, s), __fmul_rn(f.y, s));
    }
    out[base + i] = v;
  }
}

}  // namespace ll
}  // namespace symmoe
