// row_stats.cu -- small per-row kernels of the brute-force path: norms and
// zero flags, gathering rows for the exact fallback, clearing lists and
// results, merging the results of successive target chunks.
#include <algorithm>
#include <cmath>

#include "brute_kernels.cuh"
#include "cuda_check.cuh"
#include "grid.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return grid_stride_blocks(n, kThreads); }


__global__ void row_stats_kernel(const float *__restrict__ x, int64_t n, int dim,
                                 float *__restrict__ norm, uint8_t *__restrict__ zero) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float *row = x + i * dim;
    norm[i] = knn_dot(row, row, dim);  // the canonical norm, as the CPU computes it
    bool all_zero = true;
    for (int j = 0; j < dim && all_zero; j++) all_zero = row[j] == 0.0f;
    zero[i] = all_zero ? 1 : 0;
  }
}

// Long rows (above kWarpRowDim dimensions) get one warp each, whose loads
// are coalesced; one thread per row would walk a long row alone.
constexpr int kWarpRowDim = 64;
constexpr unsigned kFullMask = 0xffffffffu;

// Rows of more than kWarpRowDim dimensions: one warp per row. knn_dot's 8
// lanes are 8 sums in index order (dimension e goes to lane e % 8); the
// warp stages 256 consecutive values at a time in shared memory (coalesced
// loads), then threads 0..7 each add their lane's 32 products in order, so
// every lane, and the fold, is bit for bit knn_dot's.
__global__ void row_stats_warp_kernel(const float *__restrict__ x, int64_t n, int dim,
                                      float *__restrict__ norm, uint8_t *__restrict__ zero) {
  constexpr int kStage = 256;  // a multiple of KNN_LANES: lane = index % 8 within a stage too
  __shared__ float stage[kThreads / 32][kStage];
  const int lane = threadIdx.x % 32;
  float *buf = stage[threadIdx.x / 32];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < n;
       r += warps) {
    const float *row = x + r * dim;
    float acc = 0.0f;  // knn_dot's lane `lane` (threads 0..7)
    bool nonzero = false;
    for (int base = 0; base < dim; base += kStage) {
      const int count = min(kStage, dim - base);
      for (int j = lane; j < count; j += 32) {
        const float v = row[base + j];
        buf[j] = v;
        nonzero = nonzero || v != 0.0f;
      }
      __syncwarp();
      if (lane < KNN_LANES)
        for (int j = lane; j < count; j += KNN_LANES)
          acc = KNN_FADD(acc, KNN_FMUL(buf[j], buf[j]));
      __syncwarp();  // buf is refilled next
    }
    float lanes[KNN_LANES];
#pragma unroll
    for (int j = 0; j < KNN_LANES; j++) lanes[j] = __shfl_sync(kFullMask, acc, j);
    nonzero = __any_sync(kFullMask, nonzero);
    if (lane == 0) {
      norm[r] = knn_fold_lanes(lanes);
      zero[r] = nonzero ? 0 : 1;
    }
  }
}

// xd = x as doubles; norm_d = the double sums of squares, one warp per row
// (coalesced). The order of those additions is free: the DGEMM filter's
// bound holds for any order (tile_value.cuh), and each product of two
// floats is exact in double (so contracting it into an FMA changes nothing).
__global__ void to_double_kernel(const float *__restrict__ x, int64_t n, int dim,
                                 double *__restrict__ xd, double *__restrict__ norm_d) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * dim;
       i += step)
    xd[i] = x[i];
  const int lane = threadIdx.x % 32;
  const int64_t warps = step / 32;
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < n;
       r += warps) {
    const float *row = x + r * dim;
    double sum = 0.0;
    for (int j = lane; j < dim; j += 32) {
      const double v = row[j];
      sum += v * v;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(kFullMask, sum, off);
    if (lane == 0) norm_d[r] = sum;
  }
}

__global__ void gather_rows_kernel(const int32_t *__restrict__ index, int64_t n, int dim,
                                   const float *__restrict__ src,
                                   const float *__restrict__ src_norm,
                                   const uint8_t *__restrict__ src_zero,
                                   const int64_t *__restrict__ src_key, float *__restrict__ dst,
                                   float *__restrict__ dst_norm, uint8_t *__restrict__ dst_zero,
                                   int64_t *__restrict__ dst_key) {
  const int64_t total = n * dim;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += step) {
    const int64_t r = i / dim, c = i % dim;
    dst[i] = src[static_cast<int64_t>(index[r]) * dim + c];
  }
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += step) {
    const int32_t s = index[r];
    if (dst_norm != nullptr) dst_norm[r] = src_norm[s];
    if (dst_zero != nullptr) dst_zero[r] = src_zero[s];
    if (dst_key != nullptr) dst_key[r] = src_key[s];
  }
}

__global__ void clear_entries_kernel(uint64_t *key, uint32_t *row, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    key[i] = kEmptyKey;
    row[i] = kEmptyRow;
  }
}

