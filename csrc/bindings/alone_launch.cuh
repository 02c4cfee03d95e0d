// The launch of kernels/alone.cuh's kernels: by a Context at world size 1 (Ctx::alone), and
// bound by symmoe_cuda as `alone` for protocols that have no Context of this module (nvshmem
// alone).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "../kernels/alone.cuh"
#include "../common/follow_launch.h"

namespace symmoe {

// A kernel's dynamic shared memory: the opt-in limit less its own static part (set on the
// kernel at its first launch).
template <class Kernel>
int alone_smem_limit(Kernel kernel, const char* name) {
  int dev = 0, max_smem = 0;
  cudaFuncAttributes fa{};
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaFuncGetAttributes(&fa, kernel) != cudaSuccess)
    throw std::runtime_error(std::string(name) + ": the shared memory limit query failed");
  const int lim = max_smem - int((fa.sharedSizeBytes + 127) / 128 * 128);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, lim) != cudaSuccess)
    throw std::runtime_error(std::string(name) + ": cudaFuncSetAttribute failed");
  return lim;
}

// The phased fan-out's geometry in m for E experts and rows of rb bytes in `limit` bytes of shared
// memory: its rows past the plan tables the phases still read, or (`past`) past all of FanPlan,
// for rows that load before the plan is built. False: not one row fits.
inline bool fan_geometry(MoveCfg& m, int64_t E, int64_t rb, int limit, bool grid, bool past) {
  m.plan_bytes = past ? (FanPlan::bytes(E) + kSlotAlign - 1) / kSlotAlign * kSlotAlign : FanPlan::bytes(E);
  return phase_geometry(m, past ? m.plan_bytes : FanPlan::kept_bytes(E), limit, rb, grid);
}

// The launch of a one-rank dispatch whose arguments `a` (all but the mover's geometry) are
// set: expert-major the phased fan-out with mode kernel.fan_phases (1 block, 2 grid, 3 steal;
// sy.done: a zeroed grid counter), else the rows by the mover, in pieces of at most `row_piece` bytes
// with `row_depth` slots a warp (depth_auto as fit_mover's). False, launching nothing, when the
// layout has peers or, expert-major, not one row fits in shared memory: the caller runs its
// own kernel.
inline bool launch_alone_args(AloneArgs a, bool expert_major, int mode, int blocks, int64_t row_piece, int row_depth,
                              bool depth_auto, cudaStream_t s) {
  if (expert_major && (mode < 1 || mode > 3))
    throw std::invalid_argument("alone: fan_phases mode " + std::to_string(mode) + ", must be 1, 2 or 3");
  if (a.lay.world_size != 1) return false;
  const int64_t rb = a.lay.row_bytes();
  MoveCfg m{};
  size_t smem = 0;
  bool early = false;  // expert-major: alone_fan_kernel<true> (round 0's loads ahead of the routing's end)
  if (expert_major) {
    // Both instances get the opt-in (the same static part).
    static const int limit = std::min(alone_smem_limit(alone_fan_kernel<false>, "alone_fan_kernel"),
                                      alone_smem_limit(alone_fan_kernel<true>, "alone_fan_kernel"));
    const int64_t E = a.lay.num_experts;
    if (!fan_geometry(m, E, rb, limit, mode == 2, false)) return false;
    if (a.routed.placed != nullptr) {
      // Behind the routing the rows load before the plan is built, so they go past all of it;
      // only where that keeps every row a block holds (16 at the DeepSeek shape).
      MoveCfg past{};
      early = fan_geometry(past, E, rb, limit, mode == 2, true) && past.phase_rows == m.phase_rows;
      if (early) m = past;
    }
    m.phase_steal = mode == 3;
    if (m.phase_grid) {
      const std::string refusal =
          phase_grid_refusal(early ? alone_fan_kernel<true> : alone_fan_kernel<false>, m, rb, blocks);
      if (!refusal.empty()) throw std::invalid_argument(refusal);
    }
    smem = size_t(phase_smem(m, rb));
  } else {
    // Both instances get the opt-in (the same static part).
    static const int limit = std::min(alone_smem_limit(alone_rows_kernel<false>, "alone_rows_kernel"),
                                      alone_smem_limit(alone_rows_kernel<true>, "alone_rows_kernel"));
    m = row_mover(rb, row_piece, row_depth, limit, depth_auto);
    smem = size_t(m.warps) * WarpMoverSmem::per_warp_bytes(m.slot_bytes, m.depth);
  }
  a.mc = m;
  auto kernel = expert_major ? (early ? alone_fan_kernel<true> : alone_fan_kernel<false>)
                             : (a.routed.placed != nullptr ? alone_rows_kernel<true> : alone_rows_kernel<false>);
  const cudaError_t e = launch_following(kernel, blocks, m.warps * 32, smem, s, a);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(expert_major ? "alone_fan_kernel" : "alone_rows_kernel") +
                             " launch: " + cudaGetErrorString(e));
  return true;
}

