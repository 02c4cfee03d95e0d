// The combine reduction every protocol shares: a token's contributions gathered in the fixed
// order -- rank order for rank-major, k order for expert-major -- added in fp32 (w * y rounded
// before the add, no FMA) and cast once. One block of kReduceThreads reduces one part of a
// token's row at a time; the caller's kernel decides when the slots are ready.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "elem.cuh"
#include "layout.cuh"
#include "ptx.cuh"

namespace symmoe {

constexpr int kReduceThreads = 128;
// A block's item is one part of a token's row (ReduceLaunch: 1 or 2 parts a row). Alone, halves
// over the resident blocks: 4096 whole tokens over the 1188 blocks of a whole H200 (9 a SM) left
// the last round 45 % full and halves made it 90 % (expert combine kernel 135.5 -> 132.5 µs).
// With peers, whole tokens over 16 blocks a SM: under MPS at W=4 the halves cost 698 -> 767 µs
// a combine and whole tokens over a persistent grid of the rank's share 889.
constexpr int kReduceBlocksPerSm = 16;

// Where the contributions of this rank's tokens lie once the combine's data has arrived.
struct CombineSources {
  const uint8_t* y;         // [rows, H] expert outputs of this rank: the rows it kept itself
  const float* rw;          // [rows, K] their weights to combine (rank-major) or nullptr
  const int32_t* selfmap;   // [T * S] y row of each (token, slot) this rank kept
  const uint8_t* cx;        // [T * S, H] combine slots the peers stored into
  const float* cw;          // [T * S, K] their weights
  const bool* in_rank;      // [T, W] (rank-major)
  const int64_t* topk_idx;  // [T, K] as dispatched (expert-major)
  const float* topk_w;      // [T, K] as dispatched (expert-major)
  int64_t tokens, row_bytes;
  int world, topk, slots, local_experts, me;
  bool expert_major;
};

struct SlotList {  // shared memory: token t's contributions, in order
  const uint8_t* src[kMaxSlots];
  const float* wsrc[kMaxSlots];
  float wt[kMaxSlots];
  int n;
};

// Lane c's view of one slot of token t: loaded in one round (no load waits on another), and
// for the first 32 slots one token ahead of the reduction (reduce_tokens).
struct SlotRoute {
  int owner;     // rank holding the slot's row, -1: no row
  float wt;      // expert-major weight
  int32_t self;  // selfmap entry (read only when owner is this rank)

