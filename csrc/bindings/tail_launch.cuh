// The host's launch of num_worst_tokens' tail (kernels/tail.cuh) behind a dispatch's data
// kernels, for every module that binds it (symmoe_cuda's Context, symmoe_nvshmem): here, not in
// the device header, because it sizes the launch and words its refusals.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "../common/follow_launch.h"
#include "../kernels/tail.cuh"

namespace symmoe {

// After the data kernels on `stream`, launched to follow them (its launch gap and table build
// hide under their last rows where they call start_following_grid, as the alone kernels do;
// counts_late: a data kernel that started before its routing ended, whose counts the tail reads
// only after it), at most `max_blocks` blocks (LaunchShape.tail; the tail is a plain fill). The
// tables take SendPlan::bytes(W, L) of shared memory; an error string when they exceed
// `max_smem`, else the launch's error.
// Internal linkage, as the kernel's: each module keeps its own attribute state below (a static
// of an inline function is one object for every library loaded in the process).
static std::string launch_recv_tail(const Layout& L, const int32_t* counts, TailOutputs o, int64_t worst,
                                    bool expert_major, int alignment, int me, int32_t* per_expert, DeferredError* df,
                                    int64_t epoch, bool counts_late, int max_blocks, int max_smem, cudaStream_t stream) {
  const int64_t smem = SendPlan::bytes(int(L.world_size), int(L.local_experts()));
  if (smem > max_smem)
    return "num_worst_tokens: the receivers' tables (" + std::to_string(smem) +
           " bytes) exceed shared memory (fewer experts per rank needed)";
  // The attribute once per module, and only past the default 48 KiB: set on every call it cost
  // 2-5 µs of host time in each worst-case dispatch.
  static int allowed = 48 * 1024;
  cudaError_t e = cudaSuccess;
  if (smem > allowed) {
    e = cudaFuncSetAttribute(recv_tail_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
    if (e == cudaSuccess) allowed = max_smem;
  }
  if (e == cudaSuccess) {
    const int64_t vecs = worst * (L.row_bytes() / 16);
    const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(max_blocks, (vecs + kTailThreads - 1) / kTailThreads)));
    e = launch_following(recv_tail_kernel, blocks, kTailThreads, size_t(smem), stream, L, counts, o, worst,
                         expert_major, alignment, me, per_expert, df, epoch, counts_late);
  }
  return e == cudaSuccess ? std::string() : std::string("recv_tail_kernel launch: ") + cudaGetErrorString(e);
}

}  // namespace symmoe
