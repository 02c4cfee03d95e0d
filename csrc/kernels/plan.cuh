// Row offsets every rank derives identically from the exchanged counts matrix
// counts[s][1 + W + E] = (tokens of s, tokens s sends each rank, pairs s sends each expert).
// Each block recomputes its tables in shared memory (cheaper than another launch).
#pragma once
#include <cstdint>

#include "../common/layout.cuh"
#include "../common/scan.cuh"

namespace symmoe {

__device__ __forceinline__ int32_t count_at(const int32_t* counts, const Layout& L, int s, int64_t col) {
  return counts[int64_t(s) * L.counts_cols() + col];
}

// A rank whose expert ids failed the routing checks publishes tokens = -1: then nobody moves
// data (every rank still runs its barriers, so the buffer stays usable) and every host raises.
// More tokens than max_tokens never come from a validated call; refusing them keeps every
// receive pool (one row per source token, W * max_tokens at most) in bounds on the device too.
__device__ __forceinline__ bool counts_valid(const int32_t* counts, const Layout& L) {
  for (int s = 0; s < int(L.world_size); ++s)
    if (count_at(counts, L, s, 0) < 0 || count_at(counts, L, s, 0) > L.max_tokens) return false;
  return true;
}

// One receiver's view. Shared arrays sized by plan_bytes().
struct RecvPlan {
  int64_t* tstart;  // [W + 1] token prefix over sources
  int64_t* rbase;   // [W + 1] rank-major: first row of each source (rbase[W] = rows)
  int64_t* tmax;    // [1] the most tokens any source has
  int64_t* goff;    // [L + 1] expert-major: padded group starts (goff[L] = rows)
  // Only the build and fill_padding read these two; they come last, so that the phased
  // fan-out's rows may start over them (kept_bytes).
  int64_t* tmp;     // scan scratch [33]
  int32_t* gcnt;    // [L] unpadded rows per local expert

  static __host__ __device__ int64_t bytes(int W, int L) {
    return 8 * (int64_t(W + 1) * 2 + (L + 1) + 34) + 4 * int64_t(L) + 16;
  }
  // The leading bytes read after fill_padding (tstart, rbase, tmax, goff).
  static __host__ __device__ int64_t kept_bytes(int W, int L) { return 8 * (int64_t(W + 1) * 2 + 1 + (L + 1)); }

  __device__ void carve(uint8_t* p, int W, int L) {
    tstart = reinterpret_cast<int64_t*>(p);
    rbase = tstart + W + 1;
    tmax = rbase + W + 1;
    goff = tmax + 1;
    tmp = goff + L + 1;
    gcnt = reinterpret_cast<int32_t*>(tmp + 33);
  }

  // Whole block. Returns the rows this receiver gets in `layout` (expert_major or not).
  __device__ int64_t build(const int32_t* counts, const Layout& L, int r, bool expert_major, int alignment) {
    const int W = int(L.world_size), Le = int(L.local_experts());
    // Up to 32 sources, warp 0 scans the sources' tokens and rows in registers: one barrier in
    // place of two block scans (six barriers and a serial loop), which push's rank-major plan
    // never had (pull's tables took 2.8 µs against push's 1.3 before).
    const bool warp_scan = W <= 32;
    if (warp_scan) {
      if (threadIdx.x < 32) {
        const int s = int(threadIdx.x);
        const int64_t tk = s < W ? count_at(counts, L, s, 0) : 0, rw = s < W ? count_at(counts, L, s, 1 + r) : 0;
        int64_t ti = tk, ri = rw, m = max(tk, int64_t(0));  // inclusive sums, the most tokens
        for (int d = 1; d < 32; d <<= 1) {
          const int64_t a = __shfl_up_sync(0xffffffffu, ti, d), b = __shfl_up_sync(0xffffffffu, ri, d);
          if (s >= d) ti += a, ri += b;
          m = max(m, __shfl_xor_sync(0xffffffffu, m, d));
        }
        if (s < W) {
          tstart[s] = ti - tk;
          rbase[s] = ri - rw;
        }
        if (s == W - 1) {
          tstart[W] = ti;
          rbase[W] = ri;
          *tmax = m;
        }
      }
    } else {
      for (int s = threadIdx.x; s < W; s += blockDim.x) {
        tstart[s] = count_at(counts, L, s, 0);
        rbase[s] = count_at(counts, L, s, 1 + r);
      }
    }
    // The expert groups (gcnt, goff) only exist in the expert-major layout.
    for (int j = threadIdx.x; expert_major && j < Le; j += blockDim.x) {
      int32_t c = 0;
      for (int s = 0; s < W; ++s) c += count_at(counts, L, s, 1 + W + int64_t(r) * Le + j);
      gcnt[j] = c;
      goff[j] = (int64_t(c) + alignment - 1) / alignment * alignment;
    }
    __syncthreads();
    if (!warp_scan) {
      tstart[W] = 0;  // scanned below; the last slot receives the total
      const int64_t tokens = block_exclusive_scan(tstart, W, tmp);
      const int64_t rows_r = block_exclusive_scan(rbase, W, tmp);
      if (threadIdx.x == 0) {
        tstart[W] = tokens;
        rbase[W] = rows_r;
        int64_t m = 0;
        for (int s = 0; s < W; ++s) m = max(m, tstart[s + 1] - tstart[s]);
        *tmax = m;
      }
    }
    const int64_t rows_e = expert_major ? block_exclusive_scan(goff, Le, tmp) : 0;
    if (expert_major && threadIdx.x == 0) goff[Le] = rows_e;
    if (!warp_scan || expert_major) __syncthreads();  // else the one above published warp 0's sums
    return expert_major ? rows_e : rbase[W];
  }