__global__ void clear_results_kernel(ResultArrays res, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    res.key[i] = kEmptyKey;
    res.row[i] = -1;
    res.dist[i] = NAN;
  }
}

__device__ __forceinline__ bool result_before(uint64_t ka, int64_t ra, uint64_t kb, int64_t rb) {
  // Empty slots carry row -1: compare rows as unsigned so they stay last.
  return ka < kb || (ka == kb && static_cast<uint64_t>(ra) < static_cast<uint64_t>(rb));
}

// One thread per query: a two-way merge of two sorted lists of k, keeping k.
__global__ void merge_results_kernel(ResultArrays into, ResultArrays add, int64_t n, int k) {
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = q * k;
    // First count how many of the k best come from each list (a from
    // `into`, b from `add`)...
    int a = 0, b = 0;
    for (int j = 0; j < k; j++) {
      if (b >= k || (a < k && !result_before(add.key[base + b], add.row[base + b],
                                             into.key[base + a], into.row[base + a])))
        a++;
      else
        b++;
    }
    // ...then merge those backwards, so that `into` is written in place
    // without overwriting an entry not yet read.
    int i = a - 1, m = b - 1;
    for (int j = k - 1; j >= 0; j--) {
      bool take_add;
      if (m < 0)
        take_add = false;
      else if (i < 0)
        take_add = true;
      else
        take_add = !result_before(add.key[base + m], add.row[base + m], into.key[base + i],
                                  into.row[base + i]);
      if (take_add) {
        into.key[base + j] = add.key[base + m];
        into.row[base + j] = add.row[base + m];
        into.dist[base + j] = add.dist[base + m];
        m--;
      } else {
        into.key[base + j] = into.key[base + i];
        into.row[base + j] = into.row[base + i];
        into.dist[base + j] = into.dist[base + i];
        i--;
      }
    }
  }
}

}  // namespace

KnnStatus launch_row_stats(DeviceContext &ctx, const float *x, int64_t n, int dim, float *norm,
                           uint8_t *zero) {
  if (n <= 0) return KNN_OK;
  if (dim > kWarpRowDim) {
    row_stats_warp_kernel<<<blocks_for(n * 32), kThreads, 0, ctx.stream>>>(x, n, dim, norm, zero);
    CUDA_CHECK_LAUNCH(ctx, "row_stats_warp_kernel");
    return KNN_OK;
  }
  row_stats_kernel<<<blocks_for(n), kThreads, 0, ctx.stream>>>(x, n, dim, norm, zero);
  CUDA_CHECK_LAUNCH(ctx, "row_stats_kernel");
  return KNN_OK;
}

KnnStatus launch_to_double(DeviceContext &ctx, const float *x, int64_t n, int dim, double *xd,
                           double *norm_d) {
  if (n <= 0) return KNN_OK;
  to_double_kernel<<<blocks_for(std::max<int64_t>(n * dim, n * 32)), kThreads, 0, ctx.stream>>>(
      x, n, dim, xd, norm_d);
  CUDA_CHECK_LAUNCH(ctx, "to_double_kernel");
  return KNN_OK;
}

KnnStatus launch_gather_rows(DeviceContext &ctx, const int32_t *index, int64_t n, int dim,
                             const Rows &src, float *dst, float *dst_norm, uint8_t *dst_zero,
                             int64_t *dst_key) {
  if (n <= 0) return KNN_OK;
  gather_rows_kernel<<<blocks_for(n * dim), kThreads, 0, ctx.stream>>>(
      index, n, dim, src.x, src.norm, src.zero, src.keys, dst, dst_norm, dst_zero, dst_key);
  CUDA_CHECK_LAUNCH(ctx, "gather_rows_kernel");
  return KNN_OK;
}

KnnStatus launch_clear_entries(DeviceContext &ctx, uint64_t *key, uint32_t *row, int64_t n) {
  if (n <= 0) return KNN_OK;
  clear_entries_kernel<<<blocks_for(n), kThreads, 0, ctx.stream>>>(key, row, n);
  CUDA_CHECK_LAUNCH(ctx, "clear_entries_kernel");
  return KNN_OK;
}

KnnStatus launch_clear_results(DeviceContext &ctx, ResultArrays res, int64_t n, int k) {
  const int64_t total = n * k;
  if (total <= 0) return KNN_OK;
  clear_results_kernel<<<blocks_for(total), kThreads, 0, ctx.stream>>>(res, total);
  CUDA_CHECK_LAUNCH(ctx, "clear_results_kernel");
  return KNN_OK;
}

KnnStatus launch_merge_results(DeviceContext &ctx, ResultArrays into, ResultArrays add,
                               int64_t n, int k) {
  if (n <= 0) return KNN_OK;
  merge_results_kernel<<<blocks_for(n), kThreads, 0, ctx.stream>>>(into, add, n, k);
  CUDA_CHECK_LAUNCH(ctx, "merge_results_kernel");
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
