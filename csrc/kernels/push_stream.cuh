// Push with peers, streamed (the stream push mode; DeepEP V1's normal-mode shape on any
// transport): one kernel of C sender blocks (the channels) and R <= C receiver blocks.
//
//   sender c    tokens [chan_begin(T, c, C), chan_begin(T, c + 1, C)) of this rank, in
//               kStreamChunks chunks (at least a token per warp each): own rows straight into
//               the outputs, peers' rows into their pools (push_token / push_row, as
//               push_kernel). After each chunk its stores are complete (mover flush) and it
//               raises, at every peer d,
//               tail[c][me] = (epoch, rows sent to d so far | kStreamDone on the last chunk);
//               before the first rows to d, head[c][me] = (epoch, their first pool position).
//   receiver r  polls tail[c][s] of every peer s for its channels c = r, r + R, ... and
//               copies each newly arrived pool row into the outputs (unpack_row, as
//               unpack_kernel): the fan-out of expert-major rows and the copy out of the pool
//               overlap the link instead of following it.
//
// The host sizes C + R so that the grids of ranks sharing a GPU fit at once (receivers wait
// inside the kernel for peers' senders), R half of them unless configured otherwise
// (symmoe/launch_shape.py: stream_blocks, stream_split). Waits are bounded: a peer whose rows
// stop coming is reported as stage "dispatch.data".
#pragma once
#include <cstdint>

#include "../common/channel.cuh"
#include "dispatch.cuh"

namespace symmoe {

// Chunks per channel: receivers start on a channel's rows after its first chunk, and each
// chunk boundary drains the senders' bulk stores (the link idles while loads restart).
constexpr int kStreamChunks = 4;
constexpr int64_t kStreamDone = 1ll << 30;   // in a tail word: the channel sent its last row

// Bookkeeping in shared memory, after the two plans, for N = W * (channels per receiver)
// streams (q = j * W + s: source s of the receiver's j-th channel; a sender uses q = peer).
struct StreamState {
  int32_t* sent;    // [W] sender: rows sent to each peer so far in this channel
  int32_t* start;   // [W] sender: first pool position among them (INT32_MAX: none yet; -1: head is up)
  int64_t* first;   // [N] receiver: pool row of stream q's first row (-1: unknown)
  int64_t* done;    // [N] receiver: rows of q copied so far
  int64_t* from;    // [N] receiver: this round's new rows of q, [from, to)
  int64_t* to;
  int32_t* fin;     // [N] receiver: q sent and this block copied its last row

  static __host__ __device__ int64_t bytes(int N) { return int64_t(N) * (4 + 4 + 8 * 4 + 4) + 16; }

