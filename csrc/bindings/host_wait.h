// The host's one wait of a dispatch: spin on a host-mapped word the routing kernel writes
// (DeepEP's way of reading its receive counts), instead of synchronising on an event.
#pragma once
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "../common/layout.cuh"

namespace symmoe {

// Spin until *word == value or the ErrorWord at err_host records a failed wait, for at most
// max_s seconds. True when one of the two happened; false after max_s. The caller has
// released the GIL.
inline bool spin_mapped(uintptr_t word, int64_t value, uintptr_t err_host, double max_s) {
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

// An exact-size dispatch's wait and what it reads once the counts are in, where the host built
// the result beforehand (protocol/counts.py's Guess): the checks and the two copies of its
// fast path, here because a GPU machine's host took 10-17 µs for them in Python while only
// the data kernel's last ~21 µs hide the host's work.
class CountsWait {
 public:
  enum : int { kTimedOut = 0, kReady = 1, kFilled = 2 };

  // Host addresses: the ready word, the ErrorWord, the DeferredError record (0: none), the
  // summary (kernels/route.cuh's CountsSummary: `head` words, then the per-expert counts) and
  // the counts matrix of `counts_words` int32.
  CountsWait(uintptr_t ready, uintptr_t err_host, uintptr_t deferred_host, uintptr_t summary, int64_t head,
             uintptr_t counts, int64_t counts_words, int64_t local_experts, int64_t recv_rows)
      : ready_(ready), err_(err_host), deferred_(deferred_host), summary_(reinterpret_cast<const int32_t*>(summary)),
        head_(head), counts_(counts), counts_words_(counts_words), local_experts_(local_experts), recv_rows_(recv_rows) {}

  // kTimedOut after max_s; kReady when the counts are in or a failure is recorded (the caller
  // reads them); kFilled when, besides, nothing is to be raised and this rank and every
  // receiver got exactly `rows` rows (> 0), which fit: the matrix and the per-expert counts
  // are then copied to counts_dst / per_expert_dst, and the caller's result is complete.
  int wait(int64_t epoch, double max_s, int64_t rows, bool expert_major, uintptr_t counts_dst,
           uintptr_t per_expert_dst) const {
    pybind11::gil_scoped_release nogil;  // other Python threads run while this one spins
    if (!spin_mapped(ready_, epoch, err_, max_s)) return kTimedOut;
    if (rows <= 0 || __atomic_load_n(reinterpret_cast<int64_t*>(ready_), __ATOMIC_ACQUIRE) != epoch) return kReady;
    if (err_ && __atomic_load_n(&reinterpret_cast<ErrorWord*>(err_)->stage, __ATOMIC_ACQUIRE) != 0) return kReady;
    if (deferred_ && __atomic_load_n(reinterpret_cast<int64_t*>(deferred_), __ATOMIC_ACQUIRE) != 0) return kReady;
    const int32_t* s = summary_;  // [0] bad ids, [1] / [2] rank-major rows and most, [3] / [4] expert-major
    const int64_t got = s[expert_major ? 3 : 1], most = s[expert_major ? 4 : 2];
    if (s[0] != 0 || got != rows || most != rows || most > recv_rows_) return kReady;
    std::memcpy(reinterpret_cast<void*>(counts_dst), reinterpret_cast<const void*>(counts_), 4 * counts_words_);
    std::memcpy(reinterpret_cast<void*>(per_expert_dst), s + head_, 4 * local_experts_);
    return kFilled;
  }

 private:
  uintptr_t ready_, err_, deferred_;
  const int32_t* summary_;
  int64_t head_;
  uintptr_t counts_;
  int64_t counts_words_, local_experts_, recv_rows_;
};

inline void bind_counts_wait(pybind11::module_& m) {
  pybind11::class_<CountsWait>(m, "CountsWait", pybind11::module_local())  // both extensions bind it
      .def(pybind11::init<uintptr_t, uintptr_t, uintptr_t, uintptr_t, int64_t, uintptr_t, int64_t, int64_t, int64_t>(),
           pybind11::arg("ready"), pybind11::arg("err_host"), pybind11::arg("deferred_host"), pybind11::arg("summary"),
           pybind11::arg("head"), pybind11::arg("counts"), pybind11::arg("counts_words"),
           pybind11::arg("local_experts"), pybind11::arg("recv_rows"))
      .def("wait", &CountsWait::wait,
           "wait(epoch, max_s, rows, expert_major, counts_dst, per_expert_dst): TIMED_OUT, READY or FILLED "
           "(rows 0: no guess to fill)");
  m.attr("COUNTS_TIMED_OUT") = int(CountsWait::kTimedOut);
  m.attr("COUNTS_READY") = int(CountsWait::kReady);
  m.attr("COUNTS_FILLED") = int(CountsWait::kFilled);
}

}  // namespace symmoe
