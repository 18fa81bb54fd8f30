// ti_dedup.cu -- groups the bitwise-identical rows of a point set.
//
// Identical rows have identical distances to everything (knn_distance.h is
// a function of the bits), so the join runs once per distinct row and
// expands the results back to rows: a distinct target stands for all its
// rows (ascending), a distinct query's list is shared by all its rows. The
// benchmark sets are full of duplicates (skin: 51444 distinct rows of
// 245057, kdd: 141480 of 494021), and without this every query would have
// to compute the distance to each copy of a tie.
//
// Method: a 64-bit hash per row, a stable radix sort of (hash, row), and a
// bitwise comparison of neighbours in sorted order. A hash collision can
// only split a group of identical rows into two groups, which costs speed,
// never exactness: every group holds identical rows in ascending order.
#include <cub/cub.cuh>

#include "ti_common.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

__global__ void hash_rows_kernel(const float *x, int64_t n, int stride, int dim,
                                 uint64_t *hash, int32_t *row) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t *w = reinterpret_cast<const uint32_t *>(x + i * stride);
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)dim;
  for (int j = 0; j < dim; j++) {
    h ^= w[j];
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 31;
  }
  hash[i] = h;
  row[i] = (int32_t)i;
}

__device__ bool rows_equal(const float *x, int stride, int dim, int32_t a, int32_t b) {
  const uint32_t *pa = reinterpret_cast<const uint32_t *>(x + (int64_t)a * stride);
  const uint32_t *pb = reinterpret_cast<const uint32_t *>(x + (int64_t)b * stride);
  for (int j = 0; j < dim; j++)
    if (pa[j] != pb[j]) return false;
  return true;
}

// flag[j] = 1 where sorted position j starts a new group.
__global__ void group_start_kernel(const float *x, int64_t n, int stride, int dim,
                                   const uint64_t *hash, const int32_t *row, int32_t *flag) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= n) return;
  bool start = j == 0 || hash[j] != hash[j - 1] ||
               !rows_equal(x, stride, dim, row[j], row[j - 1]);
  flag[j] = start ? 1 : 0;
}

// group_index[j] is the inclusive scan of the flags (group + 1).
__global__ void group_tables_kernel(int64_t n, const int32_t *flag, const int32_t *group_index,
                                    const int32_t *row, int32_t *group_begin,
                                    int32_t *group_of_row, int32_t *n_groups) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= n) return;
  int32_t g = group_index[j] - 1;
  if (flag[j]) group_begin[g] = (int32_t)j;
  group_of_row[row[j]] = g;
  if (j == n - 1) {
    group_begin[g + 1] = (int32_t)n;
    *n_groups = g + 1;
  }
}

__global__ void identity_groups_kernel(int64_t n, int32_t *group_begin, int32_t *rows,
                                       int32_t *group_of_row) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j > n) return;
  group_begin[j] = (int32_t)j;
  if (j < n) {
    rows[j] = (int32_t)j;
    group_of_row[j] = (int32_t)j;
  }
}

// The representative (smallest row) of each group.
__global__ void gather_representatives_kernel(const float *x, int stride, int64_t groups,
                                              const int32_t *group_begin, const int32_t *rows,
                                              float *out) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t g = i / (stride / 4);
  int c = (int)(i % (stride / 4));
  if (g >= groups) return;
  int32_t r = rows[group_begin[g]];
  reinterpret_cast<float4 *>(out + g * stride)[c] =
      reinterpret_cast<const float4 *>(x + (int64_t)r * stride)[c];
}

}  // namespace

