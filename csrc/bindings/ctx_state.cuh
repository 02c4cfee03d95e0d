// What a Context (the Python-facing kernel context, a template on the device transport) owns:
// the layout, the transport, the stall watch and the launch shape, fixed at construction, and
// the few settings that change, each in the small struct of the calls that change it.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/layout.cuh"
#include "../common/mover.cuh"
#include "../common/phases.cuh"
#include "../common/stamps.cuh"
#include "../kernels/route.cuh"
#include "cuda_check.h"
#include "ctx_smem.cuh"
#include "ctx_watch.h"
#include "launch_geometry.h"
#include "refusals.h"

namespace symmoe {

// Default piece of the expert-major fan-out (one load, up to top-k bulk stores): smaller pieces
// let 16 warps per block keep stores in flight. Row-copy microbenchmark, 4096 rows of 14336 B
// to 8 rows each: 147 µs at 3584-byte pieces against 155 µs at whole rows.
constexpr uint32_t kFanSlotBytes = 3584;

// The data kernels' mover and the world-size-1 phases (set_copy_bytes, set_copy_depth,
// set_fan_phases: kernel.copy_bytes, .copy_depth, .fan_phases).
struct MoverSettings {
  MoveCfg move{};          // bulk piece size and warps per block (for plan_bytes = 0)
  MoveCfg move_fan{};      // the same for the expert-major dispatch (a piece goes to several rows)
  bool depth_auto = true;  // kernel.copy_depth 0: kRowDepth where two warps still fit, else 2
  int fan_phases = 0;      // 0 off, 1 per block, 2 grid-wide, 3 steal
  int64_t max_piece = 0;   // kernel.copy_bytes

  // Rows of rb bytes split into equal pieces of at most `max_piece` bytes (0: 16 KB, and
  // kFanSlotBytes for the expert-major dispatch), each rounded up to 128 so every warp's slots
  // stay aligned.
  void set_copy_bytes(int64_t rb, int64_t max_piece) {
    if (max_piece < 0 || max_piece % 128)
      throw std::invalid_argument("copy_bytes=" + std::to_string(max_piece) + ": must be 0 or a multiple of 128");
    this->max_piece = max_piece;
    move_fan = move;
    size_pieces(rb);
  }
  // The pieces of both movers for rows of rb bytes (nothing else changes).
  void size_pieces(int64_t rb) {
    move.slot_bytes = piece_bytes(rb, max_piece ? max_piece : kMaxSlotBytes);
    move_fan.slot_bytes = piece_bytes(rb, max_piece ? max_piece : kFanSlotBytes);
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
  // each block alone, 2 every block meeting the others (all of them resident at once), 3 steal.
  void set_fan_phases(int mode) {
    if (mode < 0 || mode > 3)
      throw std::invalid_argument("fan_phases=" + std::to_string(mode) +
                                  ": must be 0 (off), 1 (block), 2 (grid) or 3 (steal)");
    fan_phases = mode;
  }
};

// Where the next dispatch's routing leaves what the host and a cached dispatch read
// (set_routing_outputs), and the in-kernel expert-id checks (set_input_check).
struct RoutingOutputs {
  int32_t* counts_host = nullptr;  // the counts matrix, host-mapped (device-side address)
  int32_t* counts_snap = nullptr;  // ... and in device memory
  uint8_t* routing_copy = nullptr;  // the published routing's copy (a cached dispatch puts it back)
  int64_t* counts_ready = nullptr;  // host-mapped: the dispatch's epoch once counts_host is in
  CountsSummary summary;            // what the host reads after its wait (summary.host nullptr: none)
  BadInput bad{nullptr, nullptr};
};

// The last routing queued and what the data kernel behind it did: written by each dispatch.
struct LastRouting {
  // route_kernel's chunks' placed marks, their number, its epoch and tokens, and its column
  // totals, for a data kernel alone that starts on the marks (ctx_alone).
  const int64_t* placed = nullptr;
  int chunks = 0;
  int64_t epoch = 0, tokens = 0;
  const int32_t* totals = nullptr;
  // The last data kernel queued started before its routing grid ended (ctx_alone behind
  // route_kernel): the tail after it reads the counts only once that kernel ended.
  bool data_early = false;
};

template <class Transport>
struct Ctx {
  // Fixed at construction.
  Layout L;
  Transport tp;
  CtxWatch watch;
  LaunchGeometry shape;  // every launch's blocks (symmoe/launch_shape.py)
  SmemBudget smem;
  // Changed by the calls named at each struct.
  MoverSettings mover;
  RoutingOutputs outs;
  LastRouting last;
  uint64_t* stamps = nullptr;  // the data kernels' timeline (set_stamps; common/stamps.cuh)

