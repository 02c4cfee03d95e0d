// Prepared in session 48, not run (no device time was left): does L2 keep rows prefetched
// evict-last through the expert-major fan-out's round 0 stores? next/prefetch
// (results/session48/patches/prefetch.patch) prefetched the later rounds' rows (32 MB at the
// DeepSeek shape) while the routing kept the stores waiting, and those rounds did not get faster
// (results/NOTES.md, session 48 M). Either L2 lost the rows under round 0's 211 MB of evict-first
// bulk stores, or the stores bound those rounds. This times bulk loads of the 32 MB four ways:
//   cold   after a 256 MB scratch write (L2 holds none of it: HBM)
//   hot    right after the evict-last prefetch (L2; its bulk prefetches may still be in flight)
//   kept   prefetch, then 211 MB of evict-first bulk stores, then the loads
//   plain  as kept, without the prefetch (the stores alone; what the loads then cost)
// kept near hot: the rows survive (the later rounds were store-bound); kept near cold: evicted.
// Each case runs with the L2 set-aside for persisting accesses at 0 (the default, as next/prefetch
// ran) and at its device maximum (cudaLimitPersistingL2CacheSize): evict-last lines may keep a
// priority only inside that set-aside (CUDA programming guide, L2 cache control; under MPS only
// the server's CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT sets it).
// From the repository root on the GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/l2_keep results/session48/calls/l2_keep.cu && /tmp/l2_keep
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../../csrc/common/ptx.cuh"

using namespace symmoe;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

constexpr uint32_t kRow = 7168 * 2;  // one DeepSeek-V3 bf16 row
constexpr int kWarps = 8;             // rows in flight a block (one tile and mbarrier a warp)

__device__ __forceinline__ uint64_t evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// Every row of x into L2, evict-last (next/prefetch's fan_prefetch_later).
__global__ void prefetch_kernel(const uint8_t* x, int64_t rows) {
  const uint64_t pol = evict_last();
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x)
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(x + r * kRow), "r"(kRow),
                 "l"(pol)
                 : "memory");
}

// Lane 0 of each warp bulk-loads rows of x into its tile (evict-first, as the fan-out's loads),
// one in flight a warp, kWarps a block; `sum` keeps the tiles' first words live.
__global__ void load_kernel(const uint8_t* x, int64_t rows, unsigned long long* sum) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bars[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* tile = smem + size_t(warp) * kRow;
  if (lane != 0) return;
  mbar_init(&bars[warp], 1);
  mbar_init_fence();
  const uint64_t pol = evict_first_policy();
  uint32_t parity = 0;
  unsigned long long acc = 0;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + warp; r < rows; r += int64_t(gridDim.x) * kWarps) {
    fence_proxy_async_shared();
    mbar_arrive_expect_tx(&bars[warp], kRow);
    bulk_load_evict_first(tile, x + r * kRow, kRow, &bars[warp], pol);
    while (!mbar_try_wait(&bars[warp], parity)) {
    }
    parity ^= 1u;
    acc += *reinterpret_cast<const uint32_t*>(tile);
  }
  atomicAdd(sum, acc);
}

// Each warp's tile bulk-stored over `out` (evict-first, as the fan-out's stores), grid-stride.
__global__ void store_kernel(uint8_t* out, int64_t rows) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* tile = smem + size_t(warp) * kRow;
  for (uint32_t i = lane; i < kRow / 4; i += 32) reinterpret_cast<uint32_t*>(tile)[i] = i;
  fence_proxy_async_shared();
  __syncwarp();
  if (lane != 0) return;
  const uint64_t pol = evict_first_policy();
  int n = 0;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + warp; r < rows; r += int64_t(gridDim.x) * kWarps) {
    bulk_store_evict_first(out + r * kRow, tile, kRow, pol);
    bulk_commit();
    if (++n % 8 == 0) bulk_wait_read<4>();
  }
  bulk_wait_all();
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t later = 4096 - 132 * 14;          // the rows past round 0 (steal, 14 rows a block)
  const int64_t stores = int64_t(132) * 14 * 8;   // round 0's stores: 8 slots a row
  const int64_t scratch = (256ll << 20) / kRow;   // the cold case's L2 flush
  uint8_t *x, *out, *flush;
  unsigned long long* sum;
  CK(cudaMalloc(&x, later * kRow));
  CK(cudaMalloc(&out, stores * kRow));
  CK(cudaMalloc(&flush, scratch * kRow));
  CK(cudaMalloc(&sum, sizeof(unsigned long long)));
  CK(cudaMemset(x, 1, later * kRow));
  CK(cudaMemset(sum, 0, sizeof(unsigned long long)));
  const size_t smem = size_t(kWarps) * kRow;
  CK(cudaFuncSetAttribute(load_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CK(cudaFuncSetAttribute(store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto flush_l2 = [&] { store_kernel<<<sms, kWarps * 32, smem>>>(flush, scratch); };
  auto timed_load = [&] {
    CK(cudaEventRecord(a));
    load_kernel<<<sms, kWarps * 32, smem>>>(x, later, sum);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return double(ms) * 1e3;
  };
  const char* names[] = {"cold", "hot", "kept", "plain"};
  int l2 = 0, most = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  CK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxPersistingL2CacheSize, 0));
  for (const size_t aside : {size_t(0), size_t(most)}) {
    CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, aside));
    size_t got = 0;
    CK(cudaDeviceGetLimit(&got, cudaLimitPersistingL2CacheSize));
    std::vector<double> us[4];
    for (int rep = 0; rep < 11; ++rep) {
      for (int c = 0; c < 4; ++c) {
        flush_l2();
        if (c != 0 && c != 3) prefetch_kernel<<<sms, 256>>>(x, later);
        if (c >= 2) store_kernel<<<sms, kWarps * 32, smem>>>(out, stores);
        us[c].push_back(timed_load());
      }
    }
    CK(cudaGetLastError());
    CK(cudaCtxResetPersistingL2Cache());
    std::printf("L2 %d MB, set-aside %.1f MB (max %.1f): bulk loads of %lld rows (%.1f MB) after ...; "
                "median of 11, us (GB/s)\n",
                l2 >> 20, got / 1048576.0, most / 1048576.0, (long long)later, later * kRow / 1e6);
    for (int c = 0; c < 4; ++c) {
      std::sort(us[c].begin(), us[c].end());
      const double m = us[c][us[c].size() / 2];
      std::printf("  %-6s %8.1f us  (%7.1f GB/s)\n", names[c], m, later * kRow / m / 1e3);
    }
  }
  return 0;
}