// Tokens a chunk of the routed kernels' own routing: top-8 over 16 warps, one step (32 pairs)
// a warp; the chunks' sums a few vector loads a thread (at 4096 tokens 64 chunks, so the last
// sums 63 chunks' counts, and 64 marks to wait for).
constexpr int64_t kOwnChunkTokens = 64;
// The fewest warps that route a chunk in a routing block of the rank-major routed kernel (the
// rest are its mover warps: 3 at the DeepSeek shape, so 13 route there).
constexpr int kOwnRouteWarps = 8;

// num_worst_tokens' tail for a world-size-1 rank-major dispatch that routes, folded into the
// repair (RoutedTail): worst 0 none; else per_expert ([E] int32 on the device) and deferred (the
// host-mapped DeferredError) are required. Expert-major the caller launches recv_tail_kernel: the
// tail is folded only rank-major, and `what` names the launch in the error.
inline RoutedTail routed_tail(const char* what, bool expert_major, int64_t worst, uintptr_t per_expert,
                              uintptr_t deferred, int64_t epoch) {
  if (worst < 0) throw std::invalid_argument(std::string(what) + ": worst " + std::to_string(worst) + ", must be >= 0");
  if (worst > 0 && (expert_major || per_expert == 0 || deferred == 0))
    throw std::invalid_argument(std::string(what) + ": a folded num_worst_tokens tail is rank-major only and needs "
                                "per_expert and deferred (got expert_major " + std::to_string(expert_major) +
                                ", per_expert " + std::to_string(per_expert) + ", deferred " +
                                std::to_string(deferred) + ")");
  return RoutedTail{worst, reinterpret_cast<int32_t*>(per_expert), reinterpret_cast<DeferredError*>(deferred), epoch};
}

// The launch of alone_rows_routed_kernel and the repair behind it (world size 1, rank-major, a
// dispatch that routes itself): `a` and `f` as launch_alone_routed's; the mover's geometry of the
// cached dispatch's alone_rows_kernel (launch_alone_args: whole rows, kRowDepth slots a warp),
// in blocks of kMaxMoverWarps warps for the routing, whose tables go past the mover's slots (as
// many mover warps as fit beside them, at most kMaxMoverWarps - kOwnRouteWarps: the rest of a
// routing block routes its chunk, and all of it where the host waits for the counts: the
// scratch's counts_ready is set, OwnRouting::route_first). False, launching nothing, where not
// one fits or the scratch keeps no grid counter (f.sc.summed, sums_readers) or end word
// (f.sc.ended). `tail`: the repair also does num_worst_tokens' tail (routed_tail).
template <typename Idx>
bool launch_alone_rows_routed(AloneArgs a, OwnRouting<Idx> f, int blocks, cudaStream_t s, const RoutedTail& tail,
                              uint64_t* stamps) {
  static const int limit = std::min(alone_smem_limit(alone_rows_routed_kernel<Idx>, "alone_rows_routed_kernel"),
                                    alone_smem_limit(alone_rows_routed_kernel<Idx, true>, "alone_rows_routed_kernel"));
  if (f.sc.summed == nullptr || f.sc.sums_readers == nullptr || f.sc.ended == nullptr) return false;
  const int64_t rb = a.lay.row_bytes(), C = int64_t(f.a.W) + f.a.E;  // RoutingArgs::columns() is device-only
  const int64_t tables = 4 * (int64_t(f.stride) + int64_t(kMaxMoverWarps) * C);  // route_chunk's, 16 warps
  MoveCfg m{};
  try {
    m = row_mover(rb, kMaxSlotBytes, kRowDepth, limit - tables, true);
  } catch (const std::invalid_argument&) {
    return false;  // not one slot beside the routing's tables
  }
  m.warps = std::min(m.warps, kMaxMoverWarps - kOwnRouteWarps);  // a routing block's other warps route
  f.tables_off = int64_t(m.warps) * WarpMoverSmem::per_warp_bytes(m.slot_bytes, m.depth);  // 128-byte aligned
  f.delayed = 0;
  f.route_first = f.sc.counts_ready != nullptr;  // the host waits for the counts
  const size_t smem = size_t(f.tables_off + tables);
  a.mc = m;
  a.mc.stamps = stamps;
  // The chunks add nothing into sums rank-major; the scratch's counter words are the mover's.
  a.routed = AloneArgs::Routed{f.sc.placed, f.a.chunks, f.epoch,       a.routed.tokens,
                               f.sc.totals, nullptr,    f.sc.summed,   f.sc.sums_readers};
  f.sc.sums = nullptr, f.sc.summed = nullptr;
  auto kernel = stamps ? alone_rows_routed_kernel<Idx, true> : alone_rows_routed_kernel<Idx>;
  // Not a following launch: x and the routing's inputs are read at once.
  kernel<<<blocks, kMaxMoverWarps * 32, smem, s>>>(a, f);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("alone_rows_routed_kernel launch: ") + cudaGetErrorString(e));
  e = launch_following(alone_rows_repair_kernel<Idx>, blocks, kRepairThreads, 0, s, a, f.a,
                       static_cast<const int32_t*>(f.counts_row), static_cast<const int64_t*>(f.sc.ended), tail);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("alone_rows_repair_kernel launch: ") + cudaGetErrorString(e));
  return true;
}

