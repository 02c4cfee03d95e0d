// symmoe NVSHMEM extension: the push protocol (DeepEP V1 normal-mode style) on the NVSHMEM
// device API, for the `nvshmem` backend.
//
// nvshmem4py owns the runtime and the symmetric segment; this module links its own copy of
// libnvshmem_device.a, so `init()` must run after nvshmem.core.init() (it only registers this
// module's device state) and `finalize()` before nvshmem.core.finalize().
//
// The kernels (every step also documented in symmoe/protocol/nvshmem.py):
//   notify.cuh   plan_kernel, one launch: the routing (route.cuh's route_ticketed, as the
//                CUDA protocols'), the send list, the counts row to every peer by
//                put-with-signal (`ready[me]` = epoch), the wait for every peer's row, the
//                matrix in a device snapshot and pinned memory.
//   dispatch.cuh one kernel, 2*C blocks. Block c < C is the sender of channel c: for each
//                destination d, warps of one group put their rows into d's receive pool
//                (non-blocking warp puts: NVLink stores in a node, IBGDA RDMA across nodes,
//                same code), then fence and signal tail[c][me] at d with (epoch << 32 | rows
//                delivered), so rows stream per chunk. Block C + c is the receiver of channel
//                c: it waits on tail[c][s] (timeout) and copies delivered rows into the
//                outputs. The rows a rank keeps go straight from x to the output.
//   (alone, no NVSHMEM call is needed, and the protocol launches symmoe_cuda's alone kernels,
//   kernels/alone.cuh, in place of dispatch_kernel: rank-major always, expert-major with
//   kernel.fan_phases on)
//   combine.cuh  combine_send_kernel, C blocks: block c puts channel c of the received rows
//                back into their sources' combine slots (t * S + slot), signals head[c][me]
//                at every rank and waits for head[c][*] here. combine_reduce_kernel then
//                reduces tokens in the fixed order with the reduction the CUDA protocols use
//                (common/reduce.cuh), reading the rank's own contributions straight from y.
// Signals carry (epoch << 32 | count) and are compared with >=, so they never need a reset.
// Every wait has a timeout: it records (stage, peer, epoch) in the host-mapped ErrorWord and
// its device mirror, and the kernel returns; the host raises StallError.

#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "combine.cuh"
#include "device.cuh"
#include "dispatch.cuh"
#include "notify.cuh"
#include "../common/follow_launch.h"
#include "../bindings/host_wait.h"
#include "../bindings/tail_launch.cuh"

namespace py = pybind11;

