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
#include "../common/scan.cuh"
#include "../kernels/route.cuh"

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

// ---- planning: routing, send list, counts exchange (DeepEP V1's layout + notify) ------
// Whole block. This rank's counts row is in row `me` of its own matrix: put it into every
// peer's matrix with put-with-signal on ready[me] (one thread per peer, so the row and its
// signal travel in order over NVLink and IBGDA alike), then wait for every peer's row.
__device__ void exchange_counts(uint8_t* base, const Layout& lay, int me, int64_t epoch, uint64_t timeout_ns,
                                ErrorWord* err) {
  const int W = static_cast<int>(lay.world_size);
  const int64_t row_bytes = 4 * lay.counts_cols();
  uint8_t* row = base + lay.counts + me * row_bytes;
  uint64_t* ready = reinterpret_cast<uint64_t*>(base + lay.ready);
  __syncthreads();
  for (int p = threadIdx.x; p < W; p += blockDim.x) {
    if (p == me) continue;
    nvshmem_putmem_signal_nbi(row, row, row_bytes, ready + me, static_cast<uint64_t>(epoch), NVSHMEM_SIGNAL_SET, p);
  }
  for (int p = threadIdx.x; p < W; p += blockDim.x) {
    if (p == me) continue;
    if (!wait_signal(ready + p, static_cast<uint64_t>(epoch), timeout_ns, err, kStageDispatchCounts, p, epoch)) break;
  }
  if (threadIdx.x < W) nvshmem_quiet();
  __syncthreads();
}

struct PlanArgs {
  uint8_t* base;
  Layout lay;
  int me, expert_major;
  int64_t epoch;
  uint64_t timeout_ns;
  int32_t* send_ent;     // [T * max(W, K)] this rank's rows in send order, each t * S + slot
  int32_t* counts_snap;  // [W][1 + W + E] device copy of the exchanged matrix (this dispatch's own)
  int32_t* counts_host;  // the same, host-mapped: the host's one wait
  ErrorWord* err;
};

