// symmoe_ll: the low-latency mode's kernels (kernels/low_latency.cuh) over load/store peers.
// Pointers and streams cross as integers (no torch headers). One object per buffer keeps the
// geometry and launch shapes, so a call costs one pybind11 call and one launch.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/fp8_pack.cuh"
#include "../kernels/low_latency.cuh"
#include "cuda_check.h"
#include "host_mapped.h"

namespace py = pybind11;
using namespace symmoe;

namespace {

struct LowLatency {
  ll::Geometry g{};
  ll::Device d{};
  int sms;    // blocks of every grid at most (the host's SM budget for this rank)
  int ce;     // experts a dispatch-send block lists at a time (ce * T ints of shared memory)
  int parts;  // blocks per local expert of the dispatch receive and the combine send

  LowLatency(const std::vector<int64_t>& geo, uintptr_t local, uintptr_t peer_bases, uintptr_t state, uintptr_t err,
             uintptr_t err_host, double timeout_s, int num_sms)
      : sms(std::max(1, num_sms)) {
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
                   P<ErrorWord>(err_host), uint64_t(timeout_s * 1e9), nullptr};
    // Dispatch send: a block owns ceil(E / grid) experts and lists up to ce of them at a time.
    const int grid = std::min(sms, g.E);
    ce = std::min(ll::kWarps, (g.E + grid - 1) / grid);
    int dev = 0, max_smem = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "shared memory limit");
    const int64_t per_expert = int64_t(g.T_max) * sizeof(int), room = int64_t(max_smem) - 1024;  // static smem
    ce = int(std::min<int64_t>(ce, room / per_expert));
    if (ce < 1)
      throw std::invalid_argument("symmoe_ll: num_max_dispatch_tokens_per_rank=" + std::to_string(g.T_max) +
                                  " needs " + std::to_string(per_expert) + " bytes of shared memory per expert list; "
                                  "this GPU has " + std::to_string(room) + " (lower num_max_dispatch_tokens_per_rank)");
    const int64_t smem = ce * per_expert;
    if (smem > 48 * 1024)
      check(cudaFuncSetAttribute(ll::dispatch_send_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
            "dispatch_send_kernel shared memory (expert row lists)");
    parts = std::max(1, sms / g.L);
  }

  // Phase stamps (ll::Device::stamps): 4 kernels x 3 uint64 at `stamps`, or 0 for none. Launches
  // after this call stamp; the caller resets the values before each call it measures.
  void set_stamps(uintptr_t stamps) { d.stamps = P<unsigned long long>(stamps); }

  int expert_grid() const { return std::max(1, std::min(sms, g.L * parts)); }

  // The int4 of each row a dispatch moves: row_bytes (FP8 rows: data then scales), 0 = whole rows.
  int row16(int64_t row_bytes) const {
    if (row_bytes == 0) return g.H / 8;
    if (row_bytes < 0 || row_bytes % 16 || row_bytes > int64_t(g.H) * 2)
      throw std::invalid_argument("symmoe_ll: row_bytes=" + std::to_string(row_bytes) +
                                  "; allowed: a multiple of 16 up to the row's " + std::to_string(2 * g.H) + " bytes");
    return int(row_bytes / 16);
  }

  void dispatch_send(uintptr_t x, uintptr_t topk_idx, int T, uintptr_t stream, int64_t row_bytes) {
    const int grid = std::min(sms, g.E), m16 = row16(row_bytes);
    ll::dispatch_send_kernel<<<grid, ll::kThreads, size_t(ce) * T * sizeof(int), P<CUstream_st>(stream)>>>(
        g, d, P<const int4>(x), P<const int64_t>(topk_idx), T, ce, m16);
    check(cudaGetLastError(), "dispatch_send_kernel launch");
  }
  void dispatch_recv(uintptr_t recv_x, uintptr_t count, uintptr_t info, uintptr_t slot, uintptr_t range,
                     uintptr_t stream, int64_t row_bytes) {
    const int m16 = row16(row_bytes);
    ll::dispatch_recv_kernel<<<expert_grid(), ll::kThreads, 0, P<CUstream_st>(stream)>>>(
        g, d, P<int4>(recv_x), P<int>(count), P<int>(info), P<int>(slot), P<int64_t>(range), parts, m16);
    check(cudaGetLastError(), "dispatch_recv_kernel launch");
  }
  void combine_send(uintptr_t y, uintptr_t info, uintptr_t slot, uintptr_t range, uintptr_t stream) {
    ll::combine_send_kernel<<<expert_grid(), ll::kThreads, 0, P<CUstream_st>(stream)>>>(
        g, d, P<const int4>(y), P<const int>(info), P<const int>(slot), P<const int64_t>(range), parts);
    check(cudaGetLastError(), "combine_send_kernel launch");
  }
  void combine_recv(uintptr_t topk_idx, uintptr_t topk_weights, int T, uintptr_t out, uintptr_t stream) {
    // Blocks per token when the grid outnumbers the tokens: each takes kThreads columns at a time.
    const int tparts = std::max(1, std::min(sms / std::max(1, T), (g.H / 8 + ll::kThreads - 1) / ll::kThreads));
    const int grid = std::max(1, std::min(sms, T * tparts));
    ll::combine_recv_kernel<<<grid, ll::kThreads, 0, P<CUstream_st>(stream)>>>(
        g, d, P<const int64_t>(topk_idx), P<const float>(topk_weights), T, P<int4>(out), tparts);
    check(cudaGetLastError(), "combine_recv_kernel launch");
  }
  // The launch shapes, for the benchmark's notes and the tests.
  py::dict shapes() const {
    return py::dict(py::arg("sms") = sms, py::arg("dispatch_send_blocks") = std::min(sms, g.E),
                    py::arg("experts_listed_at_once") = ce, py::arg("expert_blocks") = expert_grid(),
                    py::arg("blocks_per_expert") = parts, py::arg("threads") = ll::kThreads);
  }
};

