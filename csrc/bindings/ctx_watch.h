// What a Context's kernels need to watch for stalls: the ErrorWord pair a timed-out wait records
// into (the host reads the host-mapped one), the timeout, and the zeroed grid counters, one per
// kernel kind. Fixed at construction.
#pragma once
#include <cstdint>

#include "../common/barrier.cuh"

namespace symmoe {

// Which of the caller's 8 grid counters (`done`) each kernel kind meets on.
enum CtxCounter : int {
  kCounterRoute = 0,        // route_kernel
  kCounterPull = 1,         // pull_kernel
  kCounterPush = 2,         // push_kernel, push_stream_kernel, the alone kernels
  kCounterCombineSend = 3,  // combine_send_kernel
  kCounterReduce = 4,       // combine_reduce_kernel
  kCounterCount = 5,        // route_count_kernel (get_dispatch_layout)
  kCounterRepublish = 6,    // republish_kernel
  kCounterTicket = 7,       // the routing's chunk tickets
};

struct CtxWatch {
  int rank;
  ErrorWord* err;       // device memory (the kernels poll it)
  ErrorWord* err_host;  // host-mapped (device-side address): the host raises StallError from it
  uint64_t timeout_ns;  // kernel.timeout_s
  unsigned int* done;   // [8] grid counters, zeroed by the caller (CtxCounter)

  Sync sync(int64_t epoch, CtxCounter which) const {
    return Sync{rank, epoch, timeout_ns, err, err_host, done + which};
  }
};

}  // namespace symmoe