  // First row of source s inside local expert j's group.
  __device__ __forceinline__ int64_t src_offset(const int32_t* counts, const Layout& L, int r, int s, int j) const {
    const int W = int(L.world_size), Le = int(L.local_experts());
    int64_t off = goff[j];
    for (int q = 0; q < s; ++q) off += count_at(counts, L, q, 1 + W + int64_t(r) * Le + j);
    return off;
  }

  // A puller visits the sources' tokens round-robin: visit v is token v / W of source v % W
  // (false: that source has fewer tokens). In source order the whole grid read one source at a
  // time, so the local copy ran before or after the link's share instead of under it (W=2
  // cached expert-major pull: 270 µs against push's 237).
  __device__ __forceinline__ int64_t visits(int W) const { return *tmax * W; }
  __device__ __forceinline__ bool visit(int64_t v, int W, int& s, int64_t& t) const {
    s = int(v % W);
    t = v / W;
    return t < tstart[s + 1] - tstart[s];
  }
};

// One sender's view of every receiver (push).
struct SendPlan {
  int64_t* rbase;   // [W]: first row of this sender in each receiver (rank-major)
  int64_t* rows;    // [W]: rows each receiver gets in the chosen layout
  int64_t* goff;    // [W][L + 1]: each receiver's padded group starts (expert-major)
  int64_t* tmp;     // [33]

  static __host__ __device__ int64_t bytes(int W, int L) {
    return 8 * (int64_t(W) * 2 + int64_t(W) * (L + 1) + 33) + 16;
  }

  __device__ void carve(uint8_t* p, int W, int L) {
    rbase = reinterpret_cast<int64_t*>(p);
    rows = rbase + W;
    goff = rows + W;
    tmp = goff + int64_t(W) * (L + 1);
  }

  __device__ void build(const int32_t* counts, const Layout& L, int me, bool expert_major, int alignment) {
    const int W = int(L.world_size), Le = int(L.local_experts());
    for (int o = threadIdx.x; o < W; o += blockDim.x) {
      int64_t b = 0, n = 0;
      for (int s = 0; s < W; ++s) {
        const int32_t c = count_at(counts, L, s, 1 + o);
        if (s < me) b += c;
        n += c;
      }
      rbase[o] = b;
      rows[o] = n;
    }
    if (expert_major) {
      for (int o = 0; o < W; ++o) {
        int64_t* g = goff + int64_t(o) * (Le + 1);
        for (int j = threadIdx.x; j < Le; j += blockDim.x) {
          int64_t c = 0;
          for (int s = 0; s < W; ++s) c += count_at(counts, L, s, 1 + W + int64_t(o) * Le + j);
          g[j] = (c + alignment - 1) / alignment * alignment;
        }
        __syncthreads();
        const int64_t total = block_exclusive_scan(g, Le, tmp);
        if (threadIdx.x == 0) {
          g[Le] = total;
          rows[o] = total;
        }
        __syncthreads();
      }
    }
    __syncthreads();
  }
};

}  // namespace symmoe
