// symmoe_host: the tensors of a GPU dispatch, made and cut in C++.
//
// On a GPU machine's host every tensor Python makes costs 3-6 µs (a CUDA torch.empty about 6,
// a slice 3-5), and a small-batch dispatch made about a dozen of them: more host time than its
// kernels take on the device. Here they cost about a microsecond each, and one call makes all
// of a dispatch's outputs (``outputs``), all of its views (``cut``), a combine's outputs, where
// an FP8 dispatch's rows are split to, or a low-latency dispatch's outputs. Only torch's C++ API is
// used (no CUDA header): the module builds against a CPU-only torch as on the GPU machine.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

at::TensorOptions on(const at::Device& device, at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(device);
}

void check_count(const char* what, int64_t n) {
  if (n < 0) throw std::invalid_argument(std::string(what) + "=" + std::to_string(n) + ": must be >= 0");
}

// A dispatch's outputs of `rows` rows (outputs.dispatch_outputs): x [rows, cols] of `dtype`;
// the received expert ids and weights, [rows, idx_cols] (rank-major: top-k per row) or [rows]
// (idx_cols 0, expert-major); `offsets` int64 group starts (expert-major, else None); the int32
// block of `block_words` (outputs.Int32Block); and a [tokens, world] bool is_token_in_rank
// (None when tokens < 0).
py::tuple outputs(int64_t rows, int64_t cols, at::ScalarType dtype, int64_t idx_cols, int64_t offsets,
                  int64_t block_words, int64_t tokens, int64_t world, const at::Device& device) {
  check_count("rows", rows);
  check_count("cols", cols);
  check_count("idx_cols", idx_cols);
  check_count("offsets", offsets);
  check_count("block_words", block_words);
  const auto per_row = idx_cols ? std::vector<int64_t>{rows, idx_cols} : std::vector<int64_t>{rows};
  at::Tensor x = at::empty({rows, cols}, on(device, dtype));
  at::Tensor idx = at::empty(per_row, on(device, at::kLong));
  at::Tensor w = at::empty(per_row, on(device, at::kFloat));
  py::object offs = py::none(), in_rank = py::none();
  if (offsets) offs = py::cast(at::empty({offsets}, on(device, at::kLong)));
  at::Tensor block = at::empty({std::max<int64_t>(block_words, 1)}, on(device, at::kInt));
  if (tokens >= 0) in_rank = py::cast(at::empty({tokens, world}, on(device, at::kBool)));
  return py::make_tuple(x, idx, w, offs, block, in_rank);
}

// A combine's outputs: x [tokens, hidden] of `dtype` and, for weights_cols > 0, the combined
// weights [tokens, weights_cols] float32 (else None).
py::tuple combine_outputs(int64_t tokens, int64_t hidden, at::ScalarType dtype, int64_t weights_cols,
                          const at::Device& device) {
  check_count("tokens", tokens);
  check_count("hidden", hidden);
  py::object w = py::none();
  if (weights_cols > 0) w = py::cast(at::empty({tokens, weights_cols}, on(device, at::kFloat)));
  return py::make_tuple(at::empty({tokens, hidden}, on(device, dtype)), w);
}

// Where an FP8 dispatch's received rows are split to (fp8.unpack): e4m3 data [rows, hidden]
// and scales [rows, scale_cols] of `scale_dtype`, row-major or, mn_major, DeepGEMM's MN-major
// TMA-aligned layout (fp8.mn_major_like: a [scale_cols, align(rows, 4)] store seen transposed);
// with the scales' strides in elements (row, column).
py::tuple fp8_split_outputs(int64_t rows, int64_t hidden, int64_t scale_cols, at::ScalarType scale_dtype,
                            bool mn_major, const at::Device& device) {
  check_count("rows", rows);
  check_count("hidden", hidden);
  check_count("scale_cols", scale_cols);
  at::Tensor data = at::empty({rows, hidden}, on(device, at::kFloat8_e4m3fn));
  if (!mn_major) return py::make_tuple(data, at::empty({rows, scale_cols}, on(device, scale_dtype)), scale_cols, 1);
  const int64_t aligned = (rows + 3) / 4 * 4;  // fp8.tma_aligned_rows(rows, 4)
  at::Tensor scales = at::empty({scale_cols, aligned}, on(device, scale_dtype)).narrow(1, 0, rows).t();
  return py::make_tuple(data, scales, 1, aligned);
}

