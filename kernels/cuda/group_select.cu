// group_select.cu -- the segmented exact selection of per-group joins
// (group_join.cuh): one block per work item, i.e. up to 32 queries of one
// group against one range of that group's targets, all groups of a batch
// in one launch.
//
// The block walks its target range in tiles of 64 rows. A tile's pairs are
// summed exactly in the canonical lane order (lane_ops.cuh, dimensions
// staged 32 at a time in shared memory), turned into the selection value
// of exact_pair.cuh (squared L2, L1 sum, -dot, cosine distance) and its
// order key (select_keys.cuh). A pair is offered to its query's list only
// when its key is strictly below the query's bar, the key of the kp-th
// kept entry (kEmptyKey while fewer are kept): rows arrive in increasing
// order, so an equal key loses to the kept, smaller row, and the uint64
// order of keys already puts NaN after every number. Offered pairs wait
// behind the list; when they could overflow their space in the next tile,
// one warp sorts list and waiting entries (bitonic.cuh) and keeps the kp
// best, which lowers the bar.
#include "bitonic.cuh"
#include "cuda_check.cuh"
#include "group_join.cuh"
#include "lane_ops.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsY = 16, kRowsX = 16;   // thread grid: queries x targets
constexpr int kPerY = 2, kPerX = 4;        // pairs per thread
constexpr int kQueries = kRowsY * kPerY;   // 32 per block
constexpr int kTargets = kRowsX * kPerX;   // 64 per tile
constexpr int kDims = 32;                  // dimensions staged per step
constexpr int kPitch = kDims + 4;          // floats per staged row (float4 aligned)
static_assert(kQueries == kGroupTileQueries, "tile shape");

// Shared entries per query: the list, then room for the offered pairs of
// at least one tile.
template <int CAP>
struct Entries {
  static constexpr int kCount = CAP <= 32 ? 128 : 256;
  static constexpr int kSortAbove = kCount - CAP - kTargets;  // waiting entries before a sort
  static constexpr size_t kBytes = static_cast<size_t>(kQueries) * kCount * 12;
};

// The selection value of exact_pair.cuh from a folded lane sum.
template <int OP, bool kCosine>
__device__ __forceinline__ double selection_value(float sum, float q_norm, float t_norm) {
  if (kCosine) return knn_cosine_from_dot(sum, q_norm, t_norm);
  if (OP == kProduct) return knn_ip_from_dot(sum);
  return static_cast<double>(sum);
}

