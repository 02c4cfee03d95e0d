// Session 52 probe, not the package's code: does a programmatic dependent launch start early
// behind a kernel launched as one thread-block cluster, and does a cluster kernel start early
// as the dependent? Call A saw route_cluster_kernel's follower start only near its end.
// Each primary triggers its dependents at entry, then spins `spin_us`; the dependent records
// the globaltimer at its first block's entry. Printed: dependent start - primary start, µs.
// Build and run: nvcc -std=c++17 -O3 -arch=sm_90a pdl_cluster.cu -o pdl_cluster && ./pdl_cluster
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// times[0]: the primary's first entry, times[1]: the dependent's first entry (atomicMin).
__global__ void primary(unsigned long long* times, int spin_us, int trigger) {
  const uint64_t t0 = now();
  if (threadIdx.x == 0) atomicMin(times, (unsigned long long)t0);
  if (trigger) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  while (now() < t0 + uint64_t(spin_us) * 1000) {
  }
}

__global__ void dependent(unsigned long long* times) {
  if (threadIdx.x == 0) atomicMin(times + 1, (unsigned long long)now());
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

static cudaError_t launch(void (*k)(unsigned long long*, int, int), int blocks, int threads, int cluster,
                          bool follow, cudaStream_t s, unsigned long long* t, int spin, int trig) {
  cudaLaunchAttribute at[2];
  int n = 0;
  if (cluster > 1) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = cluster, at[n].val.clusterDim.y = 1, at[n].val.clusterDim.z = 1;
    ++n;
  }
  if (follow) {
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks), cfg.blockDim = dim3(threads), cfg.stream = s, cfg.attrs = at, cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, k, t, spin, trig);
}

static cudaError_t launch_dep(int blocks, int threads, int cluster, cudaStream_t s, unsigned long long* t) {
  cudaLaunchAttribute at[2];
  int n = 0;
  if (cluster > 1) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = cluster, at[n].val.clusterDim.y = 1, at[n].val.clusterDim.z = 1;
    ++n;
  }
  at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[n].val.programmaticStreamSerializationAllowed = 1;
  ++n;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks), cfg.blockDim = dim3(threads), cfg.stream = s, cfg.attrs = at, cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, dependent, t);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(primary, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(dependent, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  unsigned long long* t;
  CK(cudaMalloc(&t, 16));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct Case {
    const char* name;
    int p_blocks, p_threads, p_cluster, trigger, d_blocks, d_cluster;
  };
  const Case cases[] = {
      {"plain 16 x 1024 primary (trigger) -> plain dependent on the rest", 16, 1024, 1, 1, sms - 16, 1},
      {"cluster 16 x 1024 primary (trigger) -> plain dependent on the rest", 16, 1024, 16, 1, sms - 16, 1},
      {"cluster 16 x 1024 primary (no trigger) -> plain dependent on the rest", 16, 1024, 16, 0, sms - 16, 1},
      {"cluster 8 x 1024 primary x2 (trigger) -> plain dependent on the rest", 16, 1024, 8, 1, sms - 16, 1},
      {"plain rest x 1024 primary (trigger) -> cluster 16 dependent", sms - 16, 1024, 1, 1, 16, 16},
  };
  const int spin = 30;
  std::printf("{\"sms\": %d, \"spin_us\": %d, \"cases\": [\n", sms, spin);
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); ++c) {
    const Case& k = cases[c];
    std::vector<double> d;
    for (int it = 0; it < 25; ++it) {
      CK(cudaMemset(t, 0xff, 16));
      CK(cudaDeviceSynchronize());
      CK(launch(primary, k.p_blocks, k.p_threads, k.p_cluster, false, s, t, spin, k.trigger));
      CK(launch_dep(k.d_blocks, 128, k.d_cluster, s, t));
      CK(cudaStreamSynchronize(s));
      unsigned long long h[2];
      CK(cudaMemcpy(h, t, 16, cudaMemcpyDeviceToHost));
      if (it >= 5) d.push_back((double(h[1]) - double(h[0])) / 1000.0);
    }
    std::sort(d.begin(), d.end());
    std::printf("  {\"case\": \"%s\", \"dependent_start_us_median\": %.2f, \"min\": %.2f, \"max\": %.2f}%s\n", k.name,
                d[d.size() / 2], d.front(), d.back(), c + 1 < sizeof(cases) / sizeof(cases[0]) ? "," : "");
  }
  std::printf("]}\n");
  return 0;
}
