// symmoe_cuda: the kernels over the load/store (LSA) transport, for backends whose peers'
// segments are mapped into this process (torch symmetric memory). Pointers, sizes and CUDA
// streams cross from Python as integers: no torch headers, so this builds with a CPU torch.
// Also `alone`, a one-rank dispatch from plain routing tables, and `alone_routed`, one that routes
// itself, which the nvshmem protocol launches alone.
#include "../common/transport.cuh"
#include "context.cuh"
#include "alone_launch.cuh"

using namespace symmoe;

PYBIND11_MODULE(symmoe_cuda, m) {
  m.doc() = "symmoe CUDA kernels over the load/store (LSA) transport";
  bind_context<LsaTransport>(m, [](const std::vector<int64_t>& layout, int rank, uintptr_t local, uintptr_t peer_bases,
                                   uintptr_t err, uintptr_t err_host, double timeout_s, int num_sms, uintptr_t counters) {
    return new Ctx<LsaTransport>(layout, rank, LsaTransport{P<uint8_t>(local), P<const int64_t>(peer_bases)}, err,
                                 err_host, timeout_s, num_sms, counters);
  });
  m.def("alone", &launch_alone, py::arg("layout"), py::arg("expert_major"), py::arg("alignment"), py::arg("capacity"),
        py::arg("epoch"), py::arg("timeout_ns"), py::arg("ptrs"), py::arg("mode"), py::arg("blocks"), py::arg("done"),
        py::arg("err"), py::arg("err_host"), py::arg("stream"),
        "A one-rank dispatch (kernels/alone.cuh) from a protocol's own routing tables: expert-major the phased "
        "fan-out, rank-major the mover. False: not launched (peers, or no row fits in shared memory).");
  m.def("alone_routed", &launch_alone_routed_ptrs, py::arg("layout"), py::arg("expert_major"), py::arg("idx64"),
        py::arg("tokens"), py::arg("alignment"), py::arg("capacity"), py::arg("epoch"), py::arg("timeout_ns"),
        py::arg("ptrs"), py::arg("mode"), py::arg("blocks"), py::arg("done"), py::arg("err"), py::arg("err_host"),
        py::arg("stream"), py::arg("worst") = 0, py::arg("per_expert") = 0, py::arg("deferred") = 0,
        "A one-rank dispatch that routes inside its data kernel (alone_fan_routed_kernel, alone_rows_routed_kernel): `alone`'s 13 pointers, "
        "then topk_idx, topk_weights, in_rank, scratch, bad flag, bad record, host counts, ready word, summary. "
        "worst / per_expert / deferred: rank-major, num_worst_tokens' tail done by the repair kernel (0: none). "
        "False: not launched (no token, one block, fan_phases off, or no room for the routing).");
  m.def("routed_scratch_words", [](int64_t blocks, int64_t num_experts) {
    return RoutedScratch::words(blocks, 1 + num_experts);
  }, py::arg("blocks"), py::arg("num_experts"), "int32 words of alone_routed's scratch (zeroed once).");
}
