// The Python-facing kernel context, a template on the device transport. Each extension
// module instantiates it with its transport and binds it with bind_context(); the Python
// protocol (symmoe/protocol/cuda.py) calls the same methods whatever the backend.
#pragma once
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/barrier.cuh"
#include "../common/layout.cuh"
#include "../kernels/combine.cuh"
#include "../kernels/dispatch.cuh"
#include "../kernels/push_stream.cuh"
#include "../kernels/tail.cuh"
#include "alone_launch.cuh"
#include "../common/follow_launch.h"
#include "host_wait.h"
#include "launch_geometry.h"

namespace symmoe {
namespace py = pybind11;

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
T* P(uintptr_t v) {
  return reinterpret_cast<T*>(v);
}

inline cudaStream_t S(uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); }

// Default piece of the expert-major fan-out (one load, up to top-k bulk stores): smaller pieces
// let 16 warps per block keep stores in flight. Row-copy microbenchmark, 4096 rows of 14336 B
// to 8 rows each: 147 µs at 3584-byte pieces against 155 µs at whole rows.
constexpr uint32_t kFanSlotBytes = 3584;

template <class Transport>
struct Ctx {
  Layout L;
  int rank;
  Transport tp;
  ErrorWord* err;       // device memory
  ErrorWord* err_host;  // host-mapped (device-side address)
  uint64_t timeout_ns;
  LaunchGeometry shape;  // every launch's blocks (symmoe/launch_shape.py)
  int max_smem;   // opt-in shared memory per block, less every kernel's static tables
  int data_smem;  // ... less the data kernels' (pull, push) only: what their dynamic part may take
  unsigned int* done;  // [8] grid completion counters, zeroed by the caller (one per kernel kind: 0-6 used)
  MoveCfg move;        // data kernels' bulk piece size and warps per block (for plan_bytes = 0)
  MoveCfg move_fan;    // the same for the expert-major dispatch (a piece goes to several rows)
  bool depth_auto = true;  // kernel.copy_depth 0: kRowDepth where two warps still fit, else 2
  int fan_phases = 0;       // kernel.fan_phases: 0 off, 1 per block, 2 grid-wide, 3 steal (set_fan_phases)
  int32_t* counts_host = nullptr;  // where a dispatch's routing kernels leave the counts matrix
  int32_t* counts_snap = nullptr;
  uint8_t* routing_copy = nullptr;
  int64_t* counts_ready = nullptr;
  CountsSummary summary;  // what the host reads after its wait (summary.host nullptr: none)
  BadInput bad{nullptr, nullptr};  // in-kernel expert-id checks of dispatch (set_input_check)
  uint64_t* stamps = nullptr;  // the dispatch data kernels' timeline (set_stamps; stamps.cuh)
  // The last dispatch routing (route_kernel) queued: its chunks' placed marks, their number, its
  // epoch and tokens, for a data kernel alone that starts on the marks (Ctx::alone).
  struct Routed {
    const int64_t* placed = nullptr;
    int chunks = 0;
    int64_t epoch = 0, tokens = 0;
    const int32_t* totals = nullptr;
  } routed;
  // The last data kernel queued started before its routing grid ended (Ctx::alone behind
  // route_kernel): the tail after it reads the counts only once that kernel ended.
  bool data_early = false;

