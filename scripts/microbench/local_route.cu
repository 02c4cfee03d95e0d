// How the world-size-1 expert-major dispatch that routes could route, against the positions read
// from a table (what the cached dispatch does): the kernels' routing (csrc/kernels/route.cuh) has
// 64 routing blocks publish chunk counts and wait for one another, 7-8 dependent global round trips,
// each ~1 µs behind round 0's bulk loads (sessions 36-52), and the routed kernel runs ~9 µs behind
// the cached one. Each form here is the same phased fan-out (csrc/common/phases.cuh's steal mode:
// 16 rows a block, round 0 = group blockIdx.x, later groups to whichever block asks first):
//   table      positions from a table computed before
//   table+ids  the table's positions, but every block also reads and counts all T x K ids
//   table+id loads  the same, every block reading all ids but counting nothing
//   local      every block counts all ids itself (no block waits for another): the experts'
//              offsets and the pairs before its own round 0 group and before a second group
//              (blockIdx.x + blocks, published with a mark for the block that takes it later)
//   groups     each block counts its two groups' pairs, publishes those rows and adds the experts'
//              totals; once every block has (one grid arrival) it sums the rows before its group
//   columns    the same rows; after the arrival block j scans columns 2j, 2j + 1 over the groups
//              and publishes their prefixes; after a second arrival each block reads its rows'
//   columns, rows after / half the rows after: round 0's loads (all, or the second half of the
//              warps') only once the routing is done
//   cluster    no global trip: a cluster of cs blocks splits the tokens into cs chunks of whole
//              groups; rank r counts chunk r, takes the chunk's group c (its cluster's index) in
//              round 0 and group ncl + c as its second, and reads the other ranks' counts over
//              distributed shared memory (cs: the largest of 16, 8, 4, 2 whose clusters all fit
//              and cover every chunk's groups; "table, cluster grid" is the table on its grid)
//   cluster, ids staged first: the same, but the chunk's ids are read first, as uint16, into the
//              tiles of the last warps (whose round 0 loads then wait for the routing), and the
//              other warps' round 0 loads go out once every id is in
//   cluster, staged, paired groups: the same with each block's two groups side by side in its
//              chunk, one packed shared atomic an id
//   staged, warps 0-5 / 0-12 load first: the staged form with those warps' round 0 loads issued
//              before the ids are read
//   staged, clusters of 4, three levels: half the ids a block, on the 120 blocks that clusters of 4
//              fill (a third level of groups, its base counted from global after round 0's stores);
//              "table, that form's grid" is the table on those 120 blocks
// Every form's outputs (rows, ids, source tokens) are checked against the host's routing. The arrivals
// need every block resident at once (one a SM, 132 on an H200, no MPS).
// Per-block stamps (globaltimer, from the earliest block's start): positions known, round 0's
// rows landed, round 0's stores issued, end.
//
// Build and run: nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/lr scripts/microbench/local_route.cu && /tmp/lr
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "../../csrc/common/ptx.cuh"
#include "harness.cuh"

using namespace symmoe;

// The forms, in the order they were written (kTableCgrid: the table form launched on the cluster
// forms' grid, a host choice).
enum Mode {
  kTable = 0,
  kTableIds = 1,
  kLocal = 2,
  kTableLoads = 3,
  kGroups = 4,
  kColumns = 5,
  kColumnsFirst = 6,
  kColumnsHalf = 7,
  kCluster = 8,
  kTableCgrid = 9,
  kClusterStaged = 10,
  kClusterPaired = 11,
  kStagedEarly6 = 12,  // host choices: the staged form with warps 0-5 / 0-12 loading before the ids
  kStagedEarly13 = 13,
  kClusterStaged3 = 14,  // the staged form on clusters of 4, with a third group where the chunk needs it
  kTableC3 = 15          // host choice: the table form on that form's grid
};
constexpr int kStamps = 7;  // start, positions known, round 0 landed, round 0 stores issued, end, (staged) ids in, counted
constexpr int kFieldBits = 16;  // two counts in a 32-bit shared atomic: T < 65536
constexpr unsigned kField = (1u << kFieldBits) - 1;

struct Args {
  const uint8_t* x;
  uint8_t* out;
  const int64_t* idx;    // [T, K], -1 masked
  const int32_t* table;  // [T, K] expert-major positions (the host's)
  int32_t* pub;          // [T, K] positions of the groups a block routes for another
  int64_t* marks;        // [groups] epoch once a group's positions are in pub
  int64_t epoch;
  unsigned* ctr;         // the steal's counter, zero at launch and after
  int32_t* o_idx;        // [T * K] output rows' expert
  int32_t* o_src;        // [T * K] output rows' source token
  unsigned long long* stamps;  // [blocks][kStamps]
  // groups: each group's expert counts, the experts' totals (zero at launch and after), the
  // blocks that published (never reset: gen x blocks once this launch's have), the totals' readers
  int32_t* rowcnt;             // [groups][E]
  int32_t* totals;             // [E]
  unsigned long long* arrived;
  unsigned* readers;
  int64_t gen;                 // groups launches so far, this one included
  // columns: the prefix matrix ([groups + 1][E], pairs of expert e in the groups before g; the
  // last row the totals, apart from groups' zeroed ones) and a second never-reset arrival count
  int32_t* prefix;
  unsigned long long* arrived2;
  int64_t gen2;  // columns launches so far, this one included
  int early;     // staged: warps (from 0, outside the stage) whose round 0 loads go out before the ids are read
  int T, K, E, rows;
  int64_t R;
};