  __device__ __forceinline__ static SlotRoute load(const CombineSources& cs, int64_t t, int c) {
    SlotRoute r{-1, 0.f, 0};
    const int nc = cs.expert_major ? cs.topk : cs.world;
    if (t >= cs.tokens || c >= nc) return r;
    r.self = cs.selfmap[t * cs.slots + c];
    if (cs.expert_major) {
      const int64_t e = cs.topk_idx[t * cs.topk + c];
      r.owner = e >= 0 ? int(e / cs.local_experts) : -1;
      r.wt = cs.topk_w[t * cs.topk + c];
    } else {
      r.owner = cs.in_rank[t * cs.world + c] ? c : -1;
    }
    return r;
  }
};

// One warp: token t's valid slots, in order, into `sl`; `first` holds slots 0..31 (lane c).
__device__ __forceinline__ void collect_slots(const CombineSources& cs, int64_t t, const SlotRoute& first,
                                              SlotList& sl, int lane) {
  const int nc = cs.expert_major ? cs.topk : cs.world;
  const int K = cs.topk, S = cs.slots;
  int n = 0;
  for (int base = 0; base < nc; base += 32) {
    const int c = base + lane;
    const SlotRoute r = base == 0 ? first : SlotRoute::load(cs, t, c);
    const bool valid = r.owner >= 0;
    const uint32_t bal = __ballot_sync(0xffffffffu, valid);
    if (valid) {
      const int at = n + __popc(bal & lanemask_lt());
      const int64_t slot = t * S + c;
      if (r.owner == cs.me) {
        const int64_t row = r.self;
        sl.src[at] = cs.y + row * cs.row_bytes;
        sl.wsrc[at] = cs.rw ? cs.rw + row * K : nullptr;
      } else {
        sl.src[at] = cs.cx + slot * cs.row_bytes;
        sl.wsrc[at] = cs.cw + slot * K;
      }
      sl.wt[at] = r.wt;
    }
    n += __popc(bal);
  }
  if (lane == 0) sl.n = n;
}

// The block (NT threads): vectors [vb, ve) of out row t = sum of the slots in order; out_w row
// t likewise when asked. U vectors per thread in flight.
template <typename T, int U = 2, int NT = kReduceThreads>
__device__ __forceinline__ void reduce_slots(const CombineSources& cs, const SlotList& sl, int64_t t, T* out,
                                             float* out_w, int64_t vb, int64_t ve) {
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte vector
  const int tid = threadIdx.x, n = sl.n;
  const bool em = cs.expert_major;
  for (int64_t v0 = vb + tid; v0 < ve; v0 += int64_t(NT) * U) {
    float acc[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < V; ++i) acc[u][i] = 0.f;
#pragma unroll 4
    for (int j = 0; j < n; ++j) {  // unrolled: loads of several slots in flight, adds stay in order
      const int4* src = reinterpret_cast<const int4*>(sl.src[j]);
      int4 raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t v = v0 + int64_t(u) * NT;
        raw[u] = v < ve ? src[v] : make_int4(0, 0, 0, 0);
      }
      const float wj = sl.wt[j];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float f[V];
        Vec<T>::load(raw[u], f);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[u][i] = em ? __fadd_rn(acc[u][i], __fmul_rn(wj, f[i])) : __fadd_rn(acc[u][i], f[i]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = v0 + int64_t(u) * NT;
      if (v < ve) reinterpret_cast<int4*>(reinterpret_cast<uint8_t*>(out) + t * cs.row_bytes)[v] = Vec<T>::store(acc[u]);
    }
  }
  if (out_w != nullptr && tid < cs.topk) {
    float a = 0.f;
    for (int j = 0; j < n; ++j) a = __fadd_rn(a, sl.wsrc[j][tid]);
    out_w[t * cs.topk + tid] = a;
  }
}

// The block reduces items blockIdx.x, blockIdx.x + gridDim.x, ...: item i is part i % parts of
// token i / parts's row (parts 1 or 2; part 0 also sums the weights). Shifts, not a 64-bit
// division: the division's registers spilled.
template <typename T, int U = 2, int NT = kReduceThreads>
__device__ __forceinline__ void reduce_tokens(const CombineSources& cs, T* out, float* out_w, int parts) {
  __shared__ SlotList sl;
  const bool collector = threadIdx.x < 32;
  const int h = parts == 2 ? 1 : 0;  // log2(parts)
  const int64_t items = cs.tokens << h, nvec = cs.row_bytes / 16, part = (nvec + h) >> h;
  SlotRoute next = collector ? SlotRoute::load(cs, int64_t(blockIdx.x) >> h, threadIdx.x) : SlotRoute{-1, 0.f, 0};
  for (int64_t i = blockIdx.x; i < items; i += gridDim.x) {
    const int64_t t = i >> h, p = i & h;
    if (collector) collect_slots(cs, t, next, sl, threadIdx.x);
    __syncthreads();
    // The next item's slots are in flight while this one is reduced.
    if (collector) next = SlotRoute::load(cs, (i + gridDim.x) >> h, threadIdx.x);
    reduce_slots<T, U, NT>(cs, sl, t, out, p == 0 ? out_w : nullptr, p * part, min(nvec, (p + 1) * part));
    __syncthreads();
  }
}

// A reduction's launch over `tokens` tokens on `sms` SMs: alone, halves over a persistent grid
// of as many blocks as are resident at once (the items divide evenly over blocks that all
// start together); with peers, whole tokens over kReduceBlocksPerSm blocks a SM.
struct ReduceLaunch {
  int blocks;
  int parts;
};
template <class Kernel>
inline ReduceLaunch reduce_launch(Kernel kernel, int sms, int64_t tokens, bool alone) {
  sms = std::max(sms, 1);
  if (!alone) return ReduceLaunch{int(std::max<int64_t>(1, std::min<int64_t>(tokens, int64_t(kReduceBlocksPerSm) * sms))), 1};
  static const int per_sm = [&] {
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kReduceThreads, 0) == cudaSuccess && n > 0 ? n : 1;
  }();
  return ReduceLaunch{int(std::max<int64_t>(1, std::min<int64_t>(tokens * 2, int64_t(per_sm) * sms))), 2};
}

}  // namespace symmoe