namespace symmoe {
namespace nv {

void cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::ostringstream os;
  os << what << " failed: " << cudaGetErrorString(e) << " (cudaError_t " << int(e) << ")";
  throw std::runtime_error(os.str());
}

// ---- host side -------------------------------------------------------------------------
Layout layout_from(const std::vector<int64_t>& v) {
  if (v.size() != static_cast<size_t>(kLayoutArgs)) {
    std::ostringstream os;
    os << "layout has " << v.size() << " fields; this extension was built for " << kLayoutArgs
       << " (rebuild: csrc/common/layout.cuh and symmoe/layout.py disagree)";
    throw std::runtime_error(os.str());
  }
  Layout l;
  std::memcpy(&l, v.data(), sizeof(Layout));
  return l;
}

template <typename T>
T* ptr(int64_t p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

int num_channels(int requested, int world) {
  if (world > kMaxWorld) {
    std::ostringstream os;
    os << "world size " << world << " exceeds the " << kMaxWorld << " ranks the nvshmem kernels support";
    throw std::runtime_error(os.str());
  }
  return requested;
}

ErrorWord* error_mirror() {
  void* p = nullptr;
  cuda_check(cudaGetSymbolAddress(&p, g_err), "cudaGetSymbolAddress(g_err)");
  return static_cast<ErrorWord*>(p);
}

// After the host raised a recorded failure (it clears its copy too).
void reset_error() { cuda_check(cudaMemset(error_mirror(), 0, sizeof(ErrorWord)), "cudaMemset(g_err)"); }

// A block count from the launch shape (symmoe/launch_shape.py's nvshmem_shape), refused unless >= 1.
int shape_blocks(const char* what, int64_t blocks) {
  if (blocks < 1 || blocks > (int64_t(1) << 31) - 1) {
    std::ostringstream os;
    os << what << ": " << blocks << " blocks; the launch shape (symmoe/launch_shape.py) gives at least 1";
    throw std::invalid_argument(os.str());
  }
  return int(blocks);
}

// Routing scratch, zeroed once by the caller: each chunk's counted epoch [route_blocks] (int64),
// the plan's ticket (8 bytes), then part [route_blocks][C] and totals [C] (int32), for a routing
// grid of at most `route_blocks` blocks (LaunchShape.route).
int64_t route_scratch_ints(const std::vector<int64_t>& lay, int64_t route_blocks) {
  Layout l = layout_from(lay);
  const int64_t C = l.world_size + l.num_experts, MB = shape_blocks("route_scratch_ints", route_blocks);
  return 2 * MB + 2 + MB * C + C;
}

// Dynamic shared memory the routing kernels may ask for: the opt-in limit less 1 KiB for their
// static part.
int route_smem_limit() {
  static const int limit = [] {
    int dev = 0, max_smem = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
    return max_smem - 1024;
  }();
  return limit;
}

// Largest dynamic shared memory the routing and dispatch kernels may ask for (set once).
void allow_smem() {
  static bool done = false;
  if (done) return;
  const auto attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  const int smem = route_smem_limit();
  cuda_check(cudaFuncSetAttribute(route_count_kernel<int64_t>, attr, smem), "route attr");
  cuda_check(cudaFuncSetAttribute(route_count_kernel<int32_t>, attr, smem), "route attr");
  cuda_check(cudaFuncSetAttribute(plan_kernel<int64_t>, attr, smem), "plan attr");
  cuda_check(cudaFuncSetAttribute(plan_kernel<int32_t>, attr, smem), "plan attr");
  cuda_check(cudaFuncSetAttribute(dispatch_kernel, attr, 64 * 1024), "dispatch attr");
  done = true;
}

// Routing of one dispatch (plan = true: plan_kernel, one launch: routing, send list, counts
// exchange) or of get_dispatch_layout (plan = false: counts and is_token_in_rank only).
// ptrs: idx, w, scratch, in_rank, per_rank, per_expert, pub_idx, pub_w, pos, send_ent,
//       counts_snap, counts_host, bad_flag, bad_info, err, done, counts_ready, summary
// (summary: route.cuh's CountsSummary for the host, written with the groups padded to `alignment`)
template <typename Idx>
void route(const Layout& l, int64_t base, int me, int64_t T, bool plan, int64_t epoch,
           uint64_t timeout_ns, const std::vector<int64_t>& p, int alignment, int route_blocks, cudaStream_t st) {
  allow_smem();
  const int C = static_cast<int>(l.world_size + l.num_experts);
  const int B = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(route_blocks, (T + 127) / 128)));
  const int64_t MB = route_blocks;
  int32_t* scratch = ptr<int32_t>(p[2]);
  int32_t* part = scratch + 2 * MB + 2;
  RouteScratch sc{part, part + MB * C, nullptr, nullptr, nullptr, nullptr, CountsSummary{},
                  reinterpret_cast<int64_t*>(scratch), reinterpret_cast<unsigned int*>(scratch + 2 * MB)};
  RoutingArgs<Idx> a{ptr<const Idx>(p[0]), ptr<const float>(p[1]), static_cast<int>(T), static_cast<int>(l.topk),
                     static_cast<int>(l.world_size), static_cast<int>(l.num_experts), ptr<int32_t>(p[8]),
                     ptr<bool>(p[3]), ptr<int32_t>(p[6]), ptr<float>(p[7]),
                     BadInput{ptr<int32_t>(p[12]), ptr<int64_t>(p[13])}};
  auto* err = ptr<ErrorWord>(p[14]);
  auto* done = ptr<unsigned int>(p[15]);
  const int threads = route_threads(C, route_smem_limit());
  if (!plan) {
    route_count_kernel<Idx><<<B, threads, size_t(C) * 4, st>>>(a, sc, ptr<int32_t>(p[4]), ptr<int32_t>(p[5]),
                                                                    error_mirror(), done);
    cuda_check(cudaGetLastError(), "route_count_kernel launch");
    return;
  }
  PlanArgs pa{ptr<uint8_t>(base), l, me, epoch, timeout_ns, ptr<int32_t>(p[9]), ptr<int32_t>(p[10]),
              ptr<int32_t>(p[11]), ptr<int64_t>(p[16]), err, CountsSummary{ptr<int32_t>(p[17]), me, alignment}};
  plan_kernel<Idx><<<B, threads, size_t(threads / 32 + 1) * C * 4, st>>>(a, sc, pa, done);
  cuda_check(cudaGetLastError(), "plan_kernel launch");
}

