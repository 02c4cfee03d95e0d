// symmoe_cuda: the kernels over the load/store (LSA) transport, for backends whose peers'
// segments are mapped into this process (torch symmetric memory). Pointers, sizes and CUDA
// streams cross from Python as integers: no torch headers, so this builds with a CPU torch.
// Also `alone`, a one-rank dispatch from plain routing tables, which the nvshmem protocol
// launches alone, and the FP8 dispatch's row packing, which every backend's Buffer uses.
#include "../common/transport.cuh"
#include "alone_launch.cuh"
#include "bind_context.cuh"
#include "fp8_rows_launch.cuh"

using namespace symmoe;

namespace py = pybind11;

PYBIND11_MODULE(symmoe_cuda, m) {
  m.doc() = "symmoe CUDA kernels over the load/store (LSA) transport";
  bind_context<LsaTransport>(m, [](const std::vector<int64_t>& layout, int rank, uintptr_t local, uintptr_t peer_bases,
                                   uintptr_t err, uintptr_t err_host, double timeout_s,
                                   const std::vector<int64_t>& geometry, uintptr_t counters) {
    return new Ctx<LsaTransport>(layout, rank, LsaTransport{P<uint8_t>(local), P<const int64_t>(peer_bases)}, err,
                                 err_host, timeout_s, geometry, counters);
  });
  m.def("alone", &launch_alone, py::arg("layout"), py::arg("expert_major"), py::arg("alignment"), py::arg("capacity"),
        py::arg("epoch"), py::arg("timeout_ns"), py::arg("ptrs"), py::arg("mode"), py::arg("blocks"), py::arg("sms"),
        py::arg("done"), py::arg("err"), py::arg("err_host"), py::arg("stream"),
        "A one-rank dispatch (kernels/alone.cuh) from a protocol's own routing tables: expert-major the phased "
        "fan-out, rank-major the mover. False: not launched (peers, or no row fits in shared memory).");
  m.def("fp8_pack_rows", &fp8_pack_rows, py::arg("data"), py::arg("scales"), py::arg("out"), py::arg("tokens"),
        py::arg("hidden"), py::arg("scale_words"), py::arg("row_bytes"), py::arg("stream"),
        "An FP8 dispatch's rows: each token's e4m3 bytes, then its scale words (symmoe/fp8.py pack).");
  m.def("fp8_unpack_rows", &fp8_unpack_rows, py::arg("rows"), py::arg("count"), py::arg("hidden"),
        py::arg("scale_words"), py::arg("row_bytes"), py::arg("data"), py::arg("scales"), py::arg("scale_row"),
        py::arg("scale_col"), py::arg("stream"),
        "Received FP8 rows split into contiguous e4m3 data and scale words at the given strides (symmoe/fp8.py unpack).");
}