// Place pass of the routing (same grid as route_count_kernel), then each block scatters its
// tokens into the send list: rank-major by destination, then token; expert-major by expert,
// then token (so by destination too). The last block publishes the counts row and waits for
// the peers' rows (stage dispatch.counts), then leaves the matrix in the snapshot and in
// host-mapped memory. A rank with bad expert ids publishes tokens = -1: nobody moves data.
template <typename Idx>
__global__ void __launch_bounds__(kRouteThreads) plan_kernel(RoutingArgs<Idx> a, RouteScratch sc, PlanArgs p,
                                                             unsigned int* done) {
  const int C = a.columns(), W = a.W, K = a.K, S = static_cast<int>(p.lay.combine_slots);
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = failed();
  __syncthreads();
  if (dead) return;
  const bool bad = a.bad.flag != nullptr && *a.bad.flag != 0;  // set by the count pass
  int32_t* base = reinterpret_cast<int32_t*>(dyn_smem());     // [C] + [kRouteWarps][C]
  if (!bad) {
    chunk_base(sc, C, base);
    __syncthreads();
    route_place_chunk(a, base, base + C);
    // start[c]: this rank's pairs in the columns of the same kind before c.
    const int n = p.expert_major ? a.E : W, first_col = p.expert_major ? W : 0;
    int32_t* start = base;
    for (int c = threadIdx.x; c < n; c += blockDim.x) start[c] = __ldcg(sc.totals + first_col + c);
    __syncthreads();
    block_exclusive_scan(start, n, base + C);
    const int64_t t0 = a.chunk_begin(blockIdx.x), t1 = a.chunk_begin(blockIdx.x + 1), PC = W + K;
    if (!p.expert_major) {
      for (int64_t i = t0 * W + threadIdx.x; i < t1 * W; i += blockDim.x) {
        const int64_t t = i / W;
        const int d = static_cast<int>(i % W);
        if (a.in_rank[i]) p.send_ent[start[d] + a.pos[t * PC + d]] = static_cast<int32_t>(t * S + d);
      }
    } else {
      for (int64_t i = t0 * K + threadIdx.x; i < t1 * K; i += blockDim.x) {
        const int64_t t = i / K;
        const int k = static_cast<int>(i % K), e = a.pub_idx[i];
        if (e >= 0) p.send_ent[start[e] + a.pos[t * PC + W + k]] = static_cast<int32_t>(t * S + k);
      }
    }
  }
  if (!grid_last_block(done)) return;
  if (bad && threadIdx.x == 0) *a.bad.flag = 0;  // every block has read it
  const int64_t row = 1 + C;
  int32_t* m = reinterpret_cast<int32_t*>(p.base + p.lay.counts);
  for (int c = threadIdx.x; c < row; c += blockDim.x)
    m[p.me * row + c] = c == 0 ? (bad ? -1 : a.T) : __ldcg(sc.totals + c - 1);
  exchange_counts(p.base, p.lay, p.me, p.epoch, p.timeout_ns, p.err);
  for (int64_t i = threadIdx.x; i < int64_t(W) * row; i += blockDim.x) {
    const int32_t v = __ldcg(m + i);
    p.counts_snap[i] = v;
    p.counts_host[i] = v;
  }
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

// ---- dispatch geometry -----------------------------------------------------------------
// Every offset of one dispatch, built by each block in shared memory from the counts matrix
// (identical on every rank). n(s, d): rows s sends d. The pool of d is source-major, each
// source's rows in its send-list order; the output is rank-major (source, token) or
// expert-major (local expert, source, token) with each group padded to `alignment`.
struct Geometry {
  int32_t send_off[kMaxWorld], send_cnt[kMaxWorld], dst_base[kMaxWorld], recv_cnt[kMaxWorld], recv_base[kMaxWorld];
  int32_t rows_of[kMaxWorld];  // output rows of each receiver (padded, expert-major)
  int32_t tmp[33];
  int ok;                      // every rank's ids valid and every receiver within capacity
  // expert-major only, in dynamic shared memory:
  int32_t* first;  // [W][L + 1] each source's rows for this rank, prefix over local experts
  int32_t* obase;  // [W][L] output row of source s's first row of expert j
  int32_t* goff;   // [L + 1] padded group starts
  int32_t* gcnt;   // [L] unpadded rows per local expert

  static int64_t dyn_bytes(const Layout& lay) {
    const int64_t W = lay.world_size, L = lay.local_experts();
    return 4 * (W * (L + 1) + W * L + (L + 1) + L);
  }

  __device__ void build(const int32_t* counts, const Layout& lay, int me, bool em, int alignment, int64_t cap) {
    const int W = static_cast<int>(lay.world_size), E = static_cast<int>(lay.num_experts), L = E / W;
    const int64_t cols = lay.counts_cols();
    auto cnt = [&](int s, int64_t col) { return __ldg(counts + s * cols + col); };
    auto n = [&](int s, int d) {
      if (!em) return cnt(s, 1 + d);
      int32_t v = 0;
      for (int j = 0; j < L; ++j) v += cnt(s, 1 + W + int64_t(d) * L + j);
      return v;
    };
    if (em) {
      uint8_t* dyn = dyn_smem();
      first = reinterpret_cast<int32_t*>(dyn);
      obase = first + W * (L + 1);
      goff = obase + W * L;
      gcnt = goff + L + 1;
    }
    if (threadIdx.x == 0) ok = 1;
    for (int d = threadIdx.x; d < W; d += blockDim.x) {
      send_cnt[d] = n(me, d);
      recv_cnt[d] = n(d, me);
      int32_t b = 0;
      for (int s = 0; s < me; ++s) b += n(s, d);
      dst_base[d] = b;
      rows_of[d] = 0;
    }
    __syncthreads();
    if (!em) {
      for (int d = threadIdx.x; d < W; d += blockDim.x) {
        int32_t r = 0;
        for (int s = 0; s < W; ++s) r += cnt(s, 1 + d);
        rows_of[d] = r;
      }
    } else {
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t g = 0;
        for (int s = 0; s < W; ++s) g += cnt(s, 1 + W + e);
        atomicAdd(&rows_of[e / L], (g + alignment - 1) / alignment * alignment);
      }
      for (int j = threadIdx.x; j < L; j += blockDim.x) {
        int32_t g = 0;
        for (int s = 0; s < W; ++s) g += cnt(s, 1 + W + int64_t(me) * L + j);
        gcnt[j] = g;
        goff[j] = (g + alignment - 1) / alignment * alignment;
      }
      __syncthreads();
      const int32_t total = block_exclusive_scan(goff, L, tmp);
      if (threadIdx.x == 0) goff[L] = total;
      for (int s = threadIdx.x; s < W; s += blockDim.x) {
        int32_t* f = first + s * (L + 1);
        int32_t run = 0;
        for (int j = 0; j < L; ++j) {
          f[j] = run;
          run += cnt(s, 1 + W + int64_t(me) * L + j);
        }
        f[L] = run;
      }
      __syncthreads();
      for (int j = threadIdx.x; j < L; j += blockDim.x) {
        int32_t run = goff[j];
        for (int s = 0; s < W; ++s) {
          obase[s * L + j] = run;
          run += cnt(s, 1 + W + int64_t(me) * L + j);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int32_t so = 0, rb = 0;
      for (int d = 0; d < W; ++d) {
        send_off[d] = so;
        so += send_cnt[d];
        recv_base[d] = rb;
        rb += recv_cnt[d];
        if (cnt(d, 0) < 0 || rows_of[d] > cap) ok = 0;
      }
    }
    __syncthreads();
  }

  // Output row of row i (0-based) among the rows source s sent this rank.
  __device__ __forceinline__ int64_t out_row(bool em, int s, int64_t i, int L) const {
    if (!em) return recv_base[s] + i;
    const int32_t* f = first + s * (L + 1);
    int lo = 0, hi = L;  // the last j with f[j] <= i (its group is not empty: f[j + 1] > i)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (f[mid] <= i) lo = mid; else hi = mid;
    }
    return obase[s * L + lo] + (i - f[lo]);
  }
};

// ---- dispatch --------------------------------------------------------------------------
struct DispatchArgs {
  uint8_t* base;
  Layout lay;
  int me, C, expert_major, alignment;
  int64_t epoch;
  uint64_t timeout_ns;
  int64_t capacity;          // rows the output tensors hold (the same on every rank)
  const uint8_t* x;          // [T, H] rows to send (x itself, or a symmetric staging copy)
  const int32_t* idx;        // [T, K] int32 copy made by the routing
  const float* w;            // [T, K]
  const int32_t* send_ent;   // [P] t * S + slot, grouped by destination, in receiver order
  const int32_t* counts;     // [W][1 + W + E] this dispatch's counts matrix
  uint8_t* out_x;
  int64_t* out_idx;          // [N, K] rank-major, [M] expert-major
  float* out_w;
  int32_t* out_rank;
  int32_t* out_tok;
  int32_t* out_slot;
  int64_t* out_offsets;      // [L + 1] expert-major, else nullptr
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
  const int L = static_cast<int>(a.lay.local_experts());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool sender = blockIdx.x < C, em = a.expert_major != 0;
  const int c = sender ? blockIdx.x : blockIdx.x - C;
  const int64_t rb = a.lay.row_bytes();
  __shared__ Geometry geo;
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = failed();
  __syncthreads();
  if (dead) return;  // the counts exchange timed out: the snapshot is not this dispatch's
  geo.build(a.counts, a.lay, me, em, a.alignment, a.capacity);
  if (!geo.ok) return;  // bad ids or a receiver over capacity: every rank skips, every host raises
  const int32_t *send_off = geo.send_off, *send_cnt = geo.send_cnt, *dst_base = geo.dst_base,
                *recv_cnt = geo.recv_cnt, *recv_base = geo.recv_base;
  uint64_t* tail = reinterpret_cast<uint64_t*>(a.base + a.lay.tail);

  if (em) {  // group starts, and the padding rows of each group (zeros, ids and sources -1)
    if (blockIdx.x == 0)
      for (int j = threadIdx.x; j <= L; j += blockDim.x) a.out_offsets[j] = geo.goff[j];
    for (int j = blockIdx.x; j < L; j += gridDim.x) {
      for (int64_t r = geo.goff[j] + geo.gcnt[j] + warp; r < geo.goff[j + 1]; r += kWarps) {
        int4* row = reinterpret_cast<int4*>(a.out_x + r * rb);
        for (int v = lane; v < rb / 16; v += 32) row[v] = make_int4(0, 0, 0, 0);
        if (lane == 0) {
          a.out_idx[r] = -1;
          a.out_w[r] = 0.f;
          a.out_rank[r] = a.out_tok[r] = a.out_slot[r] = -1;
        }
      }
    }
  }

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
      const int64_t o = geo.out_row(em, me, i, L);
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
      const int64_t o = geo.out_row(em, s, s_from[s] + rr, L);
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

ErrorWord* error_mirror() {
  void* p = nullptr;
  cuda_check(cudaGetSymbolAddress(&p, g_err), "cudaGetSymbolAddress(g_err)");
  return static_cast<ErrorWord*>(p);
}

// After the host raised a recorded failure (it clears its copy too).
void reset_error() { cuda_check(cudaMemset(error_mirror(), 0, sizeof(ErrorWord)), "cudaMemset(g_err)"); }

// Routing scratch: part [max_blocks][C], totals [C] (int32), and the routing grid.
int route_max_blocks() {
  int dev = 0, sms = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return sms;
}

int64_t route_scratch_ints(const std::vector<int64_t>& lay) {
  Layout l = layout_from(lay);
  const int64_t C = l.world_size + l.num_experts;
  return int64_t(route_max_blocks()) * C + C;
}

// Largest dynamic shared memory the routing and dispatch kernels may ask for (set once).
void allow_smem() {
  static bool done = false;
  if (done) return;
  int dev = 0, max_smem = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
  const auto attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  cuda_check(cudaFuncSetAttribute(route_count_kernel<int64_t>, attr, max_smem - 1024), "route attr");
  cuda_check(cudaFuncSetAttribute(route_count_kernel<int32_t>, attr, max_smem - 1024), "route attr");
  cuda_check(cudaFuncSetAttribute(plan_kernel<int64_t>, attr, max_smem - 1024), "plan attr");
  cuda_check(cudaFuncSetAttribute(plan_kernel<int32_t>, attr, max_smem - 1024), "plan attr");
  cuda_check(cudaFuncSetAttribute(dispatch_kernel, attr, 64 * 1024), "dispatch attr");
  done = true;
}

// Routing of one dispatch (plan = true: count + place/send list/counts exchange) or of
// get_dispatch_layout (plan = false: counts and is_token_in_rank only).
// ptrs: idx, w, scratch, in_rank, per_rank, per_expert, pub_idx, pub_w, pos, send_ent,
//       counts_snap, counts_host, bad_flag, bad_info, err, done
template <typename Idx>
void route(const Layout& l, int64_t base, int me, int64_t T, bool plan, int expert_major, int64_t epoch,
           uint64_t timeout_ns, const std::vector<int64_t>& p, cudaStream_t st) {
  allow_smem();
  const int C = static_cast<int>(l.world_size + l.num_experts);
  const int B = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(route_max_blocks(), (T + 127) / 128)));
  RouteScratch sc{ptr<int32_t>(p[2]), ptr<int32_t>(p[2]) + int64_t(route_max_blocks()) * C, nullptr, nullptr, nullptr};
  RoutingArgs<Idx> a{ptr<const Idx>(p[0]), ptr<const float>(p[1]), static_cast<int>(T), static_cast<int>(l.topk),
                     static_cast<int>(l.world_size), static_cast<int>(l.num_experts), ptr<int32_t>(p[8]),
                     ptr<bool>(p[3]), ptr<int32_t>(p[6]), ptr<float>(p[7]),
                     BadInput{ptr<int32_t>(p[12]), ptr<int64_t>(p[13])}};
  auto* err = ptr<ErrorWord>(p[14]);
  auto* done = ptr<unsigned int>(p[15]);
  route_count_kernel<Idx><<<B, kRouteThreads, size_t(C) * 4, st>>>(a, sc, ptr<int32_t>(p[4]), ptr<int32_t>(p[5]),
                                                                  error_mirror(), done);
  cuda_check(cudaGetLastError(), "route_count_kernel launch");
  if (!plan) return;
  PlanArgs pa{ptr<uint8_t>(base), l, me, expert_major, epoch, timeout_ns, ptr<int32_t>(p[9]), ptr<int32_t>(p[10]),
              ptr<int32_t>(p[11]), err};
  plan_kernel<Idx><<<B, kRouteThreads, size_t(kRouteWarps + 1) * C * 4, st>>>(a, sc, pa, done);
  cuda_check(cudaGetLastError(), "plan_kernel launch");
}

