// Row-copy and row-reduce strategies for the data kernels, timed against cudaMemcpy in one
// run on the DeepSeek-V3 shape at world size 1 (4096 rows of 7168 bf16, top-8).
//
//   copy    rows gathered through a permutation, as the rank-major dispatch moves them:
//           mover    csrc/common/mover.cuh as the dispatch kernels use it (depth slots per warp)
//           mover+meta  the same with the dispatch's per-row work around each copy: the row's
//                    routing read one row ahead (K ids, K weights, 1 + K positions), its metadata
//                    stored (K int64 ids, K weights, source rank / token / slot): what the data
//                    kernels do besides copying, without their plan and prologue; "2 ahead":
//                    the routing read two rows ahead
//           ring<S>  one lane per warp keeps S-1 bulk loads in flight (S slots), stores from
//                    shared as each lands
//           ldst<U>  16-byte loads/stores, U in flight per thread (nc: non-coherent loads and
//                    no-L1-allocate stores), grid-stride over the whole copy
//           warprow<U> one warp per row, U vectors per lane in flight
//           flat<U>  identity rows only: the copy as one flat range, no index math (what a
//                    plain SM copy kernel reaches next to cudaMemcpy)
//   fan-out each row to K rows, to random rows and in the expert-major order of a uniform
//           top-K routing (as the expert-major dispatch at world size 1 writes them): mover
//           (push's), bulk-load ring with K bulk stores per piece (also with an L2 evict-first
//           policy), warp rows with plain / no-L1-allocate / streaming (.cs) stores; cudaMemset
//           of the written rows, SM stores and bulk stores of them are the write-only references
//   reduce  csrc/common/reduce.cuh: rank-major (one slot per token) and expert-major (8
//           weighted slots per token), U vectors per thread, NT threads per block
//
// Every variant's output is compared with the first variant of its group (bitwise); a
// mismatch prints MISMATCH. Build and run: scripts/gpu_check.sh micro.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../../csrc/common/mover.cuh"
#include "../../csrc/common/reduce.cuh"
#include "harness.cuh"

using namespace symmoe;

// Non-coherent, no L1 allocation; kL2: with the L2 prefetch-size hint (each miss fetches the
// 256-byte sector group).
template <bool kL2 = false>
__device__ __forceinline__ int4 ld_nc(const int4* p) {
  int4 v;
  if constexpr (kL2)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}
__device__ __forceinline__ void st_na(int4* p, int4 v) {
  asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__global__ void count_diff(const int4* a, const int4* b, int64_t n, unsigned long long* out) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int4 x = a[i], y = b[i];
    c += (x.x != y.x) | (x.y != y.y) | (x.z != y.z) | (x.w != y.w);
  }
  if (c) atomicAdd(out, c);
}

// -- copy variants -----------------------------------------------------------------------
// The kernels' mover (WarpMover). Copy (kFan false): row r of dst from row idx[r] of src.
// Fan-out (kFan true): row t of src to rows idx[t * K + k] of dst, k < K.
template <bool kFan>
__global__ void mover_move(const uint8_t* src, uint8_t* dst, const int* idx, int64_t N, int K, int64_t R, uint32_t slot,
                           int warps, int depth) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  WarpMover mv;
  mv.init(dyn_smem() + int64_t(warp) * WarpMoverSmem::per_warp_bytes(slot, depth), slot, depth);
  const int64_t P = (R + slot - 1) / slot, items = N * P;
  const int64_t gw = int64_t(blockIdx.x) * warps + warp, nwt = int64_t(gridDim.x) * warps;
  for (int64_t it = gw; it < items; it += nwt) {
    const int64_t row = it / P, off = (it % P) * slot;
    const uint32_t bytes = uint32_t(min(int64_t(slot), R - off));
    if (kFan) {
      if (lane < K) mv.next_dsts()[lane] = dst + int64_t(idx[row * K + lane]) * R + off;
    } else if (lane == 0) {
      mv.next_dsts()[0] = dst + row * R + off;
    }
    __syncwarp();
    mv.push(src + int64_t(kFan ? row : idx[row]) * R + off, kFan ? K : 1, bytes);
  }
  mv.flush();
}

// mover_move<false> with the rank-major dispatch's per-row work (push_kernel's pattern).
struct RowMeta {
  const int* idx;    // [N, K] routing ids
  const float* w;    // [N, K]
  const int* pos;    // [N, 1 + K]
  int64_t* out_idx;  // [N, K]
  float* out_w;      // [N, K]
  int* out_src;      // [3, N]: rank, token, slot
};
// kAhead: rows whose routing is in flight ahead of the copy (the kernels: 1). Under a saturated
// HBM a small load may take longer than one row's copy; 2 says whether that is the cost.
template <int kAhead>
__global__ void mover_meta_move(const uint8_t* src, uint8_t* dst, const int* perm, int64_t N, int K, int64_t R,
                                uint32_t slot, int warps, int depth, RowMeta m) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  WarpMover mv;
  mv.init(dyn_smem() + int64_t(warp) * WarpMoverSmem::per_warp_bytes(slot, depth), slot, depth);
  const int64_t gw = int64_t(blockIdx.x) * warps + warp, nwt = int64_t(gridDim.x) * warps;
  auto load = [&](int64_t t, int& e, float& wt, int& ps) {
    e = -1, wt = 0.f, ps = 0;
    if (t >= N) return;
    if (lane < K) e = m.idx[t * K + lane], wt = m.w[t * K + lane];
    if (lane <= K) ps = m.pos[t * (1 + K) + lane];
  };
  int e[kAhead], ps[kAhead];
  float wt[kAhead];
#pragma unroll
  for (int a = 0; a < kAhead; ++a) load(gw + a * nwt, e[a], wt[a], ps[a]);
  for (int64_t row = gw; row < N; row += nwt) {
    const int ce = e[0], cps = ps[0];
    const float cw = wt[0];
#pragma unroll
    for (int a = 0; a + 1 < kAhead; ++a) e[a] = e[a + 1], wt[a] = wt[a + 1], ps[a] = ps[a + 1];
    load(row + kAhead * nwt, e[kAhead - 1], wt[kAhead - 1], ps[kAhead - 1]);
    const bool own = ce >= 0;
    const int64_t out = __shfl_sync(0xffffffffu, cps, 0);  // the output row comes from the routing, as in the kernels
    if (__ballot_sync(0xffffffffu, own) == 0 || out < 0 || out >= N) continue;
    if (lane < K) {
      m.out_idx[out * K + lane] = own ? int64_t(ce) : -1;
      m.out_w[out * K + lane] = own ? cw : 0.f;
    }
    if (lane == 0) {
      m.out_src[out] = 0;
      m.out_src[N + out] = int(row);
      m.out_src[2 * N + out] = 0;
    }
    if (lane == 0) mv.next_dsts()[0] = dst + out * R;
    __syncwarp();
    mv.push(src + int64_t(perm[row]) * R, 1, uint32_t(R));
  }
  mv.flush();
}