  Ctx(const std::vector<int64_t>& layout, int rank_, Transport tp_, uintptr_t err_dev, uintptr_t err_host_dev,
      double timeout_s, const std::vector<int64_t>& geometry, uintptr_t counters)
      : rank(rank_), tp(tp_), err(P<ErrorWord>(err_dev)), err_host(P<ErrorWord>(err_host_dev)),
        done(P<unsigned int>(counters)) {
    if (layout.size() != size_t(kLayoutArgs))
      throw std::invalid_argument("layout: expected " + std::to_string(kLayoutArgs) + " values (BufferLayout.kernel_args()), got " +
                                  std::to_string(layout.size()));
    std::memcpy(&L, layout.data(), sizeof(Layout));
    timeout_ns = uint64_t(timeout_s * 1e9);
    int dev = 0, sms = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "multiprocessor count");
    check(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "shared memory limit");
    shape = launch_geometry(geometry, sms);
    move.plan_bytes = 0;
    move.warps = 8;
    set_copy_bytes(0);
    set_copy_depth(0);
    set_max_smem();
  }

  // Bulk-copy piece: rows split into equal pieces of at most `max_piece` bytes (0: 16 KB, and
  // kFanSlotBytes for the expert-major dispatch), each rounded up to 128 so every warp's slots
  // stay aligned.
  void set_copy_bytes(int64_t max_piece) {
    if (max_piece < 0 || max_piece % 128)
      throw std::invalid_argument("copy_bytes=" + std::to_string(max_piece) + ": must be 0 or a multiple of 128");
    move.slot_bytes = piece_bytes(L.row_bytes(), max_piece ? max_piece : kMaxSlotBytes);
    move_fan = move;
    move_fan.slot_bytes = piece_bytes(L.row_bytes(), max_piece ? max_piece : kFanSlotBytes);
  }
  // Slots per warp of the data kernels' mover: depth - 1 loads in flight per warp. 0: 4 for
  // whole rows (cached rank dispatch 37.1 -> 36.4 µs push, 38.7 -> 37.4 pull) and 3
  // for the expert-major fan-out (156.6-157.3 -> 153.6-155.0 µs against 2; 4 slowed it from 154
  // to 175 µs, fewer warps per block).
  void set_copy_depth(int depth) {
    if (depth != 0 && (depth < 2 || depth > kMaxDepth))
      throw std::invalid_argument("copy_depth=" + std::to_string(depth) + ": must be 0 (automatic) or 2.." +
                                  std::to_string(kMaxDepth));
    depth_auto = depth == 0;
    move.depth = depth ? depth : kRowDepth;
    move_fan.depth = depth ? depth : 3;
  }
  // The world-size-1 expert-major dispatch in phases of whole rows (fan_in_phases): 0 off, 1
  // each block alone, 2 every block meeting the others (all of them resident at once).
  void set_fan_phases(int mode) {
    if (mode < 0 || mode > 3)
      throw std::invalid_argument("fan_phases=" + std::to_string(mode) +
                                  ": must be 0 (off), 1 (block), 2 (grid) or 3 (steal)");
    fan_phases = mode;
  }

  // Static __shared__ bytes count against the opt-in limit too: dynamic may use at most
  // optin - static (cudaFuncSetAttribute fails with "invalid argument" otherwise).
  template <typename K>
  int static_smem(K kernel) {
    cudaFuncAttributes fa;
    check(cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes");
    return int(fa.sharedSizeBytes);
  }

  void set_max_smem() {
    // Once per kernel: allow the opt-in shared memory (bulk-copy slots need > 48 KB).
    int st = 0;
    st = std::max(st, static_smem(pull_kernel<Transport>));
    st = std::max(st, static_smem(push_kernel<Transport>));
    st = std::max(st, static_smem(pull_kernel<Transport, true>));
    st = std::max(st, static_smem(push_kernel<Transport, true>));
    // The data kernels' own limit: the routing kernels' larger static tables would cost the
    // phased fan-out a whole row (15 rows a block, three rounds instead of two).
    data_smem = max_smem - (st + 127) / 128 * 128;
    st = std::max(st, static_smem(push_stream_kernel<Transport>));
    st = std::max(st, static_smem(unpack_kernel<Transport>));
    st = std::max(st, static_smem(combine_send_kernel<Transport>));
    st = std::max(st, static_smem(route_count_kernel<int64_t>));
    st = std::max(st, static_smem(route_count_kernel<int32_t>));
    st = std::max(st, static_smem(route_kernel<Transport, int64_t>));
    st = std::max(st, static_smem(route_kernel<Transport, int32_t>));
    max_smem -= (st + 127) / 128 * 128;
    check(cudaFuncSetAttribute(pull_kernel<Transport>, cudaFuncAttributeMaxDynamicSharedMemorySize, data_smem), "pull attr");
    check(cudaFuncSetAttribute(push_kernel<Transport>, cudaFuncAttributeMaxDynamicSharedMemorySize, data_smem), "push attr");
    check(cudaFuncSetAttribute(pull_kernel<Transport, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, data_smem),
          "pull attr");
    check(cudaFuncSetAttribute(push_kernel<Transport, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, data_smem),
          "push attr");
    check(cudaFuncSetAttribute(push_stream_kernel<Transport>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem),
          "push_stream attr");
    check(cudaFuncSetAttribute(unpack_kernel<Transport>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem), "unpack attr");
    check(cudaFuncSetAttribute(combine_send_kernel<Transport>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem),
          "combine attr");
    check(cudaFuncSetAttribute(route_count_kernel<int64_t>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem), "route attr");
    check(cudaFuncSetAttribute(route_count_kernel<int32_t>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem), "route attr");
    check(cudaFuncSetAttribute(route_kernel<Transport, int64_t>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem),
          "route attr");
    check(cudaFuncSetAttribute(route_kernel<Transport, int32_t>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem),
          "route attr");
  }

  // Warps per block that fit next to `plan` bytes of tables.
  // fan: the expert-major dispatch's mover (small pieces, 16 warps), else whole rows.
  // data: the pull and push kernels' limit (data_smem), else every kernel's (max_smem).
  MoveCfg move_cfg(int64_t plan, bool fan = false, bool data = false) const {
    return fit_mover(fan ? move_fan : move, plan, data ? data_smem : max_smem, depth_auto);
  }
  size_t smem_of(const MoveCfg& m) const {
    if (m.phase_rows > 0) return size_t(phase_smem(m, L.row_bytes()));
    return size_t(m.plan_bytes + int64_t(m.warps) * WarpMoverSmem::per_warp_bytes(m.slot_bytes, m.depth));
  }
  // fan_in_phases' geometry in place of the mover's: one warp per row a block holds (rows that
  // fit past the plan's first `kept` bytes, the ones the phases still read, at most
  // kMaxMoverWarps; none: the mover stays). Starting over the rest gives torch pull's 256 local
  // experts 16 rows of hidden 7168 instead of 15: two rounds of 4096 tokens on 132 SMs, not
  // three. Grid-wide phases need every block resident at once: refused, naming the numbers,
  // when the kernel's occupancy says they are not.
  template <typename K>
  void phase_cfg(MoveCfg& m, K kernel, int64_t kept) const {
    if (!phase_geometry(m, kept, data_smem, L.row_bytes(), fan_phases == 2) || !m.phase_grid) return;
    const std::string refusal = phase_grid_refusal(kernel, m, L.row_bytes(), shape.dispatch, shape.sms);
    if (!refusal.empty()) throw std::invalid_argument(refusal);
  }

  Sync sync(int64_t epoch, int which) const { return Sync{rank, epoch, timeout_ns, err, err_host, done + which}; }

  // Routing: one chunk of tokens per block, at least 128 tokens a chunk (fewer chunks: the
  // serial sums over chunks stay short). When the columns'
  // per-warp tables do not fit in shared memory they go to global scratch, for at most 8 blocks.
  int64_t route_columns() const { return L.world_size + L.num_experts; }
  bool route_big() const { return int64_t(kRouteWarps + 1) * route_columns() * 4 > max_smem; }
  int route_max_blocks() const { return route_big() ? std::min(shape.route, 8) : shape.route; }
  int route_blocks(int64_t T) const {
    return int(std::max<int64_t>(1, std::min<int64_t>(route_max_blocks(), (T + 127) / 128)));
  }
  // Bytes of global routing scratch the caller allocates once, zeroed (RouteScratch: the
  // chunks' counted epochs, then their placed epochs, then the int32 tables; a multiple of 16).
  int64_t layout_scratch_bytes() const {
    const int64_t C = route_columns(), B = route_max_blocks();
    return 4 * (4 * B + (B * C + C + (route_big() ? B * (kRouteWarps + 1) * C : 0) + 3) / 4 * 4);
  }

  // The routing kernels' arguments for `scratch`: publish, a dispatch's (ids, weights and
  // positions into the input region, the checks, the counts' hand-over), else the layout alone.
  template <typename Idx>
  RoutingArgs<Idx> routing_args(const Idx* idx, const float* w, int64_t T, bool* in_rank, bool publish) const {
    RoutingArgs<Idx> a{idx, w, int(T), int(L.topk), int(L.world_size), int(L.num_experts), nullptr, in_rank, nullptr, nullptr,
                       BadInput{nullptr, nullptr}};
    if (publish) {
      a.pos = reinterpret_cast<int32_t*>(tp.local + L.in_pos);
      a.pub_idx = reinterpret_cast<int32_t*>(tp.local + L.in_idx);
      a.pub_w = reinterpret_cast<float*>(tp.local + L.in_w);
      a.bad = bad;
      a.mirror = routing_copy;
      a.pub_base = tp.local + L.in_idx;
    }
    return a;
  }
  RouteScratch route_scratch(int32_t* scratch, bool publish) {
    const int64_t C = route_columns(), MB = route_max_blocks();
    int64_t* counted = reinterpret_cast<int64_t*>(scratch);
    int32_t* tables = scratch + 4 * MB;
    return RouteScratch{tables, tables + MB * C, route_big() ? tables + MB * C + C : nullptr, counts_host, counts_snap,
                        publish ? counts_ready : nullptr, publish ? summary : CountsSummary{}, counted, done + 7,
                        counted + MB};
  }

  template <typename Idx>
  void route(const Idx* idx, const float* w, int64_t T, int32_t* scratch, bool* in_rank, int32_t* per_rank,
             int32_t* per_expert, bool publish, int64_t epoch, cudaStream_t st) {
    const int64_t C = route_columns();
    const int B = route_blocks(T);
    const bool big = route_big();
    RoutingArgs<Idx> a = routing_args(idx, w, T, in_rank, publish);
    RouteScratch sc = route_scratch(scratch, publish);
    const int threads = big ? kRouteThreads : route_threads(C, max_smem);
    if (!publish) {  // the layout alone (get_dispatch_layout): the count pass
      route_count_kernel<Idx><<<B, threads, big ? 0 : size_t(C * 4), st>>>(a, sc, per_rank, per_expert, err, done + 5);
      check(cudaGetLastError(), "route_count_kernel launch");
      return;
    }
    route_kernel<Transport, Idx><<<B, threads, big ? 0 : size_t((threads / 32 + 1) * C * 4), st>>>(
        tp, L, a, sc, per_rank, per_expert, sync(epoch, 0));
    check(cudaGetLastError(), "route_kernel launch");
    routed = Routed{sc.placed, B, epoch, T, sc.totals};
  }

  // Where the next dispatch's routing kernels leave the counts matrix ([W][1 + W + E] int32:
  // host, the device-side address of host-mapped memory; snap, device memory), a copy of the
  // routing they publish (copy: the bytes from in_idx to the last position; 0: none), the
  // host-mapped int64 that receives the dispatch's epoch once the host copy is complete (ready),
  // and the matrix's summary for the host (route.cuh's CountsSummary: host-mapped, 0: none;
  // `alignment`: the dispatch's expert-major group padding).
  void set_routing_outputs(uintptr_t host, uintptr_t snap, uintptr_t copy, uintptr_t ready, uintptr_t summary_host,
                           int alignment) {
    if (alignment < 1) throw std::invalid_argument("set_routing_outputs: alignment must be >= 1, got " +
                                                   std::to_string(alignment));
    counts_host = P<int32_t>(host);
    counts_snap = P<int32_t>(snap);
    routing_copy = P<uint8_t>(copy);
    counts_ready = P<int64_t>(ready);
    summary = CountsSummary{P<int32_t>(summary_host), rank, alignment};
  }

  // Device memory of `words` int64 words, symmoe.bench.timeline.words(STAMP_WARPS) per block of
  // the data kernels (shape.dispatch): the next pull/push launches are the kernels built with stamps and leave their
  // timeline there (scripts/timeline_probe.py); 0: the normal kernels again.
  void set_stamps(uintptr_t s, int64_t words) {
    const int64_t need = int64_t(shape.dispatch) * kStampWarps * kStampMarks * 2;
    if (s != 0 && words < need)
      throw std::invalid_argument("set_stamps: words=" + std::to_string(words) + ", the timeline of " +
                                  std::to_string(shape.dispatch) + " blocks needs " + std::to_string(need));
    stamps = P<uint64_t>(s);
  }

  // flag: device int32 (zero); info: device-side address of host-mapped int64[4].
  void set_input_check(uintptr_t flag, uintptr_t info) { bad = BadInput{P<int32_t>(flag), P<int64_t>(info)}; }

  void layout(uintptr_t idx, bool idx64, uintptr_t w, int64_t T, uintptr_t scratch, uintptr_t in_rank,
              uintptr_t per_rank, uintptr_t per_expert, bool publish, int64_t epoch, uintptr_t stream) {
    if (!scratch) throw std::invalid_argument("layout: scratch of layout_scratch_bytes() bytes is required");
    if (idx64)
      route(P<const int64_t>(idx), P<const float>(w), T, P<int32_t>(scratch), P<bool>(in_rank), P<int32_t>(per_rank),
            P<int32_t>(per_expert), publish, epoch, S(stream));
    else
      route(P<const int32_t>(idx), P<const float>(w), T, P<int32_t>(scratch), P<bool>(in_rank), P<int32_t>(per_rank),
            P<int32_t>(per_expert), publish, epoch, S(stream));
  }

  static Outputs outputs(const py::dict& o) {
    auto g = [&](const char* k) { return o[k].cast<uintptr_t>(); };
    return Outputs{P<uint8_t>(g("x")),         P<int64_t>(g("idx")),       P<float>(g("w")),
                   P<int32_t>(g("src_rank")),  P<int32_t>(g("src_token")), P<int32_t>(g("src_slot")),
                   P<int64_t>(g("expert_offsets")), P<int32_t>(g("selfmap")), o["capacity"].cast<int64_t>()};
  }

  // pull_kernel and push_kernel share one signature; the stamped build while a timeline is set.
  using DataKernel = void (*)(Transport, Layout, const uint8_t*, Outputs, bool, int, MoveCfg, Sync);
  // kept: the plan bytes the phased fan-out still reads (phase_cfg).
  void launch_data(DataKernel kernel, int64_t plan_bytes, int64_t kept, uintptr_t x, const py::dict& out,
                   bool expert_major, int alignment, const Sync& sy, uintptr_t stream, const char* what) {
    MoveCfg m = move_cfg(plan_bytes, expert_major, true);
    if (expert_major && L.world_size == 1 && fan_phases) phase_cfg(m, kernel, kept);
    m.stamps = stamps;
    data_early = false;
    check(launch_following(kernel, shape.dispatch, m.warps * 32, smem_of(m), S(stream), tp, L, P<const uint8_t>(x), outputs(out),
                           expert_major, alignment, m, sy),
          what);
  }

  void pull(uintptr_t self_x, const py::dict& out, bool expert_major, int alignment, int64_t epoch, uintptr_t stream) {
    launch_data(stamps ? pull_kernel<Transport, true> : pull_kernel<Transport>,
                RecvPlan::bytes(int(L.world_size), int(L.local_experts())),
                RecvPlan::kept_bytes(int(L.world_size), int(L.local_experts())), self_x, out, expert_major, alignment,
                sync(epoch, 1), stream, "pull_kernel launch");
  }

  void push(uintptr_t x, const py::dict& out, bool expert_major, int alignment, int64_t epoch, uintptr_t stream) {
    launch_data(stamps ? push_kernel<Transport, true> : push_kernel<Transport>,
                SendPlan::bytes(int(L.world_size), int(L.local_experts())),
                SendPlan::bytes(int(L.world_size), int(L.local_experts())) /* push's phases read all of it */, x, out,
                expert_major, alignment, sync(epoch, 2), stream, "push_kernel launch");
  }

  // World size 1: this dispatch's rows by kernels/alone.cuh's kernels in place of pull /
  // push, from the routing the routing kernel published and this dispatch's counts (the
  // counts matrix, [1][2 + E]); nvshmem runs them alone too, 1-2 µs of kernel faster than its
  // own dispatch kernel. They take the data kernels' grid counter (they run in their place).
  // False, launching nothing, when they do not apply: peers, a timeline recording (its stamps
  // are pull's and push's), the expert-major dispatch with kernel.fan_phases off (the mover's
  // fan-out is pull's and push's) or not one row fitting in shared memory.
  // after_route: launched right behind this dispatch's route_kernel; both kernels then start on
  // that routing's placed marks, not on its grid's end (the expert-major one loads its first
  // rows before them).
  bool alone(uintptr_t x, const py::dict& out, bool expert_major, int alignment, uintptr_t counts, int64_t epoch,
             bool after_route, uintptr_t stream) {
    if (L.world_size != 1 || stamps || (expert_major && !fan_phases)) return false;
    AloneArgs a{};
    if (after_route)
      a.routed = AloneArgs::Routed{routed.placed, routed.chunks, routed.epoch, routed.tokens, routed.totals};
    a.lay = L;
    a.alignment = alignment;
    a.x = P<const uint8_t>(x);
    a.idx = reinterpret_cast<const int32_t*>(tp.local + L.in_idx);
    a.w = reinterpret_cast<const float*>(tp.local + L.in_w);
    a.pos = reinterpret_cast<const int32_t*>(tp.local + L.in_pos);
    a.counts = P<const int32_t>(counts);
    a.o = outputs(out);
    a.sy = sync(epoch, 2);
    const bool launched =
        launch_alone_args(a, expert_major, fan_phases, shape.alone, shape.sms, move.slot_bytes, move.depth, depth_auto,
                          S(stream));
    data_early = launched && a.routed.placed != nullptr;  // expert-major: also where it did not start early
    return launched;
  }

  // Push with peers in one kernel of `senders` sender blocks (the channels) and `receivers`
  // receiver blocks (push_stream.cuh); no unpack follows. senders <= the layout's num_channels.
  void push_stream(uintptr_t x, const py::dict& out, bool expert_major, int alignment, int senders, int receivers,
                   int64_t epoch, uintptr_t stream) {
    if (senders < 1 || senders > L.num_channels)
      throw std::invalid_argument("push_stream: senders=" + std::to_string(senders) + " outside 1.." +
                                  std::to_string(L.num_channels) + " (the layout's tail words)");
    if (receivers < 1 || receivers > senders)
      throw std::invalid_argument("push_stream: receivers=" + std::to_string(receivers) + " outside 1.." +
                                  std::to_string(senders) + " (the senders)");
    // The fan-out's mover (small pieces, 16 warps a block) in both layouts: receivers copy with
    // warps, not slots, and at W=2 rank-major ran 378 -> 192 us with it (whole-row slots leave
    // 3 warps a block).
    const MoveCfg m = move_cfg(push_stream_plan_bytes(int(L.world_size), int(L.local_experts()), senders, receivers),
                               /*fan=*/true);
    data_early = false;
    check(launch_following(push_stream_kernel<Transport>, senders + receivers, m.warps * 32, smem_of(m), S(stream), tp, L,
                           P<const uint8_t>(x), outputs(out), expert_major, alignment, m, sync(epoch, 2), senders,
                           receivers),
          "push_stream_kernel launch");
  }

  void unpack(uintptr_t counts, const py::dict& out, bool expert_major, int alignment, uintptr_t stream) {
    const size_t smem = size_t(RecvPlan::bytes(int(L.world_size), int(L.local_experts())));
    unpack_kernel<Transport><<<shape.dispatch, kUnpackThreads, smem, S(stream)>>>(tp, L, P<const int32_t>(counts), outputs(out), expert_major,
                                                             alignment, err, rank);
    check(cudaGetLastError(), "unpack_kernel launch");
  }

  // num_worst_tokens, after the data kernels on the same stream: this rank's outputs from its
  // received rows to `worst` filled, its per-expert counts (int32[L]) and, on bad ids or a
  // receiver over the limit, the host-mapped DeferredError. No host wait.
  void recv_tail(uintptr_t counts, const py::dict& out, int64_t worst, bool expert_major, int alignment,
                 uintptr_t per_expert, uintptr_t deferred, int64_t epoch, uintptr_t stream) {
    const Outputs o = outputs(out);
    const std::string e = launch_recv_tail(L, P<const int32_t>(counts),
                                           TailOutputs{o.x, o.idx, o.w, o.src_rank, o.src_token, o.src_slot}, worst,
                                           expert_major, alignment, rank, P<int32_t>(per_expert),
                                           P<DeferredError>(deferred), epoch, data_early, shape.tail, max_smem - 128,
                                           S(stream));
    if (!e.empty()) throw std::invalid_argument(e);
  }

  void combine_send(uintptr_t y, uintptr_t rw, uintptr_t src_rank, uintptr_t src_token, uintptr_t src_slot, int64_t rows,
                    int64_t epoch, uintptr_t stream) {
    const MoveCfg m = move_cfg(0);
    RecvRows rr{P<const int32_t>(src_rank), P<const int32_t>(src_token), P<const int32_t>(src_slot), rows};
    combine_send_kernel<Transport><<<shape.combine, m.warps * 32, smem_of(m), S(stream)>>>(
        tp, L, P<const uint8_t>(y), P<const float>(rw), rr, m, sync(epoch, 3));
    check(cudaGetLastError(), "combine_send_kernel launch");
  }

  void combine_reduce(int elem_size, bool is_bf16, uintptr_t y, uintptr_t rw, uintptr_t in_rank, uintptr_t topk_idx,
                      uintptr_t topk_w, int64_t T, uintptr_t selfmap, uintptr_t out, uintptr_t out_w, bool expert_major,
                      int64_t epoch, uintptr_t stream) {
    if (L.combine_slots > kMaxSlots) throw std::invalid_argument("combine: more than 64 slots per token (max(world, topk))");
    const CombineSources cs{P<const uint8_t>(y), P<const float>(rw), P<const int32_t>(selfmap),
                            tp.local + L.combine_x, reinterpret_cast<const float*>(tp.local + L.combine_w),
                            P<const bool>(in_rank), P<const int64_t>(topk_idx), P<const float>(topk_w), T,
                            L.row_bytes(), int(L.world_size), int(L.topk), int(L.combine_slots),
                            int(L.local_experts()), rank, expert_major};
    const Sync sy = sync(epoch, 4);
    auto launch = [&](auto kernel, auto* o) {
      const ReduceLaunch rl = reduce_launch(kernel, shape.reduce, T, L.world_size == 1);
      kernel<<<rl.blocks, kReduceThreads, 0, S(stream)>>>(tp, L, cs, o, P<float>(out_w), rl.parts, sy);
    };
    if (elem_size == 4)
      launch(combine_reduce_kernel<Transport, float>, P<float>(out));
    else if (is_bf16)
      launch(combine_reduce_kernel<Transport, __nv_bfloat16>, P<__nv_bfloat16>(out));
    else
      launch(combine_reduce_kernel<Transport, __half>, P<__half>(out));
    check(cudaGetLastError(), "combine_reduce_kernel launch");
  }

  // Cached dispatch: `routing` (nbytes, a multiple of 16) back to the input region from
  // in_idx on, `counts` to the counts region, then barrier "dispatch.counts".
  void republish(uintptr_t routing, int64_t nbytes, uintptr_t counts, int64_t epoch, uintptr_t stream) {
    if (nbytes < 0 || nbytes % 16) throw std::invalid_argument("republish: routing bytes must be a multiple of 16");
    const int64_t vecs = nbytes / 16;
    const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(shape.dispatch, (vecs + kRouteThreads - 1) / kRouteThreads)));
    republish_kernel<Transport><<<blocks, kRouteThreads, 0, S(stream)>>>(tp, L, P<const int4>(routing), vecs,
                                                                         P<const int32_t>(counts), sync(epoch, 6));
    check(cudaGetLastError(), "republish_kernel launch");
  }

  void barrier(int64_t flags_off, int64_t epoch, int stage, uintptr_t stream) {
    barrier_kernel<Transport><<<1, 32, 0, S(stream)>>>(tp, rank, int(L.world_size), flags_off, epoch, timeout_ns, err, err_host,
                                                         stage);
    check(cudaGetLastError(), "barrier_kernel launch");
  }
};

