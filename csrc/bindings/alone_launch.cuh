// The launch of kernels/alone.cuh's kernels: by a Context at world size 1 (ctx_dispatch.cuh's
// ctx_alone), and bound by symmoe_cuda as `alone` for protocols that have no Context of this
// module (nvshmem alone).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/alone.cuh"
#include "../common/follow_launch.h"
#include "refusals.h"

namespace symmoe {

// A kernel's dynamic shared memory: the opt-in limit less its own static part (set on the
// kernel at its first launch).
template <class Kernel>
int alone_smem_limit(Kernel kernel, const char* name) {
  int dev = 0, max_smem = 0;
  cudaFuncAttributes fa{};
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaFuncGetAttributes(&fa, kernel) != cudaSuccess)
    throw std::runtime_error(std::string(name) + ": the shared memory limit query failed");
  const int lim = max_smem - int((fa.sharedSizeBytes + 127) / 128 * 128);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, lim) != cudaSuccess)
    throw std::runtime_error(std::string(name) + ": cudaFuncSetAttribute failed");
  return lim;
}

// The phased fan-out's geometry in m for E experts and rows of rb bytes in `limit` bytes of shared
// memory: its rows past the plan tables the phases still read, or (`past`) past all of FanPlan,
// for rows that load before the plan is built. False: not one row fits.
inline bool fan_geometry(MoveCfg& m, int64_t E, int64_t rb, int limit, bool grid, bool past) {
  m.plan_bytes = past ? (FanPlan::bytes(E) + kSlotAlign - 1) / kSlotAlign * kSlotAlign : FanPlan::bytes(E);
  return phase_geometry(m, past ? m.plan_bytes : FanPlan::kept_bytes(E), limit, rb, grid);
}

// The launch of a one-rank dispatch whose arguments `a` (all but the mover's geometry) are
// set, on `blocks` blocks of a GPU of `sms` SMs (LaunchShape.alone, .sms): expert-major the
// phased fan-out with mode kernel.fan_phases (1 block, 2 grid, 3 steal;
// sy.done: a zeroed grid counter), else the rows by the mover, in pieces of at most `row_piece` bytes
// with `row_depth` slots a warp (depth_auto as fit_mover's). False, launching nothing, when the
// layout has peers or, expert-major, not one row fits in shared memory: the caller runs its
// own kernel.
inline bool launch_alone_args(AloneArgs a, bool expert_major, int mode, int blocks, int sms, int64_t row_piece,
                              int row_depth, bool depth_auto, cudaStream_t s) {
  if (expert_major && (mode < 1 || mode > 3))
    throw std::invalid_argument("alone: fan_phases mode " + std::to_string(mode) + ", must be 1, 2 or 3");
  if (a.lay.world_size != 1) return false;
  const int64_t rb = a.lay.row_bytes();
  MoveCfg m{};
  size_t smem = 0;
  bool early = false;  // expert-major: alone_fan_kernel<true> (round 0's loads ahead of the routing's end)
  if (expert_major) {
    // Both instances get the opt-in (the same static part).
    static const int limit = std::min(alone_smem_limit(alone_fan_kernel<false>, "alone_fan_kernel"),
                                      alone_smem_limit(alone_fan_kernel<true>, "alone_fan_kernel"));
    const int64_t E = a.lay.num_experts;
    if (!fan_geometry(m, E, rb, limit, mode == 2, false)) return false;
    if (a.routed.placed != nullptr) {
      // Behind the routing the rows load before the plan is built, so they go past all of it;
      // only where that keeps every row a block holds (16 at the DeepSeek shape).
      MoveCfg past{};
      early = fan_geometry(past, E, rb, limit, mode == 2, true) && past.phase_rows == m.phase_rows;
      if (early) m = past;
    }
    m.phase_steal = mode == 3;
    if (m.phase_grid)
      refuse_phase_grid(phase_grid_fit(early ? alone_fan_kernel<true> : alone_fan_kernel<false>, m, rb, blocks, sms),
                        blocks, sms);
    smem = size_t(phase_smem(m, rb));
  } else {
    // Both instances get the opt-in (the same static part).
    static const int limit = std::min(alone_smem_limit(alone_rows_kernel<false>, "alone_rows_kernel"),
                                      alone_smem_limit(alone_rows_kernel<true>, "alone_rows_kernel"));
    m = refuse_unfit(row_mover(rb, row_piece, row_depth, limit, depth_auto), 0);
    smem = size_t(m.warps) * WarpMoverSmem::per_warp_bytes(m.slot_bytes, m.depth);
  }
  a.mc = m;
  auto kernel = expert_major ? (early ? alone_fan_kernel<true> : alone_fan_kernel<false>)
                             : (a.routed.placed != nullptr ? alone_rows_kernel<true> : alone_rows_kernel<false>);
  const cudaError_t e = launch_following(kernel, blocks, m.warps * 32, smem, s, a);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(expert_major ? "alone_fan_kernel" : "alone_rows_kernel") +
                             " launch: " + cudaGetErrorString(e));
  return true;
}

