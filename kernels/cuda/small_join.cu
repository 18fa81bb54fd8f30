// small_join.cu -- knn::cuda::small_join: tiny brute-force joins without the
// general path's fixed costs.
//
// Where the time of a tiny join went through brute_force.cu (one H100,
// bench/knn_bench with a stopwatch at each step, k = 20 self-joins): on
// arcene (100 x 10000, 1.2 ms) 0.41 ms for the upload of its 4 MB (helper
// threads and a synchronised staged copy), 0.42 ms for the exact re-rank
// of 64 candidates of 10000 dimensions per query (one thread per pair),
// 0.14 ms for the fp16 filter, 0.05 ms for a dozen allocations and their
// synchronisation; on 3DNet's first 5000 rows (5000 x 3, 1.5 ms) 0.88 ms
// for the fused exact selection (lists merged in shared memory), 0.2 ms
// for two staged downloads, 0.07 ms for two synchronised uploads. Here,
// everything is queued on ctx.stream, with no synchronisation but the
// waits for the results:
//  1. one allocation from the device's pool for every array;
//  2. one upload of every input (the queries unless they are the first
//     rows of the targets, the targets, the keys), packed into two pinned
//     slices of the runtime's staging memory: in pieces, so that the DMA
//     of one piece runs while the host fills the next, or from 2 MiB on
//     by a few threads, each sending its share once packed;
//  3. cosine: every row's norm (row_stats.cu);
//  4. above kDirectMaxDim dimensions: every pair's canonical lane sum into
//     a |Q| x |T| matrix, eight threads per pair -- one per lane of
//     knn_distance.h, folded with shuffles in knn_fold_lanes' order -- so
//     that a few pairs of many dimensions still fill the GPU;
//  5. the selection: one warp per query walks the targets in row order,
//     one per lane, takes each pair's value (computed by the lane itself
//     with knn_distance.h at few dimensions, else read from the matrix),
//     keeps the k best (value, row) entries sorted in registers, and
//     writes the k results in the layout of the result arrays;
//  6. one download of the results in pieces, each copied into the
//     caller's arrays while the next one arrives.
// Exact: the values are knn_distance.h's lane sums (each operation rounded
// on its own, as the general path's kernels and the CPU compute them),
// ordered by (value, row) with select_keys.cuh's keys (NaN after every
// number, -0 equal to +0, ties to the smaller row), and the distances come
// from the same float sums through knn_distance.h's conversions.
//
// Every device array is one DeviceBuffer, freed into the pool on every
// path; the staging slices are the runtime's (given back with it);
// cancellation is looked at before the upload and before the download
// (the whole join takes well under a millisecond of GPU time).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "../knn_distance.h"
#include "../stopwatch.h"
#include "brute_kernels.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "device_thread.cuh"
#include "grid.cuh"
#include "host_transfer.cuh"
#include "lane_ops.cuh"
#include "select_keys.cuh"
#include "small_join.cuh"

