// Pinned host memory the device writes and the host reads without a copy (error words, the
// counts a host wait polls): one binding for every module that has device waits.
#pragma once
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>

#include "cuda_check.h"

namespace symmoe {

inline void bind_host_mapped(pybind11::module_& m) {
  m.def("host_alloc_mapped", [](size_t nbytes) {
    void* h = nullptr;
    check(cudaHostAlloc(&h, nbytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
    std::memset(h, 0, nbytes);
    void* d = nullptr;
    check(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer");
    return pybind11::make_tuple(reinterpret_cast<uintptr_t>(h), reinterpret_cast<uintptr_t>(d));
  }, "Pinned host memory the device can write: (host pointer, device pointer).");
  m.def("host_free", [](uintptr_t h) { check(cudaFreeHost(reinterpret_cast<void*>(h)), "cudaFreeHost"); });
}

}  // namespace symmoe
