// The launch of kernels/fan.cuh's fan_kernel, bound by symmoe_cuda as `fan` for protocols that
// have no Context of this module (nvshmem alone).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/fan.cuh"

namespace symmoe {

// The fan kernel's dynamic shared memory: the opt-in limit less its own static part (set on
// the kernel once).
inline int fan_smem_limit() {
  static const int limit = [] {
    int dev = 0, max_smem = 0;
    cudaFuncAttributes fa{};
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaFuncGetAttributes(&fa, fan_kernel) != cudaSuccess)
      throw std::runtime_error("fan_kernel: the shared memory limit query failed");
    const int lim = max_smem - int((fa.sharedSizeBytes + 127) / 128 * 128);
    if (cudaFuncSetAttribute(fan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, lim) != cudaSuccess)
      throw std::runtime_error("fan_kernel: cudaFuncSetAttribute failed");
    return lim;
  }();
  return limit;
}

// ptrs: x, idx (int32 [T, K]), w, pos ([T, 1 + K]), counts ([1][2 + E]), out x, idx, w, src_rank,
// src_token, src_slot, expert_offsets, selfmap (0: none). mode: kernel.fan_phases (1 block, 2
// grid); done: a zeroed grid counter. False, launching nothing, when not one row fits in shared
// memory or the layout has peers: the caller runs its own kernel.
inline bool launch_fan(const std::vector<int64_t>& layout, int alignment, int64_t capacity, int64_t epoch,
                       uint64_t timeout_ns, const std::vector<int64_t>& p, int mode, int blocks, uintptr_t done,
                       uintptr_t err, uintptr_t err_host, uintptr_t stream) {
  if (layout.size() != size_t(kLayoutArgs))
    throw std::invalid_argument("fan: layout of " + std::to_string(layout.size()) + " values, expected " +
                                std::to_string(kLayoutArgs));
  if (p.size() != 13) throw std::invalid_argument("fan: expected 13 pointers, got " + std::to_string(p.size()));
  if (mode != 1 && mode != 2) throw std::invalid_argument("fan: mode " + std::to_string(mode) + ", must be 1 or 2");
  FanArgs a{};
  std::memcpy(&a.lay, layout.data(), sizeof(Layout));
  if (a.lay.world_size != 1) return false;
  MoveCfg m{};
  m.plan_bytes = FanPlan::bytes(a.lay.num_experts);
  if (!phase_geometry(m, FanPlan::kept_bytes(a.lay.num_experts), fan_smem_limit(), a.lay.row_bytes(), mode == 2))
    return false;
  if (m.phase_grid) {
    const std::string refusal = phase_grid_refusal(fan_kernel, m, a.lay.row_bytes(), blocks);
    if (!refusal.empty()) throw std::invalid_argument(refusal);
  }
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
  a.mc = m;
  a.sy = Sync{0, epoch, timeout_ns, reinterpret_cast<ErrorWord*>(err), reinterpret_cast<ErrorWord*>(err_host),
              reinterpret_cast<unsigned int*>(done)};
  fan_kernel<<<blocks, m.warps * 32, size_t(phase_smem(m, a.lay.row_bytes())), reinterpret_cast<cudaStream_t>(stream)>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("fan_kernel launch: ") + cudaGetErrorString(e));
  return true;
}

}  // namespace symmoe
