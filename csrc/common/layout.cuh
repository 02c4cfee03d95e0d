// The symmetric buffer's layout, mirrored from symmoe/layout.py (BufferLayout.kernel_args()):
// the same fields in the same order, all int64. The arithmetic lives in Python; kernels only
// read offsets from here.
#pragma once
#include <cstdint>

namespace symmoe {

struct Layout {
  // KERNEL_FIELDS. recv_rows: the most rows a receiver's outputs take (the receive capacity);
  // pool_rows: rows of the recv region (the receive pool), never more. x_row_bytes: the bytes of
  // an x row that the dispatch kernels move, which are also its stride in the input region, the
  // pool and the outputs: hidden * elem_size, or fewer for an FP8 dispatch (e4m3 + scales, a
  // multiple of 16). The regions stay sized for full rows.
  int64_t world_size, max_tokens, hidden, topk, num_experts, elem_size, recv_rows, pool_rows, num_channels,
      combine_slots, x_row_bytes;
  // KERNEL_OFFSETS (bytes from the segment base)
  int64_t barrier, ready, tail, head, ack, counts, in_x, in_idx, in_w, in_pos, recv_x, recv_idx, recv_w, recv_src,
      combine_x, combine_w;

  __host__ __device__ int64_t local_experts() const { return num_experts / world_size; }
  __host__ __device__ int64_t counts_cols() const { return 1 + world_size + num_experts; }
  __host__ __device__ int64_t row_bytes() const { return x_row_bytes; }
  __host__ __device__ int64_t full_row_bytes() const { return hidden * elem_size; }
  __host__ __device__ int64_t pos_cols() const { return world_size + topk; }
};

constexpr int kLayoutArgs = 11 + 16;
// combine_slots = max(world_size, topk) <= kMaxSlots (checked on the host, protocol/base.py's
// MAX_SLOTS): per-token slot lists and per-rank tables in shared memory are sized by it.
constexpr int kMaxSlots = 64;
static_assert(sizeof(Layout) == kLayoutArgs * sizeof(int64_t));  // Layout is a flat int64 array

// Stages named in errors; the Python side maps the code back to the name (symmoe/protocol/cuda.py).
enum Stage : int {
  kStageNone = 0,
  kStageDispatchCounts = 1,  // counts exchanged (and, for pull, inputs published)
  kStageDispatchData = 2,    // push: rows stored into the receivers' pools
  kStageDispatchDone = 3,    // pull: every receiver finished reading the sources' inputs
  kStageCombineData = 4,     // expert outputs stored into the sources' combine regions
  kStageCombineDone = 5,     // sources finished reducing (combine regions reusable)
  kStageMemoryBarrier = 6,   // SymmetricMemory.barrier()
  kStageBulkCopy = 7,        // a bulk (TMA) load into a warp's shared slot never completed
  kStageFanPhase = 8,        // a block of the phased fan-out never reached a phase (not resident)
  kStageRouteChunk = 9,      // a chunk of the routing kernel was never counted (its block never ran)
};

// Host-mapped error record the device writes when a wait expires: never hang, tell the host.
struct ErrorWord {
  int64_t stage;   // 0 = no error
  int64_t peer;    // the rank whose arrival never came
  int64_t epoch;   // the barrier epoch that was awaited
  int64_t detail;  // reserved (e.g. capacity overflow rows)
};

}  // namespace symmoe
