// Routing layout of one rank's topk_idx: tokens per rank, pairs per expert, is_token_in_rank,
// and each pair's position among the pairs of its column (the order receivers use: by
// token). With the exchanged counts these positions give every row's destination, for push
// (senders) and pull (receivers) alike.
//
// Columns: c < W are ranks (a token counts once per rank: at its first slot owned by that
// rank), c = W + e are experts. The tokens are split into one chunk per block so that every
// block works at once (one block walking all T*K pairs took ~100 us). route_chunk numbers a
// chunk's pairs inside the chunk (each warp its own run of tokens, 32 pairs a step; then the
// warps' counts are scanned per column), waits for the counts of the chunks before it and
// publishes the positions after theirs: kernels/route.cuh's route_ticketed, in one launch, for
// the CUDA protocols' route_kernel and the NVSHMEM plan_kernel. get_dispatch_layout counts
// only (route_count_chunk).
// __match_any_sync ranks equal columns inside a step. Because an expert (and, by the
// first-slot rule, a rank) occurs at most once per token, rank by p = t * K + k equals rank by t.
#pragma once
#include <cstdint>

#include "ptx.cuh"

namespace symmoe {

// Expert ids checked where they are read, so a dispatch needs no host round trip for them:
// the first bad pair found records (kind, token, slot, value) for the host and raises a flag
// that the routing's last block publishes to every peer (tokens = -1 in its counts row).
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
  // Block b's tokens [first, last): contiguous chunks, one a block, the same split in both passes.
  __device__ __forceinline__ int chunk_begin(int b) const {
    const int n = int(gridDim.x);
    const int per = (T + n - 1) / n;
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

// The walk goes warp by warp: warp w takes a contiguous run of the chunk's tokens and
// walks their pairs 32 at a time. One pair of such a step: its token and slot, its expert and
// rank columns (-1: none) and its rank among the warp's pairs of each column.
struct PairPlace {
  int t = 0, k = 0, ce = -1, cr = -1, le = 0, lr = 0;
};

// The pairs [p0, p1) of chunk b that warp `warp` of `nw` places.
template <typename Idx>
__device__ __forceinline__ void warp_pairs(const RoutingArgs<Idx>& a, int b, int warp, int nw, int64_t& p0,
                                           int64_t& p1) {
  const int c0 = a.chunk_begin(b), c1 = a.chunk_begin(b + 1);
  const int per_warp = (c1 - c0 + nw - 1) / nw;
  const int64_t t0 = min(c1, c0 + warp * per_warp), t1 = min(int64_t(c1), t0 + per_warp);
  p0 = t0 * a.K;
  p1 = t1 * a.K;
}

// A pair's columns. kCount: the routing's first look at the pair, which also publishes its
// int32 id and weight, checks it (a bad pair is reported and is no pair here) and marks
// is_token_in_rank (the chunk's entries were cleared: in_rank_clear); otherwise out-of-range
// ids are no pair (the first look reported them; nothing reads their positions). Every load
// comes before the first store: a store may alias what a later load reads, which kept the
// compiler from issuing the weight's load beside the id's.
template <bool kCount, typename Idx>
__device__ __forceinline__ void pair_columns(const RoutingArgs<Idx>& a, int64_t p, PairPlace& q) {
  const int L = a.E / a.W;
  q.t = int(p / a.K);
  q.k = int(p % a.K);
  const Idx v = a.idx[p];
  const Idx* row = a.idx + int64_t(q.t) * a.K;
  float w = 0.f;
  int64_t kind = 0;
  if constexpr (kCount) {
    if (a.pub_idx) w = a.w[p];
    if (a.bad.flag) {
      kind = (v < -1 || v >= a.E) ? kBadRange : 0;
      for (int kk = 0; kk < q.k && kind == 0 && v >= 0; ++kk)
        if (row[kk] == v) kind = kBadDuplicate;
    }
  }
  if (kind == 0 && v >= 0 && v < a.E) {
    const int e = static_cast<int>(v), o = e / L;
    q.ce = a.W + e;
    q.cr = first_slot_of_owner(row, q.k, o, L) ? o : -1;
  }
  if constexpr (kCount) {
    if (a.pub_idx) {
      a.publish(a.pub_idx + p, static_cast<int32_t>(v));
      a.publish(a.pub_w + p, w);
    }
    if (a.in_rank && q.cr >= 0) a.in_rank[int64_t(q.t) * a.W + q.cr] = true;
    if (kind && atomicCAS(a.bad.flag, 0, 1) == 0) {
      a.bad.info[0] = kind;
      a.bad.info[1] = q.t;
      a.bad.info[2] = q.k;
      a.bad.info[3] = int64_t(v);
    }
  }
}

// Clears is_token_in_rank for chunk b's tokens (a.in_rank nullptr: none), whole block; the
// first look at the pairs then marks the (token, rank) hits, after a barrier. A token's first
// slot owned by a rank is a hit, so the marks are exactly the pairs' rank columns.
template <typename Idx>
__device__ __forceinline__ void in_rank_clear(const RoutingArgs<Idx>& a, int b) {
  if (a.in_rank == nullptr) return;
  const int64_t t0 = a.chunk_begin(b), t1 = a.chunk_begin(b + 1);
  for (int64_t i = t0 * a.W + int(threadIdx.x); i < t1 * a.W; i += int(blockDim.x)) a.in_rank[i] = false;
}

// Pass 1, whole warp: the pairs [start, start + 32) ∩ [.., p1), one per lane, numbered among
// the warp's pairs of their columns so far; h: the warp's [C] counts, advanced here.
// __match_any_sync ranks equal columns inside the step.
template <bool kCount, typename Idx>
__device__ __forceinline__ PairPlace place_step(const RoutingArgs<Idx>& a, int32_t* h, int64_t start, int64_t p1,
                                                int lane) {
  PairPlace q;
  const int64_t p = start + lane;
  if (p < p1) pair_columns<kCount>(a, p, q);
  const uint32_t me = __match_any_sync(0xffffffffu, q.ce);
  const uint32_t mr = __match_any_sync(0xffffffffu, q.cr);
  const int32_t be = q.ce >= 0 ? h[q.ce] : 0;
  const int32_t br = q.cr >= 0 ? h[q.cr] : 0;
  __syncwarp();
  if (q.ce >= 0 && lane == 31 - __clz(me)) h[q.ce] = be + __popc(me);
  if (q.cr >= 0 && lane == 31 - __clz(mr)) h[q.cr] = br + __popc(mr);
  __syncwarp();
  q.le = be + __popc(me & lanemask_lt());
  q.lr = br + __popc(mr & lanemask_lt());
  return q;
}

// Pass 2: the pair's positions, base[c] (the earlier chunks) + hw[c] (the earlier warps of this
// chunk) + its rank inside the warp, published.
template <typename Idx>
__device__ __forceinline__ void place_final(const RoutingArgs<Idx>& a, const int32_t* base, const int32_t* hw,
                                            const PairPlace& q) {
  const int64_t row = int64_t(q.t) * (a.W + a.K);
  if (q.ce >= 0) a.publish(a.pos + row + a.W + q.k, base[q.ce] + hw[q.ce] + q.le);
  if (q.cr >= 0) a.publish(a.pos + row + q.cr, base[q.cr] + hw[q.cr] + q.lr);
}

// Positions of chunk b's pairs, whole block; hist: [the block's warps][C] scratch (shared, or
// global when C is large). Pass 1 numbers each warp's pairs; then each column's per-warp counts
// become the warps' starts inside the chunk and its chunk total goes to `total` (nullptr: not
// kept); `between()` (whole block) then leaves in base[C] the pairs of each column in the chunks
// before b, or returns false (a wait failed: no position is written); pass 2 publishes the
// positions. The first kKeep steps of a warp stay in registers (at 128 tokens a chunk, top-8,
// 32 warps: one step); later ones park their ranks in `pos`.
// kCount: this is the routing's only look at the ids (route_kernel): it also publishes them,
// checks them and writes is_token_in_rank.
template <bool kCount, typename Idx, typename Between>
__device__ void route_chunk(const RoutingArgs<Idx>& a, const int32_t* base, int32_t* hist, int32_t* total, int b,
                            Between&& between) {
  constexpr int kKeep = 2;
  const int tid = int(threadIdx.x), nt = int(blockDim.x), lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
  const int C = a.columns(), PC = a.W + a.K;
  for (int i = tid; i < nw * C; i += nt) hist[i] = 0;
  if (kCount) in_rank_clear(a, b);
  __syncthreads();
  int64_t p0, p1;
  warp_pairs(a, b, warp, nw, p0, p1);
  int32_t* h = hist + int64_t(warp) * C;
  PairPlace kept[kKeep];
#pragma unroll
  for (int s = 0; s < kKeep; ++s)
    if (p0 + 32 * s < p1) kept[s] = place_step<kCount>(a, h, p0 + 32 * s, p1, lane);
  for (int64_t start = p0 + 32 * kKeep; start < p1; start += 32) {
    const PairPlace q = place_step<kCount>(a, h, start, p1, lane);
    if (q.ce >= 0) a.pos[int64_t(q.t) * PC + a.W + q.k] = q.le;
    if (q.cr >= 0) a.pos[int64_t(q.t) * PC + q.cr] = q.lr;
  }
  __syncthreads();
  for (int c = tid; c < C; c += nt) {
    int32_t run = 0;
    for (int w = 0; w < nw; ++w) {
      const int32_t v = hist[int64_t(w) * C + c];
      hist[int64_t(w) * C + c] = run;
      run += v;
    }
    if (total) total[c] = run;
  }
  __syncthreads();
  if (!between()) return;  // a wait failed: the host raises; no position is written
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kKeep; ++s)
    if (p0 + 32 * s < p1) place_final(a, base, h, kept[s]);
  for (int64_t p = p0 + 32 * kKeep + lane; p < p1; p += 32) {
    PairPlace q;
    pair_columns<false>(a, p, q);
    if (q.ce >= 0) q.le = a.pos[int64_t(q.t) * PC + a.W + q.k];
    if (q.cr >= 0) q.lr = a.pos[int64_t(q.t) * PC + q.cr];
    place_final(a, base, h, q);
  }
  __syncthreads();
}

// The count pass alone (get_dispatch_layout), whole
// block: chunk b -> cnt[C] (zeroed here), with the ids published and checked and
// is_token_in_rank written as route_chunk's first walk does.
template <typename Idx>
__device__ void route_count_chunk(const RoutingArgs<Idx>& a, int32_t* cnt, int b) {
  for (int c = threadIdx.x; c < a.columns(); c += blockDim.x) cnt[c] = 0;
  in_rank_clear(a, b);
  __syncthreads();
  const int t0 = a.chunk_begin(b), t1 = a.chunk_begin(b + 1);
  for (int64_t p = int64_t(t0) * a.K + threadIdx.x; p < int64_t(t1) * a.K; p += blockDim.x) {
    PairPlace q;
    pair_columns<true>(a, p, q);
    if (q.ce >= 0) atomicAdd(&cnt[q.ce], 1);
    if (q.cr >= 0) atomicAdd(&cnt[q.cr], 1);
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