// Whole warp, token t of the group starting at g0: lanes < K get their slot's expert e (-1: masked
// or out of range) and the pairs of e in [g0, t); the lanes split the earlier tokens four ways
// (lane / 8) and add up. A slot's position is then its expert's base plus that count.
__device__ __forceinline__ int group_count(const Args& a, int64_t t, int64_t g0, int lane, int& e) {
  const int k = lane & 7, s = lane >> 3;
  e = k < a.K ? int(a.idx[t * a.K + k]) : -1;
  int c = 0;
  for (int64_t u = g0 + s; u < t; u += 4)
    for (int kk = 0; kk < a.K; ++kk) c += int(a.idx[u * a.K + kk] == e);
  c += __shfl_xor_sync(0xffffffffu, c, 8);
  c += __shfl_xor_sync(0xffffffffu, c, 16);
  if (lane >= a.K || e >= a.E) e = -1;
  return c;
}

// An expert id read as an int4's two 32-bit halves.
__device__ __forceinline__ int64_t pair_id(int lo32, int hi32) {
  return int64_t((uint64_t(uint32_t(hi32)) << 32) | uint32_t(lo32));
}

// Whole block: the exclusive sum of v over the threads before this one.
__device__ __forceinline__ int block_exscan(int v, int32_t* wsum, int warp, int lane) {
  int inc = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, inc, d);
    if (lane >= d) inc += o;
  }
  if (lane == 31) wsum[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int s = lane < int(blockDim.x >> 5) ? wsum[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += o;
    }
    wsum[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  const int r = inc - v + (warp ? wsum[warp - 1] : 0);
  __syncthreads();  // wsum free again
  return r;
}

// Column c's sum over rows [r0, r1) of an [.][E] int32 matrix, 8 loads in flight.
__device__ __forceinline__ int column_sum(const int32_t* m, int E, int c, int64_t r0, int64_t r1) {
  int s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t r = r0;
  for (; r + 8 <= r1; r += 8)
#pragma unroll
    for (int u = 0; u < 8; ++u) s[u] += __ldcg(m + (r + u) * E + c);
  for (; r < r1; ++r) s[0] += __ldcg(m + r * E + c);
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

template <int kMode>
__global__ void __launch_bounds__(512, 1) fan(Args a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = gridDim.x;
  const unsigned long long t_start = global_timer_ns();
  uint8_t* smem = dyn_smem();
  uint8_t* tile = smem + int64_t(warp) * a.R;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + int64_t(a.rows) * a.R) + warp;
  // [E] packed counts (total | before the second group << 16), [E] counts before round 0's group;
  // then in place two int32 bases a expert: round 0's group, the second group.
  unsigned* hist = reinterpret_cast<unsigned*>(bar + a.rows - warp);
  unsigned* hist_lo = hist + a.E;
  int32_t* base = reinterpret_cast<int32_t*>(hist);
  __shared__ int32_t wsum[32];
  __shared__ int64_t given;
  constexpr bool kIds = kMode == kTableIds || kMode == kLocal || kMode == kTableLoads;
  constexpr bool kCol = kMode == kColumns || kMode == kColumnsFirst || kMode == kColumnsHalf;
  // paired: the staged form with each block's two groups side by side in its chunk (groups 2c, 2c + 1),
  // so one packed atomic an id (the chunk's count | the count before round 0's group << 16) serves
  // both: the second group's pairs before it are the first group's base plus what lies in between
  constexpr bool kPaired = kMode == kClusterPaired;
  // three: clusters of 4 hold fewer blocks than the SMs (30 of 33 on an H200), so a chunk's groups
  // need a third level (2 ncl + c), whose base is counted from global once round 0 is stored
  constexpr bool kL3 = kMode == kClusterStaged3;
  constexpr bool kStaged = kMode == kClusterStaged || kPaired || kL3;  // the ids first, into the last warps' tiles
  constexpr bool kClu = kMode == kCluster || kStaged;
  constexpr bool kOwn = kMode == kLocal || kMode == kGroups || kCol || kClu;  // positions of its own (and a second group)
  constexpr bool kCounts = kMode == kGroups || kCol;  // two groups' counts published
  // round 0's rows only once the routing is done: all (first), or the second half of the warps' (half)
  bool late = kMode == kColumnsFirst || (kMode == kColumnsHalf && warp >= a.rows / 2);
  // cluster: a cluster of CS blocks splits the tokens into CS chunks of gpc whole groups; rank r
  // counts chunk r and takes the chunk's groups c (c: its cluster) in round 0 and ncl + c as its
  // second (ncl: the clusters), so that the pairs before either lie in the chunk it counts.
  namespace cg = cooperative_groups;
  int64_t CS = 1, crank = 0, ncl = 1, gpc = 0;
  if (kClu) {
    const cg::cluster_group cl = cg::this_cluster();
    CS = cl.num_blocks();
    crank = cl.block_rank();
    ncl = G / CS;
    gpc = ((a.T + CS - 1) / CS + a.rows - 1) / a.rows;
  }
  const int64_t groups = (a.T + a.rows - 1) / a.rows, cidx = blockIdx.x / CS;
  const int64_t g_first = !kClu      ? int64_t(blockIdx.x)
                          : kPaired ? (2 * cidx < gpc ? crank * gpc + 2 * cidx : groups)
                          : cidx < gpc ? crank * gpc + cidx : groups;
  const int64_t g2 = !kClu      ? int64_t(blockIdx.x) + G
                     : kPaired ? (2 * cidx + 1 < gpc ? crank * gpc + 2 * cidx + 1 : groups)
                     : ncl + cidx < gpc ? crank * gpc + ncl + cidx : groups;
  const int64_t g3 = kL3 && 2 * ncl + cidx < gpc ? crank * gpc + 2 * ncl + cidx : groups;
  // the groups handed out after round 0, and the v-th of them
  const int64_t remaining = kPaired ? CS * (gpc / 2)
                            : kClu  ? CS * max(gpc - ncl, int64_t(0))
                                    : max(groups - G, int64_t(0));
  auto stolen = [&](int64_t v) -> int64_t {
    if (!kClu) return G + v;
    if (kPaired) return v < remaining ? v / (gpc / 2) * gpc + 2 * (v % (gpc / 2)) + 1 : groups;
    const int64_t rem = gpc - ncl;
    return v < remaining ? v / rem * gpc + ncl + v % rem : groups;
  };
  // groups: this block's two groups' pairs, one a thread (the loads go out first)
  const int P = a.rows * a.K;
  int64_t ev = -1;
  int which = 0;
  if (kCounts) {
    for (int e = threadIdx.x; e < 2 * a.E; e += blockDim.x) hist[e] = 0u;
    const int i = threadIdx.x;
    which = i / P;
    const int64_t p = (which ? g2 : int64_t(blockIdx.x)) * P + i % P;
    if (i < 2 * P && p < int64_t(a.T) * a.K && (which == 0 || g2 < groups)) ev = __ldg(a.idx + p);
  }
  const int64_t lo = g_first * a.rows, mid = int64_t(blockIdx.x + G) * a.rows;
  const int64_t n4 = int64_t(a.T) * a.K / 2, step = blockDim.x;
  const int4* ids4 = reinterpret_cast<const int4*>(a.idx);
  constexpr int kB = 8;
  int4 v[kB];
  if (kIds) {
    for (int e = threadIdx.x; e < 2 * a.E; e += blockDim.x) hist[e] = 0u;
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int64_t j = threadIdx.x + u * step;
      v[u] = j < n4 ? __ldg(ids4 + j) : make_int4(-1, -1, -1, -1);
    }
  }
  // cluster: H [E] this rank's chunk's pairs per expert (read by the whole cluster), P [E] the
  // chunk's pairs before round 0's group (low 16 bits) and before the second group (high 16 bits)
  unsigned* H = hist;
  unsigned* Pp = hist + a.E;
  const int64_t c0 = kClu ? min(int64_t(a.T), crank * gpc * a.rows) * a.K / 2 : 0;
  const int64_t nclu = kClu ? min(int64_t(a.T), (crank + 1) * gpc * a.rows) * a.K / 2 - c0 : 0;
  int4 cv[4];
  // Lane 0: this warp's mbarrier, and its round 0 row's load (the three places that issue it).
  auto init_bar = [&] {
    fence_proxy_async_shared();
    mbar_init(bar, 1);
    mbar_init_fence();
  };
  auto load_row0 = [&] {
    if (lo + warp < a.T) {
      mbar_arrive_expect_tx(bar, uint32_t(a.R));
      bulk_load(tile, a.x + (lo + warp) * a.R, uint32_t(a.R), bar);
    }
  };
  // staged: the chunk's ids as uint16 (0xffff: none) over the tiles of the last `ns` warps, whose
  // round 0 loads wait for the routing; every other warp's load goes out once the ids are in
  uint16_t* stage = nullptr;
  if (kStaged) {
    const int64_t ns = (nclu * 4 + a.R - 1) / a.R;
    stage = reinterpret_cast<uint16_t*>(smem + (a.rows - ns) * a.R);
    late = warp >= a.rows - ns;
    if (lane == 0 && warp < a.early && !late) {  // these rows' loads beside the ids' reads
      init_bar();
      load_row0();
    }
    __syncwarp();
    for (int e = threadIdx.x; e < 2 * a.E; e += blockDim.x) hist[e] = 0u;
    auto id16 = [&](int lo32, int hi32) -> uint16_t {
      const int64_t e = pair_id(lo32, hi32);
      return e >= 0 && e < a.E ? uint16_t(e) : uint16_t(0xffff);
    };
    for (int64_t j0 = threadIdx.x; j0 < nclu; j0 += 8 * step) {
      int4 w[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t j = j0 + u * step;
        w[u] = j < nclu ? __ldg(ids4 + c0 + j) : make_int4(-1, -1, -1, -1);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t j = j0 + u * step;
        if (j < nclu) {
          stage[2 * j] = id16(w[u].x, w[u].y);
          stage[2 * j + 1] = id16(w[u].z, w[u].w);
        }
      }
    }
    __syncthreads();  // every id in: the other warps' loads may go out
    if (threadIdx.x == 0) a.stamps[blockIdx.x * kStamps + 5] = global_timer_ns();
  }
  if (kClu && !kStaged) {
    for (int e = threadIdx.x; e < 2 * a.E; e += blockDim.x) hist[e] = 0u;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t j = threadIdx.x + u * step;
      cv[u] = j < nclu ? __ldg(ids4 + c0 + j) : make_int4(-1, -1, -1, -1);
    }
  }
  if (lane == 0 && !(kStaged && warp < a.early && !late)) {  // round 0's row behind the ids' loads
    init_bar();
    if (!late) load_row0();
  }
  __syncwarp();
  int off = 0, pre = 0;  // groups, thread e: expert e's offset and its pairs before round 0's group
  int b1_reg = 0;        // cluster, thread e: the second group's base until H may be overwritten
  int b2_reg = 0;        // three, thread e: expert e's offset and pairs of the chunks before this one
  if (kClu) {
    __syncthreads();  // H, P zeroed
    auto add = [&](int64_t p, int lo32, int hi32) {
      const int64_t e = pair_id(lo32, hi32);
      if (e < 0 || e >= a.E) return;
      const int64_t t = int64_t(uint32_t(p) / uint32_t(a.K));  // 32-bit: T x K < 2^31 (host check)
      atomicAdd(H + e, 1u);
      const unsigned before = (t < lo ? 1u : 0u) | (t < g2 * a.rows ? 1u << 16 : 0u);
      if (before) atomicAdd(Pp + e, before);
    };
    if (kStaged)
      for (int64_t j = threadIdx.x; j < 2 * nclu; j += step) {
        const uint16_t e = stage[j];
        if (e == 0xffff) continue;
        const int64_t t = int64_t(uint32_t(2 * c0 + j) / uint32_t(a.K));
        if (kPaired) {
          atomicAdd(H + e, t < lo ? 1u | 1u << 16 : 1u);
          continue;
        }
        atomicAdd(H + e, 1u);
        const unsigned before = (t < lo ? 1u : 0u) | (t < g2 * a.rows ? 1u << 16 : 0u);
        if (before) atomicAdd(Pp + e, before);
      }
    for (int64_t j0 = threadIdx.x; !kStaged && j0 < nclu; j0 += 4 * step) {
      int4 w[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t j = j0 + (4 + u) * step;
        w[u] = j < nclu ? __ldg(ids4 + c0 + j) : make_int4(-1, -1, -1, -1);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t j = j0 + u * step;
        if (j < nclu) {
          add(2 * (c0 + j), cv[u].x, cv[u].y);
          add(2 * (c0 + j) + 1, cv[u].z, cv[u].w);
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) cv[u] = w[u];
    }
    if (kStaged) {
      __syncthreads();
      if (threadIdx.x == 0) a.stamps[blockIdx.x * kStamps + 6] = global_timer_ns();
    }
    const cg::cluster_group cl = cg::this_cluster();
    cl.sync();  // every rank's chunk counted
    const int e = threadIdx.x;
    int tot = 0, pre0 = 0;
    if (e < a.E) {
      for (int j = 0; j < int(cl.num_blocks()); ++j) {
        const int h = int(*cl.map_shared_rank(H + e, j) & (kPaired ? 0xffffu : ~0u));
        tot += h;
        pre0 += j < crank ? h : 0;
      }
    }
    const unsigned pp = e >= a.E ? 0u : kPaired ? H[e] >> 16 : Pp[e];
    off = block_exscan(tot, wsum, warp, lane);
    if (e < a.E) Pp[e] = unsigned(off + pre0 + int(pp & 0xffffu));  // round 0's bases, in place
    b1_reg = off + pre0 + int(pp >> 16);
    b2_reg = off + pre0;
    __syncthreads();
  }
  // Thread 0: this block's arrival at *w, then a bounded wait for every block of the `gen`-th launch.
  auto arrive_wait = [&](unsigned long long* w, int64_t gen, const char* what) {
    __threadfence();  // this block's writes before its arrival
    atomicAdd(w, 1ull);
    int64_t spins = 0;
    while (ld_acquire_gpu(reinterpret_cast<const int64_t*>(w)) < gen * G)
      if (++spins > (int64_t(1) << 26)) {
        printf("block %d: %s never all arrived\n", int(blockIdx.x), what);
        __trap();
      }
  };
  if (kCounts) {
    __syncthreads();  // hist zeroed
    if (ev >= 0 && ev < a.E) atomicAdd(hist + 2 * ev + which, 1u);
    __syncthreads();
    const int e = threadIdx.x;
    if (e < a.E) {
      const int c0 = int(hist[2 * e]), c1 = int(hist[2 * e + 1]);
      a.rowcnt[int64_t(blockIdx.x) * a.E + e] = c0;
      if (g2 < groups) a.rowcnt[g2 * a.E + e] = c1;
      if (kMode == kGroups && c0 + c1) atomicAdd(a.totals + e, c0 + c1);
    }
  }
  if (kCol) {  // block j scans columns [j * cpb, ...) over the groups, then rows back
    __syncthreads();
    if (threadIdx.x == 0) arrive_wait(a.arrived, a.gen, "the groups' counts");
    __syncthreads();
    const int cpb = (a.E + G - 1) / G, i = threadIdx.x, sc = i / int(groups), r = i % int(groups);
    const int c = int(blockIdx.x) * cpb + sc;
    const bool in = sc < cpb && c < a.E;
    const int v = in ? __ldcg(a.rowcnt + int64_t(r) * a.E + c) : 0;
    const int ex = block_exscan(v, wsum, warp, lane);
    int32_t* start = reinterpret_cast<int32_t*>(hist);  // [cpb + 1]: each column's start in the scan
    if (in && r == 0) start[sc] = ex;
    if (in && r == int(groups) - 1) start[sc + 1] = ex + v;
    __syncthreads();
    if (in) {
      a.prefix[int64_t(r) * a.E + c] = ex - start[sc];
      if (r == int(groups) - 1) a.prefix[groups * a.E + c] = ex + v - start[sc];
    }
    __syncthreads();
    if (threadIdx.x == 0) arrive_wait(a.arrived2, a.gen2, "the columns' prefixes");
    __syncthreads();
    const int e = threadIdx.x;
    const int tot = e < a.E ? __ldcg(a.prefix + groups * a.E + e) : 0;
    const int p0 = e < a.E ? __ldcg(a.prefix + int64_t(blockIdx.x) * a.E + e) : 0;
    const int p1 = e < a.E && g2 < groups ? __ldcg(a.prefix + g2 * a.E + e) : 0;
    off = block_exscan(tot, wsum, warp, lane);
    if (e < a.E) {
      base[2 * e] = off + p0;
      base[2 * e + 1] = off + p1;
    }
    __syncthreads();
  }
  if (kMode == kGroups) {
    __syncthreads();
    if (threadIdx.x == 0) arrive_wait(a.arrived, a.gen, "the groups' counts");
    __syncthreads();
    const int e = threadIdx.x;
    const int tot = e < a.E ? __ldcg(a.totals + e) : 0;
    if (e < a.E) pre = column_sum(a.rowcnt, a.E, e, 0, blockIdx.x);
    off = block_exscan(tot, wsum, warp, lane);
    if (e < a.E) base[2 * e] = off + pre;
    if (threadIdx.x == 0 && atomicAdd(a.readers, 1u) == unsigned(G) - 1) {  // every block read the totals
      for (int c = 0; c < a.E; ++c) a.totals[c] = 0;
      *a.readers = 0u;
    }
    __syncthreads();
  }
  if (kIds) {
    __syncthreads();  // hist zeroed
    unsigned sink = 0;
    auto add = [&](int64_t p, int lo32, int hi32) {
      const int64_t e = pair_id(lo32, hi32);
      if (e < 0 || e >= a.E) return;
      const int64_t t = int64_t(uint32_t(p) / uint32_t(a.K));  // 32-bit: T x K < 2^31 (host check)
      if (kMode == kTableLoads) {  // the loads alone: a sum nobody reads but the compiler keeps
        sink += unsigned(e);
        return;
      }
      atomicAdd(hist + e, 1u | (t < mid ? 1u << kFieldBits : 0u));
      if (t < lo) atomicAdd(hist_lo + e, 1u);
    };
    for (int64_t j0 = threadIdx.x; j0 < n4; j0 += kB * step) {
      int4 w[kB];
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        const int64_t j = j0 + (kB + u) * step;
        w[u] = j < n4 ? __ldg(ids4 + j) : make_int4(-1, -1, -1, -1);
      }
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        const int64_t j = j0 + u * step;
        add(2 * j, v[u].x, v[u].y);
        add(2 * j + 1, v[u].z, v[u].w);
      }
#pragma unroll
      for (int u = 0; u < kB; ++u) v[u] = w[u];
    }
    __syncthreads();
    // Offsets: exclusive scan of the totals (E <= blockDim.x), then the two bases in place.
    const int e = threadIdx.x;
    if (kMode == kTableLoads && sink == 0x7fffffffu) hist[0] = sink;
    const unsigned h = e < a.E ? hist[e] : 0u, hl = e < a.E ? hist_lo[e] : 0u;
    const int tot = int(h & kField);
    const int off = block_exscan(tot, wsum, warp, lane);
    if (e < a.E) {
      base[2 * e] = off + int(hl);
      base[2 * e + 1] = off + int(h >> kFieldBits);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) a.stamps[blockIdx.x * kStamps + 1] = global_timer_ns();
  if (late && lane == 0) {
    fence_proxy_async_shared();  // staged: the ids' generic writes to this tile before the bulk load's
    load_row0();
  }
  // Round 0's and the second group's bases: interleaved in `base`, or (cluster) P and then H.
  const int32_t* b0 = kClu ? reinterpret_cast<const int32_t*>(Pp) : base;
  int32_t* b1 = kClu ? reinterpret_cast<int32_t*>(H) : base + 1;
  const int bs = kClu ? 1 : 2;
  // A later group's positions: the table's, or (local) those its routing block published.
  auto pos_of = [&](int64_t t, int64_t g) -> int {
    if (!kOwn) return lane < a.K ? __ldg(a.table + t * a.K + lane) : -1;
    if (lane == 0) {
      int64_t spins = 0;
      while (ld_acquire_gpu(a.marks + g) != a.epoch)
        if (++spins > (int64_t(1) << 26)) {
          printf("block %d: group %lld never marked\n", int(blockIdx.x), (long long)g);
          __trap();
        }
    }
    __syncwarp();
    return lane < a.K ? __ldcg(a.pub + t * a.K + lane) : -1;
  };
  int64_t g = g_first;
  uint32_t parity = 0;
  for (int r = 0; r == 0 || g < groups; ++r) {
    const int64_t g0 = g * a.rows, t = g0 + warp;
    const bool mine = g < groups && t < a.T;
    int p = -1;
    if (mine) {
      if (lane == 0 && r > 0) {
        mbar_arrive_expect_tx(bar, uint32_t(a.R));
        bulk_load(tile, a.x + t * a.R, uint32_t(a.R), bar);
      }
      if (kOwn && r == 0) {  // round 0: the block's own counts (base[2e])
        int e;
        const int c = group_count(a, t, g0, lane, e);
        p = e >= 0 ? b0[bs * e] + c : -1;
      } else {
        p = pos_of(t, g);
      }
      if (lane < a.K && p >= 0) {
        a.o_idx[p] = int(a.idx[t * a.K + lane]);
        a.o_src[p] = int(t);
      }
      if (lane == 0)
        while (!mbar_try_wait(bar, parity)) {
        }
      parity ^= 1u;
      __syncwarp();
    }
    __syncthreads();
    if (r == 0 && threadIdx.x == 0) a.stamps[blockIdx.x * kStamps + 2] = global_timer_ns();
    if (threadIdx.x == 0) {  // the next group (phase_steal_next)
      const unsigned w = atomicAdd(a.ctr, 1u);
      if (int64_t(w) == remaining + G - 1) *a.ctr = 0u;
      given = stolen(w);
    }
    if (mine) {
      for (int i = 0; i < a.K; ++i) {
        const int d = __shfl_sync(0xffffffffu, p, i);
        if (lane == 0 && d >= 0) bulk_store(a.out + int64_t(d) * a.R, tile, uint32_t(a.R));
      }
      if (lane == 0) bulk_commit();
    }
    if (r == 0 && threadIdx.x == 0) a.stamps[blockIdx.x * kStamps + 3] = global_timer_ns();
    if (kMode == kGroups && r == 0) {  // the second group's bases: its pairs before it
      const int e = threadIdx.x;
      if (e < a.E && g2 < groups) base[2 * e + 1] = off + pre + column_sum(a.rowcnt, a.E, e, blockIdx.x, g2);
      __syncthreads();
    }
    if (kClu && r == 0) {  // the second group's bases, once no rank reads this block's H any more
      cg::this_cluster().sync();
      if (threadIdx.x < a.E) b1[threadIdx.x] = b1_reg;
      __syncthreads();
    }
    if (kOwn && r == 0) {  // the second group's positions, for whoever takes it
      const int64_t t2 = g2 * a.rows + warp;
      if (g2 < groups && t2 < a.T) {
        int e;
        // paired: counted from round 0's group on, over round 0's bases
        const int c = group_count(a, t2, kPaired ? lo : g2 * a.rows, lane, e);
        if (lane < a.K) a.pub[t2 * a.K + lane] = e < 0 ? -1 : kPaired ? b0[e] + c : b1[bs * e] + c;
      }
    }
    if (kL3 && r == 0 && g3 < groups) {  // the third group: its chunk's pairs before it, from global
      int32_t* b2 = reinterpret_cast<int32_t*>(Pp);  // round 0's bases are read: P is free
      for (int e = threadIdx.x; e < a.E; e += blockDim.x) Pp[e] = 0u;
      __syncthreads();
      for (int64_t q = c0 * 2 + threadIdx.x; q < g3 * a.rows * a.K; q += step) {
        const int64_t e = __ldg(a.idx + q);
        if (e >= 0 && e < a.E) atomicAdd(Pp + e, 1u);
      }
      __syncthreads();
      if (threadIdx.x < a.E) b2[threadIdx.x] = b2_reg + int(Pp[threadIdx.x]);
      __syncthreads();
      const int64_t t3 = g3 * a.rows + warp;
      if (t3 < a.T) {
        int e;
        const int c = group_count(a, t3, g3 * a.rows, lane, e);
        if (lane < a.K) a.pub[t3 * a.K + lane] = e < 0 ? -1 : b2[e] + c;
      }
    }
    if (mine && lane == 0) bulk_wait_read_all();
    __syncthreads();
    if (kOwn && r == 0 && threadIdx.x == 0 && g2 < groups) {
      __threadfence();
      st_release_gpu(a.marks + g2, a.epoch);
      if (g3 < groups) st_release_gpu(a.marks + g3, a.epoch);
    }
    g = given;
  }
  if (lane == 0) bulk_wait_all();
  __syncthreads();
  if (threadIdx.x == 0) {
    a.stamps[blockIdx.x * kStamps + 0] = t_start;
    a.stamps[blockIdx.x * kStamps + 4] = global_timer_ns();
  }
}

