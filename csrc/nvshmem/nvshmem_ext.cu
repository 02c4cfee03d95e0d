// symmoe NVSHMEM extension: the push protocol (DeepEP V1 normal-mode style) on the NVSHMEM
// device API, for the `nvshmem` backend.
//
// nvshmem4py owns the runtime and the symmetric segment; this module links its own copy of
// libnvshmem_device.a, so `init()` must run after nvshmem.core.init() (it only registers this
// module's device state) and `finalize()` before nvshmem.core.finalize().
//
// Protocol (every step also documented in symmoe/protocol/nvshmem.py):
//   counts   each rank puts its counts row into row `me` of every peer's counts matrix with
//            put-with-signal (`ready[me]` = epoch); waits for every peer's ready flag.
//   dispatch one kernel, 2*C blocks. Block c < C is the sender of channel c: for each
//            destination d, warps of one group put the rows [c*n/C, (c+1)*n/C) of the n rows
//            this rank sends to d into d's receive pool (non-blocking warp puts: NVLink stores
//            in a node, IBGDA RDMA across nodes, same code), then fence and signal
//            tail[c][me] at d with (epoch << 32 | rows delivered), so rows stream per chunk.
//            Block C + c is the receiver of channel c: it waits on tail[c][s] (timeout) and
//            copies delivered rows from the pool into the output tensors as they arrive. The
//            rows a rank keeps for itself go straight from x to the output (no pool).
//   combine  one kernel, 2*C blocks. Block c < C pushes the expert outputs of channel c back
//            to their source ranks' combine slots (t * S + slot), signalling head[c][me];
//            then every block waits for all head signals and reduces tokens in the fixed
//            order (rank order for rank-major; k order with __fmul_rn/__fadd_rn for
//            expert-major), reading the rank's own contributions straight from y.
// Signals carry (epoch << 32 | count) and are compared with >=, so they never need a reset.
// Every wait has a timeout: it records (stage, peer, epoch) in the host-mapped ErrorWord and
// the kernel returns; the host raises StallError.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/layout.cuh"
#include "../common/ptx.cuh"

namespace py = pybind11;

namespace symmoe {
namespace nv {

constexpr int kThreads = 768;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroups = 8;     // warp groups per sender block (named barriers 1..8)
constexpr int kMaxWorld = 64;     // receiver bookkeeping lives in shared memory
constexpr int kRowsPerWarp = 2;   // rows each warp puts between two tail signals

void cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::ostringstream os;
  os << what << " failed: " << cudaGetErrorString(e) << " (cudaError_t " << int(e) << ")";
  throw std::runtime_error(os.str());
}

// ---- small device helpers --------------------------------------------------------------
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ int64_t chan_begin(int64_t n, int c, int C) { return n * c / C; }

__device__ __forceinline__ uint64_t sig_value(int64_t epoch, int64_t count) {
  return (static_cast<uint64_t>(epoch) << 32) | static_cast<uint64_t>(count);
}

// Rows the signal says have arrived for this epoch (all of them if a later epoch wrote it).
__device__ __forceinline__ int64_t delivered(uint64_t v, int64_t epoch, int64_t total) {
  const uint64_t e = v >> 32;
  if (e == static_cast<uint64_t>(epoch)) return min(total, static_cast<int64_t>(v & 0xffffffffull));
  return e > static_cast<uint64_t>(epoch) ? total : 0;
}

__device__ __forceinline__ void report(ErrorWord* err, int stage, int peer, int64_t epoch) {
  volatile int64_t* e = reinterpret_cast<volatile int64_t*>(err);
  if (e[0] != 0) return;  // keep the first failure
  e[1] = peer;
  e[2] = epoch;
  __threadfence_system();
  e[0] = stage;
  __threadfence_system();
}

__device__ __forceinline__ bool failed(const ErrorWord* err) {
  return *reinterpret_cast<const volatile int64_t*>(&err->stage) != 0;
}

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
      if (failed(err)) return false;
    }
  }
  return true;
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
  constexpr int U = 4;
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

