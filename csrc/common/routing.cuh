// Routing layout of one rank's topk_idx, computed by one block: tokens per rank, pairs per
// expert, is_token_in_rank, and each pair's position among the pairs of its column (the
// order receivers use: by token). With the exchanged counts these positions give every row's
// destination, for push (senders) and pull (receivers) alike.
//
// Columns: c < W are ranks (a token counts once per rank: at its first slot owned by that
// rank), c = W + e are experts. Pairs (t, k) are walked flattened, p = t * K + k, in chunks
// of 32 per warp; __match_any_sync ranks equal columns inside a chunk. Because an expert (and,
// by the first-slot rule, a rank) occurs at most once per token, rank by p equals rank by t.
#pragma once
#include <cstdint>

#include "ptx.cuh"

namespace symmoe {

template <typename Idx>
struct RoutingArgs {
  const Idx* idx;        // [T, K]
  const float* w;        // [T, K] (published when pub_w != nullptr)
  int T, K, W, E;
  int32_t* hist;         // [nwarps][W + E] scratch (shared or global), then [W + E] totals after it
  int32_t* pos;          // [T][W + K] positions (nullptr: counts only)
  bool* in_rank;         // [T][W], zeroed by the caller (nullptr: skip)
  int32_t* pub_idx;      // [T, K] int32 copy (nullptr: skip)
  float* pub_w;          // [T, K] copy (nullptr: skip)
};

template <typename Idx>
__device__ __forceinline__ bool first_slot_of_owner(const Idx* row, int k, int owner, int L) {
  for (int kk = 0; kk < k; ++kk) {
    const int e2 = static_cast<int>(row[kk]);
    if (e2 >= 0 && e2 / L == owner) return false;
  }
  return true;
}

// Whole block calls. Returns a pointer to the [W + E] totals (inside a.hist's allocation).
template <typename Idx>
__device__ int32_t* routing_block(const RoutingArgs<Idx>& a) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const int C = a.W + a.E, L = a.E / a.W, PC = a.W + a.K;
  int32_t* totals = a.hist + int64_t(nw) * C;
  for (int i = tid; i < nw * C; i += blockDim.x) a.hist[i] = 0;
  __syncthreads();

  const int per_warp = (a.T + nw - 1) / nw;
  const int64_t t0 = min(a.T, warp * per_warp), t1 = min(a.T, int(t0) + per_warp);
  const int64_t p0 = t0 * a.K, p1 = t1 * a.K;
  int32_t* h = a.hist + int64_t(warp) * C;

  // Phase 1: positions inside this warp's chunk; per-warp column counts.
  for (int64_t base = p0; base < p1; base += 32) {
    const int64_t p = base + lane;
    const bool valid = p < p1;
    const int t = valid ? int(p / a.K) : 0, k = valid ? int(p % a.K) : 0;
    const int e = valid ? static_cast<int>(a.idx[p]) : -1;
    const int o = e >= 0 ? e / L : -1;
    const bool first = o >= 0 && first_slot_of_owner(a.idx + int64_t(t) * a.K, k, o, L);
    if (valid && a.pub_idx) {
      a.pub_idx[p] = e;
      a.pub_w[p] = a.w[p];
    }
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
    if (a.pos) {
      if (ce >= 0) a.pos[int64_t(t) * PC + a.W + k] = be + __popc(me & lanemask_lt());
      if (cr >= 0) a.pos[int64_t(t) * PC + o] = br + __popc(mr & lanemask_lt());
    }
    if (cr >= 0 && a.in_rank) a.in_rank[int64_t(t) * a.W + o] = true;
  }
  __syncthreads();

  // Phase 2: exclusive scan of each column over the warps; totals.
  for (int c = tid; c < C; c += blockDim.x) {
    int32_t run = 0;
    for (int w = 0; w < nw; ++w) {
      const int32_t v = a.hist[int64_t(w) * C + c];
      a.hist[int64_t(w) * C + c] = run;
      run += v;
    }
    totals[c] = run;
  }
  __syncthreads();

  // Phase 3: add each warp's column bases to its positions.
  if (a.pos) {
    for (int64_t base = p0; base < p1; base += 32) {
      const int64_t p = base + lane;
      if (p >= p1) continue;
      const int t = int(p / a.K), k = int(p % a.K);
      const int e = static_cast<int>(a.idx[p]);
      if (e < 0) continue;
      const int o = e / L;
      a.pos[int64_t(t) * PC + a.W + k] += h[a.W + e];
      if (first_slot_of_owner(a.idx + int64_t(t) * a.K, k, o, L)) a.pos[int64_t(t) * PC + o] += h[o];
    }
  }
  __syncthreads();
  return totals;
}

}  // namespace symmoe
