// Channels of a streamed transfer: a range split into C near-equal contiguous parts that
// sender and receiver compute alike, and the epoch-tagged signal words that report progress
// (epoch in the high 32 bits, so a word left by an earlier call reads as "nothing yet").
#pragma once
#include <cstdint>

namespace symmoe {

__device__ __forceinline__ int64_t chan_begin(int64_t n, int c, int C) { return n * c / C; }

__device__ __forceinline__ uint64_t sig_value(int64_t epoch, int64_t count) {
  return (static_cast<uint64_t>(epoch) << 32) | static_cast<uint64_t>(count);
}

}  // namespace symmoe