// ---- counts exchange + barrier ---------------------------------------------------------
// One block. Puts this rank's counts row (already in row `me` of its own matrix) into every
// peer's matrix with put-with-signal on ready[me], then waits for every peer's row.
__global__ void counts_kernel(uint8_t* base, Layout lay, int me, int64_t epoch, uint64_t timeout_ns, ErrorWord* err) {
  const int W = static_cast<int>(lay.world_size);
  const int64_t row_bytes = 4 * lay.counts_cols();
  uint8_t* row = base + lay.counts + me * row_bytes;
  uint64_t* ready = reinterpret_cast<uint64_t*>(base + lay.ready);
  for (int p = threadIdx.x; p < W; p += blockDim.x) {
    if (p == me) continue;
    nvshmem_putmem_signal_nbi(row, row, row_bytes, ready + me, static_cast<uint64_t>(epoch), NVSHMEM_SIGNAL_SET, p);
  }
  for (int p = threadIdx.x; p < W; p += blockDim.x) {
    if (p == me) continue;
    if (!wait_signal(ready + p, static_cast<uint64_t>(epoch), timeout_ns, err, kStageDispatchCounts, p, epoch)) break;
  }
  nvshmem_quiet();
}

// Flag barrier over `barrier[W]` with signals (SymmetricMemory.barrier).
__global__ void barrier_kernel(uint8_t* base, Layout lay, int me, int64_t epoch, uint64_t timeout_ns, ErrorWord* err,
                               int stage) {
  const int W = static_cast<int>(lay.world_size);
  uint64_t* flags = reinterpret_cast<uint64_t*>(base + lay.barrier);
  for (int p = threadIdx.x; p < W; p += blockDim.x)
    nvshmemx_signal_op(flags + me, static_cast<uint64_t>(epoch), NVSHMEM_SIGNAL_SET, p);
  for (int p = threadIdx.x; p < W; p += blockDim.x)
    if (!wait_signal(flags + p, static_cast<uint64_t>(epoch), timeout_ns, err, stage, p, epoch)) break;
  nvshmem_quiet();
}

// ---- dispatch --------------------------------------------------------------------------
struct DispatchArgs {
  uint8_t* base;
  Layout lay;
  int me, C, expert_major;
  int64_t epoch;
  uint64_t timeout_ns;
  const uint8_t* x;          // [T, H] rows to send (x itself, or a symmetric staging copy)
  const int32_t* idx;        // [T, K]
  const float* w;            // [T, K]
  const int32_t* send_ent;   // [P] t * S + slot, grouped by destination, in receiver order
  const int32_t* info;       // [5][W] send_off, send_cnt, dst_base, recv_cnt, recv_base
  const int32_t* out_pos;    // [rows] pool row -> output row (expert-major); nullptr: identity
  uint8_t* out_x;
  int64_t* out_idx;          // [N, K] rank-major, [M] expert-major
  float* out_w;
  int32_t* out_rank;
  int32_t* out_tok;
  int32_t* out_slot;
  ErrorWord* err;
};

// Metadata of one (token, slot) sent to rank d, computed by lanes < K (rank-major: the whole
// top-k row; expert-major: lane 0, the slot itself).
struct Meta {
  int idx;
  float w;
};
__device__ __forceinline__ Meta row_meta(const DispatchArgs& a, int t, int slot, int d, int lane) {
  const int K = static_cast<int>(a.lay.topk), L = static_cast<int>(a.lay.local_experts());
  Meta m{-1, 0.f};
  if (!a.expert_major) {
    if (lane < K) {
      const int e = a.idx[int64_t(t) * K + lane];
      if (e >= 0 && e / L == d) {
        m.idx = e - d * L;
        m.w = a.w[int64_t(t) * K + lane];
      }
    }
  } else if (lane == 0) {
    m.idx = a.idx[int64_t(t) * K + slot] - d * L;
    m.w = a.w[int64_t(t) * K + slot];
  }
  return m;
}

__device__ __forceinline__ void write_out_meta(const DispatchArgs& a, int64_t o, int src_rank, int ent, Meta m,
                                               int lane) {
  const int K = static_cast<int>(a.lay.topk), S = static_cast<int>(a.lay.combine_slots);
  if (!a.expert_major) {
    if (lane < K) {
      a.out_idx[o * K + lane] = m.idx;
      a.out_w[o * K + lane] = m.w;
    }
  } else if (lane == 0) {
    a.out_idx[o] = m.idx;
    a.out_w[o] = m.w;
  }
  if (lane == 0) {
    a.out_rank[o] = src_rank;
    a.out_tok[o] = ent / S;
    a.out_slot[o] = ent % S;
  }
}

