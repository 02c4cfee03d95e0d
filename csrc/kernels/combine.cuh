// Combine kernels, templates on the device transport:
//
//   combine_send_kernel    receivers store each received row (and, rank-major, its weights)
//                          into the source's combine region at slot t * S + slot; rows whose
//                          source is this rank are not copied: their row index goes into
//                          `selfmap` and the reduction reads them where they lie. Barrier
//                          "combine.data".
//   combine_reduce_kernel  sources add, per token, the slots in fixed order in fp32 -- rank
//                          order for rank-major, k order with w * y rounded before the add for
//                          expert-major (__fmul_rn/__fadd_rn: no FMA) -- and cast once. Barrier
//                          "combine.done" (peers may then store the next combine).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/elem.cuh"
#include "../common/layout.cuh"
#include "../common/mover.cuh"
#include "dispatch.cuh"

namespace symmoe {

struct RecvRows {  // the receiver side of a dispatch handle
  const int32_t* src_rank;
  const int32_t* src_token;
  const int32_t* src_slot;
  int64_t rows;
};

template <class Transport>
__global__ void __launch_bounds__(1024) combine_send_kernel(Transport tp, Layout L, const uint8_t* y,
                                                            const float* rw, RecvRows rr, int32_t* selfmap,
                                                            MoveCfg mc, Sync sy) {
  uint8_t* smem_raw = dyn_smem();
  const int W = int(L.world_size), K = int(L.topk), S = int(L.combine_slots), me = sy.rank;
  const int64_t rb = L.row_bytes();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(sy.err);
  __syncthreads();
  WarpMover mv;
  mv.init(smem_raw + int64_t(warp) * WarpMoverSmem::per_warp_bytes(mc.slot_bytes), mc.slot_bytes,
          MoverWatch{sy.timeout_ns, sy.err, sy.err_host, sy.epoch});
  if (!dead) {
    // Warp w owns rows w, w + nwt, ... as before; their metadata is read 32 rows at a time
    // (one per lane), so own rows cost one store each instead of a serial round trip.
    const int64_t gw = int64_t(blockIdx.x) * mc.warps + warp, nwt = int64_t(gridDim.x) * mc.warps;
    for (int64_t first = gw; first < rr.rows; first += 32 * nwt) {
      const int64_t i = first + lane * nwt;
      const int s = i < rr.rows ? rr.src_rank[i] : -1;
      const bool ok = s >= 0 && s < W;  // else padding row or past the end
      const int64_t slot = ok ? int64_t(rr.src_token[i]) * S + rr.src_slot[i] : 0;
      if (ok && s == me) selfmap[slot] = int32_t(i);
      uint32_t remote = __ballot_sync(0xffffffffu, ok && s != me);
      while (remote) {
        const int l = __ffs(remote) - 1;
        remote &= remote - 1;
        const int64_t ri = __shfl_sync(0xffffffffu, i, l), rslot = __shfl_sync(0xffffffffu, slot, l);
        const int rs = __shfl_sync(0xffffffffu, s, l);
        if (rw != nullptr && lane < K)
          reinterpret_cast<float*>(tp.map(rs, L.combine_w))[rslot * K + lane] = rw[ri * K + lane];
        uint8_t* dst = tp.map(rs, L.combine_x) + rslot * rb;
        const uint8_t* src = y + ri * rb;
        for (int64_t off = 0; off < rb; off += mc.slot_bytes) {
          const uint32_t bytes = uint32_t(min(int64_t(mc.slot_bytes), rb - off));
          if (lane == 0) mv.next_dsts()[0] = dst + off;
          __syncwarp();
          mv.push(src + off, 1, bytes);
        }
      }
    }
  }
  mv.flush();
  if (grid_last_block(sy.done) && !dead)
    block_barrier(tp, me, W, L.barrier, sy.epoch, sy.timeout_ns, sy.err, sy.err_host, kStageCombineData);
}

struct SourceSide {  // the source side of a dispatch handle
  const bool* in_rank;     // [T, W] (rank-major)
  const int64_t* topk_idx; // [T, K] (expert-major)
  const float* topk_w;     // [T, K] (expert-major)
  int64_t tokens;
};

constexpr int kReduceThreads = 128;
constexpr int kMaxSlots = 64;  // S = max(W, K) <= 64 (checked on the host)

template <class Transport, typename T>
__global__ void __launch_bounds__(kReduceThreads) combine_reduce_kernel(Transport tp, Layout L, const uint8_t* y,
                                                                        const float* rw, SourceSide ss,
                                                                        const int32_t* selfmap, T* out, float* out_w,
                                                                        bool expert_major, Sync sy) {
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte vector
  constexpr int U = 2;               // vectors per thread in flight (4 measured slower: 183 vs 157 us)
  __shared__ const uint8_t* ptrs[kMaxSlots];
  __shared__ const float* wptrs[kMaxSlots];
  __shared__ float wts[kMaxSlots];
  __shared__ int nslots;
  __shared__ bool dead;
  const int W = int(L.world_size), K = int(L.topk), S = int(L.combine_slots), Le = int(L.local_experts());
  const int me = sy.rank;
  const int64_t rb = L.row_bytes(), nvec = rb / 16;
  const int tid = threadIdx.x, lane = tid & 31;
  const uint8_t* cx = tp.local + L.combine_x;
  const float* cw = reinterpret_cast<const float*>(tp.local + L.combine_w);
  if (tid == 0) dead = error_set(sy.err);
  __syncthreads();
  if (!dead) {
    for (int64_t t = blockIdx.x; t < ss.tokens; t += gridDim.x) {
      if (tid < 32) {  // warp 0: the valid slots of token t, in order
        int n = 0;
        const int nc = expert_major ? K : W;
        for (int base = 0; base < nc; base += 32) {
          const int c = base + lane;
          bool valid = false;
          int owner = -1;
          float wt = 0.f;
          if (c < nc) {
            if (expert_major) {
              const int64_t e = ss.topk_idx[t * K + c];
              valid = e >= 0;
              owner = valid ? int(e / Le) : -1;
              wt = ss.topk_w[t * K + c];
            } else {
              valid = ss.in_rank[t * W + c];
              owner = c;
            }
          }
          const uint32_t bal = __ballot_sync(0xffffffffu, valid);
          if (valid) {
            const int at = n + __popc(bal & lanemask_lt());
            const int64_t slot = t * S + c;
            if (owner == me) {
              const int64_t row = selfmap[slot];
              ptrs[at] = y + row * rb;
              wptrs[at] = rw ? rw + row * K : nullptr;
            } else {
              ptrs[at] = cx + slot * rb;
              wptrs[at] = cw + slot * K;
            }
            wts[at] = wt;
          }
          n += __popc(bal);
        }
        if (lane == 0) nslots = n;
      }
      __syncthreads();
      const int n = nslots;
      for (int64_t v0 = tid; v0 < nvec; v0 += int64_t(kReduceThreads) * U) {
        float acc[U][V];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int i = 0; i < V; ++i) acc[u][i] = 0.f;
#pragma unroll 4
        for (int j = 0; j < n; ++j) {  // unrolled: loads of several slots in flight, adds stay in order
          const int4* src = reinterpret_cast<const int4*>(ptrs[j]);
          int4 raw[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const int64_t v = v0 + int64_t(u) * kReduceThreads;
            raw[u] = v < nvec ? src[v] : make_int4(0, 0, 0, 0);
          }
          const float wj = wts[j];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
            for (int i = 0; i < V; ++i) {
              const float f = Elem<T>::to_f(e[i]);
              acc[u][i] = expert_major ? __fadd_rn(acc[u][i], __fmul_rn(wj, f)) : __fadd_rn(acc[u][i], f);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t v = v0 + int64_t(u) * kReduceThreads;
          if (v >= nvec) continue;
          int4 o;
          T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
          for (int i = 0; i < V; ++i) oe[i] = Elem<T>::from_f(acc[u][i]);
          reinterpret_cast<int4*>(reinterpret_cast<uint8_t*>(out) + t * rb)[v] = o;
        }
      }
      if (out_w != nullptr && tid < K) {
        float a = 0.f;
        for (int j = 0; j < n; ++j) a = __fadd_rn(a, wptrs[j][tid]);
        out_w[t * K + tid] = a;
      }
      __syncthreads();
    }
  }
  if (grid_last_block(sy.done) && !dead)
    block_barrier(tp, me, W, L.barrier, sy.epoch, sy.timeout_ns, sy.err, sy.err_host, kStageCombineDone);
}

}  // namespace symmoe