// The benchmark's expert-op stand-in over the received rows only (ll::masked_scale_kernel).
void masked_scale(uintptr_t x, uintptr_t count, uintptr_t scale, uintptr_t out, int L, int64_t rows, int hidden,
                  int blocks_per_expert, uintptr_t stream) {
  if (hidden % 8) throw std::invalid_argument("symmoe_ll.masked_scale: hidden must be a multiple of 8");
  const dim3 grid(std::max(1, blocks_per_expert), std::max(1, L));
  ll::masked_scale_kernel<<<grid, 256, 0, P<CUstream_st>(stream)>>>(P<const int4>(x), P<const int>(count),
                                                                    P<const __nv_bfloat16>(scale), P<int4>(out), rows,
                                                                    hidden / 8);
  check(cudaGetLastError(), "masked_scale_kernel launch");
}

// use_fp8's rows (kernels/fp8_pack.cuh): x bfloat16 [T, H] -> e4m3 bytes and float32 scales in
// the first bytes of each row of out (rows 2H bytes apart), as symmoe/fp8.py's quantize + pack.
void fp8_pack(uintptr_t x, uintptr_t out, int64_t T, int hidden, bool round_scale, uintptr_t stream) {
  if (hidden % kFp8Block || T < 0)
    throw std::invalid_argument("symmoe_ll.fp8_pack: hidden=" + std::to_string(hidden) + ", T=" + std::to_string(T) +
                                "; hidden must be a multiple of 128 and T >= 0");
  const int64_t warps = T * (hidden / kFp8Block);
  if (warps == 0) return;
  fp8_pack_kernel<<<unsigned((warps + 7) / 8), 256, 0, P<CUstream_st>(stream)>>>(P<const __nv_bfloat16>(x),
                                                                                  P<uint8_t>(out), T, hidden,
                                                                                  round_scale);
  check(cudaGetLastError(), "fp8_pack_kernel launch");
}

}  // namespace

PYBIND11_MODULE(symmoe_ll, m) {
  m.doc() = "symmoe low-latency dispatch/combine kernels over load/store peers";
  m.attr("STAGES") = py::dict(py::arg("low_latency_dispatch.receive") = int(ll::kStageDispatchRecv),
                              py::arg("low_latency_combine.receive") = int(ll::kStageCombineRecv),
                              py::arg("bad expert") = int(ll::kStageBadExpert));
  bind_host_mapped(m);
  py::class_<LowLatency>(m, "LowLatency")
      .def(py::init<const std::vector<int64_t>&, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, double, int>(),
           py::arg("geometry"), py::arg("local"), py::arg("peer_bases"), py::arg("state"), py::arg("err"),
           py::arg("err_host"), py::arg("timeout_s"), py::arg("num_sms"))
      .def("dispatch_send", &LowLatency::dispatch_send)
      .def("dispatch_recv", &LowLatency::dispatch_recv)
      .def("combine_send", &LowLatency::combine_send)
      .def("combine_recv", &LowLatency::combine_recv)
      .def("shapes", &LowLatency::shapes)
      .def("set_stamps", &LowLatency::set_stamps);
  m.def("masked_scale", &masked_scale, py::arg("x"), py::arg("count"), py::arg("scale"), py::arg("out"), py::arg("L"),
        py::arg("rows"), py::arg("hidden"), py::arg("blocks_per_expert"), py::arg("stream"),
        "out[j, q] = x[j, q] * scale[j] (bfloat16) for q < count[j]: the benchmark's expert op, received rows only.");
  m.def("fp8_pack", &fp8_pack, py::arg("x"), py::arg("out"), py::arg("T"), py::arg("hidden"), py::arg("round_scale"),
        py::arg("stream"), "FP8 rows of x into out (symmoe.fp8 quantize + pack) in one kernel.");
}
