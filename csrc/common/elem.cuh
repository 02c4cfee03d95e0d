// Element types of the payload (bf16, fp16, fp32) and their conversions to fp32, where every
// reduction happens: one element (Elem) or a 16-byte vector of them (Vec).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace symmoe {

template <typename T>
struct Elem;
template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Elem<__half> {
  static __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_f(float v) { return __float2half_rn(v); }
};
template <>
struct Elem<float> {
  static __device__ __forceinline__ float to_f(float v) { return v; }
  static __device__ __forceinline__ float from_f(float v) { return v; }
};

template <typename T>
struct Vec {  // 16 bytes of T <-> N floats
  static constexpr int N = 16 / sizeof(T);
  __device__ static void load(const int4& v, float* f) {
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = Elem<T>::to_f(h[i]);
  }
  __device__ static int4 store(const float* f) {
    int4 v;
    T* h = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = Elem<T>::from_f(f[i]);
    return v;
  }
};

}  // namespace symmoe
