// Session 51 probe for the routing on one cluster (NOTES, "Next GPU session", item 3), not the
// package's code: can a cluster of 16 blocks (one GPC) be resident on the H200, and how long
// does a routing of 4096 tokens x top-8 over 256 experts take on it, alone and while 116 other
// SMs stream a copy through HBM (launched right after it, as the fan-out would follow it)?
//
// The routing here is the critical path only: each block reads its 256 tokens' int64 ids (one
// round of loads), counts them per expert in shared memory, meets its cluster, reads the other
// blocks' counts over distributed shared memory (the prefix below it and the totals), scans the
// totals, writes a position per (token, slot) and releases a mark. Positions inside a block take
// a shared atomic per pair (not the stable order the package needs): this times the trips, and
// the check is that every position is written once, in [0, pairs).
//
// Build and run: nvcc -std=c++17 -O3 -arch=sm_90a cluster_route.cu -o cluster_route && ./cluster_route
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

constexpr int kT = 4096, kK = 8, kE = 256, kThreads = 1024;

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// times[0] = block 0's entry, times[1] = block 0's mark (globaltimer, ns).
__global__ void __launch_bounds__(kThreads, 1)
    cluster_route(const int64_t* ids, int32_t* pos, int* mark, int epoch, uint64_t* times) {
  __shared__ int hist[kE], below[kE], offs[kE], next[kE];
  cg::cluster_group cluster = cg::this_cluster();
  const int me = int(cluster.block_rank()), nb = int(cluster.num_blocks());
  if (blockIdx.x == 0 && threadIdx.x == 0) times[0] = now_ns();
  const int per = kT / nb, first = me * per;
  for (int e = threadIdx.x; e < kE; e += blockDim.x) hist[e] = 0, next[e] = 0;
  // Every id of the block's tokens in flight at once: per * K / threads loads a thread.
  constexpr int kMaxIds = 4;
  int64_t mine[kMaxIds];
  const int n = per * kK;
#pragma unroll
  for (int i = 0; i < kMaxIds; ++i) {
    const int j = threadIdx.x + i * kThreads;
    mine[i] = j < n ? __ldcg(ids + int64_t(first) * kK + j) : -1;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kMaxIds; ++i)
    if (mine[i] >= 0) atomicAdd(&hist[mine[i]], 1);
  cluster.sync();  // every block's counts are in its shared memory
  for (int e = threadIdx.x; e < kE; e += blockDim.x) {
    int b = 0, t = 0;
    for (int r = 0; r < nb; ++r) {
      const int c = cluster.map_shared_rank(hist, r)[e];
      b += r < me ? c : 0;
      t += c;
    }
    below[e] = b;
    offs[e] = t;
  }
  cluster.sync();  // no block leaves while another reads its counts
  if (threadIdx.x < 32) {  // exclusive scan of the totals, one warp
    int carry = 0;
    for (int e0 = 0; e0 < kE; e0 += 32) {
      const int v = offs[e0 + threadIdx.x];
      int s = v;
      for (int d = 1; d < 32; d *= 2) {
        const int u = __shfl_up_sync(0xffffffffu, s, d);
        if (threadIdx.x >= d) s += u;
      }
      offs[e0 + threadIdx.x] = carry + s - v;
      carry += __shfl_sync(0xffffffffu, s, 31);
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kMaxIds; ++i) {
    const int j = threadIdx.x + i * kThreads;
    if (j < n && mine[i] >= 0) {
      const int e = int(mine[i]);
      pos[int64_t(first) * kK + j] = offs[e] + below[e] + atomicAdd(&next[e], 1);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicExch(mark + me, epoch);  // the fan-out would poll these marks
    if (blockIdx.x == 0) times[1] = now_ns();
  }
}

// The load: grid-stride 16-byte copy, `blocks` blocks of 1024 threads.
__global__ void __launch_bounds__(1024) stream_copy(const int4* src, int4* dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __ldcs(src + i);
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaFuncSetAttribute(cluster_route, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for (int size : {8, 16}) {
    for (int smem : {0, 200 * 1024}) {
      if (smem) CK(cudaFuncSetAttribute(cluster_route, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = size, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
      cfg.gridDim = dim3(size), cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = size_t(smem);
      cfg.attrs = &attr, cfg.numAttrs = 1;
      int clusters = -1;
      CK(cudaOccupancyMaxActiveClusters(&clusters, cluster_route, &cfg));
      std::printf("cluster of %d blocks x %d threads, %d KB dynamic shared memory: %d clusters resident at once (%d SMs)\n",
                  size, kThreads, smem / 1024, clusters, sms);
    }
  }
  CK(cudaFuncSetAttribute(cluster_route, cudaFuncAttributeMaxDynamicSharedMemorySize, 0));

  std::mt19937 rng(51);
  std::vector<int64_t> h_ids(size_t(kT) * kK);
  for (int t = 0; t < kT; ++t) {  // top-8 of 256, distinct, uniform
    std::vector<int> e(kE);
    for (int i = 0; i < kE; ++i) e[i] = i;
    for (int k = 0; k < kK; ++k) {
      std::swap(e[k], e[k + rng() % (kE - k)]);
      h_ids[size_t(t) * kK + k] = e[k];
    }
  }
  int64_t* ids;
  int32_t* pos;
  int* mark;
  uint64_t* times;
  const int64_t copy_n = (int64_t(1) << 30) / 16;  // 1 GiB each way
  int4 *src, *dst;
  CK(cudaMalloc(&ids, h_ids.size() * 8));
  CK(cudaMalloc(&pos, h_ids.size() * 4));
  CK(cudaMalloc(&mark, 64 * 4));
  CK(cudaMalloc(&times, 2 * 8));
  CK(cudaMalloc(&src, copy_n * 16));
  CK(cudaMalloc(&dst, copy_n * 16));
  CK(cudaMemset(mark, 0, 64 * 4));
  CK(cudaMemset(src, 1, copy_n * 16));
  CK(cudaMemcpy(ids, h_ids.data(), h_ids.size() * 8, cudaMemcpyHostToDevice));
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

  for (int loaded = 0; loaded < 2; ++loaded) {
    std::vector<double> spans;
    bool ok = true;
    for (int it = 0; it < 30; ++it) {
      CK(cudaMemset(pos, 0xff, h_ids.size() * 4));
      CK(cudaDeviceSynchronize());
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 16, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
      cfg.gridDim = dim3(16), cfg.blockDim = dim3(kThreads), cfg.stream = s1;
      cfg.attrs = &attr, cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, cluster_route, (const int64_t*)ids, pos, mark, it + 1 + 100 * loaded, times));
      // The fan-out would follow on the other SMs: here a copy on sms - 16 of them.
      if (loaded) stream_copy<<<sms - 16, 1024, 0, s2>>>(src, dst, copy_n);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      uint64_t ht[2];
      CK(cudaMemcpy(ht, times, 16, cudaMemcpyDeviceToHost));
      if (it >= 5) spans.push_back(double(ht[1] - ht[0]) / 1000.0);
      if (it == 0) {  // every pair's position written once, inside [0, pairs)
        std::vector<int32_t> hp(h_ids.size());
        CK(cudaMemcpy(hp.data(), pos, hp.size() * 4, cudaMemcpyDeviceToHost));
        std::vector<int> seen(hp.size(), 0);
        for (int32_t p : hp) {
          if (p < 0 || p >= int32_t(hp.size()) || seen[p]++) ok = false;
        }
      }
    }
    std::sort(spans.begin(), spans.end());
    std::printf("routing on one cluster of 16, %s: block 0 entry to its mark median %.2f us (min %.2f, max %.2f, %zu runs); positions %s\n",
                loaded ? "with a copy on the other SMs launched after it" : "alone", spans[spans.size() / 2],
                spans.front(), spans.back(), spans.size(), ok ? "a permutation" : "MISMATCH");
  }
  return 0;
}