// route_blocks: LaunchShape.route, as route_scratch_ints was given for this scratch.
void launch_route(int64_t base, const std::vector<int64_t>& lay, int me, bool idx64, int64_t T, bool plan,
                  int64_t epoch, uint64_t timeout_ns, const std::vector<int64_t>& p, int64_t stream, int alignment,
                  int64_t route_blocks) {
  if (p.size() != 18) throw std::runtime_error("route: expected 18 pointers");
  if (alignment < 1) throw std::runtime_error("route: alignment must be >= 1, got " + std::to_string(alignment));
  const int MB = shape_blocks("route", route_blocks);
  Layout l = layout_from(lay);
  auto st = ptr<CUstream_st>(stream);
  if (idx64) route<int64_t>(l, base, me, T, plan, epoch, timeout_ns, p, alignment, MB, st);
  else route<int32_t>(l, base, me, T, plan, epoch, timeout_ns, p, alignment, MB, st);
}

void launch_barrier(int64_t base, const std::vector<int64_t>& lay, int me, int64_t epoch, uint64_t timeout_ns,
                    int64_t err, int stage, int64_t stream) {
  Layout l = layout_from(lay);
  barrier_kernel<<<1, 256, 0, ptr<CUstream_st>(stream)>>>(ptr<uint8_t>(base), l, me, epoch, timeout_ns,
                                                           ptr<ErrorWord>(err), stage);
  cuda_check(cudaGetLastError(), "barrier_kernel launch");
}

// ptrs: x, idx, w, send_ent, pos, counts, out_x, out_idx, out_w, out_rank, out_tok, out_slot, out_offsets, err,
//       selfmap
void launch_dispatch(int64_t base, const std::vector<int64_t>& lay, int me, int channels, int64_t ring, int expert_major,
                     int direct, int alignment, int64_t capacity, int64_t epoch, uint64_t timeout_ns,
                     const std::vector<int64_t>& p,
                     int64_t stream) {
  if (p.size() != 15) throw std::runtime_error("dispatch: expected 15 pointers");
  allow_smem();
  DispatchArgs a{};
  a.base = ptr<uint8_t>(base);
  a.lay = layout_from(lay);
  a.me = me;
  a.C = num_channels(channels, static_cast<int>(a.lay.world_size));
  if (ring < 1 || ring * a.C * a.lay.world_size > a.lay.pool_rows)
    throw std::invalid_argument("dispatch: " + std::to_string(a.lay.world_size * a.C) + " rings of " + std::to_string(ring) +
                                " rows do not fit the receive pool of " + std::to_string(a.lay.pool_rows) + " rows");
  a.ring = ring;
  a.expert_major = expert_major;
  a.direct = direct;
  a.alignment = alignment;
  a.capacity = capacity;
  a.epoch = epoch;
  a.timeout_ns = timeout_ns;
  a.x = ptr<const uint8_t>(p[0]);
  a.idx = ptr<const int32_t>(p[1]);
  a.w = ptr<const float>(p[2]);
  a.send_ent = ptr<const int32_t>(p[3]);
  a.pos = ptr<const int32_t>(p[4]);
  a.counts = ptr<const int32_t>(p[5]);
  a.out_x = ptr<uint8_t>(p[6]);
  a.out_idx = ptr<int64_t>(p[7]);
  a.out_w = ptr<float>(p[8]);
  a.out_rank = ptr<int32_t>(p[9]);
  a.out_tok = ptr<int32_t>(p[10]);
  a.out_slot = ptr<int32_t>(p[11]);
  a.out_offsets = ptr<int64_t>(p[12]);
  a.err = ptr<ErrorWord>(p[13]);
  a.selfmap = ptr<int32_t>(p[14]);
  const size_t smem = expert_major ? size_t(Geometry::dyn_bytes(a.lay)) : 0;
  cuda_check(launch_following(dispatch_kernel, 2 * a.C, kThreads, smem, ptr<CUstream_st>(stream), a),
             "dispatch_kernel launch");
}

