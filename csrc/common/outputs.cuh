// A receiver's output tensors, as every dispatch kernel writes them, and the padding rows of
// the expert-major layout.
#pragma once
#include <cstdint>

namespace symmoe {

struct Outputs {  // a receiver's output tensors (worst-case sized by the host)
  uint8_t* x;          // [cap, H]
  int64_t* idx;        // [cap, K] rank-major, [cap] expert-major
  float* w;            // same shape as idx
  int32_t* src_rank;   // [cap]
  int32_t* src_token;  // [cap]
  int32_t* src_slot;   // [cap]
  int64_t* expert_offsets;  // [L + 1] (expert-major) or nullptr
  int32_t* selfmap;    // [T * S] output row of each (token, slot) of this rank's own tokens that
                       // it kept: combine reduces those rows where they lie (nullptr: not kept)
  int64_t capacity;    // rows the tensors hold
  // An FP8 dispatch's rows split on the way out (fp8_data != nullptr): the e4m3 bytes of a row
  // go to fp8_data [cap, fp8_h], its scale words to fp8_scales [cap, fp8_s] (row-major), and
  // `x` is not written. Only the unpack writes rows then: the push kernel sends a rank's own
  // rows through its own pool as a peer's (a bulk store cannot split a row).
  uint8_t* fp8_data = nullptr;
  int32_t* fp8_scales = nullptr;
  int32_t fp8_h = 0, fp8_s = 0;

  __host__ __device__ bool split() const { return fp8_data != nullptr; }
};

// Zero-filled padding rows of the expert-major output (ids -1, weights 0, sources -1), and
// the group starts. goff: [Le + 1] padded starts; count(j): group j's unpadded rows. Block
// blk of nblk shares the groups (default: the whole grid).
template <typename G, class Count>
__device__ void fill_padding(const G* goff, Count count, int Le, const Outputs& o, int64_t row_bytes,
                             int blk = -1, int nblk = -1) {
  if (blk < 0) blk = int(blockIdx.x), nblk = int(gridDim.x);
  if (blk == 0)
    for (int j = threadIdx.x; j <= Le; j += blockDim.x) o.expert_offsets[j] = goff[j];
  for (int j = blk; j < Le; j += nblk) {
    const int64_t a = goff[j] + count(j), b = goff[j + 1];
    if (a >= b || b > o.capacity) continue;
    if (o.split()) {  // zero bytes, as the split of a zero row gives
      const int64_t nvec = (b - a) * o.fp8_h / 16;
      int4* x = reinterpret_cast<int4*>(o.fp8_data + a * o.fp8_h);
      for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) x[i] = make_int4(0, 0, 0, 0);
      for (int64_t i = threadIdx.x; i < (b - a) * o.fp8_s; i += blockDim.x) o.fp8_scales[a * o.fp8_s + i] = 0;
    } else {
      const int64_t nvec = (b - a) * row_bytes / 16;
      int4* x = reinterpret_cast<int4*>(o.x + a * row_bytes);
      for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) x[i] = make_int4(0, 0, 0, 0);
    }
    for (int64_t r = a + threadIdx.x; r < b; r += blockDim.x) {
      o.idx[r] = -1;
      o.w[r] = 0.f;
      o.src_rank[r] = -1;
      o.src_token[r] = -1;
      o.src_slot[r] = -1;
    }
  }
}

}  // namespace symmoe
