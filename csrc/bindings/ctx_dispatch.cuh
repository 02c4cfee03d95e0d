// A Context's dispatch data launches after the routing: pull, push (and its unpack, or the
// streamed push), the world-size-1 alone kernels, and num_worst_tokens' tail. Blocks:
// LaunchShape.dispatch (alone: .alone, tail: .tail; the streamed push: its senders + receivers).
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "../common/follow_launch.h"
#include "../kernels/dispatch.cuh"
#include "../kernels/push_stream.cuh"
#include "alone_launch.cuh"
#include "ctx_state.cuh"
#include "refusals.h"
#include "tail_launch.cuh"

namespace symmoe {

// Each launch takes `row_bytes`, the bytes of this dispatch's x rows (0: the layout's full rows; an
// FP8 dispatch's are fewer), and runs on the Context for them (Ctx::rows).
template <class T>
struct OnRows {
  Ctx<T>& full;
  Ctx<T> c;  // the Context for these rows
  OnRows(Ctx<T>& f, int64_t row_bytes) : full(f), c(f.rows(row_bytes)) {}
  ~OnRows() { full.last = c.last; }  // what the launch recorded of the call
};

// A dispatch's outputs as protocol/cuda.py passes them: a dict of pointers and `capacity`.
// With "fp8_data" also an FP8 dispatch's split outputs ("fp8_scales", "fp8_h", "fp8_s"; check_fp8_rows).
inline Outputs outputs(const pybind11::dict& o) {
  auto g = [&](const char* k) { return o[k].cast<uintptr_t>(); };
  Outputs r{P<uint8_t>(g("x")),         P<int64_t>(g("idx")),       P<float>(g("w")),
            P<int32_t>(g("src_rank")),  P<int32_t>(g("src_token")), P<int32_t>(g("src_slot")),
            P<int64_t>(g("expert_offsets")), P<int32_t>(g("selfmap")), o["capacity"].cast<int64_t>()};
  if (o.contains("fp8_data")) {
    r.fp8_data = P<uint8_t>(g("fp8_data"));
    r.fp8_scales = P<int32_t>(g("fp8_scales"));
    r.fp8_h = o["fp8_h"].cast<int32_t>();
    r.fp8_s = o["fp8_s"].cast<int32_t>();
  }
  return r;
}

// An FP8 dispatch's rows as only the push with peers (move mode 1, W > 1) takes them: split
// outputs (the unpack writes them) and rows read from two sources ("x_tail", "x_head":
// MoveCfg::x_tail). Both must fit the dispatch's rows; refused before any launch.
inline void check_fp8_rows(const pybind11::dict& out, int mode, int64_t world_size, int64_t row_bytes) {
  const bool split = out.contains("fp8_data"), two = out.contains("x_tail");
  if (!split && !two) return;
  if (mode != 1 || world_size == 1)
    throw std::invalid_argument(std::string(split ? "split FP8 outputs" : "FP8 rows from two sources") +
                                ": only the push with peers takes them (move mode " + std::to_string(mode) +
                                ", world size " + std::to_string(world_size) + ")");
  if (two) {
    const int64_t head = out["x_head"].cast<int64_t>();
    if (out["x_tail"].cast<uintptr_t>() == 0 || head <= 0 || head >= row_bytes || head % 16 || (row_bytes - head) % 16)
      throw std::invalid_argument("FP8 rows from two sources: x_head=" + std::to_string(head) + " must split rows of " +
                                  std::to_string(row_bytes) + " bytes into two multiples of 16, x_tail given");
  }
  if (!split) return;
  const Outputs o = outputs(out);
  if (o.fp8_data == nullptr || o.fp8_scales == nullptr || o.fp8_h <= 0 || o.fp8_h % 16 || o.fp8_s <= 0 ||
      int64_t(o.fp8_h) + 4 * int64_t(o.fp8_s) > row_bytes)
    throw std::invalid_argument("split FP8 outputs: fp8_h=" + std::to_string(o.fp8_h) + " (a multiple of 16) and " +
                                "fp8_s=" + std::to_string(o.fp8_s) + " scale words must fit rows of " +
                                std::to_string(row_bytes) + " bytes, both outputs given");
}

// fan_in_phases' geometry in place of the mover's: one warp per row a block holds (rows that fit
// past the plan's first `kept` bytes, the ones the phases still read, at most kMaxMoverWarps;
// none: the mover stays). Starting over the rest gives torch pull's 256 local experts 16 rows of
// hidden 7168 instead of 15: two rounds of 4096 tokens on 132 SMs, not three. Grid-wide phases
// need every block resident at once: refused, naming the numbers, when the kernel's occupancy
// says they are not.
template <class T, typename K>
void phase_cfg(const Ctx<T>& c, MoveCfg& m, K kernel, int64_t kept) {
  if (!phase_geometry(m, kept, c.smem.data, c.L.row_bytes(), c.mover.fan_phases == 2) || !m.phase_grid) return;
  refuse_phase_grid(phase_grid_fit(kernel, m, c.L.row_bytes(), c.shape.dispatch, c.shape.sms), c.shape.dispatch,
                    c.shape.sms);
}

// pull_kernel and push_kernel share one signature; the stamped build while a timeline is set.
// kept: the plan bytes the phased fan-out still reads (phase_cfg).
template <class T>
void launch_data(Ctx<T>& c, void (*kernel)(T, Layout, const uint8_t*, Outputs, bool, int, MoveCfg, Sync),
                 int64_t plan_bytes, int64_t kept, uintptr_t x, const pybind11::dict& out, bool expert_major,
                 int alignment, const Sync& sy, uintptr_t stream, const char* what) {
  MoveCfg m = c.move_cfg(plan_bytes, expert_major, true);
  if (out.contains("x_tail")) {  // check_fp8_rows: the push with peers only
    m.x_tail = P<const uint8_t>(out["x_tail"].cast<uintptr_t>());
    m.x_head = out["x_head"].cast<int64_t>();
  }
  if (expert_major && c.L.world_size == 1 && c.mover.fan_phases) phase_cfg(c, m, kernel, kept);
  m.stamps = c.stamps;
  c.last.data_early = false;
  check(launch_following(kernel, c.shape.dispatch, m.warps * 32, c.smem_of(m), S(stream), c.tp, c.L,
                         P<const uint8_t>(x), outputs(out), expert_major, alignment, m, sy),
        what);
}

template <class T>
void ctx_pull(Ctx<T>& full, uintptr_t self_x, const pybind11::dict& out, bool expert_major, int alignment, int64_t epoch,
              uintptr_t stream, int64_t row_bytes) {
  OnRows<T> on(full, row_bytes);
  Ctx<T>& c = on.c;
  const int W = int(c.L.world_size), LE = int(c.L.local_experts());
  launch_data(c, c.stamps ? pull_kernel<T, true> : pull_kernel<T>, RecvPlan::bytes(W, LE), RecvPlan::kept_bytes(W, LE),
              self_x, out, expert_major, alignment, c.sync(epoch, kCounterPull), stream, "pull_kernel launch");
}

template <class T>
void ctx_push(Ctx<T>& full, uintptr_t x, const pybind11::dict& out, bool expert_major, int alignment, int64_t epoch,
              uintptr_t stream, int64_t row_bytes) {
  OnRows<T> on(full, row_bytes);
  Ctx<T>& c = on.c;
  const int W = int(c.L.world_size), LE = int(c.L.local_experts());
  launch_data(c, c.stamps ? push_kernel<T, true> : push_kernel<T>, SendPlan::bytes(W, LE),
              SendPlan::bytes(W, LE) /* push's phases read all of it */, x, out, expert_major, alignment,
              c.sync(epoch, kCounterPush), stream, "push_kernel launch");
}

// World size 1: this dispatch's rows by kernels/alone.cuh's kernels in place of pull / push,
// from the routing the routing kernel published and this dispatch's counts (the counts matrix,
// [1][2 + E]); nvshmem runs them alone too, 1-2 µs of kernel faster than its own dispatch kernel.
// They take the data kernels' grid counter (they run in their place). False, launching nothing,
// when they do not apply: peers, a timeline recording (its stamps are pull's and push's), the
// expert-major dispatch with kernel.fan_phases off (the mover's fan-out is pull's and push's) or
// not one row fitting in shared memory. after_route: launched right behind this dispatch's
// route_kernel; both kernels then start on that routing's placed marks, not on its grid's end
// (the expert-major one loads its first rows before them).
template <class T>
bool ctx_alone(Ctx<T>& full, uintptr_t x, const pybind11::dict& out, bool expert_major, int alignment, uintptr_t counts,
               int64_t epoch, bool after_route, uintptr_t stream, int64_t row_bytes) {
  OnRows<T> on(full, row_bytes);
  Ctx<T>& c = on.c;
  const Layout& L = c.L;
  if (L.world_size != 1 || c.stamps || (expert_major && !c.mover.fan_phases)) return false;
  AloneArgs a{};
  if (after_route)
    a.routed = AloneArgs::Routed{c.last.placed, c.last.chunks, c.last.epoch, c.last.tokens, c.last.totals};
  a.lay = L;
  a.alignment = alignment;
  a.x = P<const uint8_t>(x);
  a.idx = reinterpret_cast<const int32_t*>(c.tp.local + L.in_idx);
  a.w = reinterpret_cast<const float*>(c.tp.local + L.in_w);
  a.pos = reinterpret_cast<const int32_t*>(c.tp.local + L.in_pos);
  a.counts = P<const int32_t>(counts);
  a.o = outputs(out);
  a.sy = c.sync(epoch, kCounterPush);
  const MoveCfg& mv = c.mover.move;
  const bool launched = launch_alone_args(a, expert_major, c.mover.fan_phases, c.shape.alone, c.shape.sms,
                                          mv.slot_bytes, mv.depth, c.mover.depth_auto, S(stream));
  c.last.data_early = launched && a.routed.placed != nullptr;  // expert-major: also where it did not start early
  return launched;
}

// Push with peers in one kernel of `senders` sender blocks (the channels) and `receivers`
// receiver blocks (push_stream.cuh; launch_shape.stream_split); no unpack follows. senders <=
// the layout's num_channels.
template <class T>
void ctx_push_stream(Ctx<T>& full, uintptr_t x, const pybind11::dict& out, bool expert_major, int alignment,
                     int senders, int receivers, int64_t epoch, uintptr_t stream, int64_t row_bytes) {
  OnRows<T> on(full, row_bytes);
  Ctx<T>& c = on.c;
  const Layout& L = c.L;
  if (senders < 1 || senders > L.num_channels)
    throw std::invalid_argument("push_stream: senders=" + std::to_string(senders) + " outside 1.." +
                                std::to_string(L.num_channels) + " (the layout's tail words)");
  if (receivers < 1 || receivers > senders)
    throw std::invalid_argument("push_stream: receivers=" + std::to_string(receivers) + " outside 1.." +
                                std::to_string(senders) + " (the senders)");
  // The fan-out's mover (small pieces, 16 warps a block) in both layouts: receivers copy with
  // warps, not slots, and at W=2 rank-major ran 378 -> 192 us with it (whole-row slots leave
  // 3 warps a block).
  const MoveCfg m =
      c.move_cfg(push_stream_plan_bytes(int(L.world_size), int(L.local_experts()), senders, receivers), /*fan=*/true);
  c.last.data_early = false;
  check(launch_following(push_stream_kernel<T>, senders + receivers, m.warps * 32, c.smem_of(m), S(stream), c.tp, L,
                         P<const uint8_t>(x), outputs(out), expert_major, alignment, m, c.sync(epoch, kCounterPush),
                         senders, receivers),
        "push_stream_kernel launch");
}

template <class T>
void ctx_unpack(Ctx<T>& full, uintptr_t counts, const pybind11::dict& out, bool expert_major, int alignment,
                uintptr_t stream, int64_t row_bytes) {
  const Ctx<T> c = full.rows(row_bytes);  // records nothing
  const size_t smem = size_t(RecvPlan::bytes(int(c.L.world_size), int(c.L.local_experts())));
  unpack_kernel<T><<<c.shape.dispatch, kUnpackThreads, smem, S(stream)>>>(
      c.tp, c.L, P<const int32_t>(counts), outputs(out), expert_major, alignment, c.watch.err, c.rank());
  check(cudaGetLastError(), "unpack_kernel launch");
}

// num_worst_tokens, after the data kernels on the same stream: this rank's outputs from its
// received rows to `worst` filled, its per-expert counts (int32[L]) and, on bad ids or a receiver
// over the limit, the host-mapped DeferredError. No host wait.
template <class T>
void ctx_recv_tail(Ctx<T>& full, uintptr_t counts, const pybind11::dict& out, int64_t worst, bool expert_major,
                   int alignment, uintptr_t per_expert, uintptr_t deferred, int64_t epoch, uintptr_t stream,
                   int64_t row_bytes) {
  const Ctx<T> c = full.rows(row_bytes);  // records nothing
  const Outputs o = outputs(out);
  if (o.split()) throw std::invalid_argument("recv_tail: split FP8 outputs are not filled by the tail (worst-case rows)");
  const std::string e = launch_recv_tail(c.L, P<const int32_t>(counts),
                                         TailOutputs{o.x, o.idx, o.w, o.src_rank, o.src_token, o.src_slot}, worst,
                                         expert_major, alignment, c.rank(), P<int32_t>(per_expert),
                                         P<DeferredError>(deferred), epoch, c.last.data_early, c.shape.tail,
                                         c.smem.max - 128, S(stream));
  if (!e.empty()) throw std::invalid_argument(e);
}

}  // namespace symmoe