// The launch of a dispatch that routes itself at world size 1: rank-major
// launch_alone_rows_routed's, expert-major alone_fan_routed_kernel. `a` as for launch_alone_args
// (a.routed.tokens the tokens), f.a / f.sc / f.stride / f.epoch / f.counts_row set, f.a.chunks in
// [1, blocks). Expert-major the rows get the geometry
// alone_fan_kernel<false> would (`plain_limit` its shared memory) but past all of FanPlan; the
// routing's tables go past the rows where they fit, else over the last rows, whose round 0
// loads wait for the routing. False, launching nothing, where that costs a row or the tables
// do not fit: the caller routes and moves with two kernels.
template <typename Idx>
bool launch_alone_routed(AloneArgs a, OwnRouting<Idx> f, bool expert_major, int mode, int blocks, cudaStream_t s,
                         const RoutedTail& tail, uint64_t* stamps = nullptr) {
  if (mode < 1 || mode > 3)
    throw std::invalid_argument("alone_fan_routed_kernel: fan_phases mode " + std::to_string(mode) +
                                ", must be 1, 2 or 3");
  if (a.lay.world_size != 1 || f.a.chunks < 1 || f.a.chunks >= blocks || f.stride % 4) return false;
  if (!expert_major) return launch_alone_rows_routed(a, f, blocks, s, tail, stamps);
  static const int plain_limit = alone_smem_limit(alone_fan_kernel<false>, "alone_fan_kernel");
  // Both instances get the opt-in (the same static part); `stamps`: the timeline's build.
  static const int limit = std::min(alone_smem_limit(alone_fan_routed_kernel<Idx>, "alone_fan_routed_kernel"),
                                    alone_smem_limit(alone_fan_routed_kernel<Idx, true>, "alone_fan_routed_kernel"));
  auto kernel = stamps ? alone_fan_routed_kernel<Idx, true> : alone_fan_routed_kernel<Idx>;
  const int64_t rb = a.lay.row_bytes(), E = a.lay.num_experts, C = int64_t(f.a.W) + f.a.E;  // RoutingArgs::columns() is device-only
  MoveCfg plain{}, m{};
  if (!fan_geometry(plain, E, rb, plain_limit, mode == 2, false) || !fan_geometry(m, E, rb, limit, mode == 2, true) ||
      m.phase_rows != plain.phase_rows ||
      FanPlan::bytes(E) < 4 * int64_t(f.stride))  // the end's totals lie in FanPlan's tables
    return false;
  const int64_t tables = 4 * (int64_t(f.stride) + int64_t(m.warps) * C), rows_end = m.phase_base + m.phase_rows * rb;
  int64_t smem = phase_smem(m, rb);
  const int64_t after = (smem + 15) / 16 * 16;
  if (after + tables <= limit) {
    f.tables_off = after;
    f.delayed = m.warps;
    smem = after + tables;
  } else {
    f.tables_off = (rows_end - tables) / 16 * 16;
    if (f.tables_off < m.phase_base) return false;
    f.delayed = int((f.tables_off - m.phase_base) / rb);
  }
  if (m.phase_grid) {
    const std::string refusal = phase_grid_refusal(kernel, m, rb, blocks);
    if (!refusal.empty()) throw std::invalid_argument(refusal);
  }
  a.mc = m;
  a.mc.stamps = stamps;
  a.mc.phase_steal = mode == 3;
  a.routed = AloneArgs::Routed{f.sc.placed, f.a.chunks, f.epoch,     a.routed.tokens,
                               f.sc.totals, f.sc.sums,  f.sc.summed, f.sc.sums_readers};
  // Not a following launch: x and the routing's inputs are read at once.
  kernel<<<blocks, m.warps * 32, size_t(smem), s>>>(a, f);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("alone_fan_routed_kernel launch: ") + cudaGetErrorString(e));
  return true;
}