template <int S>
__host__ __device__ int64_t ring_warp_bytes(uint32_t slot) {
  return (int64_t(S) * slot + S * 8 + 127) / 128 * 128;
}

// Lane 0 of each warp keeps S-1 bulk loads in flight (S slots) and stores each piece as it
// lands. Copy (kFan false): row r of dst from row idx[r] of src. Fan-out (kFan true): row t of
// src to rows idx[t * K + k] of dst, k < K.
// kEvictFirst: stores with the evict-first policy; kLoadEvictFirst: loads with it.
template <int S, bool kFan, bool kEvictFirst = false, bool kLoadEvictFirst = false>
__global__ void ring_move(const uint8_t* src, uint8_t* dst, const int* idx, int64_t N, int K, int64_t R, uint32_t slot,
                          int warps) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* base = dyn_smem() + int64_t(warp) * ring_warp_bytes<S>(slot);
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + int64_t(S) * slot);
  if (lane != 0) return;
  for (int s = 0; s < S; ++s) mbar_init(&bar[s], 1);
  mbar_init_fence();
  const int64_t P = (R + slot - 1) / slot, items = N * P;
  const int64_t gw = int64_t(blockIdx.x) * warps + warp, nwt = int64_t(gridDim.x) * warps;
  const int64_t n = items > gw ? (items - gw + nwt - 1) / nwt : 0;
  auto issue = [&](int64_t j) {
    const int64_t it = gw + j * nwt, row = it / P, off = (it % P) * slot;
    const uint32_t bytes = uint32_t(min(int64_t(slot), R - off));
    const int s = int(j % S);
    mbar_arrive_expect_tx(&bar[s], bytes);
    const uint8_t* from = src + int64_t(kFan ? row : idx[row]) * R + off;
    if constexpr (kLoadEvictFirst) {
      const uint64_t policy = evict_first_policy();
      bulk_load_evict_first(base + int64_t(s) * slot, from, bytes, &bar[s], policy);
    } else {
      bulk_load(base + int64_t(s) * slot, from, bytes, &bar[s]);
    }
  };
  for (int64_t j = 0; j < min(n, int64_t(S - 1)); ++j) issue(j);
  uint32_t phase = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int s = int(j % S);
    while (!mbar_try_wait(&bar[s], (phase >> s) & 1u)) {
    }
    phase ^= 1u << s;
    const int64_t it = gw + j * nwt, row = it / P, off = (it % P) * slot;
    const uint32_t bytes = uint32_t(min(int64_t(slot), R - off));
    if (kFan && kEvictFirst) {
      const uint64_t policy = evict_first_policy();
      for (int k = 0; k < K; ++k)
        bulk_store_evict_first(dst + int64_t(idx[row * K + k]) * R + off, base + int64_t(s) * slot, bytes, policy);
    } else if (kFan) {
      for (int k = 0; k < K; ++k) bulk_store(dst + int64_t(idx[row * K + k]) * R + off, base + int64_t(s) * slot, bytes);
    } else if (kEvictFirst) {
      const uint64_t policy = evict_first_policy();
      bulk_store_evict_first(dst + row * R + off, base + int64_t(s) * slot, bytes, policy);
    } else {
      bulk_store(dst + row * R + off, base + int64_t(s) * slot, bytes);
    }
    bulk_commit();
    if (j + S - 1 < n) {
      bulk_wait_read<1>();  // the slot of item j - 1 (its stores were the group before this one)
      issue(j + S - 1);
    }
  }
  bulk_wait_all();
}

template <int U, bool NC>
__global__ void ldst_copy(const int4* src, int4* dst, const int* perm, int64_t N, int64_t nv) {
  const int64_t total = N * nv, nt = int64_t(gridDim.x) * blockDim.x;
  for (int64_t q0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q0 < total; q0 += nt * U) {
    int4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t q = q0 + u * nt;
      if (q < total) {
        const int4* p = src + int64_t(perm[q / nv]) * nv + q % nv;
        r[u] = NC ? ld_nc(p) : *p;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t q = q0 + u * nt;
      if (q < total) {
        if (NC)
          st_na(dst + q, r[u]);
        else
          dst[q] = r[u];
      }
    }
  }
}

// The whole copy as one flat range, no row structure and no index math: what an SM kernel
// reaches against cudaMemcpy's copy of the same bytes (identity rows only).
// kL2: NC loads with the 256-byte L2 prefetch hint.
template <int U, bool NC, bool kL2 = false>
__global__ void flat_copy(const int4* src, int4* dst, const int* /*perm*/, int64_t N, int64_t nv) {
  const int64_t total = N * nv, nt = int64_t(gridDim.x) * blockDim.x;
  for (int64_t q0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q0 < total; q0 += nt * U) {
    int4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (q0 + u * nt < total) r[u] = NC ? ld_nc<kL2>(src + q0 + u * nt) : src[q0 + u * nt];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (q0 + u * nt < total) {
        if (NC)
          st_na(dst + q0 + u * nt, r[u]);
        else
          dst[q0 + u * nt] = r[u];
      }
  }
}

// Write-only references for the fan-out: what SM stores alone reach over the bytes the
// expert-major dispatch writes, next to cudaMemset's (session 26: 110-111 µs against 105, so
// the SM store path is not what holds the fan-out at 142-148).
// store_only: 16-byte stores of a value that differs per vector, grid-stride, U per thread.
template <int U>
__global__ void store_only(int4* dst, int64_t nv) {
  const int64_t nt = int64_t(gridDim.x) * blockDim.x;
  for (int64_t q0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q0 < nv; q0 += nt * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t q = q0 + u * nt;
      if (q < nv) dst[q] = make_int4(int(q), int(q >> 32), int(q) ^ 0x5a5a5a5a, ~int(q));
    }
  }
}
// read_write_mix: the fan-out's traffic (each source vector read once, 8 vectors written)
// with no dependency between them: the writes are of the vector's own index, the reads fold
// into one word stored at the end. Next to the fan-out it tells whether its gap to a copy of the
// same bytes is HBM's read/write mix or the wait of each store on its row's load.
template <int U>
__global__ void read_write_mix(const int4* src, int4* dst, int64_t nsrc, int K, int* sink) {
  const int64_t nt = int64_t(gridDim.x) * blockDim.x;
  int acc = 0;
  for (int64_t q0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q0 < nsrc; q0 += nt * U) {
    int4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (q0 + u * nt < nsrc) r[u] = ld_nc(src + q0 + u * nt);
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t q = k * nsrc + q0 + u * nt;  // K planes of the source's size: coalesced
        if (q0 + u * nt < nsrc) dst[q] = make_int4(int(q), int(q >> 32), k, ~int(q));
      }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= r[u].x ^ r[u].w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}