KnnStatus build_distinct_set(const DevicePoints &points, bool dedup, DistinctSet &out,
                             MemoryBudget &mem, DeviceContext &ctx) {
  const int64_t n = points.n;
  cudaStream_t stream = ctx.stream;
  out.n_rows = n;
  out.stride = points.stride;
  KNN_TRY(mem.allocate(ctx, out.rows, n, "duplicate groups"));
  KNN_TRY(mem.allocate(ctx, out.group_of_row, n, "duplicate groups"));

  if (!dedup) {
    KNN_TRY(mem.allocate(ctx, out.group_begin, n + 1, "duplicate groups"));
    identity_groups_kernel<<<grid_for(n + 1, 256), 256, 0, stream>>>(
        n, out.group_begin.get(), out.rows.get(), out.group_of_row.get());
    CUDA_CHECK_LAUNCH(ctx, "identity_groups_kernel");
    out.n_distinct = n;
  } else {
    DeviceBuffer<uint64_t> hash, hash_sorted;
    DeviceBuffer<int32_t> row, flag, group_index, n_groups;
    KNN_TRY(mem.allocate(ctx, hash, n, "row hashes"));
    KNN_TRY(mem.allocate(ctx, hash_sorted, n, "row hashes"));
    KNN_TRY(mem.allocate(ctx, row, n, "row hashes"));
    KNN_TRY(mem.allocate(ctx, flag, n, "row hashes"));
    KNN_TRY(mem.allocate(ctx, group_index, n, "row hashes"));
    KNN_TRY(mem.allocate(ctx, n_groups, 1, "row hashes"));

    hash_rows_kernel<<<grid_for(n, 256), 256, 0, stream>>>(points.x, n, points.stride,
                                                           points.dim, hash.get(), row.get());
    CUDA_CHECK_LAUNCH(ctx, "hash_rows_kernel");

    size_t sort_bytes = 0, scan_bytes = 0;
    CUDA_CHECK(ctx, cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, hash.get(),
                                                     hash_sorted.get(), row.get(),
                                                     out.rows.get(), (int)n, 0, 64, stream));
    CUDA_CHECK(ctx, cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, flag.get(),
                                                   group_index.get(), (int)n, stream));
    DeviceBuffer<unsigned char> temp;
    KNN_TRY(mem.allocate(ctx, temp, sort_bytes > scan_bytes ? sort_bytes : scan_bytes,
                         "sort workspace"));
    CUDA_CHECK(ctx, cub::DeviceRadixSort::SortPairs(temp.get(), sort_bytes, hash.get(),
                                                     hash_sorted.get(), row.get(),
                                                     out.rows.get(), (int)n, 0, 64, stream));
    group_start_kernel<<<grid_for(n, 256), 256, 0, stream>>>(
        points.x, n, points.stride, points.dim, hash_sorted.get(), out.rows.get(), flag.get());
    CUDA_CHECK_LAUNCH(ctx, "group_start_kernel");
    CUDA_CHECK(ctx, cub::DeviceScan::InclusiveSum(temp.get(), scan_bytes, flag.get(),
                                                   group_index.get(), (int)n, stream));
    // group_begin needs n_distinct + 1 entries; n + 1 is enough.
    KNN_TRY(mem.allocate(ctx, out.group_begin, n + 1, "duplicate groups"));
    group_tables_kernel<<<grid_for(n, 256), 256, 0, stream>>>(
        n, flag.get(), group_index.get(), out.rows.get(), out.group_begin.get(),
        out.group_of_row.get(), n_groups.get());
    CUDA_CHECK_LAUNCH(ctx, "group_tables_kernel");
    int32_t groups = 0;
    CUDA_CHECK(ctx, cudaMemcpyAsync(&groups, n_groups.get(), sizeof groups,
                                    cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(stream));
    out.n_distinct = groups;
    // The temporaries go back before the representatives are allocated.
    mem.release(temp);
    mem.release(hash);
    mem.release(hash_sorted);
    mem.release(row);
    mem.release(flag);
    mem.release(group_index);
    mem.release(n_groups);
  }

  KNN_TRY(mem.allocate(ctx, out.x, (size_t)out.n_distinct * points.stride,
                       "distinct points"));
  int64_t work = out.n_distinct * (points.stride / 4);
  gather_representatives_kernel<<<grid_for(work, 256), 256, 0, stream>>>(
      points.x, points.stride, out.n_distinct, out.group_begin.get(), out.rows.get(),
      out.x.get());
  CUDA_CHECK_LAUNCH(ctx, "gather_representatives_kernel");
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
