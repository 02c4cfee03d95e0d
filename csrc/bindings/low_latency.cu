// symmoe_ll: the low-latency mode's kernels (kernels/low_latency.cuh) over load/store peers.
// Pointers and streams cross as integers (no torch headers). One object per buffer keeps the
// geometry and launch shapes, so a call costs one pybind11 call and one launch.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/low_latency.cuh"

namespace py = pybind11;
using namespace symmoe;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("symmoe_ll: ") + what + ": " + cudaGetErrorString(e));
}

template <class T>
T* P(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

struct LowLatency {
  ll::Geometry g{};
  ll::Device d{};
  int sms;
  size_t send_smem;

  LowLatency(const std::vector<int64_t>& geo, uintptr_t local, uintptr_t peer_bases, uintptr_t state, uintptr_t err,
             uintptr_t err_host, double timeout_s, int num_sms)
      : sms(num_sms) {
    if (geo.size() != 17) throw std::invalid_argument("symmoe_ll: geometry needs 17 values");
    int* gi[] = {&g.rank, &g.W, &g.L, &g.E, &g.K, &g.T_max, &g.H};
    for (int i = 0; i < 7; ++i) *gi[i] = int(geo[i]);
    int64_t* go[] = {&g.dflag, &g.cflag, &g.dmeta, &g.dx, &g.cx, &g.dflag_p, &g.cflag_p, &g.dmeta_p, &g.dx_p, &g.cx_p};
    for (int i = 0; i < 10; ++i) *go[i] = geo[7 + i];
    if (g.W > ll::kMaxWorld || g.K > ll::kMaxTopk || g.H % 8)
      throw std::invalid_argument("symmoe_ll: world_size, topk or hidden out of range");
    if (num_sms < 1)  // symmoe/launch_shape.py's low_latency_blocks gives at least 1
      throw std::invalid_argument("symmoe_ll: num_sms=" + std::to_string(num_sms) + ", the most blocks a kernel "
                                  "launches must be >= 1 (symmoe/launch_shape.py decides it)");
    d = ll::Device{P<uint8_t>(local), P<const int64_t>(peer_bases), P<int>(state), P<ErrorWord>(err),
                   P<ErrorWord>(err_host), uint64_t(timeout_s * 1e9)};
    send_smem = size_t(g.T_max) * g.K * sizeof(int);
    if (send_smem > 48 * 1024)
      check(cudaFuncSetAttribute(ll::dispatch_send_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(send_smem)),
            "dispatch_send_kernel shared memory (T_max * topk ids)");
  }

  int blocks(int64_t work) const { return int(std::max<int64_t>(1, std::min<int64_t>(work, sms))); }

  void dispatch_send(uintptr_t x, uintptr_t topk_idx, int T, uintptr_t stream) {
    const int grid = blocks((g.E + ll::kWarps - 1) / ll::kWarps);
    ll::dispatch_send_kernel<<<grid, ll::kThreads, size_t(T) * g.K * sizeof(int), P<CUstream_st>(stream)>>>(
        g, d, P<const int4>(x), P<const int64_t>(topk_idx), T);
    check(cudaGetLastError(), "dispatch_send_kernel launch");
  }
  void dispatch_recv(uintptr_t recv_x, uintptr_t count, uintptr_t info, uintptr_t slot, uintptr_t range,
                     uintptr_t stream) {
    ll::dispatch_recv_kernel<<<blocks(g.L), ll::kThreads, 0, P<CUstream_st>(stream)>>>(
        g, d, P<int4>(recv_x), P<int>(count), P<int>(info), P<int>(slot), P<int64_t>(range));
    check(cudaGetLastError(), "dispatch_recv_kernel launch");
  }
  void combine_send(uintptr_t y, uintptr_t info, uintptr_t slot, uintptr_t range, uintptr_t stream) {
    ll::combine_send_kernel<<<blocks(g.L), ll::kThreads, 0, P<CUstream_st>(stream)>>>(
        g, d, P<const int4>(y), P<const int>(info), P<const int>(slot), P<const int64_t>(range));
    check(cudaGetLastError(), "combine_send_kernel launch");
  }
  void combine_recv(uintptr_t topk_idx, uintptr_t topk_weights, int T, uintptr_t out, uintptr_t stream) {
    ll::combine_recv_kernel<<<blocks(T), ll::kThreads, 0, P<CUstream_st>(stream)>>>(
        g, d, P<const int64_t>(topk_idx), P<const float>(topk_weights), T, P<int4>(out));
    check(cudaGetLastError(), "combine_recv_kernel launch");
  }
};

}  // namespace

PYBIND11_MODULE(symmoe_ll, m) {
  m.doc() = "symmoe low-latency dispatch/combine kernels over load/store peers";
  m.attr("STAGES") = py::dict(py::arg("low_latency_dispatch.receive") = int(ll::kStageDispatchRecv),
                              py::arg("low_latency_combine.receive") = int(ll::kStageCombineRecv),
                              py::arg("bad expert") = int(ll::kStageBadExpert));
  m.def("host_alloc_mapped", [](size_t nbytes) {
    void* h = nullptr;
    check(cudaHostAlloc(&h, nbytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
    std::memset(h, 0, nbytes);
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, h, 0), "cudaHostGetDevicePointer");
    return py::make_tuple(reinterpret_cast<uintptr_t>(h), reinterpret_cast<uintptr_t>(dev));
  }, "Pinned host memory the device can write: (host pointer, device pointer).");
  m.def("host_free", [](uintptr_t h) { check(cudaFreeHost(reinterpret_cast<void*>(h)), "cudaFreeHost"); });
  py::class_<LowLatency>(m, "LowLatency")
      .def(py::init<const std::vector<int64_t>&, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, double, int>(),
           py::arg("geometry"), py::arg("local"), py::arg("peer_bases"), py::arg("state"), py::arg("err"),
           py::arg("err_host"), py::arg("timeout_s"), py::arg("num_sms"))
      .def("dispatch_send", &LowLatency::dispatch_send)
      .def("dispatch_recv", &LowLatency::dispatch_recv)
      .def("combine_send", &LowLatency::combine_send)
      .def("combine_recv", &LowLatency::combine_recv);
}