namespace knn {
namespace cuda {
namespace {

// ---- what the small path takes ----
constexpr int kEntriesPerLane = 8;                 // registers of a warp's list
constexpr int kMaxK = 32 * kEntriesPerLane;        // 256
constexpr int64_t kMaxTargets = 32768;             // one warp walks them per query
constexpr int kDirectMaxDim = 32;                  // one lane computes a pair up to here
constexpr double kMaxPairDims = double(1 << 28);   // pairs x max(dim, 8): GPU work bound
constexpr int64_t kMaxMatrixPairs = int64_t(1) << 22;  // the lane-sum matrix: 16 MiB
constexpr size_t kMaxUploadBytes = size_t(8) << 20;
// The results land in the two staging slices whole (then no slice is
// refilled while the host empties the other).
constexpr size_t kMaxResultBytes = 2 * PinnedStaging::kSliceBytes;
constexpr size_t kUploadPiece = size_t(512) << 10;
// Uploads from this size on are packed by several threads, one per MiB (at
// most kMaxPackThreads), each sending its share as soon as it is packed:
// on an H200 host one thread moved 4 MB into pinned memory in 0.32 ms,
// four threads in 0.09 ms, their starts included (median of 30).
constexpr size_t kParallelPackBytes = size_t(2) << 20;
constexpr int kMaxPackThreads = 4;
static_assert(kMaxUploadBytes <= 2 * PinnedStaging::kSliceBytes, "a packed upload fits the slices");
constexpr size_t kDownloadPiece = size_t(256) << 10;
constexpr size_t kAlign = 256;
static_assert(PinnedStaging::kSliceBytes % kDownloadPiece == 0, "pieces tile a slice");
static_assert(kUploadPiece <= PinnedStaging::kSliceBytes, "a piece fits a slice");

constexpr unsigned kFullMask = 0xffffffffu;

// ---- where each array lives in the one device allocation ----

struct Layout {
  bool same_rows = false;   // the queries are the first rows of the targets
  bool same_keys = false;   // ... and so are their keys
  bool cosine = false;      // row norms needed
  bool matrix = false;      // the lane-sum matrix (above kDirectMaxDim)
  // The upload region [0, upload_bytes): rows and keys, as the host has them.
  size_t t_rows = 0, q_rows = 0, t_keys = 0, q_keys = 0, upload_bytes = 0;
  // Computed on the device.
  size_t t_norm = 0, q_norm = 0, t_zero = 0, q_zero = 0, values = 0;
  // The download region: neighbours (int64) then distances (double).
  size_t results = 0, result_bytes = 0;
  size_t total = 0;
};

Layout layout_of(const KnnProblem &p) {
  Layout l;
  const size_t nq = static_cast<size_t>(p.n_queries), nt = static_cast<size_t>(p.n_targets);
  const size_t dim = static_cast<size_t>(p.dim);
  l.same_rows = p.queries == p.targets && p.n_queries <= p.n_targets;
  const bool keys = p.query_keys != nullptr;
  l.same_keys = keys && p.query_keys == p.target_keys && p.n_queries <= p.n_targets;
  l.cosine = p.metric == KNN_METRIC_COSINE;
  l.matrix = p.dim > kDirectMaxDim;
  size_t at = 0;
  auto place = [&at](size_t bytes) {
    const size_t offset = at;
    at = (at + bytes + kAlign - 1) / kAlign * kAlign;
    return offset;
  };
  l.t_rows = place(nt * dim * sizeof(float));
  if (!l.same_rows) l.q_rows = place(nq * dim * sizeof(float));
  if (keys) {
    l.t_keys = place(nt * sizeof(int64_t));
    if (!l.same_keys) l.q_keys = place(nq * sizeof(int64_t));
  }
  l.upload_bytes = at;
  if (l.cosine) {
    l.t_norm = place(nt * sizeof(float));
    l.t_zero = place(nt);
    if (!l.same_rows) {
      l.q_norm = place(nq * sizeof(float));
      l.q_zero = place(nq);
    }
  }
  if (l.matrix) l.values = place(nq * nt * sizeof(float));
  l.result_bytes = nq * static_cast<size_t>(p.k) * (sizeof(int64_t) + sizeof(double));
  l.results = place(l.result_bytes);
  l.total = at;
  return l;
}

// ---- the device side ----

// The canonical sum of a pair (knn_distance.h): squared L2, L1 sum, or the
// dot product (IP, cosine). q is the query row, as everywhere.
__device__ __forceinline__ float pair_sum(KnnMetric metric, const float *q, const float *t,
                                          int dim) {
  if (metric == KNN_METRIC_L2) return knn_l2_squared(q, t, dim);
  if (metric == KNN_METRIC_L1) return knn_l1_sum(q, t, dim);
  return knn_dot(q, t, dim);
}

// The operator's float8 result from the pair's sum (exact_pair.cuh's).
__device__ __forceinline__ double pair_distance(KnnMetric metric, float sum, float q_norm,
                                                float t_norm) {
  switch (metric) {
    case KNN_METRIC_L2: return knn_l2_from_squared(sum);
    case KNN_METRIC_L1: return knn_l1_from_sum(sum);
    case KNN_METRIC_IP: return knn_ip_from_dot(sum);
    default: return knn_cosine_from_dot(sum, q_norm, t_norm);
  }
}

// The selection value (exact_pair.cuh's: the squared L2 and the L1 sum
// order as their distances do).
__device__ __forceinline__ double pair_value(KnnMetric metric, float sum, float q_norm,
                                             float t_norm) {
  if (metric == KNN_METRIC_L2 || metric == KNN_METRIC_L1) return sum;
  return pair_distance(metric, sum, q_norm, t_norm);
}

// The lane-sum matrix: block (x, y) computes queries 8x .. 8x+7 against
// targets 16y .. 16y+15 (128 pairs). Thread tid is lane tid % 8 of four
// pairs: queries gq, gq + 4 and targets gt, gt + 8 of the block, where
// group = tid / 8, gq = group / 8, gt = group % 8. Dimensions are staged
// through shared memory in chunks of 128 (rows padded to 136 floats: the
// 32 threads of a warp read 32 different banks); dimension d of a chunk
// starting at a multiple of 8 belongs to lane d % 8, which is the thread's
// own, so each accumulator is one lane of knn_distance.h, summed in index
// order. Staged zeros past the last dimension or row add +0, which changes
// no lane (a lane starts at +0 and cannot become -0).
constexpr int kSumThreads = 256;
constexpr int kSumQueries = 8, kSumTargets = 16;
constexpr int kSumChunk = 128;
constexpr int kSumStride = kSumChunk + 8;
constexpr int kSumRows = kSumQueries + kSumTargets;
constexpr int kSumStaged = kSumRows * kSumChunk / kSumThreads;  // values per thread
static_assert(kSumChunk % KNN_LANES == 0, "chunks start on lane 0");

template <int OP>
__global__ void __launch_bounds__(kSumThreads)
lane_sum_kernel(const float *__restrict__ queries, int nq, const float *__restrict__ targets,
                int nt, int dim, float *__restrict__ values) {
  __shared__ float sq[kSumQueries * kSumStride];
  __shared__ float st[kSumTargets * kSumStride];
  const int tid = threadIdx.x;
  const int lane8 = tid % KNN_LANES;
  const int group = tid / KNN_LANES;
  const int gq = group / 8, gt = group % 8;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kSumQueries;
  const int t0 = blockIdx.y * kSumTargets;

  float staged[kSumStaged];
  auto load = [&](int d0) {
#pragma unroll
    for (int u = 0; u < kSumStaged; u++) {
      const int i = tid + u * kSumThreads;
      const int r = i / kSumChunk, d = d0 + i % kSumChunk;
      float v = 0.0f;
      if (d < dim) {
        if (r < kSumQueries) {
          if (q0 + r < nq) v = queries[(q0 + r) * dim + d];
        } else if (t0 + r - kSumQueries < nt) {
          v = targets[static_cast<int64_t>(t0 + r - kSumQueries) * dim + d];
        }
      }
      staged[u] = v;
    }
  };
  auto store = [&]() {
#pragma unroll
    for (int u = 0; u < kSumStaged; u++) {
      const int i = tid + u * kSumThreads;
      const int r = i / kSumChunk, c = i % kSumChunk;
      if (r < kSumQueries)
        sq[r * kSumStride + c] = staged[u];
      else
        st[(r - kSumQueries) * kSumStride + c] = staged[u];
    }
  };

  float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  load(0);
  for (int d0 = 0; d0 < dim; d0 += kSumChunk) {
    __syncthreads();  // the previous chunk's readers are done
    store();
    __syncthreads();
    if (d0 + kSumChunk < dim) load(d0 + kSumChunk);  // in flight while this chunk is summed
    const int dims = min(kSumChunk, dim - d0);
    for (int c = lane8; c < dims; c += KNN_LANES) {
      const float a0 = sq[gq * kSumStride + c], a1 = sq[(gq + 4) * kSumStride + c];
      const float b0 = st[gt * kSumStride + c], b1 = st[(gt + 8) * kSumStride + c];
      acc[0][0] = lane_add<OP>(acc[0][0], a0, b0);
      acc[0][1] = lane_add<OP>(acc[0][1], a0, b1);
      acc[1][0] = lane_add<OP>(acc[1][0], a1, b0);
      acc[1][1] = lane_add<OP>(acc[1][1], a1, b1);
    }
  }
  // knn_fold_lanes: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), the
  // eight lanes being the eight threads of the group.
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int n = 0; n < 2; n++) {
      float v = acc[m][n];
      v = __fadd_rn(v, __shfl_down_sync(kFullMask, v, 4, KNN_LANES));  // lane j < 4: l_j + l_j+4
      v = __fadd_rn(v, __shfl_down_sync(kFullMask, v, 2, KNN_LANES));  // lane 0: s0 + s2, 1: s1 + s3
      v = __fadd_rn(v, __shfl_down_sync(kFullMask, v, 1, KNN_LANES));  // lane 0: the fold
      const int64_t q = q0 + gq + 4 * m;
      const int t = t0 + gt + 8 * n;
      if (lane8 == 0 && q < nq && t < nt) values[q * nt + t] = v;
    }
}

struct SelectArgs {
  KnnMetric metric = KNN_METRIC_L2;
  int dim = 0;
  int k = 1;
  int nq = 0, nt = 0;
  const float *queries = nullptr;
  const float *targets = nullptr;
  const float *values = nullptr;  // the lane-sum matrix, or null: each lane computes its pair
  const float *q_norm = nullptr;  // cosine only
  const float *t_norm = nullptr;
  const int64_t *q_keys = nullptr;  // null: no exclusion
  const int64_t *t_keys = nullptr;
  int64_t *out_rows = nullptr;    // nq x k, the result arrays' layout
  double *out_dist = nullptr;
};

// Inserts (key, row) into the warp's sorted list (entry e = r * 32 + lane
// in key[r], row[r] of lane e % 32); the last entry drops out.
template <int R>
__device__ __forceinline__ void insert_entry(uint64_t (&key)[R], uint32_t (&row)[R],
                                             uint64_t new_key, uint32_t new_row, int lane) {
  int pos = 0;
#pragma unroll
  for (int r = 0; r < R; r++)
    pos += __popc(__ballot_sync(kFullMask, entry_before(key[r], row[r], new_key, new_row)));
#pragma unroll
  for (int r = R - 1; r >= 0; r--) {
    uint64_t prev_key = __shfl_up_sync(kFullMask, key[r], 1);
    uint32_t prev_row = __shfl_up_sync(kFullMask, row[r], 1);
    if (r > 0) {  // lane 0 takes the previous register's last entry
      const uint64_t carry_key = __shfl_sync(kFullMask, key[r > 0 ? r - 1 : 0], 31);
      const uint32_t carry_row = __shfl_sync(kFullMask, row[r > 0 ? r - 1 : 0], 31);
      if (lane == 0) {
        prev_key = carry_key;
        prev_row = carry_row;
      }
    }
    const int e = r * 32 + lane;
    if (e > pos) {
      key[r] = prev_key;
      row[r] = prev_row;
    } else if (e == pos) {
      key[r] = new_key;
      row[r] = new_row;
    }
  }
}

// One warp per query: the k best targets by (value, row), exclusions
// skipped. Targets come in row order, one per lane; a lane whose entry
// comes before the list's k-th one is inserted (lowest lane first), after
// which the others are tested against the new k-th entry.
template <int R>
__global__ void __launch_bounds__(256) small_select_kernel(SelectArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t q = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (q >= a.nq) return;  // the whole warp
  uint64_t key[R];
  uint32_t row[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    key[r] = kEmptyKey;
    row[r] = kEmptyRow;
  }
  uint64_t kth_key = kEmptyKey;
  uint32_t kth_row = kEmptyRow;
  const int kth_reg = (a.k - 1) / 32, kth_lane = (a.k - 1) % 32;
  const bool exclude = a.q_keys != nullptr;
  const int64_t q_key = exclude ? a.q_keys[q] : 0;
  const bool cosine = a.metric == KNN_METRIC_COSINE;
  const float q_norm = cosine ? a.q_norm[q] : 0.0f;
  const float *q_row = a.queries + q * a.dim;
  const float *v_row = a.values != nullptr ? a.values + q * a.nt : nullptr;

  for (int t0 = 0; t0 < a.nt; t0 += 32) {
    const int t = t0 + lane;
    const bool eligible = t < a.nt && !(exclude && a.t_keys[t] == q_key);
    uint64_t k_t = kEmptyKey;
    if (eligible) {
      const float sum = v_row != nullptr
                            ? v_row[t]
                            : pair_sum(a.metric, q_row, a.targets + static_cast<int64_t>(t) * a.dim,
                                       a.dim);
      k_t = order_key(pair_value(a.metric, sum, q_norm, cosine ? a.t_norm[t] : 0.0f));
    }
    unsigned pending =
        __ballot_sync(kFullMask, eligible && entry_before(k_t, t, kth_key, kth_row));
    while (pending != 0) {
      const int src = __ffs(pending) - 1;
      const uint64_t new_key = __shfl_sync(kFullMask, k_t, src);
      insert_entry<R>(key, row, new_key, static_cast<uint32_t>(t0 + src), lane);
#pragma unroll
      for (int r = 0; r < R; r++)
        if (r == kth_reg) {
          kth_key = __shfl_sync(kFullMask, key[r], kth_lane);
          kth_row = __shfl_sync(kFullMask, row[r], kth_lane);
        }
      const unsigned later = src == 31 ? 0u : (kFullMask << (src + 1));
      pending =
          __ballot_sync(kFullMask, eligible && entry_before(k_t, t, kth_key, kth_row)) & later;
    }
  }

#pragma unroll
  for (int r = 0; r < R; r++) {
    const int e = r * 32 + lane;
    if (e >= a.k) continue;
    const int64_t slot = q * a.k + e;
    if (row[r] == kEmptyRow) {  // fewer eligible targets than k
      a.out_rows[slot] = -1;
      a.out_dist[slot] = __longlong_as_double(0x7ff8000000000000LL);  // result_padding.h's NaN
      continue;
    }
    const int t = static_cast<int>(row[r]);
    const float sum =
        v_row != nullptr
            ? v_row[t]
            : pair_sum(a.metric, q_row, a.targets + static_cast<int64_t>(t) * a.dim, a.dim);
    a.out_rows[slot] = t;
    a.out_dist[slot] = pair_distance(a.metric, sum, q_norm, cosine ? a.t_norm[t] : 0.0f);
  }
}

template <int R>
KnnStatus launch_select_typed(DeviceContext &ctx, const SelectArgs &a) {
  constexpr int kThreads = 256;
  small_select_kernel<R><<<grid_for(static_cast<int64_t>(a.nq) * 32, kThreads), kThreads, 0,
                           ctx.stream>>>(a);
  CUDA_CHECK_LAUNCH(ctx, "small_select_kernel");
  return KNN_OK;
}

KnnStatus launch_select(DeviceContext &ctx, const SelectArgs &a) {
  if (a.k <= 32) return launch_select_typed<1>(ctx, a);
  if (a.k <= 64) return launch_select_typed<2>(ctx, a);
  if (a.k <= 128) return launch_select_typed<4>(ctx, a);
  return launch_select_typed<kEntriesPerLane>(ctx, a);
}

KnnStatus launch_lane_sums(DeviceContext &ctx, KnnMetric metric, const float *queries, int nq,
                           const float *targets, int nt, int dim, float *values) {
  const dim3 grid(static_cast<unsigned>(ceil_div(nq, kSumQueries)),
                  static_cast<unsigned>(ceil_div(nt, kSumTargets)));
  if (metric == KNN_METRIC_L2)
    lane_sum_kernel<kSquaredDiff><<<grid, kSumThreads, 0, ctx.stream>>>(queries, nq, targets, nt,
                                                                        dim, values);
  else if (metric == KNN_METRIC_L1)
    lane_sum_kernel<kAbsDiff><<<grid, kSumThreads, 0, ctx.stream>>>(queries, nq, targets, nt, dim,
                                                                    values);
  else
    lane_sum_kernel<kProduct><<<grid, kSumThreads, 0, ctx.stream>>>(queries, nq, targets, nt, dim,
                                                                    values);
  CUDA_CHECK_LAUNCH(ctx, "lane_sum_kernel");
  return KNN_OK;
}

// ---- the host side ----

// A host array and its place in the device region being copied.
struct HostPart {
  size_t offset = 0;  // in the region
  unsigned char *host = nullptr;
  size_t bytes = 0;
};

// The bytes [at, at + n) of the region that parts cover: into (upload) or
// out of (download) `staged`, which holds those bytes of the region.
void copy_parts(const HostPart *parts, int n_parts, size_t at, size_t n, unsigned char *staged,
                bool into_staged) {
  for (int i = 0; i < n_parts; i++) {
    const size_t lo = std::max(at, parts[i].offset);
    const size_t hi = std::min(at + n, parts[i].offset + parts[i].bytes);
    if (lo >= hi) continue;
    if (into_staged)
      std::memcpy(staged + (lo - at), parts[i].host + (lo - parts[i].offset), hi - lo);
    else
      std::memcpy(parts[i].host + (lo - parts[i].offset), staged + (lo - at), hi - lo);
  }
}

// Byte `at` of staging slices 0 and 1 taken as one area.
unsigned char *staged_at(const PinnedStaging &st, size_t at) {
  return st.slice(static_cast<int>(at / PinnedStaging::kSliceBytes)) +
         at % PinnedStaging::kSliceBytes;
}

// Region [0, bytes) of `device` from the host parts (gaps between them
// are left as they are), in pieces through staging slices 0 and 1: the
// host fills one slice while the DMA engine reads the other. Queued on
// ctx.stream; a slice is refilled once its last copy has completed.
KnnStatus upload_pipelined(DeviceContext &ctx, unsigned char *device, const HostPart *parts,
                           int n_parts, size_t bytes) {
  PinnedStaging &st = *ctx.staging;
  size_t piece = 0;
  for (size_t at = 0; at < bytes; at += kUploadPiece, piece++) {
    const size_t n = std::min(kUploadPiece, bytes - at);
    const int s = static_cast<int>(piece % 2);
    if (piece >= 2) CUDA_CHECK(ctx, cudaEventSynchronize(st.event(s)));
    copy_parts(parts, n_parts, at, n, st.slice(s), true);
    CUDA_CHECK(ctx, cudaMemcpyAsync(device + at, st.slice(s), n, cudaMemcpyHostToDevice,
                                    ctx.stream));
    CUDA_CHECK(ctx, cudaEventRecord(st.event(s), ctx.stream));
  }
  return KNN_OK;
}

// Bytes [lo, hi) of the region: packed at the same place of slices 0 and
// 1 (as one area), then queued for the device on `stream`.
KnnStatus upload_share(DeviceContext &ctx, cudaStream_t stream, unsigned char *device,
                       const HostPart *parts, int n_parts, size_t lo, size_t hi) {
  for (size_t at = lo; at < hi;) {
    const size_t n = std::min(hi - at, PinnedStaging::kSliceBytes - at % PinnedStaging::kSliceBytes);
    unsigned char *staged = staged_at(*ctx.staging, at);
    copy_parts(parts, n_parts, at, n, staged, true);
    CUDA_CHECK(ctx, cudaMemcpyAsync(device + at, staged, n, cudaMemcpyHostToDevice, stream));
    at += n;
  }
  return KNN_OK;
}

// The region in `workers` shares: share 0 on this thread, the others on
// helper threads (or here, where none can be started), all queued on
// ctx.stream before this returns. The region fits the two slices, so no
// slice is refilled.
KnnStatus upload_parallel(DeviceContext &ctx, unsigned char *device, const HostPart *parts,
                          int n_parts, size_t bytes, int workers) {
  const size_t share = ((bytes + workers - 1) / workers + 4095) / 4096 * 4096;
  const cudaStream_t stream = ctx.stream;
  auto run_share = [&](DeviceContext &c, int w) {
    const size_t lo = std::min(bytes, share * w);
    return upload_share(c, stream, device, parts, n_parts, lo, std::min(bytes, lo + share));
  };
  return run_shares<kMaxPackThreads>(ctx, workers, run_share);
}

// The packed upload of region [0, bytes) (at most kMaxUploadBytes).
KnnStatus upload(DeviceContext &ctx, unsigned char *device, const HostPart *parts, int n_parts,
                 size_t bytes) {
  if (bytes < kParallelPackBytes) return upload_pipelined(ctx, device, parts, n_parts, bytes);
  const size_t mib = size_t(1) << 20;
  const int workers = static_cast<int>(std::min<size_t>(kMaxPackThreads, (bytes + mib - 1) / mib));
  return upload_parallel(ctx, device, parts, n_parts, bytes, workers);
}

// Region [0, bytes) of `device` (at most two slices) into the host parts,
// after the work queued so far: piece i lands at byte i * kDownloadPiece
// of slices 0 and 1 taken as one area; two pieces are in flight while the
// host copies out the oldest. *waited: the seconds spent waiting for the
// first piece (the kernels before it).
KnnStatus download(DeviceContext &ctx, const unsigned char *device, const HostPart *parts,
                   int n_parts, size_t bytes, double *waited) {
  PinnedStaging &st = *ctx.staging;
  const size_t pieces = (bytes + kDownloadPiece - 1) / kDownloadPiece;
  auto staged = [&st](size_t i) { return staged_at(st, i * kDownloadPiece); };
  auto piece_bytes = [&](size_t i) { return std::min(kDownloadPiece, bytes - i * kDownloadPiece); };
  auto enqueue = [&](size_t i) -> KnnStatus {
    CUDA_CHECK(ctx, cudaMemcpyAsync(staged(i), device + i * kDownloadPiece, piece_bytes(i),
                                    cudaMemcpyDeviceToHost, ctx.stream));
    CUDA_CHECK(ctx, cudaEventRecord(st.event(static_cast<int>(i % 2)), ctx.stream));
    return KNN_OK;
  };
  for (size_t i = 0; i < pieces && i < 2; i++) KNN_TRY(enqueue(i));
  for (size_t i = 0; i < pieces; i++) {
    const Clock::time_point w = Clock::now();
    CUDA_CHECK(ctx, cudaEventSynchronize(st.event(static_cast<int>(i % 2))));
    if (i == 0) *waited = seconds_since(w);
    copy_parts(parts, n_parts, i * kDownloadPiece, piece_bytes(i), staged(i), false);
    if (i + 2 < pieces) KNN_TRY(enqueue(i + 2));
  }
  return KNN_OK;
}

}  // namespace

bool small_join_applies(const KnnProblem &p, const JoinTuning &tuning, const DeviceContext &ctx) {
  if (!tuning.small_join || tuning.sgemm_filter || tuning.brute_filter != BruteFilter::kAuto ||
      tuning.pipeline_tiles || !tuning.half_tiles || !tuning.large_k)
    return false;
  if (ctx.staging == nullptr || ctx.query_count >= 0) return false;
  if (p.element != KNN_ELEMENT_FLOAT32 || p.dim < 1 || p.k < 1 || p.k > kMaxK) return false;
  if (p.n_queries < 1 || p.n_targets < 1 || p.n_targets > kMaxTargets) return false;
  if (p.metric != KNN_METRIC_L2 && p.metric != KNN_METRIC_L1 && p.metric != KNN_METRIC_IP &&
      p.metric != KNN_METRIC_COSINE)
    return false;
  const double pairs = static_cast<double>(p.n_queries) * static_cast<double>(p.n_targets);
  if (pairs * std::max(p.dim, KNN_LANES) > kMaxPairDims) return false;
  if (p.dim > kDirectMaxDim && pairs > static_cast<double>(kMaxMatrixPairs)) return false;
  const Layout l = layout_of(p);
  return l.upload_bytes <= kMaxUploadBytes && l.result_bytes <= kMaxResultBytes &&
         l.total <= ctx.memory_budget;
}

KnnStatus small_join(const KnnProblem &p, int64_t *neighbors, double *distances, KnnStats *stats,
                     DeviceContext &ctx) {
  const Clock::time_point start = Clock::now();
  const Layout l = layout_of(p);
  DeviceBuffer<unsigned char> scratch;
  KNN_TRY(scratch.allocate(ctx, l.total, "the small join"));
  KNN_TRY(ctx.staging->reserve(ctx, 1));
  KNN_TRY(ctx.cancel_point());
  unsigned char *const dev = scratch.get();
  const size_t nq = static_cast<size_t>(p.n_queries), nt = static_cast<size_t>(p.n_targets);
  const size_t dim = static_cast<size_t>(p.dim);

  // Inputs: one packed upload.
  auto host = [](const void *x) { return static_cast<unsigned char *>(const_cast<void *>(x)); };
  HostPart in[4];
  int n_in = 0;
  in[n_in++] = HostPart{l.t_rows, host(p.targets), nt * dim * sizeof(float)};
  if (!l.same_rows) in[n_in++] = HostPart{l.q_rows, host(p.queries), nq * dim * sizeof(float)};
  if (p.query_keys != nullptr) {
    in[n_in++] = HostPart{l.t_keys, host(p.target_keys), nt * sizeof(int64_t)};
    if (!l.same_keys) in[n_in++] = HostPart{l.q_keys, host(p.query_keys), nq * sizeof(int64_t)};
  }
  KNN_TRY(upload(ctx, dev, in, n_in, l.upload_bytes));
  const double seconds_upload = seconds_since(start);

  SelectArgs a;
  a.metric = p.metric;
  a.dim = p.dim;
  a.k = p.k;
  a.nq = static_cast<int>(p.n_queries);
  a.nt = static_cast<int>(p.n_targets);
  a.targets = reinterpret_cast<const float *>(dev + l.t_rows);
  a.queries = l.same_rows ? a.targets : reinterpret_cast<const float *>(dev + l.q_rows);
  if (p.query_keys != nullptr) {
    a.t_keys = reinterpret_cast<const int64_t *>(dev + l.t_keys);
    a.q_keys = l.same_keys ? a.t_keys : reinterpret_cast<const int64_t *>(dev + l.q_keys);
  }
  if (l.cosine) {
    float *t_norm = reinterpret_cast<float *>(dev + l.t_norm);
    KNN_TRY(launch_row_stats(ctx, a.targets, p.n_targets, p.dim, t_norm, dev + l.t_zero));
    a.t_norm = a.q_norm = t_norm;
    if (!l.same_rows) {
      float *q_norm = reinterpret_cast<float *>(dev + l.q_norm);
      KNN_TRY(launch_row_stats(ctx, a.queries, p.n_queries, p.dim, q_norm, dev + l.q_zero));
      a.q_norm = q_norm;
    }
  }
  if (l.matrix) {
    float *values = reinterpret_cast<float *>(dev + l.values);
    KNN_TRY(launch_lane_sums(ctx, p.metric, a.queries, a.nq, a.targets, a.nt, p.dim, values));
    a.values = values;
  }
  a.out_rows = reinterpret_cast<int64_t *>(dev + l.results);
  a.out_dist = reinterpret_cast<double *>(a.out_rows + nq * p.k);
  KNN_TRY(launch_select(ctx, a));
  KNN_TRY(ctx.cancel_point());

  // Results: one download, straight into the caller's arrays.
  const Clock::time_point results_start = Clock::now();
  const size_t slot_bytes = nq * static_cast<size_t>(p.k) * sizeof(int64_t);
  const HostPart out[2] = {HostPart{0, reinterpret_cast<unsigned char *>(neighbors), slot_bytes},
                           HostPart{slot_bytes, reinterpret_cast<unsigned char *>(distances),
                                    nq * static_cast<size_t>(p.k) * sizeof(double)}};
  double seconds_kernels = 0;
  KNN_TRY(download(ctx, dev + l.results, out, 2, l.result_bytes, &seconds_kernels));
  if (stats != nullptr) {
    stats->method = KNN_METHOD_BRUTE;
    std::snprintf(stats->variant, sizeof stats->variant, "small-join/%s k=%d",
                  l.matrix ? "lane-sums" : "direct", p.k);
    stats->distance_computations = p.n_queries * p.n_targets;
    stats->pairs = p.n_queries * p.n_targets;
    stats->threads_per_query = 32;
    stats->seconds_select = seconds_kernels;
    stats->seconds_transfer = seconds_upload + seconds_since(results_start) - seconds_kernels;
    stats->seconds_total = seconds_since(start);
  }
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
