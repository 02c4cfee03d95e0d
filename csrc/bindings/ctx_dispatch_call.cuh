// A dispatch's launches in one call from Python: Context.move (the data kernels, as the
// protocol's move mode picks them) and Context.dispatch (the routing's outputs, the routing
// kernel, then move). A small-batch dispatch is bound by its host time, and each call from
// Python with its wrapper cost more than the launch it made.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ctx_dispatch.cuh"
#include "ctx_route.cuh"

namespace symmoe {

// protocol/cuda.py's move modes: pull; push and its unpack (with peers); the streamed push.
enum MoveMode : int { kMovePull = 0, kMovePush = 1, kMovePushStream = 2 };

// The data kernels of a dispatch after its routing (after_route) or a cached dispatch's
// republication: alone (world size 1) where its kernels apply, else as `mode` says; `counts`:
// the dispatch's device counts matrix (alone, unpack).
template <class T>
void ctx_move(Ctx<T>& c, uintptr_t x, const pybind11::dict& out, bool expert_major, int alignment, uintptr_t counts,
              bool after_route, int mode, int senders, int receivers, int64_t epoch, uintptr_t stream,
              int64_t row_bytes) {
  if (mode < kMovePull || mode > kMovePushStream)
    throw std::invalid_argument("move: mode=" + std::to_string(mode) + "; allowed: 0 (pull), 1 (push), 2 (push_stream)");
  check_fp8_rows(out, mode, c.L.world_size, row_bytes ? row_bytes : c.L.full_row_bytes());
  if (c.L.world_size == 1 &&
      ctx_alone(c, x, out, expert_major, alignment, counts, epoch, after_route, stream, row_bytes))
    return;
  if (mode == kMovePull) {
    ctx_pull(c, x, out, expert_major, alignment, epoch, stream, row_bytes);
  } else if (mode == kMovePushStream) {
    ctx_push_stream(c, x, out, expert_major, alignment, senders, receivers, epoch, stream, row_bytes);
  } else {
    ctx_push(c, x, out, expert_major, alignment, epoch, stream, row_bytes);
    if (c.L.world_size > 1)  // alone, push wrote every row, group start and padding row
      ctx_unpack(c, counts, out, expert_major, alignment, stream, row_bytes);
  }
}

// An exact-size or num_worst_tokens dispatch: set_routing_outputs(host, counts, routing, ready,
// summary, alignment), the routing kernel of `tokens` tokens publishing at route_epoch, then
// ctx_move right behind it at data_epoch.
template <class T>
void ctx_dispatch(Ctx<T>& c, uintptr_t host, uintptr_t counts, uintptr_t routing, uintptr_t ready, uintptr_t summary,
                  uintptr_t idx, bool idx64, uintptr_t w, int64_t tokens, uintptr_t scratch, uintptr_t in_rank,
                  int64_t route_epoch, uintptr_t x, const pybind11::dict& out, bool expert_major, int alignment,
                  int mode, int senders, int receivers, int64_t data_epoch, uintptr_t stream, int64_t row_bytes) {
  check_fp8_rows(out, mode, c.L.world_size, row_bytes ? row_bytes : c.L.full_row_bytes());  // before the routing publishes
  c.set_routing_outputs(host, counts, routing, ready, summary, alignment);
  ctx_layout(c, idx, idx64, w, tokens, scratch, in_rank, 0, 0, true, route_epoch, stream);
  ctx_move(c, x, out, expert_major, alignment, counts, true, mode, senders, receivers, data_epoch, stream, row_bytes);
}

}  // namespace symmoe
