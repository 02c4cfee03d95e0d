// The FP8 dispatch's row packing and unpacking (kernels/fp8_rows.cuh), for symmoe/fp8.py's pack and
// unpack on the GPU. Module-level: every backend's Buffer packs the same way before its dispatch.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../kernels/fp8_rows.cuh"
#include "cuda_check.h"

namespace symmoe {

inline void check_fp8_rows(const char* what, int64_t rows, int hidden, int scale_words, int64_t row_bytes) {
  if (rows < 0 || hidden <= 0 || hidden % 16 || scale_words < 0 || row_bytes < hidden + 4 * scale_words ||
      row_bytes % 16)
    throw std::invalid_argument(std::string(what) + ": rows=" + std::to_string(rows) + ", hidden=" +
                                std::to_string(hidden) + ", scale_words=" + std::to_string(scale_words) +
                                ", row_bytes=" + std::to_string(row_bytes) +
                                "; hidden a multiple of 16, row_bytes a multiple of 16 holding hidden + 4 * "
                                "scale_words bytes");
}

inline unsigned fp8_rows_blocks(int64_t units) {
  return unsigned(std::min<int64_t>((units + 255) / 256, 8192));  // grid-stride beyond
}

// data e4m3 [T, H] and scale words [T, S] (contiguous) -> rows of row_bytes in out.
inline void fp8_pack_rows(uintptr_t data, uintptr_t scales, uintptr_t out, int64_t T, int hidden, int scale_words,
                          int64_t row_bytes, uintptr_t stream) {
  check_fp8_rows("fp8_pack_rows", T, hidden, scale_words, row_bytes);
  const int64_t units = T * (hidden / 16 + scale_words);
  if (!units) return;
  fp8_rows_pack_kernel<<<fp8_rows_blocks(units), 256, 0, P<CUstream_st>(stream)>>>(
      P<const uint8_t>(data), P<const int32_t>(scales), P<uint8_t>(out), T, hidden, scale_words, row_bytes);
  check(cudaGetLastError(), "fp8_rows_pack_kernel launch");
}

// M rows of row_bytes -> data [M, H] (contiguous) and scale word (m, j) at scales[m * scale_row + j * scale_col].
inline void fp8_unpack_rows(uintptr_t rows, int64_t M, int hidden, int scale_words, int64_t row_bytes,
                            uintptr_t data, uintptr_t scales, int64_t scale_row, int64_t scale_col, uintptr_t stream) {
  check_fp8_rows("fp8_unpack_rows", M, hidden, scale_words, row_bytes);
  const int64_t units = M * (hidden / 16 + scale_words);
  if (!units) return;
  fp8_rows_unpack_kernel<<<fp8_rows_blocks(units), 256, 0, P<CUstream_st>(stream)>>>(
      P<const uint8_t>(rows), M, hidden, scale_words, row_bytes, P<uint8_t>(data), P<int32_t>(scales), scale_row,
      scale_col);
  check(cudaGetLastError(), "fp8_rows_unpack_kernel launch");
}

}  // namespace symmoe
