// symmoe NCCL extension: the parts of the NCCL device API that nccl4py 0.6.0 cannot
// reach on NCCL 2.28 (its create_dev_comm / get_lsa_device_pointer assume 2.29+).
//
// nccl4py owns the communicator, the ncclMemAlloc'd segment and the symmetric window;
// this module takes their raw handles as integers and adds:
//   * the device communicator (ncclDevCommCreate/Destroy) with LSA barriers and, where
//     the communicator spans more than one LSA team, GIN signals;
//   * the LSA peer-pointer table, filled by a one-time kernel calling ncclGetLsaPointer
//     (on 2.28 there is no host ncclGetLsaDevicePointer);
//   * a device barrier with a timeout: NCCL's LSA barrier session inside the LSA team,
//     GIN signals for peers outside it;
//   * GIN puts + signals of byte ranges for peers outside the LSA team.
// Errors are raised as NcclCallError("<call> failed: <NCCL result string> ...").

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

struct NcclCallError : std::runtime_error {
  int code;
  NcclCallError(const std::string& msg, int code) : std::runtime_error(msg), code(code) {}
};

void nccl_check(ncclResult_t r, const char* call, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::ostringstream os;
  os << call << " failed: " << ncclGetErrorString(r) << " (ncclResult_t " << int(r) << ")";
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') os << "; NCCL says: " << last;
  }
  throw NcclCallError(os.str(), int(r));
}

void cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::ostringstream os;
  os << what << " failed: " << cudaGetErrorString(e) << " (cudaError_t " << int(e) << ")";
  throw NcclCallError(os.str(), -int(e));
}

// Device-side status words written by the barrier kernel; read by the host after a sync.
// status[0]: 0 ok, 1 LSA wait timed out, 2 GIN wait timed out; status[1]: a late world rank.
constexpr int kStatusWords = 2;

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- peer pointers -------------------------------------------------------------------
__global__ void lsa_pointers_kernel(ncclWindow_t win, int lsa_size, uint64_t* out) {
  int i = threadIdx.x + blockIdx.x * blockDim.x;
  if (i < lsa_size) out[i] = reinterpret_cast<uint64_t>(ncclGetLsaPointer(win, 0, i));
}

// ---- barrier -------------------------------------------------------------------------
// One CTA. Inside the LSA team: NCCL's LSA barrier session (arrive is NCCL's own; the
// wait is NCCL's wait with a deadline, so a missing peer ends in a status, not a hang).
// Outside it: every rank adds 1 to signal `sig` of each remote peer through GIN and waits
// until its own signal reaches `gin_expected` (host-tracked: epoch * remote peers).
__global__ void barrier_kernel(ncclDevComm dc, int lsa_index, int sig, uint64_t gin_expected,
                               uint64_t timeout_ns, int* status) {
  ncclCoopCta cta;
  const uint64_t deadline = now_ns() + timeout_ns;
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();

  const int world = dc.nRanks, lsa_size = dc.lsaSize;
  const int lsa_first = dc.rank - dc.lsaRank;
  const bool has_remote = world > lsa_size;

  if (has_remote && dc.ginContextCount > 0) {
    ncclGin gin(dc, 0);
    ncclTeam wt = ncclTeamWorld(dc);
    for (int p = threadIdx.x; p < world; p += blockDim.x) {
      if (p >= lsa_first && p < lsa_first + lsa_size) continue;
      gin.signal(wt, p, ncclGin_SignalAdd{(ncclGinSignal_t)sig, 1});
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      while (gin.readSignal((ncclGinSignal_t)sig) < gin_expected) {
        if (now_ns() > deadline) { failed = 2; status[1] = -1; break; }
      }
    }
    __syncthreads();
  }

  {
    ncclLsaBarrierSession<ncclCoopCta> bar(cta, dc, ncclTeamTagLsa(), (uint32_t)lsa_index);
    bar.arrive(cta, cuda::memory_order_release);
    const int n = bar.team.nRanks, me = bar.team.rank;
    for (int i = threadIdx.x; i < n - 1; i += blockDim.x) {
      int peer = i + (me <= i ? 1 : 0);
      cuda::atomic_ref<uint32_t> inbox(*bar.ucInbox(me, peer));
      while (true) {
        uint32_t got = inbox.load(cuda::memory_order_acquire);
        if (got - (bar.epoch + 1) <= uint32_t(-1) >> 1) break;
        if (now_ns() > deadline) {
          if (atomicCAS(&failed, 0, 1) == 0) status[1] = lsa_first + peer;
          break;
        }
      }
    }
    cta.sync();
    bar.epoch += 1;  // the session's destructor stores it for the next session
  }
  __syncthreads();
  if (threadIdx.x == 0) status[0] = failed;
}