__global__ void __launch_bounds__(kThreads, 1) dispatch_kernel(DispatchArgs a) {
  const int W = static_cast<int>(a.lay.world_size), C = a.C, me = a.me;
  const int K = static_cast<int>(a.lay.topk), S = static_cast<int>(a.lay.combine_slots);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool sender = blockIdx.x < C;
  const int c = sender ? blockIdx.x : blockIdx.x - C;
  const int64_t rb = a.lay.row_bytes();
  const int32_t *send_off = a.info, *send_cnt = a.info + W, *dst_base = a.info + 2 * W, *recv_cnt = a.info + 3 * W,
                *recv_base = a.info + 4 * W;
  uint64_t* tail = reinterpret_cast<uint64_t*>(a.base + a.lay.tail);

  // Rows this rank keeps: x -> output directly, channel c's share. With peers the receiver
  // block copies them while the first puts are in flight, so senders start putting at once;
  // alone, both blocks split them.
  {
    const int64_t n = send_cnt[me], i0 = chan_begin(n, c, C), i1 = chan_begin(n, c + 1, C);
    const int64_t mid = W == 1 ? (i0 + i1) / 2 : i0;  // the sender block's part ends here
    const int64_t lo = sender ? i0 : mid, hi = sender ? mid : i1;
    for (int64_t i = lo + warp; i < hi; i += kWarps) {
      const int ent = a.send_ent[send_off[me] + i];
      const int t = ent / S, slot = ent % S;
      const int64_t q = recv_base[me] + i;
      const int64_t o = a.out_pos ? a.out_pos[q] : q;
      warp_copy_row<true>(a.out_x + o * rb, a.x + int64_t(t) * rb, rb, lane);
      write_out_meta(a, o, me, ent, row_meta(a, t, slot, me, lane), lane);
    }
  }

  if (sender) {
    // One warp group per peer (up to kMaxGroups): the rank itself gets none.
    const int ngroups = max(1, min(W - 1, kMaxGroups)), wpg = kWarps / ngroups;
    const int g = warp / wpg, wig = warp % wpg;
    if (g >= ngroups) return;
    uint8_t* rx = a.base + a.lay.recv_x;
    int32_t* ridx = reinterpret_cast<int32_t*>(a.base + a.lay.recv_idx);
    float* rw = reinterpret_cast<float*>(a.base + a.lay.recv_w);
    int32_t* rsrc = reinterpret_cast<int32_t*>(a.base + a.lay.recv_src);
    const int64_t chunk = int64_t(wpg) * kRowsPerWarp;
    for (int k = g; k < W - 1; k += ngroups) {
      const int d = (me + 1 + k) % W;  // next ranks first: receivers are not all hit at once
      const int64_t n = send_cnt[d], i0 = chan_begin(n, c, C), i1 = chan_begin(n, c + 1, C);
      int64_t c0 = i0;
      do {
        const int64_t c1 = min(i1, c0 + chunk);
        for (int64_t i = c0 + wig; i < c1; i += wpg) {
          const int ent = a.send_ent[send_off[d] + i];
          const int t = ent / S, slot = ent % S;
          const int64_t q = dst_base[d] + i;
          nvshmemx_putmem_nbi_warp(rx + q * rb, a.x + int64_t(t) * rb, rb, d);
          const Meta m = row_meta(a, t, slot, d, lane);
          if (!a.expert_major) {
            if (lane < K) {
              nvshmem_int_p(ridx + q * K + lane, m.idx, d);
              nvshmem_float_p(rw + q * K + lane, m.w, d);
            }
          } else if (lane == 0) {
            nvshmem_int_p(ridx + q * K, m.idx, d);
            nvshmem_float_p(rw + q * K, m.w, d);
          }
          if (lane == 0) nvshmem_int_p(rsrc + q, ent, d);
        }
        // Every put of the chunk (all warps of the group) is ordered before the signal.
        named_barrier(1 + g, wpg * 32);
        if (wig == 0 && lane == 0) {
          nvshmem_fence();
          nvshmemx_signal_op(tail + int64_t(c) * W + me, sig_value(a.epoch, c1 - i0), NVSHMEM_SIGNAL_SET, d);
        }
        c0 = c1;
      } while (c0 < i1);
    }
    if (wig == 0 && lane == 0) nvshmem_quiet();
    return;
  }

  // Receiver of channel c: stream delivered rows from the pool into the outputs.
  __shared__ int64_t s_done[kMaxWorld];    // rows of each source copied so far (absolute index)
  __shared__ int64_t s_from[kMaxWorld], s_to[kMaxWorld];
  __shared__ int s_state;                  // 0: copy what arrived, 1: finished, 2: failed
  const uint8_t* px = a.base + a.lay.recv_x;
  const int32_t* pidx = reinterpret_cast<const int32_t*>(a.base + a.lay.recv_idx);
  const float* pw = reinterpret_cast<const float*>(a.base + a.lay.recv_w);
  const int32_t* psrc = reinterpret_cast<const int32_t*>(a.base + a.lay.recv_src);
  for (int s = threadIdx.x; s < W; s += blockDim.x) s_done[s] = chan_begin(recv_cnt[s], c, C);
  __syncthreads();
  const uint64_t start = global_timer_ns();
  while (true) {
    if (threadIdx.x == 0) {
      uint32_t spins = 0;
      while (true) {
        bool pending = false, fresh = false;
        int late = -1;
        for (int s = 0; s < W; ++s) {
          s_from[s] = s_to[s] = 0;
          if (s == me) continue;
          const int64_t i0 = chan_begin(recv_cnt[s], c, C), i1 = chan_begin(recv_cnt[s], c + 1, C);
          if (s_done[s] >= i1 && i1 > i0) continue;
          const uint64_t v = static_cast<uint64_t>(ld_acquire_sys(reinterpret_cast<const int64_t*>(tail + int64_t(c) * W + s)));
          if (v < sig_value(a.epoch, 0)) {  // this epoch's first signal not there yet
            pending = true;
            late = s;
            continue;
          }
          const int64_t got = i0 + delivered(v, a.epoch, i1 - i0);
          if (got > s_done[s]) {
            s_from[s] = s_done[s];
            s_to[s] = got;
            s_done[s] = got;
            fresh = true;
          }
          if (got < i1) {
            pending = true;
            late = s;
          }
        }
        if (fresh) { s_state = 0; break; }
        if (!pending) { s_state = 1; break; }
        if ((++spins & 255) == 0 && global_timer_ns() - start > a.timeout_ns) {
          report(a.err, kStageDispatchData, late, a.epoch);
          s_state = 2;
          break;
        }
      }
    }
    __syncthreads();
    if (s_state != 0) break;
    // Copy the fresh rows: flatten (source, row) and give one row per warp.
    int64_t total = 0;
    for (int s = 0; s < W; ++s) total += s_to[s] - s_from[s];
    for (int64_t r = warp; r < total; r += kWarps) {
      int s = 0;
      int64_t rr = r;
      while (rr >= s_to[s] - s_from[s]) { rr -= s_to[s] - s_from[s]; ++s; }
      const int64_t q = recv_base[s] + s_from[s] + rr;
      const int64_t o = a.out_pos ? a.out_pos[q] : q;
      warp_copy_row<false>(a.out_x + o * rb, px + q * rb, rb, lane);
      const int ent = psrc[q];
      Meta m{-1, 0.f};
      if (!a.expert_major) {
        if (lane < K) m = Meta{pidx[q * K + lane], pw[q * K + lane]};
      } else if (lane == 0) {
        m = Meta{pidx[q * K], pw[q * K]};
      }
      write_out_meta(a, o, s, ent, m, lane);
    }
    __syncthreads();
  }
}

