// The end of a dispatch that does not wait on the host (num_worst_tokens): what the host
// would otherwise read off the counts matrix, done on the device after the data kernels.
// Every block derives every receiver's rows from the dispatch's counts snapshot (SendPlan,
// as the push kernel does) and fills this rank's outputs from its rows to num_worst_tokens
// as reference.pad_recv defines (x 0, ids -1, weights 0, sources -1). Block 0 also writes
// this rank's per-expert counts and, for a receiver over the limit or bad expert ids, a
// record the host raises from at its next call (InputError / CapacityError, on every rank:
// each derives the same decision from the same matrix).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/layout.cuh"
#include "../common/ptx.cuh"
#include "plan.cuh"

namespace symmoe {

constexpr int kTailThreads = 256;

struct TailOutputs {  // a dispatch's output tensors (at least `worst` rows each)
  uint8_t* x;         // [rows, H]
  int64_t* idx;       // [rows, K] rank-major, [rows] expert-major
  float* w;           // same shape as idx
  int32_t* src_rank;  // [rows]
  int32_t* src_token;
  int32_t* src_slot;
};

// Host-mapped; the first error of a dispatch that did not wait (kind stays once set, until
// the host clears it).
struct DeferredError {
  int64_t kind;   // 0 none, 1 a receiver over num_worst_tokens or recv_rows, 2 bad expert ids
  int64_t epoch;  // the dispatch's epoch
  int64_t rank;   // the receiver over the limit, or the first rank whose ids were rejected
  int64_t rows;   // that receiver's rows
  int64_t worst;  // num_worst_tokens of the dispatch
  int64_t expert_major;
};
enum : int64_t { kDeferredNone = 0, kDeferredCapacity = 1, kDeferredBadIds = 2 };

// Thread 0: the first error of a dispatch that did not wait, unless one is recorded already.
__device__ __forceinline__ void record_deferred(DeferredError* df, int64_t kind, int64_t rank, int64_t rows,
                                                int64_t worst, bool expert_major, int64_t epoch) {
  if (kind == kDeferredNone || *reinterpret_cast<volatile int64_t*>(&df->kind) != kDeferredNone) return;
  df->epoch = epoch;
  df->rank = rank;
  df->rows = rows;
  df->worst = worst;
  df->expert_major = expert_major;
  __threadfence_system();
  *reinterpret_cast<volatile int64_t*>(&df->kind) = kind;
}

// Rows [first, worst) of o as reference.pad_recv defines (x 0, ids -1, weights 0, sources -1),
// `ids` ids a row, thread t0 of `stride`.
__device__ __forceinline__ void fill_past_received(const TailOutputs& o, int64_t first, int64_t worst, int64_t rb,
                                                   int ids, int64_t t0, int64_t stride) {
  if (first >= worst) return;
  const int64_t n = worst - first, vecs = rb / 16;
  uint4* x = reinterpret_cast<uint4*>(o.x + first * rb);
  for (int64_t i = t0; i < n * vecs; i += stride) x[i] = make_uint4(0, 0, 0, 0);
  for (int64_t i = t0; i < n * ids; i += stride) {
    o.idx[first * ids + i] = -1;
    o.w[first * ids + i] = 0.f;
  }
  for (int64_t i = t0; i < n; i += stride) {
    o.src_rank[first + i] = -1;
    o.src_token[first + i] = -1;
    o.src_slot[first + i] = -1;
  }
}

static __global__ void __launch_bounds__(kTailThreads) recv_tail_kernel(Layout L, const int32_t* counts, TailOutputs o,
                                                                 int64_t worst, bool expert_major, int alignment,
                                                                 int me, int32_t* per_expert, DeferredError* df,
                                                                 int64_t epoch, bool counts_late) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int64_t first;  // this rank's first row past the received ones
  // Launched to follow the data kernel, which may let it be scheduled before it ends (the alone
  // kernels do). The counts snapshot is then final, unless that kernel itself started before
  // the routing's last block wrote it (counts_late): every read waits for it then. Every block
  // waits before its fill and its end either way (this grid never ends before the data kernel).
  if (counts_late) wait_prior_grid();
  const int W = int(L.world_size), Le = int(L.local_experts());
  SendPlan sp;
  sp.carve(smem_raw, W, Le);
  sp.build(counts, L, me, expert_major, alignment);
  const bool valid = counts_valid(counts, L);  // else no kernel moved data: every row is tail
  if (blockIdx.x == 0) {
    for (int j = threadIdx.x; j < Le; j += blockDim.x) {
      int32_t c = 0;
      for (int s = 0; valid && s < W; ++s) c += count_at(counts, L, s, 1 + W + int64_t(me) * Le + j);
      per_expert[j] = c;
    }
    if (threadIdx.x == 0) {
      int64_t kind = kDeferredNone, rank = 0, rows = 0;
      for (int s = 0; s < W; ++s) {
        if (!valid) {
          if (count_at(counts, L, s, 0) < 0) {
            kind = kDeferredBadIds;
            rank = s;
            break;
          }
        } else if (sp.rows[s] > worst || sp.rows[s] > L.recv_rows) {
          kind = kDeferredCapacity;
          rank = s;
          rows = sp.rows[s];
          break;
        }
      }
      record_deferred(df, kind, rank, rows, worst, expert_major, epoch);
    }
  }
  if (threadIdx.x == 0) first = valid ? sp.rows[me] : 0;
  if (!counts_late) wait_prior_grid();
  __syncthreads();
  fill_past_received(o, first, worst, L.row_bytes(), expert_major ? 1 : int(L.topk),
                     int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

}  // namespace symmoe