// ---- GIN puts ------------------------------------------------------------------------
// Byte ranges of this rank's window into remote peers' windows (same window on every
// rank): puts[i] = {peer (world rank), dst_offset, src_offset, bytes}. One warp per range;
// after the CTA has posted all of its puts, it adds 1 to signal `sig` on each peer in
// `peers` (same GIN context, so the signal lands after the payload).
struct GinPut {
  int64_t peer, dst_offset, src_offset, bytes;
};

__global__ void gin_put_kernel(ncclDevComm dc, ncclWindow_t win, const GinPut* puts, int n_puts,
                               const int* peers, int n_peers, int sig) {
  ncclGin gin(dc, 0);
  ncclTeam wt = ncclTeamWorld(dc);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int i = warp; i < n_puts; i += warps) {
    if (lane == 0) {
      GinPut p = puts[i];
      gin.put(wt, (int)p.peer, win, (size_t)p.dst_offset, win, (size_t)p.src_offset, (size_t)p.bytes);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_peers; i += blockDim.x)
    gin.signal(wt, peers[i], ncclGin_SignalAdd{(ncclGinSignal_t)sig, 1});
  gin.flush(ncclCoopCta());
}

// Wait (one thread) until signal `sig` reaches `expected`; status as in barrier_kernel.
__global__ void gin_wait_kernel(ncclDevComm dc, int sig, uint64_t expected, uint64_t timeout_ns, int* status) {
  if (threadIdx.x != 0) return;
  ncclGin gin(dc, 0);
  const uint64_t deadline = now_ns() + timeout_ns;
  int failed = 0;
  while (gin.readSignal((ncclGinSignal_t)sig) < expected) {
    if (now_ns() > deadline) { failed = 2; break; }
  }
  status[0] = failed;
  status[1] = -1;
}

// ---- host side -----------------------------------------------------------------------
class DevComm {
 public:
  DevComm(uintptr_t comm_ptr, int lsa_barriers, int gin_signals, bool force_gin)
      : comm_(reinterpret_cast<ncclComm_t>(comm_ptr)) {
    if (comm_ == nullptr) throw NcclCallError("DevComm: the NCCL communicator is null", int(ncclInvalidArgument));
    ncclDevCommRequirements reqs;
    std::memset(&reqs, 0, sizeof(reqs));  // 2.28 has no NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
    reqs.lsaBarrierCount = lsa_barriers;
    reqs.ginSignalCount = gin_signals;  // > 0 turns GIN on: only ask where peers need it
    reqs.ginForceEnable = force_gin;
    std::memset(&dc_, 0, sizeof(dc_));
    nccl_check(ncclDevCommCreate(comm_, &reqs, &dc_), "ncclDevCommCreate", comm_);
    alive_ = true;
  }
  ~DevComm() {
    try { destroy(); } catch (...) {}
  }
  void destroy() {
    if (!alive_) return;
    alive_ = false;
    nccl_check(ncclDevCommDestroy(comm_, &dc_), "ncclDevCommDestroy", comm_);
  }
  bool alive() const { return alive_; }
  const ncclDevComm& dc() const {
    if (!alive_) throw NcclCallError("the NCCL device communicator was destroyed", int(ncclInvalidUsage));
    return dc_;
  }

 private:
  ncclComm_t comm_;
  ncclDevComm dc_;
  bool alive_ = false;
};