// ---- combine ---------------------------------------------------------------------------
struct CombineArgs {
  uint8_t* base;
  Layout lay;
  int me, C, expert_major, num_tokens;
  int64_t epoch;
  uint64_t timeout_ns;
  const uint8_t* y;          // [rows, H] expert outputs (or a symmetric staging copy)
  const float* rw;           // [rows, K] weights to combine (rank-major) or nullptr
  const int32_t* info;       // [3][W] recv_cnt, recv_base (as a receiver), expect_cnt (as a source)
  const int32_t* out_pos;    // pool row -> y row (expert-major) or nullptr
  const int32_t* src_tok;    // [rows]
  const int32_t* src_slot;   // [rows]
  const int32_t* self_row;   // [T * S] y row of this rank's own (token, slot), -1 if none
  const int64_t* topk_idx;   // [T, K] as dispatched
  const float* topk_w;       // [T, K] as dispatched
  uint8_t* out_x;            // [T, H]
  float* out_w;              // [T, K] or nullptr
  ErrorWord* err;
};

template <typename T>
struct Vec;  // 16 bytes of T <-> 8 or 4 floats
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int N = 8;
  __device__ static void load(const int4& v, float* f) {
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = __bfloat162float(h[i]);
  }
  __device__ static int4 store(const float* f) {
    int4 v;
    __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&v);
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = __float2bfloat16_rn(f[i]);
    return v;
  }
};
template <>
struct Vec<__half> {
  static constexpr int N = 8;
  __device__ static void load(const int4& v, float* f) {
    const __half* h = reinterpret_cast<const __half*>(&v);
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = __half2float(h[i]);
  }
  __device__ static int4 store(const float* f) {
    int4 v;
    __half* h = reinterpret_cast<__half*>(&v);
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = __float2half_rn(f[i]);
    return v;
  }
};
template <>
struct Vec<float> {
  static constexpr int N = 4;
  __device__ static void load(const int4& v, float* f) {
    const float* h = reinterpret_cast<const float*>(&v);
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = h[i];
  }
  __device__ static int4 store(const float* f) {
    int4 v;
    float* h = reinterpret_cast<float*>(&v);
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = f[i];
    return v;
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) combine_kernel(CombineArgs a) {
  const int W = static_cast<int>(a.lay.world_size), C = a.C, me = a.me;
  const int K = static_cast<int>(a.lay.topk), S = static_cast<int>(a.lay.combine_slots);
  const int L = static_cast<int>(a.lay.local_experts());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rb = a.lay.row_bytes();
  const int32_t *recv_cnt = a.info, *recv_base = a.info + W, *expect_cnt = a.info + 2 * W;
  uint64_t* head = reinterpret_cast<uint64_t*>(a.base + a.lay.head);
  uint8_t* cx = a.base + a.lay.combine_x;
  float* cw = reinterpret_cast<float*>(a.base + a.lay.combine_w);

  // 1. Blocks c < C push channel c of the rows each source sent here back to that source.
  if (blockIdx.x < C) {
    const int c = blockIdx.x;
    // Own rows are read straight from y by the reduce: the groups serve the W - 1 peers.
    const int ngroups = max(1, min(W - 1, kMaxGroups)), wpg = kWarps / ngroups;
    const int g = warp / wpg, wig = warp % wpg;
    const int64_t chunk = int64_t(wpg) * kRowsPerWarp;
    if (g < ngroups) {
      for (int k = g; k < W - 1; k += ngroups) {
        const int s = (me + 1 + k) % W;
        const int64_t n = recv_cnt[s], i0 = chan_begin(n, c, C), i1 = chan_begin(n, c + 1, C);
        int64_t c0 = i0;
        do {
          const int64_t c1 = min(i1, c0 + chunk);
          for (int64_t i = c0 + wig; i < c1; i += wpg) {
            const int64_t q = recv_base[s] + i;
            const int64_t row = a.out_pos ? a.out_pos[q] : q;
            const int64_t slot = int64_t(a.src_tok[row]) * S + a.src_slot[row];
            nvshmemx_putmem_nbi_warp(cx + slot * rb, a.y + row * rb, rb, s);
            if (a.rw && lane < K) nvshmem_float_p(cw + slot * K + lane, a.rw[row * K + lane], s);
          }
          named_barrier(1 + g, wpg * 32);
          if (wig == 0 && lane == 0) {
            nvshmem_fence();
            nvshmemx_signal_op(head + int64_t(c) * W + me, sig_value(a.epoch, c1 - i0), NVSHMEM_SIGNAL_SET, s);
          }
          c0 = c1;
        } while (c0 < i1);
      }
      if (wig == 0 && lane == 0) nvshmem_quiet();
    }
  }

  // 2. Every block waits until all peers' channels arrived here, then reduces its tokens.
  // One warp per block polls: thousands of threads spinning on system-scope loads slowed
  // the peers' incoming NVLink writes several-fold (combine 855 us at W=2 vs 56 us at W=1).
  __shared__ int s_ok;
  if (threadIdx.x == 0) s_ok = 1;
  __syncthreads();
  for (int u = threadIdx.x; threadIdx.x < 32 && u < C * W; u += 32) {
    const int c = u / W, r = u % W;
    if (r == me) continue;
    const int64_t n = expect_cnt[r], need = chan_begin(n, c + 1, C) - chan_begin(n, c, C);
    if (!wait_signal(head + u, sig_value(a.epoch, need), a.timeout_ns, a.err, kStageCombineData, r, a.epoch)) {
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
            const int64_t row = a.self_row[t * S + r];
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
          s_src[warp][n] = r == me ? a.y + int64_t(a.self_row[t * S + k]) * rb : cx + (t * S + k) * rb;
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

// ---- host side -------------------------------------------------------------------------
Layout layout_from(const std::vector<int64_t>& v) {
  if (v.size() != static_cast<size_t>(kLayoutArgs)) {
    std::ostringstream os;
    os << "layout has " << v.size() << " fields; this extension was built for " << kLayoutArgs
       << " (rebuild: csrc/common/layout.cuh and symmoe/layout.py disagree)";
    throw std::runtime_error(os.str());
  }
  Layout l;
  std::memcpy(&l, v.data(), sizeof(Layout));
  return l;
}

template <typename T>
T* ptr(int64_t p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

int num_channels(int requested, int world) {
  if (world > kMaxWorld) {
    std::ostringstream os;
    os << "world size " << world << " exceeds the " << kMaxWorld << " ranks the nvshmem kernels support";
    throw std::runtime_error(os.str());
  }
  return requested;
}

void launch_counts(int64_t base, const std::vector<int64_t>& lay, int me, int64_t epoch, uint64_t timeout_ns,
                   int64_t err, int64_t stream) {
  Layout l = layout_from(lay);
  counts_kernel<<<1, 256, 0, ptr<CUstream_st>(stream)>>>(ptr<uint8_t>(base), l, me, epoch, timeout_ns,
                                                          ptr<ErrorWord>(err));
  cuda_check(cudaGetLastError(), "counts_kernel launch");
}

void launch_barrier(int64_t base, const std::vector<int64_t>& lay, int me, int64_t epoch, uint64_t timeout_ns,
                    int64_t err, int stage, int64_t stream) {
  Layout l = layout_from(lay);
  barrier_kernel<<<1, 256, 0, ptr<CUstream_st>(stream)>>>(ptr<uint8_t>(base), l, me, epoch, timeout_ns,
                                                           ptr<ErrorWord>(err), stage);
  cuda_check(cudaGetLastError(), "barrier_kernel launch");
}

// ptrs: x, idx, w, send_ent, info, out_pos, out_x, out_idx, out_w, out_rank, out_tok, out_slot, err
void launch_dispatch(int64_t base, const std::vector<int64_t>& lay, int me, int channels, int expert_major,
                     int64_t epoch, uint64_t timeout_ns, const std::vector<int64_t>& p, int64_t stream) {
  if (p.size() != 13) throw std::runtime_error("dispatch: expected 13 pointers");
  DispatchArgs a{};
  a.base = ptr<uint8_t>(base);
  a.lay = layout_from(lay);
  a.me = me;
  a.C = num_channels(channels, static_cast<int>(a.lay.world_size));
  a.expert_major = expert_major;
  a.epoch = epoch;
  a.timeout_ns = timeout_ns;
  a.x = ptr<const uint8_t>(p[0]);
  a.idx = ptr<const int32_t>(p[1]);
  a.w = ptr<const float>(p[2]);
  a.send_ent = ptr<const int32_t>(p[3]);
  a.info = ptr<const int32_t>(p[4]);
  a.out_pos = ptr<const int32_t>(p[5]);
  a.out_x = ptr<uint8_t>(p[6]);
  a.out_idx = ptr<int64_t>(p[7]);
  a.out_w = ptr<float>(p[8]);
  a.out_rank = ptr<int32_t>(p[9]);
  a.out_tok = ptr<int32_t>(p[10]);
  a.out_slot = ptr<int32_t>(p[11]);
  a.err = ptr<ErrorWord>(p[12]);
  dispatch_kernel<<<2 * a.C, kThreads, 0, ptr<CUstream_st>(stream)>>>(a);
  cuda_check(cudaGetLastError(), "dispatch_kernel launch");
}

// ptrs: y, rw, info, out_pos, src_tok, src_slot, self_row, topk_idx, topk_w, out_x, out_w, err
void launch_combine(int64_t base, const std::vector<int64_t>& lay, int me, int channels, int expert_major,
                    int num_tokens, int elem_kind, int64_t epoch, uint64_t timeout_ns, const std::vector<int64_t>& p,
                    int64_t stream) {
  if (p.size() != 12) throw std::runtime_error("combine: expected 12 pointers");
  CombineArgs a{};
  a.base = ptr<uint8_t>(base);
  a.lay = layout_from(lay);
  a.me = me;
  a.C = num_channels(channels, static_cast<int>(a.lay.world_size));
  a.expert_major = expert_major;
  a.num_tokens = num_tokens;
  a.epoch = epoch;
  a.timeout_ns = timeout_ns;
  a.y = ptr<const uint8_t>(p[0]);
  a.rw = ptr<const float>(p[1]);
  a.info = ptr<const int32_t>(p[2]);
  a.out_pos = ptr<const int32_t>(p[3]);
  a.src_tok = ptr<const int32_t>(p[4]);
  a.src_slot = ptr<const int32_t>(p[5]);
  a.self_row = ptr<const int32_t>(p[6]);
  a.topk_idx = ptr<const int64_t>(p[7]);
  a.topk_w = ptr<const float>(p[8]);
  a.out_x = ptr<uint8_t>(p[9]);
  a.out_w = ptr<float>(p[10]);
  a.err = ptr<ErrorWord>(p[11]);
  auto s = ptr<CUstream_st>(stream);
  const int grid = 2 * a.C;
  switch (elem_kind) {
    case 0: combine_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(a); break;
    case 1: combine_kernel<__half><<<grid, kThreads, 0, s>>>(a); break;
    case 2: combine_kernel<float><<<grid, kThreads, 0, s>>>(a); break;
    default: throw std::runtime_error("combine: elem_kind must be 0 (bf16), 1 (fp16) or 2 (fp32)");
  }
  cuda_check(cudaGetLastError(), "combine_kernel launch");
}

__global__ void pe_kernel(int* out) {
  out[0] = nvshmem_my_pe();
  out[1] = nvshmem_n_pes();
}

// Device-side view of the runtime, to check this module's device state was registered.
std::vector<int> device_pes() {
  int* d = nullptr;
  cuda_check(cudaMalloc(&d, 2 * sizeof(int)), "cudaMalloc");
  pe_kernel<<<1, 1>>>(d);
  int h[2] = {-1, -1};
  cudaError_t e = cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  cudaFree(d);
  cuda_check(e, "pe_kernel");
  return {h[0], h[1]};
}

}  // namespace nv
}  // namespace symmoe

PYBIND11_MODULE(symmoe_nvshmem, m) {
  using namespace symmoe::nv;
  m.doc() = "symmoe NVSHMEM push kernels (run after nvshmem.core.init)";
  // The inline nvshmem_init() compiled into this module registers its device state with the
  // host library nvshmem4py already initialised (reference counted).
  m.def("init", []() { nvshmem_init(); });
  m.def("finalize", []() { nvshmem_finalize(); });
  m.def("init_status", []() { return nvshmemx_init_status(); });
  m.def("device_pes", &device_pes);
  m.def("ptr", [](int64_t addr, int pe) {
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(nvshmem_ptr(reinterpret_cast<void*>(addr), pe)));
  });
  m.def("counts", &launch_counts);
  m.def("barrier", &launch_barrier);
  m.def("dispatch", &launch_dispatch);
  m.def("combine", &launch_combine);
  m.attr("threads") = kThreads;
  m.attr("max_world") = kMaxWorld;
}