void launch_route(int64_t base, const std::vector<int64_t>& lay, int me, bool idx64, int64_t T, bool plan,
                  int expert_major, int64_t epoch, uint64_t timeout_ns, const std::vector<int64_t>& p, int64_t stream) {
  if (p.size() != 16) throw std::runtime_error("route: expected 16 pointers");
  Layout l = layout_from(lay);
  auto st = ptr<CUstream_st>(stream);
  if (idx64) route<int64_t>(l, base, me, T, plan, expert_major, epoch, timeout_ns, p, st);
  else route<int32_t>(l, base, me, T, plan, expert_major, epoch, timeout_ns, p, st);
}

void launch_barrier(int64_t base, const std::vector<int64_t>& lay, int me, int64_t epoch, uint64_t timeout_ns,
                    int64_t err, int stage, int64_t stream) {
  Layout l = layout_from(lay);
  barrier_kernel<<<1, 256, 0, ptr<CUstream_st>(stream)>>>(ptr<uint8_t>(base), l, me, epoch, timeout_ns,
                                                           ptr<ErrorWord>(err), stage);
  cuda_check(cudaGetLastError(), "barrier_kernel launch");
}

// ptrs: x, idx, w, send_ent, counts, out_x, out_idx, out_w, out_rank, out_tok, out_slot, out_offsets, err
void launch_dispatch(int64_t base, const std::vector<int64_t>& lay, int me, int channels, int expert_major,
                     int alignment, int64_t capacity, int64_t epoch, uint64_t timeout_ns, const std::vector<int64_t>& p,
                     int64_t stream) {
  if (p.size() != 13) throw std::runtime_error("dispatch: expected 13 pointers");
  allow_smem();
  DispatchArgs a{};
  a.base = ptr<uint8_t>(base);
  a.lay = layout_from(lay);
  a.me = me;
  a.C = num_channels(channels, static_cast<int>(a.lay.world_size));
  a.expert_major = expert_major;
  a.alignment = alignment;
  a.capacity = capacity;
  a.epoch = epoch;
  a.timeout_ns = timeout_ns;
  a.x = ptr<const uint8_t>(p[0]);
  a.idx = ptr<const int32_t>(p[1]);
  a.w = ptr<const float>(p[2]);
  a.send_ent = ptr<const int32_t>(p[3]);
  a.counts = ptr<const int32_t>(p[4]);
  a.out_x = ptr<uint8_t>(p[5]);
  a.out_idx = ptr<int64_t>(p[6]);
  a.out_w = ptr<float>(p[7]);
  a.out_rank = ptr<int32_t>(p[8]);
  a.out_tok = ptr<int32_t>(p[9]);
  a.out_slot = ptr<int32_t>(p[10]);
  a.out_offsets = ptr<int64_t>(p[11]);
  a.err = ptr<ErrorWord>(p[12]);
  const size_t smem = expert_major ? size_t(Geometry::dyn_bytes(a.lay)) : 0;
  dispatch_kernel<<<2 * a.C, kThreads, smem, ptr<CUstream_st>(stream)>>>(a);
  cuda_check(cudaGetLastError(), "dispatch_kernel launch");
}

