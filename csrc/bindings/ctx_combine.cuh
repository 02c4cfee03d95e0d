// A Context's combine launches (the send of expert outputs back to their sources, then the
// reduction in the fixed order) and its stream-ordered barrier. Blocks: LaunchShape.combine,
// the reduction spread over LaunchShape.reduce SMs.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "../common/reduce.cuh"
#include "../kernels/combine.cuh"
#include "ctx_state.cuh"

namespace symmoe {

template <class T>
void ctx_combine_send(Ctx<T>& c, uintptr_t y, uintptr_t rw, uintptr_t src_rank, uintptr_t src_token,
                      uintptr_t src_slot, int64_t rows, int64_t epoch, uintptr_t stream) {
  const MoveCfg m = c.move_cfg(0);
  RecvRows rr{P<const int32_t>(src_rank), P<const int32_t>(src_token), P<const int32_t>(src_slot), rows};
  combine_send_kernel<T><<<c.shape.combine, m.warps * 32, c.smem_of(m), S(stream)>>>(
      c.tp, c.L, P<const uint8_t>(y), P<const float>(rw), rr, m, c.sync(epoch, kCounterCombineSend));
  check(cudaGetLastError(), "combine_send_kernel launch");
}

template <class T>
void ctx_combine_reduce(Ctx<T>& c, int elem_size, bool is_bf16, uintptr_t y, uintptr_t rw, uintptr_t in_rank,
                        uintptr_t topk_idx, uintptr_t topk_w, int64_t tokens, uintptr_t selfmap, uintptr_t out,
                        uintptr_t out_w, bool expert_major, int64_t epoch, uintptr_t stream) {
  const Layout& L = c.L;
  if (L.combine_slots > kMaxSlots) throw std::invalid_argument("combine: more than 64 slots per token (max(world, topk))");
  const CombineSources cs{P<const uint8_t>(y), P<const float>(rw), P<const int32_t>(selfmap),
                          c.tp.local + L.combine_x, reinterpret_cast<const float*>(c.tp.local + L.combine_w),
                          P<const bool>(in_rank), P<const int64_t>(topk_idx), P<const float>(topk_w), tokens,
                          L.row_bytes(), int(L.world_size), int(L.topk), int(L.combine_slots),
                          int(L.local_experts()), c.rank(), expert_major};
  const Sync sy = c.sync(epoch, kCounterReduce);
  auto launch = [&](auto kernel, auto* o) {
    const ReduceLaunch rl = reduce_launch(kernel, c.shape.reduce, tokens, L.world_size == 1);
    kernel<<<rl.blocks, kReduceThreads, 0, S(stream)>>>(c.tp, L, cs, o, P<float>(out_w), rl.parts, sy);
  };
  if (elem_size == 4)
    launch(combine_reduce_kernel<T, float>, P<float>(out));
  else if (is_bf16)
    launch(combine_reduce_kernel<T, __nv_bfloat16>, P<__nv_bfloat16>(out));
  else
    launch(combine_reduce_kernel<T, __half>, P<__half>(out));
  check(cudaGetLastError(), "combine_reduce_kernel launch");
}

// Context.combine: the send (with peers) at `epoch`, then the reduction at the next epoch (at
// `epoch` alone), in one call from Python.
template <class T>
void ctx_combine(Ctx<T>& c, int elem_size, bool is_bf16, uintptr_t y, uintptr_t rw, uintptr_t src_rank,
                 uintptr_t src_token, uintptr_t src_slot, int64_t rows, uintptr_t in_rank, uintptr_t topk_idx,
                 uintptr_t topk_w, int64_t tokens, uintptr_t selfmap, uintptr_t out, uintptr_t out_w,
                 bool expert_major, int64_t epoch, uintptr_t stream) {
  const bool send = c.L.world_size > 1;  // alone, every row is this rank's own: nothing to send
  if (send) ctx_combine_send(c, y, rw, src_rank, src_token, src_slot, rows, epoch, stream);
  ctx_combine_reduce(c, elem_size, is_bf16, y, rw, in_rank, topk_idx, topk_w, tokens, selfmap, out, out_w,
                     expert_major, epoch + (send ? 1 : 0), stream);
}

// A device barrier of every rank on the stream (one block), stage `stage` on a timeout.
template <class T>
void ctx_barrier(Ctx<T>& c, int64_t flags_off, int64_t epoch, int stage, uintptr_t stream) {
  barrier_kernel<T><<<1, 32, 0, S(stream)>>>(c.tp, c.rank(), int(c.L.world_size), flags_off, epoch,
                                             c.watch.timeout_ns, c.watch.err, c.watch.err_host, stage);
  check(cudaGetLastError(), "barrier_kernel launch");
}

}  // namespace symmoe