// ptrs: y, rw, src_rank, src_tok, src_slot, selfmap, in_rank, topk_idx, topk_w, out_x, out_w, err
// reduce_sms: LaunchShape.reduce, the SMs the reduction spreads over (kReduceBlocksPerSm blocks each).
void launch_combine(int64_t base, const std::vector<int64_t>& lay, int me, int channels, int expert_major,
                    int direct, int num_tokens, int64_t rows, int elem_kind, int reduce_sms, int64_t epoch, uint64_t timeout_ns,
                    const std::vector<int64_t>& p, int64_t stream) {
  if (p.size() != 12) throw std::runtime_error("combine: expected 12 pointers");
  CombineArgs a{};
  a.base = ptr<uint8_t>(base);
  a.lay = layout_from(lay);
  if (a.lay.combine_slots > kMaxSlots) throw std::runtime_error("combine: more than 64 slots per token (max(world, topk))");
  a.me = me;
  a.C = num_channels(channels, static_cast<int>(a.lay.world_size));
  a.direct = direct;
  a.rows = rows;
  a.epoch = epoch;
  a.timeout_ns = timeout_ns;
  a.y = ptr<const uint8_t>(p[0]);
  a.rw = ptr<const float>(p[1]);
  a.src_rank = ptr<const int32_t>(p[2]);
  a.src_tok = ptr<const int32_t>(p[3]);
  a.src_slot = ptr<const int32_t>(p[4]);
  a.err = ptr<ErrorWord>(p[11]);
  const CombineSources cs{a.y, a.rw, ptr<const int32_t>(p[5]), a.base + a.lay.combine_x,
                          reinterpret_cast<const float*>(a.base + a.lay.combine_w), ptr<const bool>(p[6]),
                          ptr<const int64_t>(p[7]), ptr<const float>(p[8]), num_tokens, a.lay.row_bytes(),
                          static_cast<int>(a.lay.world_size), static_cast<int>(a.lay.topk),
                          static_cast<int>(a.lay.combine_slots), static_cast<int>(a.lay.local_experts()), me,
                          expert_major != 0};
  auto s = ptr<CUstream_st>(stream);
  if (a.lay.world_size > 1) {  // alone, every row is this rank's own: nothing to send or wait for
    combine_send_kernel<<<a.C, kThreads, 0, s>>>(a);
    cuda_check(cudaGetLastError(), "combine_send_kernel launch");
  }
  const int blocks = std::max(1, std::min(num_tokens, kReduceBlocksPerSm * shape_blocks("combine", reduce_sms)));
  float* out_w = ptr<float>(p[10]);
  switch (elem_kind) {
    case 0: combine_reduce_kernel<<<blocks, kReduceThreads, 0, s>>>(cs, ptr<__nv_bfloat16>(p[9]), out_w); break;
    case 1: combine_reduce_kernel<<<blocks, kReduceThreads, 0, s>>>(cs, ptr<__half>(p[9]), out_w); break;
    case 2: combine_reduce_kernel<<<blocks, kReduceThreads, 0, s>>>(cs, ptr<float>(p[9]), out_w); break;
    default: throw std::runtime_error("combine: elem_kind must be 0 (bf16), 1 (fp16) or 2 (fp32)");
  }
  cuda_check(cudaGetLastError(), "combine_reduce_kernel launch");
}