// ptrs: y, rw, src_rank, src_tok, src_slot, selfmap, topk_idx, topk_w, out_x, out_w, err
void launch_combine(int64_t base, const std::vector<int64_t>& lay, int me, int channels, int expert_major,
                    int num_tokens, int64_t rows, int elem_kind, int64_t epoch, uint64_t timeout_ns,
                    const std::vector<int64_t>& p, int64_t stream) {
  if (p.size() != 11) throw std::runtime_error("combine: expected 11 pointers");
  CombineArgs a{};
  a.base = ptr<uint8_t>(base);
  a.lay = layout_from(lay);
  a.me = me;
  a.C = num_channels(channels, static_cast<int>(a.lay.world_size));
  a.expert_major = expert_major;
  a.num_tokens = num_tokens;
  a.rows = rows;
  a.epoch = epoch;
  a.timeout_ns = timeout_ns;
  a.y = ptr<const uint8_t>(p[0]);
  a.rw = ptr<const float>(p[1]);
  a.src_rank = ptr<const int32_t>(p[2]);
  a.src_tok = ptr<const int32_t>(p[3]);
  a.src_slot = ptr<const int32_t>(p[4]);
  a.selfmap = ptr<int32_t>(p[5]);
  a.topk_idx = ptr<const int64_t>(p[6]);
  a.topk_w = ptr<const float>(p[7]);
  a.out_x = ptr<uint8_t>(p[8]);
  a.out_w = ptr<float>(p[9]);
  a.err = ptr<ErrorWord>(p[10]);
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
  m.def("route", &launch_route);
  m.def("reset_error", &reset_error);
  m.def("route_scratch_ints", &route_scratch_ints);
  m.def("barrier", &launch_barrier);
  m.def("dispatch", &launch_dispatch);
  m.def("combine", &launch_combine);
  m.attr("threads") = kThreads;
  m.attr("max_world") = kMaxWorld;
}