// AloneArgs from the bindings' pointers p[0..12]: x, idx (int32 [T, K]), w, pos ([T, 1 + K]),
// counts ([1][2 + E]), out x, idx, w, src_rank, src_token, src_slot, expert_offsets (rank-major:
// 0), selfmap (0: none).
constexpr size_t kAlonePtrs = 13;
inline AloneArgs alone_args(const std::vector<int64_t>& layout, int alignment, int64_t capacity, int64_t epoch,
                            uint64_t timeout_ns, const std::vector<int64_t>& p, uintptr_t done, uintptr_t err,
                            uintptr_t err_host) {
  if (layout.size() != size_t(kLayoutArgs))
    throw std::invalid_argument("alone: layout of " + std::to_string(layout.size()) + " values, expected " +
                                std::to_string(kLayoutArgs));
  if (p.size() != kAlonePtrs)
    throw std::invalid_argument("alone: expected " + std::to_string(kAlonePtrs) + " pointers, got " +
                                std::to_string(p.size()));
  AloneArgs a{};
  std::memcpy(&a.lay, layout.data(), sizeof(Layout));
  auto ptr = [&](int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p[size_t(i)])); };
  a.alignment = alignment;
  a.x = static_cast<const uint8_t*>(ptr(0));
  a.idx = static_cast<const int32_t*>(ptr(1));
  a.w = static_cast<const float*>(ptr(2));
  a.pos = static_cast<const int32_t*>(ptr(3));
  a.counts = static_cast<const int32_t*>(ptr(4));
  a.o = Outputs{static_cast<uint8_t*>(ptr(5)), static_cast<int64_t*>(ptr(6)), static_cast<float*>(ptr(7)),
                static_cast<int32_t*>(ptr(8)), static_cast<int32_t*>(ptr(9)), static_cast<int32_t*>(ptr(10)),
                static_cast<int64_t*>(ptr(11)), static_cast<int32_t*>(ptr(12)), capacity};
  a.sy = Sync{0, epoch, timeout_ns, reinterpret_cast<ErrorWord*>(err), reinterpret_cast<ErrorWord*>(err_host),
              reinterpret_cast<unsigned int*>(done)};
  return a;
}

// The binding for protocols that have no Context of this module (nvshmem alone), with the
// mover's default geometry; ptrs as alone_args'; blocks and sms: LaunchShape.alone and .sms.
inline bool launch_alone(const std::vector<int64_t>& layout, bool expert_major, int alignment, int64_t capacity,
                         int64_t epoch, uint64_t timeout_ns, const std::vector<int64_t>& p, int mode, int blocks,
                         int sms, uintptr_t done, uintptr_t err, uintptr_t err_host, uintptr_t stream) {
  const AloneArgs a = alone_args(layout, alignment, capacity, epoch, timeout_ns, p, done, err, err_host);
  if (blocks < 1 || blocks > sms)
    throw std::invalid_argument("alone: blocks=" + std::to_string(blocks) + ", outside 1.." + std::to_string(sms) +
                                " (the GPU's SMs); symmoe/launch_shape.py decides it");
  return launch_alone_args(a, expert_major, mode, blocks, sms, kMaxSlotBytes, kRowDepth, true,
                           reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace symmoe
