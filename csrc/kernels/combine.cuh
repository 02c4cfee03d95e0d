// Combine kernels, templates on the device transport:
//
//   combine_send_kernel    receivers store each received row (and, rank-major, its weights)
//                          into the source's combine region at slot t * S + slot; rows whose
//                          source is this rank are not copied: the dispatch recorded their
//                          rows in `selfmap` and the reduction reads them where they lie.
//                          Barrier "combine.data" (not launched at world size 1).
//   combine_reduce_kernel  sources reduce each token's slots in the fixed order
//                          (common/reduce.cuh, shared with the NVSHMEM combine). Barrier
//                          "combine.done" (peers may then store the next combine).
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"
#include "../common/layout.cuh"
#include "../common/mover.cuh"
#include "../common/reduce.cuh"
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
                                                            const float* rw, RecvRows rr, MoveCfg mc, Sync sy) {
  uint8_t* smem_raw = dyn_smem();
  const int W = int(L.world_size), K = int(L.topk), S = int(L.combine_slots), me = sy.rank;
  const int64_t rb = L.row_bytes();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(sy.err);
  __syncthreads();
  WarpMover mv;
  mv.init(smem_raw + int64_t(warp) * WarpMoverSmem::per_warp_bytes(mc.slot_bytes, mc.depth), mc.slot_bytes,
          mc.depth, MoverWatch{sy.timeout_ns, sy.err, sy.err_host, sy.epoch});
  if (!dead) {
    // Warp w owns rows w, w + nwt, ... as before; their metadata is read 32 rows at a time
    // (one per lane), so own rows cost one store each instead of a serial round trip.
    const int64_t gw = int64_t(blockIdx.x) * mc.warps + warp, nwt = int64_t(gridDim.x) * mc.warps;
    for (int64_t first = gw; first < rr.rows; first += 32 * nwt) {
      const int64_t i = first + lane * nwt;
      const int s = i < rr.rows ? rr.src_rank[i] : -1;
      const bool ok = s >= 0 && s < W;  // else padding row or past the end
      const int64_t slot = ok ? int64_t(rr.src_token[i]) * S + rr.src_slot[i] : 0;
      uint32_t remote = __ballot_sync(0xffffffffu, ok && s != me);
      while (remote) {
        const int l = __ffs(remote) - 1;
        remote &= remote - 1;
        const int64_t ri = __shfl_sync(0xffffffffu, i, l), rslot = __shfl_sync(0xffffffffu, slot, l);
        const int rs = __shfl_sync(0xffffffffu, s, l);
        // The weights are stored after the row's copies are issued: their load's round trip
        // runs under the copies instead of before them.
        const float wt = rw != nullptr && lane < K ? rw[ri * K + lane] : 0.f;
        uint8_t* dst = tp.map(rs, L.combine_x) + rslot * rb;
        const uint8_t* src = y + ri * rb;
        for (int64_t off = 0; off < rb; off += mc.slot_bytes) {
          const uint32_t bytes = uint32_t(min(int64_t(mc.slot_bytes), rb - off));
          if (lane == 0) mv.next_dsts()[0] = dst + off;
          __syncwarp();
          mv.push(src + off, 1, bytes);
        }
        if (rw != nullptr && lane < K) reinterpret_cast<float*>(tp.map(rs, L.combine_w))[rslot * K + lane] = wt;
      }
    }
  }
  mv.flush();
  grid_barrier(tp, L, sy, dead, kStageCombineData);
}

template <class Transport, typename T>
__global__ void __launch_bounds__(kReduceThreads) combine_reduce_kernel(Transport tp, Layout L, CombineSources cs,
                                                                        T* out, float* out_w, int parts, Sync sy) {
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = error_set(sy.err);
  __syncthreads();
  if (!dead) reduce_tokens<T>(cs, out, out_w, parts);
  grid_barrier(tp, L, sy, dead, kStageCombineDone);
}

}  // namespace symmoe
