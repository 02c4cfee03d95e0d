// The bindings' CUDA error check and the casts of the integers Python passes (pointers and
// streams cross as integers, so no torch header is needed).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace symmoe {

// Throws std::runtime_error "<what>: <CUDA's error string>" unless `e` is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
T* P(uintptr_t v) {
  return reinterpret_cast<T*>(v);
}

inline cudaStream_t S(uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); }

}  // namespace symmoe