std::vector<uint64_t> lsa_pointers(uintptr_t win, int lsa_size, uintptr_t stream) {
  if (win == 0) throw NcclCallError("lsa_pointers: the window handle is null (registration did not complete)",
                                    int(ncclInvalidArgument));
  auto s = reinterpret_cast<cudaStream_t>(stream);
  uint64_t* d = nullptr;
  cuda_check(cudaMallocAsync(&d, sizeof(uint64_t) * lsa_size, s), "cudaMallocAsync(lsa pointers)");
  lsa_pointers_kernel<<<1, 128, 0, s>>>(reinterpret_cast<ncclWindow_t>(win), lsa_size, d);
  std::vector<uint64_t> out(lsa_size);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpyAsync(out.data(), d, sizeof(uint64_t) * lsa_size, cudaMemcpyDeviceToHost, s);
  cudaFreeAsync(d, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cuda_check(e, "ncclGetLsaPointer kernel");
  return out;
}

void barrier(const DevComm& c, int lsa_index, int sig, uint64_t gin_expected, double timeout_s,
             uintptr_t status, uintptr_t stream) {
  auto s = reinterpret_cast<cudaStream_t>(stream);
  barrier_kernel<<<1, 128, 0, s>>>(c.dc(), lsa_index, sig, gin_expected, (uint64_t)(timeout_s * 1e9),
                                   reinterpret_cast<int*>(status));
  cuda_check(cudaGetLastError(), "barrier kernel launch");
}

void gin_put(const DevComm& c, uintptr_t win, uintptr_t puts, int n_puts, uintptr_t peers, int n_peers, int sig,
             uintptr_t stream) {
  if (c.dc().ginContextCount == 0)
    throw NcclCallError("gin_put: this communicator has no GIN transport (all peers are in the LSA team)",
                        int(ncclInvalidUsage));
  auto s = reinterpret_cast<cudaStream_t>(stream);
  gin_put_kernel<<<1, 256, 0, s>>>(c.dc(), reinterpret_cast<ncclWindow_t>(win), reinterpret_cast<const GinPut*>(puts),
                                   n_puts, reinterpret_cast<const int*>(peers), n_peers, sig);
  cuda_check(cudaGetLastError(), "gin_put kernel launch");
}

void gin_wait(const DevComm& c, int sig, uint64_t expected, double timeout_s, uintptr_t status, uintptr_t stream) {
  if (c.dc().ginContextCount == 0)
    throw NcclCallError("gin_wait: this communicator has no GIN transport", int(ncclInvalidUsage));
  auto s = reinterpret_cast<cudaStream_t>(stream);
  gin_wait_kernel<<<1, 32, 0, s>>>(c.dc(), sig, expected, (uint64_t)(timeout_s * 1e9), reinterpret_cast<int*>(status));
  cuda_check(cudaGetLastError(), "gin_wait kernel launch");
}

py::tuple team_lsa(uintptr_t comm_ptr) {
  ncclTeam t = ncclTeamLsa(reinterpret_cast<ncclComm_t>(comm_ptr));
  return py::make_tuple(t.nRanks, t.rank, t.stride);
}

int runtime_version() {
  int v = 0;
  nccl_check(ncclGetVersion(&v), "ncclGetVersion");
  return v;
}

// Direct NCCL calls for the tests' error path: a bad argument must come back as an
// NcclCallError naming the call and the NCCL result string.
uintptr_t mem_alloc(size_t n) {
  void* p = nullptr;
  nccl_check(ncclMemAlloc(&p, n), "ncclMemAlloc");
  return reinterpret_cast<uintptr_t>(p);
}
void mem_free(uintptr_t p) { nccl_check(ncclMemFree(reinterpret_cast<void*>(p)), "ncclMemFree"); }

}  // namespace

PYBIND11_MODULE(symmoe_nccl, m) {
  m.doc() = "symmoe NCCL device-API helpers (device communicator, LSA pointers, barrier, GIN)";
  // The exception type lives as long as the interpreter (a leaked reference, no static dtor).
  static PyObject* exc = PyErr_NewException("symmoe_nccl.NcclCallError", PyExc_RuntimeError, nullptr);
  m.attr("NcclCallError") = py::handle(exc);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NcclCallError& e) {
      py::object err = py::reinterpret_borrow<py::object>(exc)(py::str(e.what()));
      err.attr("code") = py::int_(e.code);
      PyErr_SetObject(exc, err.ptr());
    }
  });
  m.attr("NCCL_VERSION_CODE") = NCCL_VERSION_CODE;
  m.attr("STATUS_WORDS") = kStatusWords;
  m.attr("GIN_PUT_BYTES") = (int)sizeof(GinPut);
  m.def("runtime_version", &runtime_version);
  m.def("team_lsa", &team_lsa, py::arg("comm"));
  m.def("lsa_pointers", &lsa_pointers, py::arg("window"), py::arg("lsa_size"), py::arg("stream"));
  m.def("mem_alloc", &mem_alloc);
  m.def("mem_free", &mem_free);
  py::class_<DevComm>(m, "DevComm")
      .def(py::init<uintptr_t, int, int, bool>(), py::arg("comm"), py::arg("lsa_barriers"), py::arg("gin_signals"),
           py::arg("force_gin") = false)
      .def("destroy", &DevComm::destroy)
      .def_property_readonly("alive", &DevComm::alive)
      .def_property_readonly("rank", [](const DevComm& c) { return c.dc().rank; })
      .def_property_readonly("world_size", [](const DevComm& c) { return c.dc().nRanks; })
      .def_property_readonly("lsa_rank", [](const DevComm& c) { return c.dc().lsaRank; })
      .def_property_readonly("lsa_size", [](const DevComm& c) { return c.dc().lsaSize; })
      .def_property_readonly("gin_contexts", [](const DevComm& c) { return (int)c.dc().ginContextCount; })
      .def_property_readonly("gin_signals", [](const DevComm& c) { return c.dc().ginSignalCount; })
      .def_property_readonly("lsa_barriers", [](const DevComm& c) { return c.dc().lsaBarrier.nBarriers; });
  m.def("barrier", &barrier, py::arg("devcomm"), py::arg("lsa_index"), py::arg("signal"), py::arg("gin_expected"),
        py::arg("timeout_s"), py::arg("status"), py::arg("stream"));
  m.def("gin_put", &gin_put, py::arg("devcomm"), py::arg("window"), py::arg("puts"), py::arg("n_puts"),
        py::arg("peers"), py::arg("n_peers"), py::arg("signal"), py::arg("stream"));
  m.def("gin_wait", &gin_wait, py::arg("devcomm"), py::arg("signal"), py::arg("expected"), py::arg("timeout_s"),
        py::arg("status"), py::arg("stream"));
}
