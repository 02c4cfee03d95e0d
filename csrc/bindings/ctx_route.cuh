// A Context's routing launches: get_dispatch_layout's count pass, a dispatch's route_kernel
// (which publishes the routing and hands the counts over), and a cached dispatch's republish of
// a routing the handle kept. Blocks: LaunchShape.route (republish: .dispatch).
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "../kernels/dispatch.cuh"
#include "../kernels/route.cuh"
#include "ctx_state.cuh"

namespace symmoe {

// One chunk of tokens per block, at least 128 tokens a chunk (fewer chunks: the serial sums over
// chunks stay short). When the columns' per-warp tables do not fit in shared memory they go to
// global scratch, for at most 8 blocks.
template <class T>
int64_t route_columns(const Ctx<T>& c) { return c.L.world_size + c.L.num_experts; }
template <class T>
bool route_big(const Ctx<T>& c) { return int64_t(kRouteWarps + 1) * route_columns(c) * 4 > c.smem.max; }
template <class T>
int route_max_blocks(const Ctx<T>& c) { return route_big(c) ? std::min(c.shape.route, 8) : c.shape.route; }
template <class T>
int route_blocks(const Ctx<T>& c, int64_t tokens) {
  return int(std::max<int64_t>(1, std::min<int64_t>(route_max_blocks(c), (tokens + 127) / 128)));
}

// Bytes of global routing scratch the caller allocates once, zeroed (RouteScratch: the chunks'
// counted epochs, then their placed epochs, then the int32 tables; a multiple of 16).
template <class T>
int64_t layout_scratch_bytes(const Ctx<T>& c) {
  const int64_t C = route_columns(c), B = route_max_blocks(c);
  return 4 * (4 * B + (B * C + C + (route_big(c) ? B * (kRouteWarps + 1) * C : 0) + 3) / 4 * 4);
}

// The routing kernels' arguments for `scratch`: publish, a dispatch's (ids, weights and
// positions into the input region, the checks, the counts' hand-over), else the layout alone.
template <class T, typename Idx>
RoutingArgs<Idx> routing_args(const Ctx<T>& c, const Idx* idx, const float* w, int64_t tokens, bool* in_rank,
                              bool publish) {
  const Layout& L = c.L;
  RoutingArgs<Idx> a{idx, w, int(tokens), int(L.topk), int(L.world_size), int(L.num_experts), nullptr, in_rank,
                     nullptr, nullptr, BadInput{nullptr, nullptr}};
  if (publish) {
    a.pos = reinterpret_cast<int32_t*>(c.tp.local + L.in_pos);
    a.pub_idx = reinterpret_cast<int32_t*>(c.tp.local + L.in_idx);
    a.pub_w = reinterpret_cast<float*>(c.tp.local + L.in_w);
    a.bad = c.outs.bad;
    a.mirror = c.outs.routing_copy;
    a.pub_base = c.tp.local + L.in_idx;
  }
  return a;
}
template <class T>
RouteScratch route_scratch(const Ctx<T>& c, int32_t* scratch, bool publish) {
  const int64_t C = route_columns(c), MB = route_max_blocks(c);
  int64_t* counted = reinterpret_cast<int64_t*>(scratch);
  int32_t* tables = scratch + 4 * MB;
  return RouteScratch{tables, tables + MB * C, route_big(c) ? tables + MB * C + C : nullptr, c.outs.counts_host,
                      c.outs.counts_snap, publish ? c.outs.counts_ready : nullptr,
                      publish ? c.outs.summary : CountsSummary{}, counted, c.watch.done + kCounterTicket,
                      counted + MB};
}

template <class T, typename Idx>
void route(Ctx<T>& c, const Idx* idx, const float* w, int64_t tokens, int32_t* scratch, bool* in_rank,
           int32_t* per_rank, int32_t* per_expert, bool publish, int64_t epoch, cudaStream_t st) {
  const int64_t C = route_columns(c);
  const int B = route_blocks(c, tokens);
  const bool big = route_big(c);
  RoutingArgs<Idx> a = routing_args(c, idx, w, tokens, in_rank, publish);
  RouteScratch sc = route_scratch(c, scratch, publish);
  const int threads = big ? kRouteThreads : route_threads(C, c.smem.max);
  if (!publish) {  // the layout alone (get_dispatch_layout): the count pass
    route_count_kernel<Idx><<<B, threads, big ? 0 : size_t(C * 4), st>>>(a, sc, per_rank, per_expert, c.watch.err,
                                                                         c.watch.done + kCounterCount);
    check(cudaGetLastError(), "route_count_kernel launch");
    return;
  }
  route_kernel<T, Idx><<<B, threads, big ? 0 : size_t((threads / 32 + 1) * C * 4), st>>>(
      c.tp, c.L, a, sc, per_rank, per_expert, c.sync(epoch, kCounterRoute));
  check(cudaGetLastError(), "route_kernel launch");
  c.last.placed = sc.placed;
  c.last.chunks = B;
  c.last.epoch = epoch;
  c.last.tokens = tokens;
  c.last.totals = sc.totals;
}

// Context.layout: the routing of `tokens` tokens (int64 ids when idx64), publish: a dispatch's.
template <class T>
void ctx_layout(Ctx<T>& c, uintptr_t idx, bool idx64, uintptr_t w, int64_t tokens, uintptr_t scratch,
                uintptr_t in_rank, uintptr_t per_rank, uintptr_t per_expert, bool publish, int64_t epoch,
                uintptr_t stream) {
  if (!scratch) throw std::invalid_argument("layout: scratch of layout_scratch_bytes() bytes is required");
  if (idx64)
    route(c, P<const int64_t>(idx), P<const float>(w), tokens, P<int32_t>(scratch), P<bool>(in_rank),
          P<int32_t>(per_rank), P<int32_t>(per_expert), publish, epoch, S(stream));
  else
    route(c, P<const int32_t>(idx), P<const float>(w), tokens, P<int32_t>(scratch), P<bool>(in_rank),
          P<int32_t>(per_rank), P<int32_t>(per_expert), publish, epoch, S(stream));
}

// Cached dispatch: `routing` (nbytes, a multiple of 16) back to the input region from in_idx on,
// `counts` to the counts region, then barrier "dispatch.counts".
template <class T>
void ctx_republish(Ctx<T>& c, uintptr_t routing, int64_t nbytes, uintptr_t counts, int64_t epoch, uintptr_t stream) {
  if (nbytes < 0 || nbytes % 16) throw std::invalid_argument("republish: routing bytes must be a multiple of 16");
  const int64_t vecs = nbytes / 16;
  const int blocks =
      int(std::max<int64_t>(1, std::min<int64_t>(c.shape.dispatch, (vecs + kRouteThreads - 1) / kRouteThreads)));
  republish_kernel<T><<<blocks, kRouteThreads, 0, S(stream)>>>(c.tp, c.L, P<const int4>(routing), vecs,
                                                               P<const int32_t>(counts),
                                                               c.sync(epoch, kCounterRepublish));
  check(cudaGetLastError(), "republish_kernel launch");
}

}  // namespace symmoe