// Rows whose bytes differ from their source row's (o_src), and rows whose o_src / o_idx differ from
// the host's: counted into bad.
__global__ void check_rows(const uint8_t* x, const uint8_t* out, const int32_t* o_src, const int32_t* want_src,
                           const int32_t* o_idx, const int32_t* want_idx, int64_t rows, int64_t R,
                           unsigned long long* bad) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5, nw = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t o = gw; o < rows; o += nw) {
    int wrong = o_src[o] != want_src[o] || o_idx[o] != want_idx[o];
    const int4* s = reinterpret_cast<const int4*>(x + int64_t(want_src[o]) * R);
    const int4* d = reinterpret_cast<const int4*>(out + o * R);
    for (int64_t i = lane; i < R / 16; i += 32) {
      const int4 p = s[i], q = d[i];
      wrong |= p.x != q.x || p.y != q.y || p.z != q.z || p.w != q.w;
    }
    if (__any_sync(0xffffffffu, wrong) && lane == 0) atomicAdd(bad, 1ull);
  }
}

// The host's routing: uniform top-K of E (distinct per token), or `kind` 1: masked slots (-1,
// one token in 7 fully masked) and half the pairs on expert 0..7; 2: every token's first slot on
// expert 0.
static std::vector<int64_t> routing(int64_t T, int K, int E, int kind, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> idx(T * K);
  std::vector<int> ids(E);
  std::iota(ids.begin(), ids.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(ids.begin(), ids.end(), rng);
    if (kind == 1 && rng() % 2) std::sort(ids.begin(), ids.begin() + 16);
    if (kind == 2) std::swap(ids[0], *std::find(ids.begin(), ids.end(), 0));
    for (int k = 0; k < K; ++k) idx[t * K + k] = ids[k];
    if (kind == 1)
      for (int k = 0; k < K; ++k)
        if (t % 7 == 3 || rng() % 5 == 0) idx[t * K + k] = -1;
  }
  return idx;
}

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 4096, H = argc > 2 ? std::atoll(argv[2]) : 7168;
  const int K = 8, E = 256, rows = 16, reps = 30;
  const int64_t R = H * 2;
  const Device dev = device_header(T, R);
  const int sms = dev.sms, optin = dev.optin;
  const int64_t groups = (T + rows - 1) / rows;
  if (groups > 2 * int64_t(sms) || E > rows * 32 || T >= (1 << kFieldBits) || T * K >= (int64_t(1) << 31) ||
      (E + sms - 1) / sms * groups > rows * 32) {
    std::printf("shape out of this microbenchmark's range: %lld tokens (%lld groups of %d; at most 2 x %d SMs, "
                "T < %d, T x K < 2^31), E = %d (at most %d threads a block, and %lld columns x groups)\n",
                (long long)T, (long long)groups, rows, sms, 1 << kFieldBits, E, rows * 32,
                (long long)((E + sms - 1) / sms * groups));
    return 1;
  }
  const size_t smem = size_t(rows) * R + 8 * rows + 8 * E;  // rows, mbarriers, 2 x [E] counts
  if (smem > size_t(optin)) {
    std::printf("%zu B of shared memory a block needed, %d allowed: a smaller hidden size\n", smem, optin);
    return 1;
  }
  uint8_t *x, *out;
  int64_t *idx, *marks;
  int32_t *table, *pub, *o_idx, *o_src, *want_src, *want_idx;
  unsigned *ctr, *readers;
  unsigned long long *stamps, *bad, *arrived, *arrived2;
  int32_t *rowcnt, *totals, *prefix;
  CK(cudaMalloc(&x, T * R));
  CK(cudaMalloc(&out, T * (K + 1) * R));  // the tail: room for the same-size copy's halves
  CK(cudaMalloc(&idx, T * K * 8));
  CK(cudaMalloc(&marks, groups * 8));
  for (int32_t** p : {&table, &pub, &o_idx, &o_src, &want_src, &want_idx}) CK(cudaMalloc(p, T * K * 4));
  CK(cudaMalloc(&ctr, 4));
  CK(cudaMalloc(&readers, 4));
  CK(cudaMalloc(&arrived, 8));
  CK(cudaMalloc(&arrived2, 8));
  CK(cudaMalloc(&prefix, (groups + 1) * E * 4));
  CK(cudaMemset(arrived2, 0, 8));
  CK(cudaMalloc(&rowcnt, groups * E * 4));
  CK(cudaMalloc(&totals, E * 4));
  CK(cudaMemset(readers, 0, 4));
  CK(cudaMemset(arrived, 0, 8));
  CK(cudaMemset(totals, 0, E * 4));
  CK(cudaMalloc(&stamps, sms * kStamps * 8));
  CK(cudaMalloc(&bad, 8));
  CK(cudaMemset(ctr, 0, 4));
  CK(cudaMemset(marks, 0, groups * 8));
  fill<<<1024, 256>>>(reinterpret_cast<uint16_t*>(x), T * R / 2, 1u);
  for (auto k : {fan<kTable>, fan<kTableIds>, fan<kLocal>, fan<kTableLoads>, fan<kGroups>, fan<kColumns>, fan<kColumnsFirst>,
                 fan<kColumnsHalf>, fan<kCluster>, fan<kClusterStaged>, fan<kClusterPaired>, fan<kClusterStaged3>})
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CK(cudaFuncSetAttribute(fan<kCluster>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(fan<kClusterStaged>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(fan<kClusterPaired>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(fan<kClusterStaged3>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));

  Args a{x, out, idx, table, pub, marks, 0, ctr, o_idx, o_src, stamps, rowcnt, totals, arrived, readers, 0,
         prefix, arrived2, 0, 0, int(T), K, E, rows, R};
  int64_t rows_out = 0;
  // The routing on the device and the host's answer (positions, and each row's source and expert).
  auto load = [&](int kind, uint32_t seed) {
    const std::vector<int64_t> h = routing(T, K, E, kind, seed);
    std::vector<int32_t> cnt(E + 1, 0), pos(T * K, -1);
    for (int64_t p = 0; p < T * K; ++p)
      if (h[p] >= 0) ++cnt[h[p] + 1];
    for (int e = 0; e < E; ++e) cnt[e + 1] += cnt[e];
    rows_out = cnt[E];
    std::vector<int32_t> src(T * K, -1), eid(T * K, -1);
    for (int64_t p = 0; p < T * K; ++p)
      if (h[p] >= 0) {
        pos[p] = cnt[h[p]]++;
        src[pos[p]] = int32_t(p / K);
        eid[pos[p]] = int32_t(h[p]);
      }
    CK(cudaMemcpy(idx, h.data(), T * K * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(table, pos.data(), T * K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(want_src, src.data(), T * K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(want_idx, eid.data(), T * K * 4, cudaMemcpyHostToDevice));
  };
  // The cluster form and the table beside it: the largest cluster size of 8, 4, 2 whose clusters all
  // fit at once (an H200 held 7 of 16 and 15 of 8 in session 57), on as many whole clusters as fit
  // on the SMs, with every chunk's groups covered by round 0 and the second groups (gpc <= 2 ncl)
  // and whole chunks (T a multiple of cs x rows).
  cudaLaunchAttribute cluster_at[1];  // outlives every config that points at it
  auto launch_clustered = [&](auto kernel, int grid, int cs) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(rows * 32);
    cfg.dynamicSmemBytes = smem;
    cluster_at[0].id = cudaLaunchAttributeClusterDimension;
    cluster_at[0].val.clusterDim.x = cs;
    cluster_at[0].val.clusterDim.y = 1;
    cluster_at[0].val.clusterDim.z = 1;
    cfg.attrs = cluster_at;
    cfg.numAttrs = 1;
    return cfg;
  };
  auto run_clustered = [&](auto kernel, int grid, int cs) {
    cudaLaunchConfig_t cfg = launch_clustered(kernel, grid, cs);
    CK(cudaLaunchKernelEx(&cfg, kernel, a));
  };
  int cs = 0, cgrid = 0;
  for (int c : {16, 8, 4, 2}) {
    cudaLaunchConfig_t cfg = launch_clustered(fan<kCluster>, sms / c * c, c);
    int n = 0;
    CK(cudaOccupancyMaxActiveClusters(&n, fan<kCluster>, &cfg));
    const int ncl = std::min(n, sms / c);
    const int64_t gpc = T / c / rows;
    const bool ok = T % (int64_t(c) * rows) == 0 && gpc <= 2 * int64_t(ncl) && ncl > 0;
    std::printf("clusters of %d: %d resident at once, %d blocks, %lld groups a chunk%s\n", c, n, ncl * c,
                (long long)gpc, ok && cs == 0 ? "  <- the cluster form's" : "");
    if (ok && cs == 0) cs = c, cgrid = ncl * c;
  }
  if (cs == 0) {
    std::printf("no cluster size fits %lld tokens: a cluster form needs whole chunks of %d-token groups and "
                "at most two groups a block (the sizes above)\n", (long long)T, rows);
    return 1;
  }
  int grid3 = 0;  // the three-level form: clusters of 4, every chunk's groups in three levels
  {
    cudaLaunchConfig_t cfg = launch_clustered(fan<kClusterStaged3>, sms / 4 * 4, 4);
    int n = 0;
    CK(cudaOccupancyMaxActiveClusters(&n, fan<kClusterStaged3>, &cfg));
    const int ncl = std::min(n, sms / 4);
    if (T % (4 * rows) == 0 && T / 4 / rows <= 3 * int64_t(ncl) && int64_t(ncl) * 4 * rows * 3 >= T && ncl > 0)
      grid3 = ncl * 4;
    std::printf("three levels on clusters of 4: %d blocks%s\n", grid3, grid3 ? "" : " (does not fit: not run)");
  }
  auto launch = [&](int mode) {
    ++a.epoch;
    if (mode == kTable) fan<kTable><<<sms, rows * 32, smem>>>(a);
    if (mode == kTableCgrid) fan<kTable><<<cgrid, rows * 32, smem>>>(a);
    if (mode == kCluster) run_clustered(fan<kCluster>, cgrid, cs);
    if (mode == kClusterStaged || mode == kStagedEarly6 || mode == kStagedEarly13) {
      a.early = mode == kStagedEarly6 ? 6 : mode == kStagedEarly13 ? 13 : 0;
      run_clustered(fan<kClusterStaged>, cgrid, cs);
      a.early = 0;
    }
    if (mode == kClusterStaged3 && grid3) run_clustered(fan<kClusterStaged3>, grid3, 4);
    if (mode == kTableC3 && grid3) fan<kTable><<<grid3, rows * 32, smem>>>(a);
    if (mode == kClusterPaired) run_clustered(fan<kClusterPaired>, cgrid, cs);
    if (mode == kTableIds) fan<kTableIds><<<sms, rows * 32, smem>>>(a);
    if (mode == kLocal) fan<kLocal><<<sms, rows * 32, smem>>>(a);
    if (mode == kTableLoads) fan<kTableLoads><<<sms, rows * 32, smem>>>(a);
    if (mode == kGroups || mode == kColumns || mode == kColumnsFirst || mode == kColumnsHalf) ++a.gen;  // the arrival counts are shared: one gen per launch
    if (mode == kGroups) fan<kGroups><<<sms, rows * 32, smem>>>(a);
    if (mode == kColumns || mode == kColumnsFirst || mode == kColumnsHalf) ++a.gen2;
    if (mode == kColumns) fan<kColumns><<<sms, rows * 32, smem>>>(a);
    if (mode == kColumnsFirst) fan<kColumnsFirst><<<sms, rows * 32, smem>>>(a);
    if (mode == kColumnsHalf) fan<kColumnsHalf><<<sms, rows * 32, smem>>>(a);
  };
  const char* names[16] = {"table", "table+ids", "local", "table+id loads", "groups", "columns", "columns, rows after",
                           "columns, half the rows after", "cluster", "table, cluster grid",
                           "cluster, ids staged first", "cluster, staged, paired groups",
                           "staged, warps 0-5 load first", "staged, warps 0-12 load first",
                           "staged, clusters of 4, three levels", "table, that form's grid"};
  auto verify = [&](int mode) {
    CK(cudaMemset(out, 0xab, T * K * R));
    CK(cudaMemset(o_idx, 0xff, T * K * 4));
    CK(cudaMemset(o_src, 0xff, T * K * 4));
    CK(cudaMemset(bad, 0, 8));
    launch(mode);
    check_rows<<<1024, 256>>>(x, out, o_src, want_src, o_idx, want_idx, rows_out, R, bad);
    unsigned long long b = 0;
    CK(cudaMemcpy(&b, bad, 8, cudaMemcpyDeviceToHost));
    return b;
  };
  const char* kinds[3] = {"uniform", "masked and skewed", "first slot on expert 0"};
  bool all_ok = true;
  for (int kind = 2; kind >= 0; --kind) {  // ends loaded with the uniform routing, which is timed
    load(kind, 11u + kind);
    for (int mode = 0; mode < 16; ++mode) {
      if ((mode == kClusterStaged3 || mode == kTableC3) && !grid3) continue;
      const unsigned long long b = verify(mode);
      std::printf("check %-24s %-10s %llu of %lld rows wrong%s\n", kinds[kind], names[mode], b, (long long)rows_out,
                  b ? "  MISMATCH" : "");
      all_ok = all_ok && b == 0;
    }
  }
  const double bytes = double(T) * R * (K + 1);  // each row read once, written K times
  const float memcpy_us =
      time_us([&] { CK(cudaMemcpyAsync(out, out + int64_t(bytes / 2), int64_t(bytes / 2), cudaMemcpyDeviceToDevice)); }, reps);
  const double roof = bytes / memcpy_us / 1e6;
  std::printf("-- fan-out of %lld rows to %d each, steal phases of %d rows, %d blocks\n", (long long)T, K, rows, sms);
  std::printf("%-34s %9.1f us  %5.2f TB/s  1.000\n", "cudaMemcpy of the same bytes", memcpy_us, roof);
  std::vector<unsigned long long> st(sms * kStamps);
  for (int turn = 0; turn < 3; ++turn)
    for (int mode : {kTable, kTableC3, kClusterStaged3, kClusterStaged}) {
      if ((mode == kClusterStaged3 || mode == kTableC3) && !grid3) continue;
      const float us = time_us([&] { launch(mode); }, reps);
      std::printf("%-34s %9.1f us  %5.2f TB/s  %5.3f\n", names[mode], us, bytes / us / 1e6, bytes / us / 1e6 / roof);
      if (turn) continue;
      CK(cudaMemcpy(st.data(), stamps, st.size() * 8, cudaMemcpyDeviceToHost));
      unsigned long long t0 = ~0ull;
      const bool staged = mode == kClusterStaged || mode == kClusterPaired || mode == kStagedEarly6 ||
                          mode == kStagedEarly13 || mode == kClusterStaged3;
      const int nb = mode == kClusterStaged3 || mode == kTableC3            ? grid3
                     : mode == kTableCgrid || mode == kCluster || staged ? cgrid
                                                                         : sms;
      for (int b = 0; b < nb; ++b) t0 = std::min(t0, st[b * kStamps]);
      std::printf("   stamps, µs from the first block's start, median / max over blocks:");
      const char* what[kStamps] = {"start", "positions", "round 0 landed", "round 0 issued", "end", "ids in", "counted"};
      for (int s = 0; s < (staged ? kStamps : 5); ++s) {
        std::vector<double> v;
        for (int b = 0; b < nb; ++b) v.push_back((st[b * kStamps + s] - t0) / 1e3);
        std::sort(v.begin(), v.end());
        std::printf(" %s %.1f / %.1f;", what[s], v[v.size() / 2], v.back());
      }
      std::printf("\n");
    }
  std::printf("%s\n", all_ok ? "all outputs right" : "SOME OUTPUTS WRONG");
  return all_ok ? 0 : 1;
}
