// What the microbenchmarks share: a CUDA call checked, a finite bf16 fill, and the median device
// time of a launch, timed as symmoe.bench times its calls (a spin kernel ahead of the start event).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::printf("CUDA error %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_));     \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

__global__ void fill(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    // a finite bf16: sign, exponent 120..134, mantissa
    p[i] = uint16_t(((h & 1u) << 15) | ((120u + (h >> 1) % 15u) << 7) | ((h >> 8) & 0x7fu));
  }
}

// Keeps the GPU busy while the host enqueues the timed launch (as torch.cuda._sleep does in
// symmoe.bench), so the events bracket device time, not the host's launch latency.
__global__ void spin(int64_t cycles) {
  const int64_t t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

static float time_us(const std::function<void()>& f, int reps) {
  for (int i = 0; i < 3; ++i) f();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    spin<<<1, 1>>>(100000);  // ~50 us at 1.98 GHz
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The device's SMs and opt-in shared memory a block, with the printout's first line (the
// microbenchmarks' to_json.py reads the device name from it).
struct Device {
  int sms = 0, optin = 0;
};
inline Device device_header(int64_t rows, int64_t row_bytes) {
  Device d;
  CK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, %d B shared per block; %lld rows of %lld B\n", prop.name, d.sms, d.optin,
              (long long)rows, (long long)row_bytes);
  return d;
}