// Every block of the grid meets here (all resident): ctr counts arrivals, zeroed before each
// launch; gen counts this block's meetings. Whole block calls.
__device__ __forceinline__ void grid_meet(unsigned* ctr, unsigned& gen) {
  __syncthreads();
  ++gen;
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(ctr, 1u);
    while (atomicAdd(ctr, 0u) < gen * gridDim.x) {
    }
  }
  __syncthreads();
}

// phased_mix: the same traffic in grid-wide phases (all blocks resident, one per SM): every
// block reads `rows` source rows into shared memory, all blocks meet, each row is written K
// times (K planes, coalesced), all meet again. Whether HBM serves the write-heavy mix faster
// when reads and writes do not overlap.
__global__ void phased_mix(const int4* src, int4* dst, int64_t N, int K, int64_t nv, int rows, unsigned* ctr) {
  int4* tile = reinterpret_cast<int4*>(dyn_smem());
  unsigned gen = 0;
  // Every block runs every round (a block past the rows still meets the others).
  const int64_t per_round = int64_t(gridDim.x) * rows, rounds = (N + per_round - 1) / per_round;
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t r0 = r * per_round + int64_t(blockIdx.x) * rows;
    const int n = int(max(int64_t(0), min(int64_t(rows), N - r0)));
    for (int64_t i = threadIdx.x; i < n * nv; i += blockDim.x) tile[i] = ld_nc(src + r0 * nv + i);
    grid_meet(ctr, gen);
    for (int k = 0; k < K; ++k)
      for (int64_t i = threadIdx.x; i < n * nv; i += blockDim.x) dst[(k * N + r0) * nv + i] = tile[i];
    grid_meet(ctr, gen);
  }
}

// How a phased fan-out's blocks get their rows: rounds shared evenly up front, or each phase
// claimed at run time from a counter (a block done early takes more; the kernels' warps end
// 97-143 us apart with even rounds, session 27 C); guided claims shrink to what is left over
// twice the blocks (at least one row) once that is fewer than `rows`, so the last phases are short.
enum class Claims { kEven, kClaimed, kGuided };

// phased_fan<kGrid, kClaims>: the fan-out as the kernels would run it in phases, with bulk
// copies: each block (one per SM) loads up to `rows` whole rows into shared memory (warp w: row
// w, one bulk load on its mbarrier), then warp w stores its row to its K destination rows (bulk
// stores), and waits for them to read shared memory before the next phase. kGrid: every block
// meets the others after its loads and after its stores (grid-wide phases: HBM sees reads, then
// writes; even rounds only); without, each block only runs its own phases. `ctr`: zero at launch.
// kIo: what moves, to split the fan-out's time: both (kBoth), the stores alone (kStores: the
// tiles' stale bytes go to the same rows, no load) or the loads alone (kLoads: nothing written).
enum class Io { kBoth, kStores, kLoads };
// kPend > 0: a warp's K stores in groups of one, at most kPend of them still reading its tile
// (0: all K in one group, as the kernels issue them).
template <bool kGrid, Claims kClaims = Claims::kEven, Io kIo = Io::kBoth, int kPend = 0>
__global__ void phased_fan(const uint8_t* src, uint8_t* dst, const int* idx, int64_t N, int K, int64_t R, int rows,
                           unsigned* ctr) {
  static_assert(!kGrid || kClaims == Claims::kEven, "grid-wide phases need every block in every round");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* tile = dyn_smem();
  uint64_t* bar = reinterpret_cast<uint64_t*>(tile + int64_t(rows) * R);
  __shared__ int64_t claim[2];  // claimed phases: first row, count
  if (threadIdx.x < rows) mbar_init(&bar[threadIdx.x], 1);
  mbar_init_fence();
  __syncthreads();
  unsigned gen = 0;
  uint32_t parity = 0;  // of this warp's mbarrier: flips with each load it completes
  auto grid_sync = [&] {
    if (kGrid)
      grid_meet(ctr, gen);
    else
      __syncthreads();
  };
  const int64_t per_round = int64_t(gridDim.x) * rows, rounds = (N + per_round - 1) / per_round;
  const int64_t even = (N + rounds - 1) / rounds;  // rows per round, all rounds alike
  for (int64_t r = 0;; ++r) {
    int64_t b0, n;  // this block's rows of phase r: b0 + [0, n)
    if (kClaims == Claims::kEven) {
      if (r >= rounds) break;
      const int64_t lo = r * even, hi = min(N, lo + even);
      b0 = lo + (hi - lo) * blockIdx.x / gridDim.x;
      n = lo + (hi - lo) * (blockIdx.x + 1) / gridDim.x - b0;
    } else {
      if (threadIdx.x == 0) {
        int64_t want = rows;
        if (kClaims == Claims::kGuided) {
          const int64_t left = N - int64_t(*reinterpret_cast<volatile unsigned*>(ctr));
          want = max(int64_t(1), min(int64_t(rows), left / (2 * int64_t(gridDim.x))));
        }
        const int64_t c = atomicAdd(ctr, unsigned(want));
        claim[0] = c;
        claim[1] = max(int64_t(0), min(want, N - c));
      }
      __syncthreads();  // the phase's own barriers keep claim until every thread has read it
      b0 = claim[0];
      n = claim[1];
      if (n == 0) break;  // block-uniform
    }
    const int64_t row = b0 + warp;
    const bool mine = warp < n && warp < rows;
    if (mine && lane == 0 && kIo != Io::kStores) {
      mbar_arrive_expect_tx(&bar[warp], uint32_t(R));
      bulk_load(tile + int64_t(warp) * R, src + row * R, uint32_t(R), &bar[warp]);
      while (!mbar_try_wait(&bar[warp], parity)) {
      }
    }
    if (mine && kIo != Io::kStores) parity ^= 1u;
    grid_sync();
    if (mine && lane == 0 && kIo != Io::kLoads) {
      for (int k = 0; k < K; ++k) {
        bulk_store(dst + int64_t(idx[row * K + k]) * R, tile + int64_t(warp) * R, uint32_t(R));
        if constexpr (kPend > 0) {
          bulk_commit();
          bulk_wait_read<kPend - 1>();
        }
      }
      bulk_commit();
      bulk_wait_read_all();
    }
    grid_sync();
  }
  if (lane == 0) bulk_wait_all();
}

