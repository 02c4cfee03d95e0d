// Routing layout of one rank's topk_idx: tokens per rank, pairs per expert, is_token_in_rank,
// and each pair's position among the pairs of its column (the order receivers use: by
// token). With the exchanged counts these positions give every row's destination, for push
// (senders) and pull (receivers) alike.
//
// Columns: c < W are ranks (a token counts once per rank: at its first slot owned by that
// rank), c = W + e are experts. The tokens are split into one chunk per block, in two passes
// so that every block works at once (one block walking all T*K pairs took ~100 us; the CUDA
// protocols run both in one launch, kernels/dispatch.cuh's route_kernel):
//   count  (route_count_chunk)  each block counts its chunk's columns -> part[b][C];
//   place  (route_place_chunk)  each block starts from the columns' counts in the chunks
//                               before it and numbers its own pairs in token order.
// Inside a chunk, pairs are walked flattened, p = t * K + k, 32 per warp step;
// __match_any_sync ranks equal columns inside a step. Because an expert (and, by the
// first-slot rule, a rank) occurs at most once per token, rank by p equals rank by t.
#pragma once
#include <cstdint>

#include "ptx.cuh"

namespace symmoe {

// Expert ids checked where they are read, so a dispatch needs no host round trip for them:
// the first bad pair found records (kind, token, slot, value) for the host and raises a flag
// that the place pass publishes to every peer (tokens = -1 in its counts row).
constexpr int64_t kBadRange = 1, kBadDuplicate = 2;
struct BadInput {
  int32_t* flag;  // device, zero between dispatches
  int64_t* info;  // host-mapped [4]: kind, token, slot, value
};

template <typename Idx>
struct RoutingArgs {
  const Idx* idx;        // [T, K]
  const float* w;        // [T, K] (published when pub_w != nullptr)
  int T, K, W, E;
  int32_t* pos;          // [T][W + K] positions (nullptr: counts only)
  bool* in_rank;         // [T][W], every entry written (nullptr: skip)
  int32_t* pub_idx;      // [T, K] int32 copy (nullptr: skip)
  float* pub_w;          // [T, K] copy (nullptr: skip)
  BadInput bad;          // id checks (bad.flag == nullptr: the host checked them)
  // A copy of everything published (ids, weights, positions) at the same byte offsets from
  // `mirror` as from `pub_base`: the dispatch's handle keeps it for a cached dispatch, and
  // writing it here saves a copy launch (nullptr: no copy).
  uint8_t* mirror = nullptr;
  const uint8_t* pub_base = nullptr;

  template <typename T>
  __device__ __forceinline__ void publish(T* at, T v) const {
    *at = v;
    if (mirror) *reinterpret_cast<T*>(mirror + (reinterpret_cast<const uint8_t*>(at) - pub_base)) = v;
  }

  __device__ __forceinline__ int columns() const { return W + E; }
  // Block b's tokens [first, last): contiguous chunks, the same split in both passes.
  __device__ __forceinline__ int chunk_begin(int b) const {
    const int per = (T + int(gridDim.x) - 1) / int(gridDim.x);
    return min(T, b * per);
  }
};

template <typename Idx>
__device__ __forceinline__ bool first_slot_of_owner(const Idx* row, int k, int owner, int L) {
  for (int kk = 0; kk < k; ++kk) {
    const int e2 = static_cast<int>(row[kk]);
    if (e2 >= 0 && e2 / L == owner) return false;
  }
  return true;
}

// Pass 1, whole block: chunk b -> cnt[C] (shared, zeroed here); publishes the int32 ids /
// weights and writes is_token_in_rank for the chunk.
template <typename Idx>
__device__ void route_count_chunk(const RoutingArgs<Idx>& a, int32_t* cnt, int b) {
  const int C = a.columns(), L = a.E / a.W;
  for (int c = threadIdx.x; c < C; c += blockDim.x) cnt[c] = 0;
  __syncthreads();
  const int t0 = a.chunk_begin(b), t1 = a.chunk_begin(b + 1);
  for (int64_t p = int64_t(t0) * a.K + threadIdx.x; p < int64_t(t1) * a.K; p += blockDim.x) {
    const int t = int(p / a.K), k = int(p % a.K);
    const Idx v = a.idx[p];
    const int e = static_cast<int>(v);
    if (a.pub_idx) {
      a.publish(a.pub_idx + p, e);
      a.publish(a.pub_w + p, a.w[p]);
    }
    if (a.bad.flag) {
      int64_t kind = (v < -1 || v >= a.E) ? kBadRange : 0;
      for (int kk = 0; kk < k && kind == 0 && v >= 0; ++kk)
        if (a.idx[int64_t(t) * a.K + kk] == v) kind = kBadDuplicate;
      if (kind) {
        if (atomicCAS(a.bad.flag, 0, 1) == 0) {
          a.bad.info[0] = kind;
          a.bad.info[1] = t;
          a.bad.info[2] = k;
          a.bad.info[3] = int64_t(v);
        }
        continue;  // never index the tables with it
      }
    }
    if (e < 0) continue;
    atomicAdd(&cnt[a.W + e], 1);
    const int o = e / L;
    if (first_slot_of_owner(a.idx + int64_t(t) * a.K, k, o, L)) atomicAdd(&cnt[o], 1);
  }
  if (a.in_rank) {
    for (int64_t i = int64_t(t0) * a.W + threadIdx.x; i < int64_t(t1) * a.W; i += blockDim.x) {
      const int t = int(i / a.W), o = int(i % a.W);
      bool hit = false;
      for (int k = 0; k < a.K; ++k) {
        const int e = static_cast<int>(a.idx[int64_t(t) * a.K + k]);
        hit = hit || (e >= 0 && e / L == o);
      }
      a.in_rank[i] = hit;
    }
  }
  __syncthreads();
}

// Pass 2, whole block: positions of chunk b's pairs. base[C]: pairs of each column in the
// chunks before it. hist: [nwarps][C] scratch (shared, or global when C is large). Ids out of
// range are no pair here (the count pass reported them; nothing will read these positions).
template <typename Idx>
__device__ void route_place_chunk(const RoutingArgs<Idx>& a, const int32_t* base, int32_t* hist, int b) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const int C = a.columns(), L = a.E / a.W, PC = a.W + a.K;
  for (int i = tid; i < nw * C; i += blockDim.x) hist[i] = 0;
  __syncthreads();

