// The shared memory a Context's kernels may take: the opt-in limit, set on every kernel once,
// less their static tables (SmemBudget, fixed at construction).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "../kernels/combine.cuh"
#include "../kernels/dispatch.cuh"
#include "../kernels/push_stream.cuh"
#include "../kernels/route.cuh"
#include "cuda_check.h"

namespace symmoe {

// Shared memory a block may take (set once): the opt-in limit less every kernel's static tables,
// and less the data kernels' (pull, push) only, what their dynamic part may take.
struct SmemBudget {
  int max = 0;
  int data = 0;
};

// Static __shared__ bytes count against the opt-in limit too: dynamic may use at most
// optin - static (cudaFuncSetAttribute fails with "invalid argument" otherwise).
template <typename K>
int static_smem(K kernel) {
  cudaFuncAttributes fa;
  check(cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes");
  return int(fa.sharedSizeBytes);
}

// Once per kernel: allow the opt-in shared memory `optin` (bulk-copy slots need > 48 KB), less
// the largest static part; the data kernels' own budget leaves out the routing kernels' larger
// tables, which would cost the phased fan-out a whole row (15 rows a block, three rounds, not two).
template <class Transport>
SmemBudget allow_smem(int optin) {
  const auto attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  int st = 0;
  for (int s : {static_smem(pull_kernel<Transport>), static_smem(push_kernel<Transport>),
                static_smem(pull_kernel<Transport, true>), static_smem(push_kernel<Transport, true>)})
    st = std::max(st, s);
  SmemBudget b{0, optin - (st + 127) / 128 * 128};
  for (int s : {static_smem(push_stream_kernel<Transport>), static_smem(unpack_kernel<Transport>),
                static_smem(combine_send_kernel<Transport>), static_smem(route_count_kernel<int64_t>),
                static_smem(route_count_kernel<int32_t>), static_smem(route_kernel<Transport, int64_t>),
                static_smem(route_kernel<Transport, int32_t>)})
    st = std::max(st, s);
  b.max = optin - (st + 127) / 128 * 128;
  check(cudaFuncSetAttribute(pull_kernel<Transport>, attr, b.data), "pull attr");
  check(cudaFuncSetAttribute(push_kernel<Transport>, attr, b.data), "push attr");
  check(cudaFuncSetAttribute(pull_kernel<Transport, true>, attr, b.data), "pull attr");
  check(cudaFuncSetAttribute(push_kernel<Transport, true>, attr, b.data), "push attr");
  check(cudaFuncSetAttribute(push_stream_kernel<Transport>, attr, b.max), "push_stream attr");
  check(cudaFuncSetAttribute(unpack_kernel<Transport>, attr, b.max), "unpack attr");
  check(cudaFuncSetAttribute(combine_send_kernel<Transport>, attr, b.max), "combine attr");
  check(cudaFuncSetAttribute(route_count_kernel<int64_t>, attr, b.max), "route attr");
  check(cudaFuncSetAttribute(route_count_kernel<int32_t>, attr, b.max), "route attr");
  check(cudaFuncSetAttribute(route_kernel<Transport, int64_t>, attr, b.max), "route attr");
  check(cudaFuncSetAttribute(route_kernel<Transport, int32_t>, attr, b.max), "route attr");
  return b;
}

}  // namespace symmoe