// bulk_store_only<D>: each warp fills one shared tile of `slot` bytes once, then its lane 0
// stores that tile to every `slot`-byte piece the warp owns, at most D bulk groups unfinished
// (the tile never changes, so the bound only shapes the queue, as the mover's slots do): the
// write half of the mover and the ring, without their loads.
template <int D>
__global__ void bulk_store_only(uint8_t* dst, int64_t bytes, uint32_t slot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  uint8_t* tile = dyn_smem() + int64_t(warp) * slot;
  for (uint32_t i = lane * 16; i < slot; i += 32 * 16)
    *reinterpret_cast<int4*>(tile + i) = make_int4(int(i), warp, int(blockIdx.x), ~int(i));
  fence_proxy_async_shared();
  __syncwarp();
  if (lane != 0) return;
  const int64_t pieces = bytes / slot, gw = int64_t(blockIdx.x) * warps + warp, nw = int64_t(gridDim.x) * warps;
  for (int64_t p = gw; p < pieces; p += nw) {
    bulk_store(dst + p * slot, tile, slot);
    bulk_commit();
    bulk_wait_read<D - 1>();
  }
  bulk_wait_all();
}

template <int U>
__global__ void warprow_copy(const int4* src, int4* dst, const int* perm, int64_t N, int64_t nv) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5, nwt = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = gw; row < N; row += nwt) {
    const int4* s = src + int64_t(perm[row]) * nv;
    int4* d = dst + row * nv;
    for (int64_t c0 = lane; c0 < nv; c0 += 32 * U) {
      int4 r[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c0 + u * 32 < nv) r[u] = ld_nc(s + c0 + u * 32);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c0 + u * 32 < nv) st_na(d + c0 + u * 32, r[u]);
    }
  }
}

// -- fan-out variants (expert-major dispatch: each row to K output rows) --------------------
// out_row[t * K + k]: the output row of token t's slot k (a permutation of N * K rows).
// One warp per token: U vectors per lane loaded once, stored to each of the K rows.
// ST 0: plain stores, 1: L1::no_allocate, 2: st.global.cs (evict-first streaming).
template <int U, int ST>
__global__ void warprow_fanout(const int4* src, int4* dst, const int* out_row, int64_t N, int K, int64_t nv) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5, nwt = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t t = gw; t < N; t += nwt) {
    const int4* s = src + t * nv;
    const int64_t my_row = lane < K ? int64_t(out_row[t * K + lane]) : 0;
    for (int64_t c0 = lane; c0 < nv; c0 += 32 * U) {
      int4 r[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c0 + u * 32 < nv) r[u] = ld_nc(s + c0 + u * 32);
      for (int k = 0; k < K; ++k) {
        int4* d = dst + __shfl_sync(0xffffffffu, my_row, k) * nv;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (c0 + u * 32 >= nv) continue;
          if (ST == 0) d[c0 + u * 32] = r[u];
          else if (ST == 1) st_na(d + c0 + u * 32, r[u]);
          else __stcs(d + c0 + u * 32, r[u]);
        }
      }
    }
  }
}

