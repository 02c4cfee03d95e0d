// Programmatic dependent launch of a dispatch's data kernel behind its routing kernel (or the
// cached dispatch's republish kernel), and of the num_worst_tokens tail behind the data kernel:
// the later kernel's blocks are scheduled while the earlier one runs and start the moment it
// ends, instead of after a launch gap. The later kernel calls wait_prior_grid() (common/ptx.cuh)
// before it touches what the earlier one writes; the earlier one calls start_following_grid().
#pragma once
#include <cuda_runtime.h>

namespace symmoe {

template <typename... Params, typename... Args>
cudaError_t launch_following(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args&&... args) {
  cudaLaunchAttribute follow{};
  follow.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  follow.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &follow;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace symmoe
