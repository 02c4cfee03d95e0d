// FP8 dispatch rows (symmoe/fp8.py): each token's e4m3 bytes and its scale words travel as one
// byte row. pack builds those rows from (data [T, H], scales [T, S] words); unpack splits
// received rows back into data [M, H] (contiguous) and scales [M, S] at any strides (row-major,
// or DeepGEMM's MN-major TMA-aligned layout). Byte copies only: bitwise what torch's strided
// copies give, in one launch each instead of two or three, 16 bytes a thread for the data.
#pragma once
#include <cstdint>

namespace symmoe {

// Units of one row: H / 16 data vectors, then S scale words.
__global__ void __launch_bounds__(256) fp8_rows_pack_kernel(const uint8_t* data, const int32_t* scales, uint8_t* out,
                                                            int64_t T, int H, int S, int64_t row_bytes) {
  const int per_row = H / 16 + S;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < T * per_row;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / per_row;
    const int k = int(u - t * per_row);
    uint8_t* row = out + t * row_bytes;
    if (k < H / 16)
      reinterpret_cast<int4*>(row)[k] = reinterpret_cast<const int4*>(data + t * H)[k];
    else
      reinterpret_cast<int32_t*>(row + H)[k - H / 16] = scales[t * S + (k - H / 16)];
  }
}

// Scale word (m, j) lands at scales[m * scale_row + j * scale_col] (words).
__global__ void __launch_bounds__(256) fp8_rows_unpack_kernel(const uint8_t* rows, int64_t M, int H, int S,
                                                              int64_t row_bytes, uint8_t* data, int32_t* scales,
                                                              int64_t scale_row, int64_t scale_col) {
  const int per_row = H / 16 + S;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < M * per_row;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = u / per_row;
    const int k = int(u - m * per_row);
    const uint8_t* row = rows + m * row_bytes;
    if (k < H / 16) {
      reinterpret_cast<int4*>(data + m * H)[k] = reinterpret_cast<const int4*>(row)[k];
    } else {
      const int j = k - H / 16;
      scales[m * scale_row + j * scale_col] = reinterpret_cast<const int32_t*>(row + H)[j];
    }
  }
}

}  // namespace symmoe
