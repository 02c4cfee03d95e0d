// The host's one wait of a dispatch: spin on a host-mapped word the routing kernel writes
// (DeepEP's way of reading its receive counts), instead of synchronising on an event.
#pragma once
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "../common/layout.cuh"

namespace symmoe {

// Spin with the GIL released until *word == value or the ErrorWord at err_host records a failed
// wait, for at most max_s seconds. True when one of the two happened: the caller then checks
// the error word; false after max_s, so the caller can ask the stream whether it faulted.
inline bool wait_mapped(uintptr_t word, int64_t value, uintptr_t err_host, double max_s) {
  pybind11::gil_scoped_release nogil;
  int64_t* w = reinterpret_cast<int64_t*>(word);
  int64_t* stage = err_host ? &reinterpret_cast<ErrorWord*>(err_host)->stage : nullptr;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(max_s);
  for (uint32_t i = 0;; ++i) {
    // Acquire: the matrix the kernel wrote before the word is read after it.
    if (__atomic_load_n(w, __ATOMIC_ACQUIRE) == value) return true;
    if (stage != nullptr && __atomic_load_n(stage, __ATOMIC_ACQUIRE) != 0) return true;
    if ((i & 1023) == 1023 && std::chrono::steady_clock::now() > end) return false;
#if defined(__x86_64__)
    _mm_pause();
#endif
  }
}

inline void bind_wait_mapped(pybind11::module_& m) {
  m.def("wait_mapped", &wait_mapped, pybind11::arg("word"), pybind11::arg("value"), pybind11::arg("err_host"),
        pybind11::arg("max_s"),
        "Spin until the host-mapped int64 at `word` equals `value` or the error word records a "
        "failure (True), or `max_s` seconds pass (False).");
}

}  // namespace symmoe