// -- reduce variants ---------------------------------------------------------------------
template <int U, int NT>
__global__ void __launch_bounds__(NT) reduce_kernel(CombineSources cs, __nv_bfloat16* out, float* out_w) {
  reduce_tokens<__nv_bfloat16, U, NT>(cs, out, out_w, 2);  // halves, as the combine at W=1 on a whole H200
}

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 4096, H = argc > 2 ? std::atoll(argv[2]) : 7168;
  const int K = 8, reps = 30;
  const int64_t R = H * 2, nv = R / 16;
  const Device dev = device_header(N, R);
  const int sms = dev.sms, optin = dev.optin;

  uint8_t *src, *dst, *ref, *ybig;
  int *perm_id, *perm_rand;
  unsigned long long* diff;
  CK(cudaMalloc(&src, N * R));
  CK(cudaMalloc(&dst, N * R));
  CK(cudaMalloc(&ref, N * R));
  CK(cudaMalloc(&ybig, N * K * R));
  CK(cudaMalloc(&perm_id, N * 4));
  CK(cudaMalloc(&perm_rand, N * 4));
  CK(cudaMalloc(&diff, 8));
  fill<<<1024, 256>>>(reinterpret_cast<uint16_t*>(src), N * R / 2, 1u);
  fill<<<1024, 256>>>(reinterpret_cast<uint16_t*>(ybig), N * K * R / 2, 2u);
  std::vector<int> h(N);
  for (int64_t i = 0; i < N; ++i) h[i] = int(i);
  CK(cudaMemcpy(perm_id, h.data(), N * 4, cudaMemcpyHostToDevice));
  std::mt19937 rng(7);
  std::shuffle(h.begin(), h.end(), rng);
  CK(cudaMemcpy(perm_rand, h.data(), N * 4, cudaMemcpyHostToDevice));

  const double copy_bytes = 2.0 * N * R;
  const float memcpy_us = time_us([&] { CK(cudaMemcpyAsync(dst, src, N * R, cudaMemcpyDeviceToDevice)); }, reps);
  const double roof = copy_bytes / memcpy_us / 1e6;  // TB/s
  std::printf("%-34s %9.1f us  %5.2f TB/s  1.000\n", "cudaMemcpy D2D", memcpy_us, roof);

  auto check = [&](const uint8_t* a, const uint8_t* b, int64_t bytes) {
    CK(cudaMemset(diff, 0, 8));
    count_diff<<<1024, 256>>>(reinterpret_cast<const int4*>(a), reinterpret_cast<const int4*>(b), bytes / 16, diff);
    unsigned long long d = 0;
    CK(cudaMemcpy(&d, diff, 8, cudaMemcpyDeviceToHost));
    return d;
  };
  auto report = [&](const char* name, float us, double bytes, unsigned long long bad) {
    std::printf("%-34s %9.1f us  %5.2f TB/s  %5.3f%s\n", name, us, bytes / us / 1e6, bytes / us / 1e6 / roof,
                bad ? "  MISMATCH" : "");
  };

  for (int pr = 0; pr < 2; ++pr) {
    const int* perm = pr ? perm_rand : perm_id;
    std::printf("-- copy, %s rows\n", pr ? "permuted" : "identity");
    // the reference output: mover at whole rows
    auto mover = [&](uint32_t slot, int depth) {
      const int64_t per = WarpMoverSmem::per_warp_bytes(slot, depth);
      const int warps = int(std::min<int64_t>(16, (optin - 1024) / per));
      const size_t smem = size_t(warps * per);
      CK(cudaFuncSetAttribute(mover_move<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      return std::make_pair(warps, smem);
    };
    {
      auto [w, smem] = mover(uint32_t(R), 2);
      mover_move<false><<<sms, w * 32, smem>>>(src, ref, perm, N, 1, R, uint32_t(R), w, 2);
      CK(cudaDeviceSynchronize());
    }
    for (const auto& sd : {std::pair<uint32_t, int>{uint32_t(R), 2}, {uint32_t(R / 2), 2}, {uint32_t(R / 4), 2},
                           {uint32_t(R / 2), 4}, {uint32_t(R / 4), 4}, {uint32_t(R / 4), 8}, {uint32_t(R / 8), 8}}) {
      const uint32_t slot = sd.first;
      const int depth = sd.second;
      const auto cfg = mover(slot, depth);
      const int w = cfg.first;
      const size_t smem = cfg.second;
      CK(cudaMemset(dst, 0, N * R));
      const float us =
          time_us([&] { mover_move<false><<<sms, w * 32, smem>>>(src, dst, perm, N, 1, R, slot, w, depth); }, reps);
      char name[64];
      std::snprintf(name, sizeof name, "mover slot %u depth %d (%d warps)", slot, depth, w);
      report(name, us, copy_bytes, check(dst, ref, N * R));
    }
    {  // the dispatch's default shape: whole rows, depth 4 (3 warps); plain and with the per-row work
      const int64_t per = WarpMoverSmem::per_warp_bytes(uint32_t(R), 4);
      const int w = int(std::min<int64_t>(16, (optin - 1024) / per));
      const size_t smem = size_t(w * per);
      CK(cudaFuncSetAttribute(mover_move<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      CK(cudaFuncSetAttribute(mover_meta_move<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      CK(cudaFuncSetAttribute(mover_meta_move<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      CK(cudaMemset(dst, 0, N * R));
      float us = time_us([&] { mover_move<false><<<sms, w * 32, smem>>>(src, dst, perm, N, 1, R, uint32_t(R), w, 4); }, reps);
      char name[64];
      std::snprintf(name, sizeof name, "mover slot %lld depth 4 (%d warps)", (long long)R, w);
      report(name, us, copy_bytes, check(dst, ref, N * R));
      RowMeta m{};
      std::vector<int> hidx(N * K), hpos(N * (1 + K));
      std::vector<float> hw(N * K);
      for (int64_t i = 0; i < N * K; ++i) hidx[i] = int(i % 256), hw[i] = 0.125f;
      for (int64_t i = 0; i < N * (1 + K); ++i) hpos[i] = int(i / (1 + K));
      CK(cudaMalloc(&m.idx, N * K * 4));
      CK(cudaMalloc(&m.w, N * K * 4));
      CK(cudaMalloc(&m.pos, N * (1 + K) * 4));
      CK(cudaMalloc(&m.out_idx, N * K * 8));
      CK(cudaMalloc(&m.out_w, N * K * 4));
      CK(cudaMalloc(&m.out_src, 3 * N * 4));
      CK(cudaMemcpy(const_cast<int*>(m.idx), hidx.data(), N * K * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(const_cast<float*>(m.w), hw.data(), N * K * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(const_cast<int*>(m.pos), hpos.data(), N * (1 + K) * 4, cudaMemcpyHostToDevice));
      CK(cudaMemset(dst, 0, N * R));
      us = time_us([&] { mover_meta_move<1><<<sms, w * 32, smem>>>(src, dst, perm, N, K, R, uint32_t(R), w, 4, m); }, reps);
      std::snprintf(name, sizeof name, "mover+meta slot %lld depth 4 (%d warps)", (long long)R, w);
      report(name, us, copy_bytes, check(dst, ref, N * R));
      CK(cudaMemset(dst, 0, N * R));
      us = time_us([&] { mover_meta_move<2><<<sms, w * 32, smem>>>(src, dst, perm, N, K, R, uint32_t(R), w, 4, m); }, reps);
      std::snprintf(name, sizeof name, "mover+meta 2 ahead slot %lld depth 4 (%d warps)", (long long)R, w);
      report(name, us, copy_bytes, check(dst, ref, N * R));
      CK(cudaFree(const_cast<int*>(m.idx)));
      CK(cudaFree(const_cast<float*>(m.w)));
      CK(cudaFree(const_cast<int*>(m.pos)));
      CK(cudaFree(m.out_idx));
      CK(cudaFree(m.out_w));
      CK(cudaFree(m.out_src));
    }
    // st_ef / ld_ef: the stores / loads with an L2 evict-first policy (rows moved once)
    auto ring = [&](auto S_, uint32_t slot, int blocks_per_sm, auto st_ef, auto ld_ef) {
      constexpr int S = decltype(S_)::value;
      constexpr bool kSt = decltype(st_ef)::value, kLd = decltype(ld_ef)::value;
      const int64_t per = ring_warp_bytes<S>(slot);
      const int64_t budget = (optin - 1024) / blocks_per_sm;
      const int warps = int(std::min<int64_t>(32, budget / per));
      if (warps < 1) return;
      const size_t smem = size_t(warps * per);
      auto kernel = ring_move<S, false, kSt, kLd>;
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      CK(cudaMemset(dst, 0, N * R));
      const float us = time_us(
          [&] { kernel<<<sms * blocks_per_sm, warps * 32, smem>>>(src, dst, perm, N, 1, R, slot, warps); }, reps);
      char name[80];
      std::snprintf(name, sizeof name, "ring S=%d slot %u%s%s (%dx%d warps)", S, slot, kSt ? " st-ef" : "",
                    kLd ? " ld-ef" : "", blocks_per_sm, warps);
      report(name, us, copy_bytes, check(dst, ref, N * R));
    };
    using no = std::false_type;
    using yes = std::true_type;
    ring(std::integral_constant<int, 2>{}, uint32_t(R), 1, no{}, no{});
    ring(std::integral_constant<int, 3>{}, uint32_t(R), 1, no{}, no{});
    ring(std::integral_constant<int, 4>{}, uint32_t(R), 1, no{}, no{});
    // the dispatch's shape (whole rows, 4 slots) with L2 hints: does the policy move the copy?
    ring(std::integral_constant<int, 4>{}, uint32_t(R), 1, yes{}, no{});
    ring(std::integral_constant<int, 4>{}, uint32_t(R), 1, no{}, yes{});
    ring(std::integral_constant<int, 4>{}, uint32_t(R), 1, yes{}, yes{});
    ring(std::integral_constant<int, 4>{}, uint32_t(R / 2), 1, no{}, no{});
    ring(std::integral_constant<int, 8>{}, uint32_t(R / 2), 1, no{}, no{});
    ring(std::integral_constant<int, 8>{}, uint32_t(R / 4), 1, no{}, no{});
    ring(std::integral_constant<int, 4>{}, uint32_t(R / 4), 2, no{}, no{});
    ring(std::integral_constant<int, 16>{}, uint32_t(R / 8), 1, no{}, no{});
    auto ldst = [&](auto f, const char* name, int threads, int blocks_per_sm) {
      CK(cudaMemset(dst, 0, N * R));
      const float us = time_us([&] { f<<<sms * blocks_per_sm, threads>>>(reinterpret_cast<const int4*>(src),
                                                                         reinterpret_cast<int4*>(dst), perm, N, nv); },
                               reps);
      char full[64];
      std::snprintf(full, sizeof full, "%s (%dx%d)", name, blocks_per_sm, threads);
      report(full, us, copy_bytes, check(dst, ref, N * R));
    };
    ldst(ldst_copy<4, false>, "ldst U=4", 512, 4);
    ldst(ldst_copy<8, false>, "ldst U=8", 512, 4);
    ldst(ldst_copy<4, true>, "ldst nc U=4", 512, 4);
    ldst(ldst_copy<8, true>, "ldst nc U=8", 512, 4);
    ldst(ldst_copy<8, true>, "ldst nc U=8", 256, 4);
    ldst(warprow_copy<4>, "warprow U=4", 512, 4);
    ldst(warprow_copy<7>, "warprow U=7", 512, 4);
    ldst(warprow_copy<7>, "warprow U=7", 256, 4);
    ldst(warprow_copy<14>, "warprow U=14", 256, 4);
    if (!pr) {  // a flat copy has no permutation to follow
      ldst(flat_copy<4, false>, "flat U=4", 512, 4);
      ldst(flat_copy<8, true>, "flat nc U=8", 256, 4);
      ldst(flat_copy<4, true>, "flat nc U=4", 1024, 2);
      ldst(flat_copy<8, true, true>, "flat nc L2::256B U=8", 256, 4);
      ldst(flat_copy<4, true, true>, "flat nc L2::256B U=4", 1024, 2);
      {  // the same copy in grid-wide phases (phased_mix with one plane): reads, meet, writes, meet
        const int rows = int((optin - 1024) / R);
        unsigned* ctr = reinterpret_cast<unsigned*>(diff);
        CK(cudaFuncSetAttribute(phased_mix, cudaFuncAttributeMaxDynamicSharedMemorySize, int(rows * R)));
        CK(cudaMemset(dst, 0, N * R));
        const float us = time_us(
            [&] {
              CK(cudaMemsetAsync(ctr, 0, 4));
              phased_mix<<<sms, 1024, size_t(rows) * R>>>(reinterpret_cast<const int4*>(src), reinterpret_cast<int4*>(dst), N,
                                                          1, R / 16, rows, ctr);
            },
            reps);
        char name[64];
        std::snprintf(name, sizeof name, "flat in grid phases (%d rows a block)", rows);
        report(name, us, copy_bytes, check(dst, ref, N * R));
      }
    }
  }

  // -- fan-out -------------------------------------------------------------------------------
  // Two patterns of destination rows: a random permutation of the N * K rows, and the real
  // expert-major order (uniform top-K routing; each expert's rows in token order).
  {
    uint8_t* fref;
    int* out_row;
    CK(cudaMalloc(&fref, N * K * R));
    CK(cudaMalloc(&out_row, N * K * 4));
    std::vector<int> rand_rows(N * K), expert_rows(N * K);
    for (int64_t i = 0; i < N * K; ++i) rand_rows[i] = int(i);
    std::shuffle(rand_rows.begin(), rand_rows.end(), rng);
    {
      const int E = 256;
      std::vector<int> e_of(N * K), cnt(E, 0), start(E + 1, 0);
      std::vector<int> ids(E);
      for (int e = 0; e < E; ++e) ids[e] = e;
      for (int64_t t = 0; t < N; ++t) {
        std::shuffle(ids.begin(), ids.end(), rng);  // K distinct experts
        for (int k = 0; k < K; ++k) ++cnt[e_of[t * K + k] = ids[k]];
      }
      for (int e = 0; e < E; ++e) start[e + 1] = start[e] + cnt[e];
      for (int64_t i = 0; i < N * K; ++i) expert_rows[i] = start[e_of[i]]++;
    }
    const double fan_bytes = double(N) * R * (K + 1);  // each row read once, written K times
    const float same = time_us([&] { CK(cudaMemcpyAsync(fref, ybig, int64_t(fan_bytes / 2), cudaMemcpyDeviceToDevice)); }, reps);
    const float ms = time_us([&] { CK(cudaMemsetAsync(fref, 1, N * K * R)); }, reps);
    // The phased fan-out as the kernels run it, into the rows out_row names (set per pattern).
    // rows_cap: fewer rows a block than fit (the kernels' 15 beside their plan tables: three
    // rounds of 4096 rows on 132 SMs where 16 make two)
    auto fan_phased = [&](auto kernel, const char* how, int rows_cap = 32, Io io = Io::kBoth) {
      const int rows = int(std::min<int64_t>(rows_cap, (optin - 1024 - 32 * 8) / R));
      const size_t smem = size_t(rows) * R + 32 * 8;
      unsigned* ctr = reinterpret_cast<unsigned*>(diff);
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      CK(cudaMemset(ybig, 0, N * K * R));
      const float us = time_us(
          [&] {
            CK(cudaMemsetAsync(ctr, 0, 4));
            kernel<<<sms, rows * 32, smem>>>(src, ybig, out_row, N, int(K), R, rows, ctr);
          },
          reps);
      char name[64];
      std::snprintf(name, sizeof name, "bulk rows in %s phases (%d rows)", how, rows);
      if (io == Io::kBoth) report(name, us, fan_bytes, check(ybig, fref, N * K * R));
      else report(name, us, io == Io::kStores ? double(N) * K * R : double(N) * R, 0);  // nothing to check
    };
    {  // the block phases' stores alone, token t's rows being t * K + [0, K): each warp's 8 rows
       // in one run, a block's 16 tokens' rows in one (against the scattered rows below)
      std::vector<int> seq_rows(N * K);
      for (int64_t i = 0; i < N * K; ++i) seq_rows[i] = int(i);
      CK(cudaMemcpy(out_row, seq_rows.data(), N * K * 4, cudaMemcpyHostToDevice));
      std::printf("-- fan-out's stores to sequential rows (token t: rows t * %d + [0, %d))\n", K, K);
      fan_phased(phased_fan<false, Claims::kEven, Io::kStores>, "block, stores only,", 32, Io::kStores);
    }
    for (int pat = 0; pat < 2; ++pat) {
      const bool random = pat == 0;
      CK(cudaMemcpy(out_row, (random ? rand_rows : expert_rows).data(), N * K * 4, cudaMemcpyHostToDevice));
      std::printf("-- fan-out to %s, each row to %d rows (expert-major dispatch; %.0f MB read + written)\n",
                  random ? "random rows" : "expert-major order", K, fan_bytes / 1e6);
      report("cudaMemcpy of the same bytes", same, fan_bytes, 0);
      report("cudaMemset of the written rows", ms, double(N) * K * R, 0);
      if (random) {  // write-only, no rows: once is enough
        for (int bps : {2, 4}) {
          const float us = time_us([&] { store_only<4><<<sms * bps, 512>>>(reinterpret_cast<int4*>(ybig), N * K * R / 16); }, reps);
          char name[64];
          std::snprintf(name, sizeof name, "SM stores of the written rows (%dx512)", bps);
          report(name, us, double(N) * K * R, 0);
        }
        auto bulk = [&](auto kernel, int depth) {
          const uint32_t slot = uint32_t(R / 4);
          const int warps = int(std::min<int64_t>(32, (optin - 1024) / slot));
          CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(warps * slot)));
          const float us =
              time_us([&] { kernel<<<sms, warps * 32, size_t(warps) * slot>>>(ybig, N * K * R, slot); }, reps);
          char name[64];
          std::snprintf(name, sizeof name, "bulk stores %u B, %d pending (%d warps)", slot, depth, warps);
          report(name, us, double(N) * K * R, 0);
        };
        bulk(bulk_store_only<1>, 1);
        bulk(bulk_store_only<4>, 4);
        bulk(bulk_store_only<8>, 8);
        for (int bps : {2, 4}) {
          const float us = time_us(
              [&] { read_write_mix<4><<<sms * bps, 512>>>(reinterpret_cast<const int4*>(src), reinterpret_cast<int4*>(ybig),
                                                          N * R / 16, int(K), reinterpret_cast<int*>(diff)); }, reps);
          char name[64];
          std::snprintf(name, sizeof name, "reads + 8x writes, independent (%dx512)", bps);
          report(name, us, fan_bytes, 0);
        }
        {
          const int rows = int((optin - 1024) / R);
          unsigned* ctr = reinterpret_cast<unsigned*>(diff);
          CK(cudaFuncSetAttribute(phased_mix, cudaFuncAttributeMaxDynamicSharedMemorySize, int(rows * R)));
          const float us = time_us(
              [&] {
                CK(cudaMemsetAsync(ctr, 0, 4));
                phased_mix<<<sms, 1024, size_t(rows) * R>>>(reinterpret_cast<const int4*>(src), reinterpret_cast<int4*>(ybig),
                                                            N, int(K), R / 16, rows, ctr);
              },
              reps);
          char name[64];
          std::snprintf(name, sizeof name, "reads, then 8x writes, grid phases (%d rows)", rows);
          report(name, us, fan_bytes, 0);
        }
      }
      auto fan_mover = [&](uint32_t slot, bool is_ref, int depth = 2) {
        const int64_t per = WarpMoverSmem::per_warp_bytes(slot, depth);
        const int warps = int(std::min<int64_t>(16, (optin - 1024) / per));
        const size_t smem = size_t(warps * per);
        CK(cudaFuncSetAttribute(mover_move<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        uint8_t* o = is_ref ? fref : ybig;
        CK(cudaMemset(o, 0, N * K * R));
        const float us =
            time_us([&] { mover_move<true><<<sms, warps * 32, smem>>>(src, o, out_row, N, K, R, slot, warps, depth); },
                    reps);
        char name[64];
        std::snprintf(name, sizeof name, "mover slot %u depth %d (%d warps)%s", slot, depth, warps,
                      slot == R / 4 && depth == 2 ? " [current]" : "");
        report(name, us, fan_bytes, is_ref ? 0 : check(ybig, fref, N * K * R));
      };
      auto fan_ring = [&](auto S_, auto hint_, uint32_t slot, int blocks_per_sm) {
        constexpr int S = decltype(S_)::value;
        constexpr bool hint = decltype(hint_)::value;
        const int64_t per = ring_warp_bytes<S>(slot);
        const int warps = int(std::min<int64_t>(32, (optin - 1024) / blocks_per_sm / per));
        if (warps < 1) return;
        const size_t smem = size_t(warps * per);
        CK(cudaFuncSetAttribute(ring_move<S, true, hint>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        CK(cudaMemset(ybig, 0, N * K * R));
        const float us = time_us(
            [&] {
              ring_move<S, true, hint><<<sms * blocks_per_sm, warps * 32, smem>>>(src, ybig, out_row, N, K, R, slot, warps);
            },
            reps);
        char name[64];
        std::snprintf(name, sizeof name, "ring S=%d slot %u%s (%dx%d warps)", S, slot, hint ? " evict-first" : "",
                      blocks_per_sm, warps);
        report(name, us, fan_bytes, check(ybig, fref, N * K * R));
      };
      auto fan_warp = [&](auto f, const char* name, int threads, int blocks_per_sm) {
        CK(cudaMemset(ybig, 0, N * K * R));
        const float us = time_us([&] { f<<<sms * blocks_per_sm, threads>>>(reinterpret_cast<const int4*>(src),
                                                                           reinterpret_cast<int4*>(ybig), out_row, N, K, nv); },
                                 reps);
        char full[64];
        std::snprintf(full, sizeof full, "%s (%dx%d)", name, blocks_per_sm, threads);
        report(full, us, fan_bytes, check(ybig, fref, N * K * R));
      };
      using no = std::false_type;
      using yes = std::true_type;
      fan_mover(uint32_t(R), true);
      fan_mover(uint32_t(R / 4), false);
      fan_mover(uint32_t(R / 4), false, 4);
      fan_mover(uint32_t(R / 8), false, 8);
      fan_ring(std::integral_constant<int, 8>{}, no{}, uint32_t(R / 4), 1);
      fan_ring(std::integral_constant<int, 8>{}, yes{}, uint32_t(R / 4), 1);
      fan_warp(warprow_fanout<7, 0>, "warprow U=7 st", 256, 4);
      fan_phased(phased_fan<true>, "grid");
      fan_phased(phased_fan<false>, "block");
      fan_phased(phased_fan<false>, "block", 15);
      fan_phased(phased_fan<false, Claims::kClaimed>, "claimed block");
      fan_phased(phased_fan<false, Claims::kGuided>, "guided block");
      // Session 50: the same block phases with a warp's stores at most 1, 2 or 4 in flight,
      // then split into their stores alone and their loads alone.
      fan_phased(phased_fan<false, Claims::kEven, Io::kBoth, 1>, "block, 1 store pending,");
      fan_phased(phased_fan<false, Claims::kEven, Io::kBoth, 2>, "block, 2 stores pending,");
      fan_phased(phased_fan<false, Claims::kEven, Io::kBoth, 4>, "block, 4 stores pending,");
      fan_phased(phased_fan<false, Claims::kEven, Io::kStores, 1>, "block, stores only, 1 pending,", 32, Io::kStores);
      fan_phased(phased_fan<false, Claims::kEven, Io::kStores, 2>, "block, stores only, 2 pending,", 32, Io::kStores);
      fan_phased(phased_fan<false, Claims::kEven, Io::kStores>, "block, stores only,", 32, Io::kStores);
      fan_phased(phased_fan<false, Claims::kClaimed, Io::kStores>, "claimed block, stores only,", 32, Io::kStores);
      fan_phased(phased_fan<false, Claims::kEven, Io::kLoads>, "block, loads only,", 32, Io::kLoads);
      if (!random) continue;
      fan_mover(uint32_t(R / 2), false);
      fan_ring(std::integral_constant<int, 2>{}, no{}, uint32_t(R), 1);
      fan_ring(std::integral_constant<int, 4>{}, no{}, uint32_t(R / 2), 1);
      fan_ring(std::integral_constant<int, 4>{}, no{}, uint32_t(R / 4), 2);
      fan_warp(warprow_fanout<4, 0>, "warprow U=4 st", 512, 4);
      fan_warp(warprow_fanout<4, 1>, "warprow U=4 st.na", 512, 4);
      fan_warp(warprow_fanout<7, 1>, "warprow U=7 st.na", 256, 4);
      fan_warp(warprow_fanout<4, 2>, "warprow U=4 st.cs", 512, 4);
      fan_warp(warprow_fanout<7, 2>, "warprow U=7 st.cs", 256, 4);
    }
    // the reduce section below reads ybig as its expert-major source
    fill<<<1024, 256>>>(reinterpret_cast<uint16_t*>(ybig), N * K * R / 2, 2u);
    CK(cudaFree(fref));
    CK(cudaFree(out_row));
  }

  // -- reduce -------------------------------------------------------------------------------
  int32_t* selfmap;
  bool* in_rank;
  int64_t* topk_idx;
  float* topk_w;
  uint8_t* out_ref;
  CK(cudaMalloc(&selfmap, N * K * 4));
  CK(cudaMalloc(&in_rank, N));
  CK(cudaMalloc(&topk_idx, N * K * 8));
  CK(cudaMalloc(&topk_w, N * K * 4));
  CK(cudaMalloc(&out_ref, N * R));
  CK(cudaMemset(in_rank, 1, N));
  std::vector<int32_t> sm(N * K);
  std::vector<int64_t> ti(N * K);
  std::vector<float> tw(N * K);
  std::vector<int> rows(N * K);
  for (int64_t i = 0; i < N * K; ++i) rows[i] = int(i);
  std::shuffle(rows.begin(), rows.end(), rng);
  std::uniform_real_distribution<float> uw(0.f, 1.f);
  for (int64_t t = 0; t < N; ++t)
    for (int k = 0; k < K; ++k) {
      ti[t * K + k] = (t * 37 + k * 31) % 256;
      tw[t * K + k] = uw(rng);
    }
  for (int em = 0; em < 2; ++em) {
    for (int64_t t = 0; t < N; ++t)
      for (int k = 0; k < K; ++k) sm[t * K + k] = em ? rows[t * K + k] : (k == 0 ? int(t) : -1);
    CK(cudaMemcpy(selfmap, sm.data(), N * K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(topk_idx, ti.data(), N * K * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(topk_w, tw.data(), N * K * 4, cudaMemcpyHostToDevice));
    CombineSources cs{em ? ybig : src, nullptr, selfmap, nullptr, nullptr, in_rank, topk_idx, topk_w,
                      N, R, 1, K, K, 256, 0, bool(em)};
    const double bytes = double(N) * R * (em ? K + 1 : 2);
    std::printf("-- reduce, %s (%d slot%s per token)\n", em ? "expert-major" : "rank-major", em ? K : 1, em ? "s" : "");
    auto red = [&](auto kern, const char* name, int NT, int blocks_per_sm, bool is_ref) {
      const int blocks = int(std::min<int64_t>(N, int64_t(sms) * blocks_per_sm));
      uint8_t* o = is_ref ? out_ref : dst;
      CK(cudaMemset(o, 0, N * R));
      const float us = time_us([&] { kern<<<blocks, NT>>>(cs, reinterpret_cast<__nv_bfloat16*>(o), nullptr); }, reps);
      char full[64];
      std::snprintf(full, sizeof full, "%s (%dx%d)", name, blocks_per_sm, NT);
      report(full, us, bytes, is_ref ? 0 : check(dst, out_ref, N * R));
    };
    red(reduce_kernel<2, 128>, "reduce U=2 NT=128 [current]", 128, 16, true);
    red(reduce_kernel<4, 128>, "reduce U=4 NT=128", 128, 16, false);
    red(reduce_kernel<7, 128>, "reduce U=7 NT=128", 128, 16, false);
    red(reduce_kernel<2, 256>, "reduce U=2 NT=256", 256, 8, false);
    red(reduce_kernel<4, 256>, "reduce U=4 NT=256", 256, 8, false);
    red(reduce_kernel<2, 128>, "reduce U=2 NT=128", 128, 32, false);
    red(reduce_kernel<4, 64>, "reduce U=4 NT=64", 64, 32, false);
    red(reduce_kernel<7, 64>, "reduce U=7 NT=64", 64, 32, false);
    red(reduce_kernel<14, 64>, "reduce U=14 NT=64", 64, 32, false);
  }
  std::printf("done\n");
  return 0;
}