  Ctx(const std::vector<int64_t>& layout, int rank, Transport tp_, uintptr_t err_dev, uintptr_t err_host_dev,
      double timeout_s, const std::vector<int64_t>& geometry, uintptr_t counters)
      : tp(tp_),
        watch{rank, P<ErrorWord>(err_dev), P<ErrorWord>(err_host_dev), uint64_t(timeout_s * 1e9),
              P<unsigned int>(counters)} {
    if (layout.size() != size_t(kLayoutArgs))
      throw std::invalid_argument("layout: expected " + std::to_string(kLayoutArgs) +
                                  " values (BufferLayout.kernel_args()), got " + std::to_string(layout.size()));
    std::memcpy(&L, layout.data(), sizeof(Layout));
    if (L.x_row_bytes != L.full_row_bytes())  // narrower rows are per dispatch (rows())
      throw std::invalid_argument("layout: x_row_bytes=" + std::to_string(L.x_row_bytes) + ", a Context takes full rows (" +
                                  std::to_string(L.full_row_bytes()) + ")");
    int dev = 0, sms = 0, optin = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    // The SM count only checks the shape (launch_geometry): every block count comes from Python.
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "multiprocessor count");
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "shared memory limit");
    shape = launch_geometry(geometry, sms);
    mover.move.plan_bytes = 0;
    mover.move.warps = 8;
    mover.set_copy_bytes(L.row_bytes(), 0);
    mover.set_copy_depth(0);
    smem = allow_smem<Transport>(optin);
  }

  // This Context for a dispatch whose x rows are `rb` bytes (0: the layout's full rows): an FP8
  // dispatch moves e4m3 + scale bytes, about half a bfloat16 row. The copy's layout has rows of rb
  // bytes (moved, and their stride in the input region, the pool and the outputs: every rank of
  // the dispatch passes the same rb) and its movers pieces sized for them; combine keeps the full
  // rows. A launch on the copy records into its `last`: the caller hands that back (ctx_dispatch.cuh).
  Ctx rows(int64_t rb) const {
    Ctx c = *this;
    if (rb == 0 || rb == L.full_row_bytes()) return c;
    if (rb < 16 || rb > L.full_row_bytes() || rb % 16)
      throw std::invalid_argument("row_bytes=" + std::to_string(rb) + ": must be 0 (full rows) or a multiple of 16 in 16.." +
                                  std::to_string(L.full_row_bytes()));
    c.L.x_row_bytes = rb;
    c.mover.size_pieces(rb);
    return c;
  }

  int rank() const { return watch.rank; }
  Sync sync(int64_t epoch, CtxCounter which) const { return watch.sync(epoch, which); }

  // Warps per block that fit next to `plan` bytes of tables.
  // fan: the expert-major dispatch's mover (small pieces, 16 warps), else whole rows.
  // data: the pull and push kernels' budget (smem.data), else every kernel's (smem.max).
  MoveCfg move_cfg(int64_t plan, bool fan = false, bool data = false) const {
    return refuse_unfit(fit_mover(fan ? mover.move_fan : mover.move, plan, data ? smem.data : smem.max,
                                  mover.depth_auto),
                        plan);
  }
  size_t smem_of(const MoveCfg& m) const {
    if (m.phase_rows > 0) return size_t(phase_smem(m, L.row_bytes()));
    return size_t(m.plan_bytes + int64_t(m.warps) * WarpMoverSmem::per_warp_bytes(m.slot_bytes, m.depth));
  }

  void set_copy_bytes(int64_t max_piece) { mover.set_copy_bytes(L.row_bytes(), max_piece); }
  void set_copy_depth(int depth) { mover.set_copy_depth(depth); }
  void set_fan_phases(int mode) { mover.set_fan_phases(mode); }

  // Where the next dispatch's routing kernels leave the counts matrix ([W][1 + W + E] int32:
  // host, the device-side address of host-mapped memory; snap, device memory), a copy of the
  // routing they publish (copy: the bytes from in_idx to the last position; 0: none), the
  // host-mapped int64 that receives the dispatch's epoch once the host copy is complete (ready),
  // and the matrix's summary for the host (route.cuh's CountsSummary: host-mapped, 0: none;
  // `alignment`: the dispatch's expert-major group padding).
  void set_routing_outputs(uintptr_t host, uintptr_t snap, uintptr_t copy, uintptr_t ready, uintptr_t summary_host,
                           int alignment) {
    if (alignment < 1)
      throw std::invalid_argument("set_routing_outputs: alignment must be >= 1, got " + std::to_string(alignment));
    outs.counts_host = P<int32_t>(host);
    outs.counts_snap = P<int32_t>(snap);
    outs.routing_copy = P<uint8_t>(copy);
    outs.counts_ready = P<int64_t>(ready);
    outs.summary = CountsSummary{P<int32_t>(summary_host), rank(), alignment};
  }
  // flag: device int32 (zero); info: device-side address of host-mapped int64[4].
  void set_input_check(uintptr_t flag, uintptr_t info) { outs.bad = BadInput{P<int32_t>(flag), P<int64_t>(info)}; }

  // Device memory of `words` int64 words, symmoe.bench.timeline.words(STAMP_WARPS) per block of
  // the data kernels (shape.dispatch): the next pull/push launches are the kernels built with
  // stamps and leave their timeline there (scripts/timeline_probe.py); 0: the normal kernels again.
  void set_stamps(uintptr_t s, int64_t words) {
    const int64_t need = int64_t(shape.dispatch) * kStampWarps * kStampMarks * 2;
    if (s != 0 && words < need)
      throw std::invalid_argument("set_stamps: words=" + std::to_string(words) + ", the timeline of " +
                                  std::to_string(shape.dispatch) + " blocks needs " + std::to_string(need));
    stamps = P<uint64_t>(s);
  }
};

}  // namespace symmoe