template <int OP, bool kCosine, int CAP>
__global__ void __launch_bounds__(kThreads) group_select_kernel(GroupSelectArgs a) {
  using E = Entries<CAP>;
  extern __shared__ __align__(16) unsigned char entry_space[];
  uint64_t *keys = reinterpret_cast<uint64_t *>(entry_space);          // [kQueries][kCount]
  uint32_t *rows = reinterpret_cast<uint32_t *>(keys + kQueries * E::kCount);
  __shared__ __align__(16) float q_stage[kQueries * kPitch];
  __shared__ __align__(16) float t_stage[kTargets * kPitch];
  __shared__ int64_t t_key[kTargets];
  __shared__ float t_norm[kTargets];
  __shared__ int64_t q_key[kQueries];
  __shared__ float q_norm[kQueries];
  __shared__ uint64_t bar[kQueries];
  __shared__ int waiting[kQueries];

  const GroupTile item = a.tiles[blockIdx.x];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int tx = tid % kRowsX, ty = tid / kRowsX;
  const int dim = a.dim;
  const int kp = a.lists.kp;
  const bool exclude = a.query_keys != nullptr;
  const int t_end = item.target_first + item.target_count;

  for (int i = tid; i < kQueries * E::kCount; i += kThreads) {
    keys[i] = kEmptyKey;
    rows[i] = kEmptyRow;
  }
  if (tid < kQueries) {
    const bool real = tid < item.query_count;
    const int64_t q = static_cast<int64_t>(item.query_first) + tid;
    q_key[tid] = exclude && real ? a.query_keys[q] : 0;
    q_norm[tid] = kCosine && real ? a.query_norm[q] : 0.0f;
    bar[tid] = kEmptyKey;
    waiting[tid] = 0;
  }

  // One warp: sorts query qq's entries, keeps the kp best, moves the bar.
  auto keep_best = [&](int qq) {
    uint64_t *k = keys + qq * E::kCount;
    uint32_t *r = rows + qq * E::kCount;
    bitonic_sort(k, r, nullptr, E::kCount, lane, 32, WarpSync());
    for (int i = kp + lane; i < E::kCount; i += 32) {
      k[i] = kEmptyKey;
      r[i] = kEmptyRow;
    }
    __syncwarp();
    if (lane == 0) {
      waiting[qq] = 0;
      bar[qq] = k[kp - 1];
    }
    __syncwarp();
  };

  float acc[kPerY][kPerX][KNN_LANES];
  for (int t0 = item.target_first; t0 < t_end; t0 += kTargets) {
    clear_lanes(acc);
    for (int d0 = 0; d0 < dim; d0 += kDims) {
      const int dims = min(kDims, dim - d0);
      const int cols = (dims + 3) & ~3;  // staged zeros past dim add +0
      __syncthreads();  // the stages' last readers are done
      for (int i = tid; i < kQueries * cols; i += kThreads) {
        const int r = i / cols, c = i - r * cols;
        float v = 0.0f;
        if (r < item.query_count && c < dims)
          v = a.queries[(static_cast<int64_t>(item.query_first) + r) * dim + d0 + c];
        q_stage[r * kPitch + c] = v;
      }
      for (int i = tid; i < kTargets * cols; i += kThreads) {
        const int r = i / cols, c = i - r * cols;
        float v = 0.0f;
        if (t0 + r < t_end && c < dims) v = a.targets[static_cast<int64_t>(t0 + r) * dim + d0 + c];
        t_stage[r * kPitch + c] = v;
      }
      if (d0 == 0 && tid < kTargets) {
        const bool real = t0 + tid < t_end;
        t_key[tid] = exclude && real ? a.target_keys[t0 + tid] : 0;
        t_norm[tid] = kCosine && real ? a.target_norm[t0 + tid] : 0.0f;
      }
      __syncthreads();
      add_staged_chunk<OP, kPerY, kPerX, kRowsX, kDims, kPitch>(acc, q_stage, t_stage, tx, ty,
                                                              dims);
    }
#pragma unroll
    for (int m = 0; m < kPerY; m++) {
      const int qq = ty * kPerY + m;
      if (qq >= item.query_count) continue;
#pragma unroll
      for (int n = 0; n < kPerX; n++) {
        const int tl = tx + n * kRowsX;
        if (t0 + tl >= t_end || (exclude && t_key[tl] == q_key[qq])) continue;
        const double value =
            selection_value<OP, kCosine>(knn_fold_lanes(acc[m][n]), q_norm[qq], t_norm[tl]);
        const uint64_t key = order_key(value);
        if (key < bar[qq]) {
          const int at = qq * E::kCount + CAP + atomicAdd(&waiting[qq], 1);
          keys[at] = key;
          rows[at] = static_cast<uint32_t>(t0 + tl);
        }
      }
    }
    __syncthreads();
    for (int qq = warp; qq < kQueries; qq += kThreads / 32)
      if (waiting[qq] > E::kSortAbove) keep_best(qq);
  }
  __syncthreads();
  for (int qq = warp; qq < kQueries; qq += kThreads / 32)
    if (waiting[qq] > 0) keep_best(qq);
  __syncthreads();
  const int segments = a.lists.segments;
  for (int i = tid; i < item.query_count * CAP; i += kThreads) {
    const int qq = i / CAP, j = i - qq * CAP;
    const int64_t at =
        ((static_cast<int64_t>(item.query_first) + qq) * segments + item.segment) * CAP + j;
    a.lists.key[at] = keys[qq * E::kCount + j];
    a.lists.row[at] = rows[qq * E::kCount + j];
  }
}

template <int OP, bool kCosine, int CAP>
KnnStatus launch_shape(DeviceContext &ctx, const GroupSelectArgs &a) {
  auto kernel = group_select_kernel<OP, kCosine, CAP>;
  const size_t bytes = Entries<CAP>::kBytes;
  CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  kernel<<<static_cast<unsigned>(a.n_tiles), kThreads, bytes, ctx.stream>>>(a);
  CUDA_CHECK_LAUNCH(ctx, "group_select_kernel");
  return KNN_OK;
}

template <int OP, bool kCosine>
KnnStatus launch_metric(DeviceContext &ctx, const GroupSelectArgs &a) {
  switch (a.lists.cap) {
    case 32: return launch_shape<OP, kCosine, 32>(ctx, a);
    case 64: return launch_shape<OP, kCosine, 64>(ctx, a);
    case 128: return launch_shape<OP, kCosine, 128>(ctx, a);
  }
  ctx.error = "group select: unsupported list capacity";
  return KNN_INTERNAL_ERROR;
}

}  // namespace

KnnStatus launch_group_select(DeviceContext &ctx, const GroupSelectArgs &a) {
  if (a.n_tiles <= 0) return KNN_OK;
  if (a.n_tiles > 2147483647LL || a.lists.kp < 1 || a.lists.kp > a.lists.cap ||
      a.lists.cap > kGroupMaxCap) {
    ctx.error = "group select: arguments out of range";
    return KNN_INTERNAL_ERROR;
  }
  switch (a.metric) {
    case KNN_METRIC_L2: return launch_metric<kSquaredDiff, false>(ctx, a);
    case KNN_METRIC_L1: return launch_metric<kAbsDiff, false>(ctx, a);
    case KNN_METRIC_IP: return launch_metric<kProduct, false>(ctx, a);
    case KNN_METRIC_COSINE: return launch_metric<kProduct, true>(ctx, a);
    default: break;
  }
  ctx.error = "group select: not a float metric";
  return KNN_INTERNAL_ERROR;
}

}  // namespace cuda
}  // namespace knn