// Module-level helpers and the Context class (constructor given by the module: it knows how to
// make its transport). Methods are identical across modules.
template <class Transport, class Init>
void bind_context(py::module_& m, Init init) {
  using C = Ctx<Transport>;
  m.attr("LAYOUT_ARGS") = kLayoutArgs;
  m.attr("SUMMARY_HEAD") = kSummaryHead;
  m.attr("STAMP_WARPS") = kStampWarps;  // per block of a timeline; its marks: symmoe.bench.timeline.MARKS
  m.attr("STAGES") = py::dict(py::arg("dispatch.counts") = int(kStageDispatchCounts),
                              py::arg("dispatch.data") = int(kStageDispatchData),
                              py::arg("dispatch.done") = int(kStageDispatchDone),
                              py::arg("combine.data") = int(kStageCombineData),
                              py::arg("combine.done") = int(kStageCombineDone),
                              py::arg("barrier") = int(kStageMemoryBarrier),
                              py::arg("bulk copy") = int(kStageBulkCopy),
                              py::arg("dispatch.phase") = int(kStageFanPhase),
                              py::arg("dispatch.route") = int(kStageRouteChunk));
  m.attr("DEFERRED") = py::dict(py::arg("capacity") = int(kDeferredCapacity), py::arg("bad_ids") = int(kDeferredBadIds));
  bind_counts_wait(m);
  m.def("host_alloc_mapped", [](size_t nbytes) {
    void* h = nullptr;
    check(cudaHostAlloc(&h, nbytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
    std::memset(h, 0, nbytes);
    void* d = nullptr;
    check(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer");
    return py::make_tuple(reinterpret_cast<uintptr_t>(h), reinterpret_cast<uintptr_t>(d));
  }, "Pinned host memory the device can write: (host pointer, device pointer).");
  m.def("host_free", [](uintptr_t h) { check(cudaFreeHost(reinterpret_cast<void*>(h)), "cudaFreeHost"); });
  m.def("check_launch_shape", [](const std::vector<int64_t>& shape, int device_sms) { launch_geometry(shape, device_sms); },
        py::arg("shape"), py::arg("device_sms"),
        "The check a Context makes of LaunchShape.kernel_args() on a GPU of device_sms SMs: ValueError naming the "
        "field when launch_shape.py could not have made the shape.");
  py::class_<C>(m, "Context")
      .def(py::init(init))
      .def_readonly("max_smem", &C::max_smem)
      .def("layout_scratch_bytes", &C::layout_scratch_bytes)
      .def("set_copy_bytes", &C::set_copy_bytes, py::arg("max_piece"))
      .def("set_copy_depth", &C::set_copy_depth, py::arg("depth"))
      .def("set_fan_phases", &C::set_fan_phases, py::arg("mode"))
      .def("set_input_check", &C::set_input_check, py::arg("flag"), py::arg("info"))
      .def("set_stamps", &C::set_stamps, py::arg("stamps"), py::arg("words") = 0)
      .def("set_routing_outputs", &C::set_routing_outputs, py::arg("host"), py::arg("snap"), py::arg("copy"),
           py::arg("ready"), py::arg("summary") = 0, py::arg("alignment") = 1)
      .def("layout", &C::layout, py::arg("idx"), py::arg("idx64"), py::arg("w"), py::arg("tokens"), py::arg("scratch"),
           py::arg("in_rank"), py::arg("per_rank"), py::arg("per_expert"), py::arg("publish"), py::arg("epoch"),
           py::arg("stream"))
      .def("pull", &C::pull, py::arg("self_x"), py::arg("out"), py::arg("expert_major"), py::arg("alignment"),
           py::arg("epoch"), py::arg("stream"))
      .def("push", &C::push, py::arg("x"), py::arg("out"), py::arg("expert_major"), py::arg("alignment"),
           py::arg("epoch"), py::arg("stream"))
      .def("alone", &C::alone, py::arg("x"), py::arg("out"), py::arg("expert_major"), py::arg("alignment"),
           py::arg("counts"), py::arg("epoch"), py::arg("after_route"), py::arg("stream"))
      .def("push_stream", &C::push_stream, py::arg("x"), py::arg("out"), py::arg("expert_major"), py::arg("alignment"),
           py::arg("senders"), py::arg("receivers"), py::arg("epoch"), py::arg("stream"))
      .def("unpack", &C::unpack, py::arg("counts"), py::arg("out"), py::arg("expert_major"), py::arg("alignment"), py::arg("stream"))
      .def("recv_tail", &C::recv_tail, py::arg("counts"), py::arg("out"), py::arg("worst"), py::arg("expert_major"),
           py::arg("alignment"), py::arg("per_expert"), py::arg("deferred"), py::arg("epoch"), py::arg("stream"))
      .def("combine_send", &C::combine_send, py::arg("y"), py::arg("rw"), py::arg("src_rank"), py::arg("src_token"),
           py::arg("src_slot"), py::arg("rows"), py::arg("epoch"), py::arg("stream"))
      .def("combine_reduce", &C::combine_reduce, py::arg("elem_size"), py::arg("is_bf16"), py::arg("y"), py::arg("rw"),
           py::arg("in_rank"), py::arg("topk_idx"), py::arg("topk_w"), py::arg("tokens"), py::arg("selfmap"),
           py::arg("out"), py::arg("out_w"), py::arg("expert_major"), py::arg("epoch"), py::arg("stream"))
      .def("republish", &C::republish, py::arg("routing"), py::arg("nbytes"), py::arg("counts"), py::arg("epoch"),
           py::arg("stream"))
      .def("barrier", &C::barrier, py::arg("flags_offset"), py::arg("epoch"), py::arg("stage"), py::arg("stream"));
}

}  // namespace symmoe