  __device__ void carve(uint8_t* p, int N) {
    first = reinterpret_cast<int64_t*>(p);
    done = first + N;
    from = done + N;
    to = from + N;
    sent = reinterpret_cast<int32_t*>(to + N);
    start = sent + N;
    fin = start + N;
  }
};

// Channels receiver blocks serve at most (C senders over R receivers).
__host__ __device__ inline int stream_per_receiver(int C, int R) { return (C + R - 1) / R; }

// Shared tables of the kernel: SendPlan, RecvPlan, StreamState, each at a 16-byte boundary.
__host__ __device__ inline int64_t up16(int64_t n) { return (n + 15) / 16 * 16; }
__host__ __device__ inline int64_t push_stream_plan_bytes(int W, int Le, int C, int R) {
  return up16(SendPlan::bytes(W, Le)) + up16(RecvPlan::bytes(W, Le)) + StreamState::bytes(W * stream_per_receiver(C, R));
}

// Bounded by the mover's block size, not 1024: at 64 registers the two roles spill.
template <class Transport>
__global__ void __launch_bounds__(kMaxMoverWarps * 32) push_stream_kernel(Transport tp, Layout L, const uint8_t* x, Outputs o,
                                                           bool expert_major, int alignment, MoveCfg mc, Sync sy,
                                                           int C, int R) {
  wait_prior_grid();  // first: launched to follow the routing (or republish) kernel, which may still run
  uint8_t* smem_raw = dyn_smem();
  const int W = int(L.world_size), K = int(L.topk), Le = int(L.local_experts()), me = sy.rank;
  const int PC = int(L.pos_cols());
  const int64_t rb = L.row_bytes();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = mc.warps;
  const bool sender = int(blockIdx.x) < C;
  const int c = sender ? int(blockIdx.x) : int(blockIdx.x) - C;  // receivers: r
  const int N = W * stream_per_receiver(C, R);
  __shared__ bool dead;
  __shared__ int state;  // receiver: 0 copy the new rows, 1 finished, 2 a wait expired
  if (threadIdx.x == 0) dead = error_set(sy.err);
  __syncthreads();
  const int32_t* counts = reinterpret_cast<const int32_t*>(tp.local + L.counts);
  SendPlan pl;
  pl.carve(smem_raw, W, Le);
  RecvPlan rp;
  rp.carve(smem_raw + up16(SendPlan::bytes(W, Le)), W, Le);
  StreamState st;
  st.carve(smem_raw + up16(SendPlan::bytes(W, Le)) + up16(RecvPlan::bytes(W, Le)), N);
  // `run` only reads what every rank has alike (the counts matrix and recv_rows), so a
  // receiver waits exactly when its peers' senders send.
  bool run = !dead && counts_valid(counts, L);
  if (run) {
    pl.build(counts, L, me, expert_major, alignment);
    for (int q = 0; q < W; ++q) run = run && pl.rows[q] <= L.recv_rows;
  }
  const bool own = run && pl.rows[me] <= o.capacity;  // this rank's outputs hold its rows

  if (sender && run) {
    const int32_t* pidx = reinterpret_cast<const int32_t*>(tp.local + L.in_idx);
    const float* pw = reinterpret_cast<const float*>(tp.local + L.in_w);
    const int32_t* ppos = reinterpret_cast<const int32_t*>(tp.local + L.in_pos);
    for (int q = threadIdx.x; q < W; q += blockDim.x) {
      st.sent[q] = 0;
      st.start[q] = INT32_MAX;
    }
    __syncthreads();
    WarpMover mv;
    mv.init(smem_raw + mc.plan_bytes + int64_t(warp) * WarpMoverSmem::per_warp_bytes(mc.slot_bytes, mc.depth),
            mc.slot_bytes, mc.depth, MoverWatch{sy.timeout_ns, sy.err, sy.err_host, sy.epoch});
    const int64_t T = counts[int64_t(me) * L.counts_cols()];
    const int64_t t0 = chan_begin(T, c, C), t1 = chan_begin(T, c + 1, C);
    const int64_t span = max(int64_t(nw), (t1 - t0 + kStreamChunks - 1) / kStreamChunks);
    for (int64_t a0 = t0;; a0 += span) {
      const int64_t a1 = min(t1, a0 + span);
      TokenRoute next = TokenRoute::load(pidx, pw, ppos, a0 + warp, K, PC, lane, a0 + warp < a1);
      for (int64_t t = a0 + warp; t < a1; t += nw) {
        const TokenRoute cur = next;
        next = TokenRoute::load(pidx, pw, ppos, t + nw, K, PC, lane, t + nw < a1);
        const PushDsts d = push_token(tp, L, pl, counts, ppos, o, cur, t, expert_major, me, own, lane);
        const int p = cur.pos_of(ppos, t, PC, max(d.owner, 0));  // every lane: a shuffle
        if (((d.firsts >> lane) & 1u) && d.owner != me) {
          atomicAdd(&st.sent[d.owner], 1);
          atomicMin(&st.start[d.owner], p);
        }
        if (d.n) move_row(mv, x + t * rb, d.dst, d.n, rb, mc.slot_bytes, lane);
      }
      mv.flush();  // this warp's stores are written
      __syncthreads();
      if (threadIdx.x == 0) fence_sys();  // cumulative: every warp's stores before the signals
      __syncthreads();
      const bool last = a1 >= t1;
      for (int q = threadIdx.x; q < W; q += blockDim.x) {
        if (q == me) continue;
        const int32_t n = st.sent[q];
        if (n > 0 && st.start[q] >= 0) {  // the same thread raises the tail after it: ordered
          tp.signal(q, L.head + 8 * (int64_t(c) * W + me), int64_t(sig_value(sy.epoch, st.start[q])));
          st.start[q] = -1;  // up; atomicMin keeps it there
        }
        tp.signal(q, L.tail + 8 * (int64_t(c) * W + me), int64_t(sig_value(sy.epoch, n | (last ? kStreamDone : 0))));
      }
      __syncthreads();  // the counts were read before the next chunk adds to them
      if (last) break;
    }
  }

  if (!sender && run) {
    const int64_t rows = rp.build(counts, L, me, expert_major, alignment);
    const bool out_ok = rows <= o.capacity;
    if (out_ok && expert_major) fill_padding(rp.goff, [&](int j) { return rp.gcnt[j]; }, Le, o, rb, c, R);
    for (int q = threadIdx.x; q < N; q += blockDim.x) {
      st.first[q] = -1;
      st.done[q] = 0;
      st.fin[q] = q % W == me || c + (q / W) * R >= C;  // own rows came straight; past the last channel
    }
    __syncthreads();
    // Stream q's words: channel c + (q / W) * R, source q % W (the layout keeps [channel][source]).
    const int64_t* tail = tp.local_flag(L.tail);
    const int64_t* head = tp.local_flag(L.head);
    auto word = [&](int q) { return (int64_t(c) + int64_t(q / W) * R) * W + q % W; };
    const uint64_t t_start = global_timer_ns();
    uint32_t spins = 0;
    while (true) {
      if (threadIdx.x == 0) {
        int late = -1;
        while (true) {
          bool fresh = false, pending = false;
          for (int q = 0; q < N; ++q) {
            st.from[q] = st.to[q] = 0;
            if (st.fin[q]) continue;
            const int s = q % W;
            const uint64_t v = uint64_t(ld_acquire_sys(tail + word(q)));
            if ((v >> 32) != uint64_t(sy.epoch)) {  // nothing of this call yet
              pending = true;
              late = s;
              continue;
            }
            const int64_t n = int64_t(v & uint64_t(kStreamDone - 1));
            if (n > st.done[q]) {
              if (st.first[q] < 0) st.first[q] = rp.rbase[s] + int64_t(uint64_t(ld_volatile(head + word(q))) & 0xffffffffull);
              st.from[q] = st.done[q];
              st.to[q] = n;
              st.done[q] = n;
              fresh = true;
            }
            if (v & uint64_t(kStreamDone)) st.fin[q] = 1;
            else {
              pending = true;
              late = s;
            }
          }
          if (fresh) { state = 0; break; }
          if (!pending) { state = 1; break; }
          if ((++spins & 255) == 0 && global_timer_ns() - t_start > sy.timeout_ns) {
            report_error(sy.err, sy.err_host, kStageDispatchData, late, sy.epoch);
            state = 2;
            break;
          }
        }
      }
      __syncthreads();
      if (state != 0) break;
      if (out_ok) {  // the new rows, flattened over streams, one per warp
        int64_t total = 0;
        for (int q = 0; q < N; ++q) total += st.to[q] - st.from[q];
        for (int64_t r = warp; r < total; r += nw) {
          int q = 0;
          int64_t rr = r;
          while (rr >= st.to[q] - st.from[q]) {
            rr -= st.to[q] - st.from[q];
            ++q;
          }
          unpack_row(tp, L, rp, o, st.first[q] + st.from[q] + rr, q % W, rows, expert_major, lane);
        }
      }
      __syncthreads();  // thread 0 rewrites from / to next round
    }
  }
  grid_barrier(tp, L, sy, dead, kStageDispatchData);
}

}  // namespace symmoe
