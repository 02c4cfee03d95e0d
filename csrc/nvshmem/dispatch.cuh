// The dispatch kernel of the NVSHMEM push protocol and the offsets every block builds for it
// from the exchanged counts matrix.
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdint>

#include "../common/fanout.cuh"
#include "../common/outputs.cuh"
#include "../common/scan.cuh"
#include "device.cuh"

namespace symmoe {
namespace nv {

// ---- dispatch geometry -----------------------------------------------------------------
// Every offset of one dispatch, built by each block in shared memory from the counts matrix
// (identical on every rank). Both layouts send one row per (token, destination rank): n(s, d)
// rows from s to d, by token; channel c carries a contiguous share of them through a ring of
// `ring` rows in d's pool (one ring per (source, channel)). The output is
// rank-major (source, token) or expert-major (local expert, source, token) with each group
// padded to `alignment`; expert-major, the receiver copies a pool row once per slot that names
// one of its experts, to the output row the sender computed (ebase + the slot's position).
struct Geometry {
  int32_t send_off[kMaxWorld], send_cnt[kMaxWorld], recv_cnt[kMaxWorld], recv_base[kMaxWorld];
  int32_t rows_of[kMaxWorld];  // output rows of each receiver (padded, expert-major)
  int32_t tmp[33];
  int ok;                      // every rank's ids valid and every receiver within capacity
  // expert-major only, in dynamic shared memory:
  int32_t* ebase;  // [E] output row, at receiver e / L, of this rank's first pair of expert e
  int32_t* goff;   // [L + 1] padded group starts of this rank's output
  int32_t* gcnt;   // [L] unpadded rows per local expert

  static int64_t dyn_bytes(const Layout& lay) {
    const int64_t E = lay.num_experts, L = lay.local_experts();
    return 4 * (E + (L + 1) + L);
  }

  __device__ void build(const int32_t* counts, const Layout& lay, int me, bool em, int alignment, int64_t cap) {
    const int W = static_cast<int>(lay.world_size), E = static_cast<int>(lay.num_experts), L = E / W;
    const int64_t cols = lay.counts_cols();
    auto cnt = [&](int s, int64_t col) { return __ldg(counts + s * cols + col); };
    if (em) {
      ebase = reinterpret_cast<int32_t*>(dyn_smem());
      goff = ebase + E;
      gcnt = goff + L + 1;
    }
    if (threadIdx.x == 0) ok = 1;
    for (int d = threadIdx.x; d < W; d += blockDim.x) {
      send_cnt[d] = cnt(me, 1 + d);
      recv_cnt[d] = cnt(d, 1 + me);
      int32_t r = 0;
      for (int s = 0; s < W; ++s) r += cnt(s, 1 + d);
      rows_of[d] = r;
    }
    if (em) {
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t g = 0;
        for (int s = 0; s < W; ++s) g += cnt(s, 1 + W + e);
        ebase[e] = (g + alignment - 1) / alignment * alignment;
        if (e / L == me) gcnt[e - me * L] = g;
      }
      __syncthreads();
      for (int d = 0; d < W; ++d) {  // each receiver's padded group starts
        const int32_t total = block_exclusive_scan(ebase + d * L, L, tmp);
        if (threadIdx.x == 0) rows_of[d] = total;
      }
      __syncthreads();
      for (int j = threadIdx.x; j <= L; j += blockDim.x) goff[j] = j < L ? ebase[me * L + j] : rows_of[me];
      __syncthreads();
      for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int s = 0; s < me; ++s) ebase[e] += cnt(s, 1 + W + e);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int32_t T = max(0, cnt(me, 0));  // the send list: destination d's rows from d * T on
      int32_t rb = 0;
      for (int d = 0; d < W; ++d) {
        send_off[d] = d * T;
        recv_base[d] = rb;
        rb += recv_cnt[d];
        if (cnt(d, 0) < 0 || rows_of[d] > cap) ok = 0;
      }
    }
    __syncthreads();
  }
};