// The low-latency dispatch's outputs (protocol/low_latency.py's _Engine._outputs): recv_x
// bfloat16 [L, rows, hidden], count int32 [L], src_info and src_slot int32 [L, rows], the
// layout range int64 [L, world]. Its five allocations took a quarter of its host time from Python.
py::tuple low_latency_outputs(int64_t local_experts, int64_t rows, int64_t hidden, int64_t world,
                              const at::Device& device) {
  check_count("local_experts", local_experts);
  check_count("rows", rows);
  check_count("hidden", hidden);
  check_count("world", world);
  return py::make_tuple(at::empty({local_experts, rows, hidden}, on(device, at::kBFloat16)),
                        at::empty({local_experts}, on(device, at::kInt)),
                        at::empty({local_experts, rows}, on(device, at::kInt)),
                        at::empty({local_experts, rows}, on(device, at::kInt)),
                        at::empty({local_experts, world}, on(device, at::kLong)));
}

// The first n rows of t: t itself when that is all of them.
at::Tensor head(const at::Tensor& t, int64_t n) { return t.size(0) == n ? t : t.narrow(0, 0, n); }

// The first n rows of a dispatch's x, idx and w, and n words of the block's source rank, token
// and slot pieces (at word offsets rank, token, slot): recv_views' six tensors.
py::tuple cut(int64_t n, const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w, const at::Tensor& block,
              int64_t rank, int64_t token, int64_t slot) {
  check_count("n", n);
  if (n > x.size(0) || n > idx.size(0) || n > w.size(0))
    throw std::invalid_argument("cut: " + std::to_string(n) + " rows of outputs of " + std::to_string(x.size(0)) +
                                " rows");
  const int64_t words = block.size(0);
  for (int64_t at_word : {rank, token, slot})
    if (at_word < 0 || at_word + n > words)
      throw std::invalid_argument("cut: a piece at word " + std::to_string(at_word) + " of " + std::to_string(n) +
                                  " words does not fit the block's " + std::to_string(words));
  return py::make_tuple(head(x, n), head(idx, n), head(w, n), block.narrow(0, rank, n), block.narrow(0, token, n),
                        block.narrow(0, slot, n));
}

}  // namespace

PYBIND11_MODULE(symmoe_host, m) {
  m.doc() = "A GPU dispatch's output tensors, made and cut in C++ (symmoe/protocol/outputs.py)";
  m.def("outputs", &outputs, py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("idx_cols"),
        py::arg("offsets"), py::arg("block_words"), py::arg("tokens"), py::arg("world"), py::arg("device"));
  m.def("combine_outputs", &combine_outputs, py::arg("tokens"), py::arg("hidden"), py::arg("dtype"),
        py::arg("weights_cols"), py::arg("device"));
  m.def("fp8_split_outputs", &fp8_split_outputs, py::arg("rows"), py::arg("hidden"), py::arg("scale_cols"),
        py::arg("scale_dtype"), py::arg("mn_major"), py::arg("device"));
  m.def("low_latency_outputs", &low_latency_outputs, py::arg("local_experts"), py::arg("rows"), py::arg("hidden"),
        py::arg("world"), py::arg("device"));
  m.def("cut", &cut, py::arg("n"), py::arg("x"), py::arg("idx"), py::arg("w"), py::arg("block"), py::arg("rank"),
        py::arg("token"), py::arg("slot"));
}