  const int c0 = a.chunk_begin(b), c1 = a.chunk_begin(b + 1);
  const int per_warp = (c1 - c0 + nw - 1) / nw;
  const int64_t t0 = min(c1, c0 + warp * per_warp), t1 = min(int64_t(c1), t0 + per_warp);
  const int64_t p0 = t0 * a.K, p1 = t1 * a.K;
  int32_t* h = hist + int64_t(warp) * C;

  // Positions inside this warp's tokens; per-warp column counts.
  for (int64_t start = p0; start < p1; start += 32) {
    const int64_t p = start + lane;
    const bool valid = p < p1;
    const int t = valid ? int(p / a.K) : 0, k = valid ? int(p % a.K) : 0;
    int e = valid ? static_cast<int>(a.idx[p]) : -1;
    if (e >= a.E) e = -1;
    const int o = e >= 0 ? e / L : -1;
    const bool first = o >= 0 && first_slot_of_owner(a.idx + int64_t(t) * a.K, k, o, L);
    const int ce = e >= 0 ? a.W + e : -1;
    const int cr = first ? o : -1;
    const uint32_t me = __match_any_sync(0xffffffffu, ce);
    const uint32_t mr = __match_any_sync(0xffffffffu, cr);
    const int32_t be = ce >= 0 ? h[ce] : 0;
    const int32_t br = cr >= 0 ? h[cr] : 0;
    __syncwarp();
    if (ce >= 0 && lane == 31 - __clz(me)) h[ce] = be + __popc(me);
    if (cr >= 0 && lane == 31 - __clz(mr)) h[cr] = br + __popc(mr);
    __syncwarp();
    if (ce >= 0) a.pos[int64_t(t) * PC + a.W + k] = be + __popc(me & lanemask_lt());
    if (cr >= 0) a.pos[int64_t(t) * PC + o] = br + __popc(mr & lanemask_lt());
  }
  __syncthreads();

  // Each warp's start in each column: the earlier chunks, then the earlier warps.
  for (int c = tid; c < C; c += blockDim.x) {
    int32_t run = base[c];
    for (int w = 0; w < nw; ++w) {
      const int32_t v = hist[int64_t(w) * C + c];
      hist[int64_t(w) * C + c] = run;
      run += v;
    }
  }
  __syncthreads();

  for (int64_t start = p0; start < p1; start += 32) {
    const int64_t p = start + lane;
    if (p >= p1) continue;
    const int t = int(p / a.K), k = int(p % a.K);
    const int e = static_cast<int>(a.idx[p]);
    if (e < 0 || e >= a.E) continue;
    const int o = e / L;
    int32_t* pe = a.pos + int64_t(t) * PC + a.W + k;
    a.publish(pe, *pe + h[a.W + e]);
    if (first_slot_of_owner(a.idx + int64_t(t) * a.K, k, o, L)) {
      int32_t* pr = a.pos + int64_t(t) * PC + o;
      a.publish(pr, *pr + h[o]);
    }
  }
  __syncthreads();
}

// One token's routing as a sender reads it: lane k < K its expert id and weight, lane c < PC
// its position in column c (ranks, then slots). The three loads go out together and one
// token ahead of the copies, so a copy is never issued behind a metadata round trip.
struct TokenRoute {
  int e;
  float w;
  int pos;

  __device__ __forceinline__ static TokenRoute load(const int32_t* idx, const float* wt, const int32_t* pos, int64_t t,
                                                    int K, int PC, int lane, bool in) {
    TokenRoute r{-1, 0.f, 0};
    if (in) {
      if (lane < K) {
        r.e = idx[t * K + lane];
        r.w = wt[t * K + lane];
      }
      if (lane < PC) r.pos = pos[t * PC + lane];
    }
    return r;
  }
  // Column c's position (c per lane or uniform; every lane calls). Columns past the warp's
  // 32 lanes (world + topk > 32) are read from memory.
  __device__ __forceinline__ int pos_of(const int32_t* pos_table, int64_t t, int PC, int c) const {
    const int v = __shfl_sync(0xffffffffu, pos, c & 31);
    return c < 32 ? v : (c < PC ? pos_table[t * PC + c] : 0);
  }
};

}  // namespace symmoe