// ---- dispatch --------------------------------------------------------------------------
struct DispatchArgs {
  uint8_t* base;
  Layout lay;
  int me, C, expert_major, alignment;
  int64_t ring;              // rows of each (source, channel) ring of a receiver's pool
  int64_t epoch;
  uint64_t timeout_ns;
  int direct;                // 1: plain stores to load/store-reachable peers; 0: puts to all
  int64_t capacity;          // rows the output tensors hold (the same on every rank)
  const uint8_t* x;          // [T, H] rows to send (x itself, or a symmetric staging copy)
  const int32_t* idx;        // [T, K] int32 copy made by the routing
  const float* w;            // [T, K]
  const int32_t* send_ent;   // [W][T] t * S + destination: destination d's from d * T on, by token
  const int32_t* pos;        // [T, W + K] the routing's positions (expert-major: of each slot)
  const int32_t* counts;     // [W][1 + W + E] this dispatch's counts matrix
  uint8_t* out_x;
  int64_t* out_idx;          // [N, K] rank-major, [M] expert-major
  float* out_w;
  int32_t* out_rank;
  int32_t* out_tok;
  int32_t* out_slot;
  int64_t* out_offsets;      // [L + 1] expert-major, else nullptr
  int32_t* selfmap;          // [T * S] output row of each (token, slot) this rank keeps of its
                             // own tokens (combine reduces them in place); nullptr: kept already
  ErrorWord* err;
};

// What a row sent to rank d carries for each of its K slots (lanes < K): rank-major the
// local expert id and the weight, expert-major the slot's output row at d and the weight;
// -1 / 0 for slots of other ranks.
struct Meta {
  int idx;
  float w;
};
// A token's routing words as loaded (lanes < K: slot k's expert id, weight and, expert-major,
// position), all three issued together and nothing computed from them yet: a row's copy runs
// while they are in flight, where a Meta built at once held the copy back behind two dependent
// round trips (the id, then the weight), as the CUDA kernels' TokenRoute avoids.
struct RawMeta {
  int e;
  float w;
  int pos;
};
__device__ __forceinline__ RawMeta load_meta(const DispatchArgs& a, int t, int lane) {
  const int K = static_cast<int>(a.lay.topk);
  const int64_t PC = a.lay.world_size + K;
  RawMeta r{-1, 0.f, 0};
  if (lane < K) {
    r.e = a.idx[int64_t(t) * K + lane];
    r.w = a.w[int64_t(t) * K + lane];
    if (a.expert_major) r.pos = a.pos[t * PC + a.lay.world_size + lane];
  }
  return r;
}
__device__ __forceinline__ Meta row_meta(const DispatchArgs& a, const Geometry& geo, const RawMeta& r, int d) {
  const int L = static_cast<int>(a.lay.local_experts());
  if (r.e < 0 || r.e / L != d) return Meta{-1, 0.f};
  return Meta{a.expert_major ? geo.ebase[r.e] + r.pos : r.e - d * L, r.w};
}

// One row reaches this rank's outputs (from x for its own rows, else from the pool): rank-major
// to row `rank_row`, expert-major to the row of every slot that names a local expert.
// meta(): the row's Meta, asked for after the copy where the layout allows (rank-major), so
// loads issued before the call are still in flight during it.
template <bool kImmutable, class MetaFn>
__device__ __forceinline__ void deliver_row(const DispatchArgs& a, const Geometry& geo, const uint8_t* src,
                                            int64_t rank_row, int src_rank, int ent, MetaFn meta, int lane) {
  const int K = static_cast<int>(a.lay.topk), S = static_cast<int>(a.lay.combine_slots);
  const int64_t rb = a.lay.row_bytes();
  if (!a.expert_major) {
    warp_copy_row<kImmutable>(a.out_x + rank_row * rb, src, rb, lane);
    const Meta m = meta();
    if (lane < K) {
      a.out_idx[rank_row * K + lane] = m.idx;
      a.out_w[rank_row * K + lane] = m.w;
    }
    if (lane == 0) {
      a.out_rank[rank_row] = src_rank;
      a.out_tok[rank_row] = ent / S;
      a.out_slot[rank_row] = ent % S;
      if (src_rank == a.me && a.selfmap != nullptr) a.selfmap[ent] = static_cast<int32_t>(rank_row);
    }
    return;
  }
  const Meta m = meta();
  int64_t o = m.idx;
  if (o >= geo.rows_of[a.me]) o = -1;  // only with corrupt inputs; never write out of bounds
  if (o >= 0) {
    a.out_idx[o] = group_of(geo.goff, static_cast<int>(a.lay.local_experts()), o);
    a.out_w[o] = m.w;
    a.out_rank[o] = src_rank;
    a.out_tok[o] = ent / S;
    a.out_slot[o] = lane;
    if (src_rank == a.me && a.selfmap != nullptr) a.selfmap[int64_t(ent / S) * S + lane] = static_cast<int32_t>(o);
  }
  int n;
  o = compact_lanes(o >= 0, o, lane, n);
  // 4 in flight: this kernel has 80 registers at 768 threads, and 7 raised its spill from 104
  // to 144 bytes for no gain (expert-major W=1 cached dispatch 160.7 µs vs 159.4).
  warp_fanout_row<4>(a.out_x + max(o, int64_t(0)) * rb, n, src, rb, lane);
}