// AloneArgs from the bindings' pointers p[0..12]: x, idx (int32 [T, K]), w, pos ([T, 1 + K]),
// counts ([1][2 + E]), out x, idx, w, src_rank, src_token, src_slot, expert_offsets (rank-major:
// 0), selfmap (0: none); `what` names the binding in its errors.
inline AloneArgs alone_args(const char* what, const std::vector<int64_t>& layout, int alignment, int64_t capacity,
                            int64_t epoch, uint64_t timeout_ns, const std::vector<int64_t>& p, size_t nptrs,
                            uintptr_t done, uintptr_t err, uintptr_t err_host) {
  if (layout.size() != size_t(kLayoutArgs))
    throw std::invalid_argument(std::string(what) + ": layout of " + std::to_string(layout.size()) +
                                " values, expected " + std::to_string(kLayoutArgs));
  if (p.size() != nptrs)
    throw std::invalid_argument(std::string(what) + ": expected " + std::to_string(nptrs) + " pointers, got " +
                                std::to_string(p.size()));
  AloneArgs a{};
  std::memcpy(&a.lay, layout.data(), sizeof(Layout));
  auto ptr = [&](int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p[size_t(i)])); };
  a.alignment = alignment;
  a.x = static_cast<const uint8_t*>(ptr(0));
  a.idx = static_cast<const int32_t*>(ptr(1));
  a.w = static_cast<const float*>(ptr(2));
  a.pos = static_cast<const int32_t*>(ptr(3));
  a.counts = static_cast<const int32_t*>(ptr(4));
  a.o = Outputs{static_cast<uint8_t*>(ptr(5)), static_cast<int64_t*>(ptr(6)), static_cast<float*>(ptr(7)),
                static_cast<int32_t*>(ptr(8)), static_cast<int32_t*>(ptr(9)), static_cast<int32_t*>(ptr(10)),
                static_cast<int64_t*>(ptr(11)), static_cast<int32_t*>(ptr(12)), capacity};
  a.sy = Sync{0, epoch, timeout_ns, reinterpret_cast<ErrorWord*>(err), reinterpret_cast<ErrorWord*>(err_host),
              reinterpret_cast<unsigned int*>(done)};
  return a;
}

// The binding for protocols that have no Context of this module (nvshmem alone), with the
// mover's default geometry; ptrs as alone_args'.
inline bool launch_alone(const std::vector<int64_t>& layout, bool expert_major, int alignment, int64_t capacity,
                         int64_t epoch, uint64_t timeout_ns, const std::vector<int64_t>& p, int mode, int blocks,
                         uintptr_t done, uintptr_t err, uintptr_t err_host, uintptr_t stream) {
  const AloneArgs a = alone_args("alone", layout, alignment, capacity, epoch, timeout_ns, p, 13, done, err, err_host);
  return launch_alone_args(a, expert_major, mode, blocks, kMaxSlotBytes, kRowDepth, true,
                           reinterpret_cast<cudaStream_t>(stream));
}