__global__ void pe_kernel(int* out) {
  out[0] = nvshmem_my_pe();
  out[1] = nvshmem_n_pes();
}

// num_worst_tokens, after the dispatch kernel: kernels/tail.cuh's tail (the outputs past the
// received rows, the per-expert counts, the DeferredError), as on the CUDA protocols.
// ptrs: counts, out_x, out_idx, out_w, out_rank, out_tok, out_slot, per_expert, deferred
// tail_blocks: LaunchShape.tail, the most blocks of the tail kernel.
void launch_tail(const std::vector<int64_t>& lay, int me, int expert_major, int alignment, int64_t worst,
                 int64_t epoch, const std::vector<int64_t>& p, int64_t tail_blocks, int64_t stream) {
  if (p.size() != 9) throw std::runtime_error("tail: expected 9 pointers");
  Layout l = layout_from(lay);
  const std::string e = launch_recv_tail(
      l, ptr<const int32_t>(p[0]),
      TailOutputs{ptr<uint8_t>(p[1]), ptr<int64_t>(p[2]), ptr<float>(p[3]), ptr<int32_t>(p[4]), ptr<int32_t>(p[5]),
                  ptr<int32_t>(p[6])},
      worst, expert_major != 0, alignment, me, ptr<int32_t>(p[7]), ptr<DeferredError>(p[8]), epoch,
      /*counts_late=*/false, shape_blocks("tail", tail_blocks), route_smem_limit(), ptr<CUstream_st>(stream));
  if (!e.empty()) throw std::runtime_error(e);
}

// Device-side view of the runtime, to check this module's device state was registered.
std::vector<int> device_pes() {
  int* d = nullptr;
  cuda_check(cudaMalloc(&d, 2 * sizeof(int)), "cudaMalloc");
  pe_kernel<<<1, 1>>>(d);
  int h[2] = {-1, -1};
  cudaError_t e = cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  cudaFree(d);
  cuda_check(e, "pe_kernel");
  return {h[0], h[1]};
}

}  // namespace nv
}  // namespace symmoe

PYBIND11_MODULE(symmoe_nvshmem, m) {
  using namespace symmoe::nv;
  m.doc() = "symmoe NVSHMEM push kernels (run after nvshmem.core.init)";
  // The inline nvshmem_init() compiled into this module registers its device state with the
  // host library nvshmem4py already initialised (reference counted).
  m.def("init", []() { nvshmem_init(); });
  m.def("finalize", []() { nvshmem_finalize(); });
  m.def("init_status", []() { return nvshmemx_init_status(); });
  m.def("device_pes", &device_pes);
  m.def("ptr", [](int64_t addr, int pe) {
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(nvshmem_ptr(reinterpret_cast<void*>(addr), pe)));
  });
  symmoe::bind_counts_wait(m);
  m.def("route", &launch_route);
  m.def("reset_error", &reset_error);
  // The kernels' device mirror of the ErrorWord: kernels of other modules launched for this
  // protocol (symmoe_cuda's fan) poll and record there too.
  m.def("error_mirror", []() { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(error_mirror())); });
  m.def("route_scratch_ints", &route_scratch_ints);
  m.def("barrier", &launch_barrier);
  m.def("dispatch", &launch_dispatch);
  m.def("combine", &launch_combine);
  m.def("tail", &launch_tail);
  m.attr("DEFERRED") = py::dict(py::arg("capacity") = int(symmoe::kDeferredCapacity),
                                py::arg("bad_ids") = int(symmoe::kDeferredBadIds));
  m.attr("SUMMARY_HEAD") = symmoe::kSummaryHead;
  m.attr("threads") = kThreads;
  m.attr("max_world") = kMaxWorld;
}