__global__ void __launch_bounds__(kThreads, 1) dispatch_kernel(DispatchArgs a) {
  wait_prior_grid();  // first: launched to follow the routing (or republish) kernel, which may still run
  const int W = static_cast<int>(a.lay.world_size), C = a.C, me = a.me;
  const int K = static_cast<int>(a.lay.topk), S = static_cast<int>(a.lay.combine_slots);
  const int L = static_cast<int>(a.lay.local_experts());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool sender = blockIdx.x < C, em = a.expert_major != 0;
  const int c = sender ? blockIdx.x : blockIdx.x - C;
  const int64_t rb = a.lay.row_bytes();
  __shared__ Geometry geo;
  __shared__ bool dead;
  if (threadIdx.x == 0) dead = failed();
  __syncthreads();
  if (dead) return;  // the counts exchange timed out: the snapshot is not this dispatch's
  geo.build(a.counts, a.lay, me, em, a.alignment, a.capacity);
  if (!geo.ok) return;  // bad ids or a receiver over capacity: every rank skips, every host raises
  const int32_t *send_off = geo.send_off, *send_cnt = geo.send_cnt, *recv_cnt = geo.recv_cnt,
                *recv_base = geo.recv_base;
  uint64_t* tail = reinterpret_cast<uint64_t*>(a.base + a.lay.tail);

  if (em)  // group starts, and the padding rows of each group (zeros, ids and sources -1)
    fill_padding(geo.goff, [&](int j) { return geo.gcnt[j]; }, L,
                 Outputs{a.out_x, a.out_idx, a.out_w, a.out_rank, a.out_tok, a.out_slot, a.out_offsets, nullptr,
                         a.capacity},
                 rb);

  // Rows this rank keeps: x -> output directly, channel c's share. Rank-major with peers the
  // receiver block copies them while the first puts are in flight, so senders start putting at
  // once; alone, both blocks split them. Expert-major with peers each kept row is written once
  // per local slot, and the receiver blocks alone had every fan-out to do (W=2 cached dispatch
  // 269 µs against 199 rank-major): the sender block gives kWarps / W warps to the
  // kept rows from the start, W / (W + 1) of them, so both shares take about as long as the
  // receiver's (W - 1 sources' rows and the rest of its own) on its kWarps. Past 8 ranks the
  // kept rows are a small share and every warp puts.
  const bool split_own = em && W > 1 && W <= 8;
  const int put_warps = split_own ? kWarps - kWarps / W : kWarps;
  {
    const int64_t n = send_cnt[me], i0 = chan_begin(n, c, C), i1 = chan_begin(n, c + 1, C);
    const int64_t mid = W == 1 ? (i0 + i1) / 2 : split_own ? i0 + (i1 - i0) * W / (W + 1) : i0;
    int64_t lo = sender ? i0 : mid, hi = sender ? mid : i1;
    int first = warp, step = kWarps;
    if (sender && split_own) {  // the put warps skip this share
      first = max(warp - put_warps, 0);
      step = kWarps - put_warps;
      if (warp < put_warps) hi = lo;
    }
    // The next row's send-list entry is loaded one row ahead, under this row's copy.
    int next = lo + first < hi ? a.send_ent[send_off[me] + lo + first] : 0;
    for (int64_t i = lo + first; i < hi; i += step) {
      const int ent = next, t = ent / S;
      if (i + step < hi) next = a.send_ent[send_off[me] + i + step];
      const RawMeta r = load_meta(a, t, lane);
      deliver_row<true>(a, geo, a.x + int64_t(t) * rb, recv_base[me] + i, me, ent,
                        [&] { return row_meta(a, geo, r, me); }, lane);
    }
  }

  if (sender) {
    // One warp group per peer (up to kMaxGroups) among the put warps: the rank itself gets none.
    const int ngroups = max(1, min(W - 1, kMaxGroups)), wpg = put_warps / ngroups;
    const int g = warp / wpg, wig = warp % wpg;
    if (warp >= put_warps || g >= ngroups) return;
    uint8_t* rx = a.base + a.lay.recv_x;
    int32_t* ridx = reinterpret_cast<int32_t*>(a.base + a.lay.recv_idx);
    float* rw = reinterpret_cast<float*>(a.base + a.lay.recv_w);
    int32_t* rsrc = reinterpret_cast<int32_t*>(a.base + a.lay.recv_src);
    const uint64_t* ack = reinterpret_cast<const uint64_t*>(a.base + a.lay.ack);
    const int64_t chunk = min(int64_t(wpg) * kRowsPerWarp, a.ring);
    for (int k = g; k < W - 1; k += ngroups) {
      const int d = (me + 1 + k) % W;  // next ranks first: receivers are not all hit at once
      // Load/store reachable: vector stores straight into d's pool (NVSHMEM's P2P warp put
      // copies with two warp syncs around a one-vector loop); else the put path.
      uint8_t* pd = a.direct ? static_cast<uint8_t*>(nvshmem_ptr(a.base, d)) : nullptr;
      const int64_t n = send_cnt[d], i0 = chan_begin(n, c, C), i1 = chan_begin(n, c + 1, C);
      // This rank's ring for channel c in d's pool: row i goes to slot (i - i0) % ring.
      const int64_t ring0 = (int64_t(me) * C + c) * a.ring;
      int64_t c0 = i0;
      do {
        const int64_t c1 = min(i1, c0 + chunk);
        if (c1 - i0 > a.ring) {
          // The chunk's slots last held rows c0 - ring .. c1 - ring: wait until d's receiver
          // copied those out (its head counter for this channel, in ack[c][d] here).
          if (wig == 0 && lane == 0)
            wait_signal(ack + int64_t(c) * W + d, sig_value(a.epoch, c1 - i0 - a.ring), a.timeout_ns, a.err,
                        kStageDispatchData, d, a.epoch);
          named_barrier(1 + g, wpg * 32);
        }
        int next = c0 + wig < c1 ? a.send_ent[send_off[d] + c0 + wig] : 0;
        for (int64_t i = c0 + wig; i < c1; i += wpg) {
          const int ent = next, t = ent / S;
          if (i + wpg < c1) next = a.send_ent[send_off[d] + i + wpg];
          const int64_t q = ring0 + (i - i0) % a.ring;
          const RawMeta r = load_meta(a, t, lane);
          if (pd) {
            warp_copy_row<true>(at_peer(pd, a.base, rx + q * rb), a.x + int64_t(t) * rb, rb, lane);
            const Meta m = row_meta(a, geo, r, d);
            if (lane < K) {
              at_peer(pd, a.base, ridx)[q * K + lane] = m.idx;
              at_peer(pd, a.base, rw)[q * K + lane] = m.w;
            }
            if (lane == 0) at_peer(pd, a.base, rsrc)[q] = ent;
          } else {
            nvshmemx_putmem_nbi_warp(rx + q * rb, a.x + int64_t(t) * rb, rb, d);
            const Meta m = row_meta(a, geo, r, d);
            if (lane < K) {
              nvshmem_int_p(ridx + q * K + lane, m.idx, d);
              nvshmem_float_p(rw + q * K + lane, m.w, d);
            }
            if (lane == 0) nvshmem_int_p(rsrc + q, ent, d);
          }
        }
        // Every store and put of the chunk (all warps of the group) is ordered before the signal.
        named_barrier(1 + g, wpg * 32);
        if (wig == 0 && lane == 0) {
          __threadfence_system();
          nvshmem_fence();
          nvshmemx_signal_op(tail + int64_t(c) * W + me, sig_value(a.epoch, c1 - i0), NVSHMEM_SIGNAL_SET, d);
        }
        c0 = c1;
      } while (c0 < i1);
    }
    if (wig == 0 && lane == 0) nvshmem_quiet();
    return;
  }

  // Receiver of channel c: stream delivered rows from the pool into the outputs.
  __shared__ int64_t s_done[kMaxWorld];    // rows of each source copied so far (absolute index)
  __shared__ int64_t s_from[kMaxWorld], s_to[kMaxWorld];
  __shared__ int s_state;                  // 0: copy what arrived, 1: finished, 2: failed
  const uint8_t* px = a.base + a.lay.recv_x;
  const int32_t* pidx = reinterpret_cast<const int32_t*>(a.base + a.lay.recv_idx);
  const float* pw = reinterpret_cast<const float*>(a.base + a.lay.recv_w);
  const int32_t* psrc = reinterpret_cast<const int32_t*>(a.base + a.lay.recv_src);
  uint64_t* ack = reinterpret_cast<uint64_t*>(a.base + a.lay.ack);
  for (int s = threadIdx.x; s < W; s += blockDim.x) {
    s_done[s] = chan_begin(recv_cnt[s], c, C);
    s_from[s] = s_to[s] = 0;
  }
  __syncthreads();
  const uint64_t start = global_timer_ns();
  while (true) {
    if (threadIdx.x == 0) {
      // The rows copied out last round free their ring slots: tell each source whose share of
      // this channel is longer than its ring (the only ones that wait), in its ack[c][me].
      for (int s = 0; s < W; ++s) {
        const int64_t i0 = chan_begin(recv_cnt[s], c, C), i1 = chan_begin(recv_cnt[s], c + 1, C);
        if (s != me && s_to[s] > s_from[s] && i1 - i0 > a.ring)
          nvshmemx_signal_op(ack + int64_t(c) * W + me, sig_value(a.epoch, s_to[s] - i0), NVSHMEM_SIGNAL_SET, s);
      }
      uint32_t spins = 0;
      while (true) {
        bool pending = false, fresh = false;
        int late = -1;
        for (int s = 0; s < W; ++s) {
          s_from[s] = s_to[s] = 0;
          if (s == me) continue;
          const int64_t i0 = chan_begin(recv_cnt[s], c, C), i1 = chan_begin(recv_cnt[s], c + 1, C);
          if (s_done[s] >= i1 && i1 > i0) continue;
          const uint64_t v = static_cast<uint64_t>(ld_acquire_sys(reinterpret_cast<const int64_t*>(tail + int64_t(c) * W + s)));
          if (v < sig_value(a.epoch, 0)) {  // this epoch's first signal not there yet
            pending = true;
            late = s;
            continue;
          }
          const int64_t got = i0 + delivered(v, a.epoch, i1 - i0);
          if (got > s_done[s]) {
            s_from[s] = s_done[s];
            s_to[s] = got;
            s_done[s] = got;
            fresh = true;
          }
          if (got < i1) {
            pending = true;
            late = s;
          }
        }
        if (fresh) { s_state = 0; break; }
        if (!pending) { s_state = 1; break; }
        if ((++spins & 255) == 0 && global_timer_ns() - start > a.timeout_ns) {
          report(a.err, kStageDispatchData, late, a.epoch);
          s_state = 2;
          break;
        }
      }
    }
    __syncthreads();
    if (s_state != 0) break;
    // Copy the fresh rows: flatten (source, row) and give one row per warp.
    int64_t total = 0;
    for (int s = 0; s < W; ++s) total += s_to[s] - s_from[s];
    for (int64_t r = warp; r < total; r += kWarps) {
      int s = 0;
      int64_t rr = r;
      while (rr >= s_to[s] - s_from[s]) { rr -= s_to[s] - s_from[s]; ++s; }
      const int64_t i = s_from[s] + rr, i0 = chan_begin(recv_cnt[s], c, C);
      const int64_t q = (int64_t(s) * C + c) * a.ring + (i - i0) % a.ring;  // its slot in s's ring
      const Meta m = lane < K ? Meta{pidx[q * K + lane], pw[q * K + lane]} : Meta{-1, 0.f};
      deliver_row<false>(a, geo, px + q * rb, recv_base[s] + i, s, psrc[q], [&] { return m; }, lane);
    }
    __syncthreads();
  }
}

}  // namespace nv
}  // namespace symmoe