// alone_routed's own routing scratch, zeroed once by the caller, in int32 words for `blocks`
// blocks and C columns (1 + E alone): the chunks' counted, then placed epochs (int64), the
// ticket (a 16-byte word: the ticket, the chunks summed into sums, the blocks that read them),
// the routing's end epoch (RouteScratch::ended, int64, in 16 bytes), the column totals, sums
// (RouteScratch::sums), then each chunk's counts at stride(C).
struct RoutedScratch {
  static int64_t stride(int64_t C) { return (C + 3) / 4 * 4; }
  static int64_t words(int64_t blocks, int64_t C) { return 4 * blocks + 8 + (2 + blocks) * stride(C); }
  static RouteScratch carve(int32_t* s, int64_t blocks, int64_t C) {
    RouteScratch sc{};
    sc.counted = reinterpret_cast<int64_t*>(s);
    sc.placed = sc.counted + blocks;
    sc.ticket = reinterpret_cast<unsigned int*>(s + 4 * blocks);
    sc.summed = sc.ticket + 1;
    sc.sums_readers = sc.ticket + 2;
    sc.ended = reinterpret_cast<int64_t*>(s + 4 * blocks + 4);
    sc.totals = s + 4 * blocks + 8;
    sc.sums = sc.totals + stride(C);
    sc.part = sc.sums + stride(C);
    return sc;
  }
};

// The binding of alone_fan_routed_kernel for protocols that have no Context of this module
// (nvshmem alone): a dispatch of `tokens` tokens routed inside its data kernel, leaving what
// the protocol's own routing would (the int32 ids, weights and positions, is_token_in_rank,
// the counts row, the host's copy, summary and ready epoch, the bad-id record). ptrs: alone_args'
// 13 (counts: the device counts row this kernel writes; it is the snapshot), then topk_idx
// (int64 when idx64), topk_weights (fp32), in_rank, scratch (RoutedScratch for `blocks`), the
// bad-id flag (device int32, zero between dispatches) and record (host-mapped int64 [4]), and
// the host's counts copy, ready word and summary (0, 0, 0: none, num_worst_tokens). `epoch`
// increases from one call to the next on one scratch. worst, per_expert, deferred: rank-major,
// num_worst_tokens' tail done in the repair (routed_tail; 0: none). False, launching nothing,
// where it does not apply (no token, a grid of one block, no phased fan-out, or a row it would
// cost): the caller then launches the tail itself.
inline bool launch_alone_routed_ptrs(const std::vector<int64_t>& layout, bool expert_major, bool idx64, int64_t tokens,
                                     int alignment, int64_t capacity, int64_t epoch, uint64_t timeout_ns,
                                     const std::vector<int64_t>& p, int mode, int blocks, uintptr_t done,
                                     uintptr_t err, uintptr_t err_host, uintptr_t stream, int64_t worst,
                                     uintptr_t per_expert, uintptr_t deferred) {
  const RoutedTail tail = routed_tail("alone_routed", expert_major, worst, per_expert, deferred, epoch);
  AloneArgs a = alone_args("alone_routed", layout, alignment, capacity, epoch, timeout_ns, p, 22, done, err, err_host);
  const int64_t chunks = std::min<int64_t>(blocks - 1, (tokens + kOwnChunkTokens - 1) / kOwnChunkTokens);
  if (a.lay.world_size != 1 || mode == 0 || tokens < 1 || chunks < 1) return false;
  a.routed.tokens = tokens;
  const int64_t C = 1 + a.lay.num_experts;
  auto go = [&](auto idx) {
    using Idx = std::remove_const_t<std::remove_pointer_t<decltype(idx)>>;
    OwnRouting<Idx> f{};
    f.a = RoutingArgs<Idx>{idx, reinterpret_cast<const float*>(p[14]), int(tokens), int(a.lay.topk), 1,
                           int(a.lay.num_experts), const_cast<int32_t*>(a.pos), reinterpret_cast<bool*>(p[15]),
                           const_cast<int32_t*>(a.idx), const_cast<float*>(a.w),
                           BadInput{reinterpret_cast<int32_t*>(p[17]), reinterpret_cast<int64_t*>(p[18])}};
    f.a.chunks = int(chunks);
    f.sc = RoutedScratch::carve(reinterpret_cast<int32_t*>(p[16]), blocks, C);
    f.sc.counts_host = reinterpret_cast<int32_t*>(p[19]);
    f.sc.counts_ready = reinterpret_cast<int64_t*>(p[20]);
    f.sc.summary = CountsSummary{reinterpret_cast<int32_t*>(p[21]), 0, alignment};
    f.stride = int(RoutedScratch::stride(C));
    f.epoch = epoch;
    f.counts_row = const_cast<int32_t*>(a.counts);
    return launch_alone_routed(a, f, expert_major, mode, blocks, reinterpret_cast<cudaStream_t>(stream), tail);
  };
  return idx64 ? go(reinterpret_cast<const int64_t*>(p[13])) : go(reinterpret_cast<const int32_t*>(p[13]));
}

}  // namespace symmoe
