// full_sort.cu -- the large-k path: when k is beyond what the streaming
// selection keeps in shared memory, every exact distance of a batch of
// queries is written out, keyed (key, row), and each query's segment is
// sorted with CUB's stable segmented sort. The input of each segment is in
// row order and the sort is stable, so equal keys stay ordered by row: the
// result order of knn_distance.h. Excluded pairs get kEmptyKey and sort
// last, after NaN (kNanKey).
#include <cub/device/device_segmented_sort.cuh>

#include <algorithm>
#include <cmath>

#include "brute_kernels.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "exact_pair.cuh"
#include "grid.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__global__ void make_keys_kernel(const float *__restrict__ values, int64_t rows, int64_t nt,
                                 int64_t query_base, TileValue value,
                                 const int64_t *__restrict__ query_keys,
                                 const int64_t *__restrict__ target_keys,
                                 uint64_t *__restrict__ keys, uint32_t *__restrict__ target_rows,
                                 int64_t *__restrict__ offsets) {
  const int64_t total = rows * nt;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += step) {
    const int64_t r = i / nt, t = i % nt;
    const int64_t q = query_base + r;
    const bool excluded = query_keys != nullptr && query_keys[q] == target_keys[t];
    keys[i] = excluded ? kEmptyKey : order_key(value(values[i], q, t));
    target_rows[i] = static_cast<uint32_t>(t);
  }
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r <= rows;
       r += step)
    offsets[r] = r * nt;
}

__global__ void take_best_kernel(FullSortArgs a, int64_t query_base, int64_t rows,
                                 const uint64_t *__restrict__ keys,
                                 const uint32_t *__restrict__ target_rows) {
  const int64_t total = rows * a.k;
  const int64_t nt = a.t.n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += step) {
    const int64_t r = i / a.k, j = i % a.k;
    const int64_t q = query_base + r;
    const int64_t o = (a.out_index != nullptr ? a.out_index[q] : q) * a.k + j;
    const uint64_t key = j < nt ? keys[r * nt + j] : kEmptyKey;
    if (key == kEmptyKey) {
      a.out.key[o] = kEmptyKey;
      a.out.row[o] = -1;
      a.out.dist[o] = NAN;
      continue;
    }
    const uint32_t t = target_rows[r * nt + j];
    const bool cosine = a.metric == KNN_METRIC_COSINE;
    double value, dist;
    exact_pair(a.metric, a.q.x + q * a.dim, a.t.x + static_cast<int64_t>(t) * a.dim, a.dim,
               cosine ? a.q.norm[q] : 0.0f, cosine ? a.t.norm[t] : 0.0f, &value, &dist);
    a.out.key[o] = key;
    a.out.row[o] = a.t.offset + t;
    a.out.dist[o] = dist;
  }
}

size_t cub_temp_bytes(int64_t rows, int64_t nt) {
  size_t bytes = 0;
  cub::DeviceSegmentedSort::StableSortPairs(nullptr, bytes, static_cast<const uint64_t *>(nullptr),
                                            static_cast<uint64_t *>(nullptr),
                                            static_cast<const uint32_t *>(nullptr),
                                            static_cast<uint32_t *>(nullptr), rows * nt, rows,
                                            static_cast<const int64_t *>(nullptr),
                                            static_cast<const int64_t *>(nullptr));
  return bytes;
}

}  // namespace

size_t full_sort_bytes(int64_t rows, int64_t nt) {
  // values (4) + keys in/out (16) + rows in/out (8) per pair, offsets, CUB.
  return static_cast<size_t>(rows) * nt * 28 + (rows + 1) * 8 + cub_temp_bytes(rows, nt) + 4096;
}

KnnStatus run_full_sort(DeviceContext &ctx, const FullSortArgs &a, int64_t *exact_pairs) {
  const int64_t nq = a.q.n, nt = a.t.n;
  if (nq <= 0) return KNN_OK;
  if (nt <= 0) return launch_clear_results(ctx, a.out, nq, a.k);
  // The largest batch that fits; tiles are limited to 2^31 - 1 rows.
  int64_t batch = std::min<int64_t>(nq, 1 << 20);
  while (batch > 1 && full_sort_bytes(batch, nt) > a.budget) batch = (batch + 1) / 2;
  if (full_sort_bytes(batch, nt) > a.budget) {
    char msg[200];
    std::snprintf(msg, sizeof msg,
                  "the large-k path needs %.1f MiB for one query against %lld targets",
                  full_sort_bytes(1, nt) / 1048576.0, static_cast<long long>(nt));
    ctx.error = msg;
    return KNN_OUT_OF_MEMORY;
  }

  DeviceBuffer<float> values;
  DeviceBuffer<uint64_t> keys_in, keys_out;
  DeviceBuffer<uint32_t> rows_in, rows_out;
  DeviceBuffer<int64_t> offsets;
  DeviceBuffer<unsigned char> temp;
  const size_t pairs = static_cast<size_t>(batch) * nt;
  size_t temp_bytes = cub_temp_bytes(batch, nt);
  KNN_TRY(values.allocate(ctx, pairs, "large-k distances"));
  KNN_TRY(keys_in.allocate(ctx, pairs, "large-k keys"));
  KNN_TRY(keys_out.allocate(ctx, pairs, "large-k keys"));
  KNN_TRY(rows_in.allocate(ctx, pairs, "large-k rows"));
  KNN_TRY(rows_out.allocate(ctx, pairs, "large-k rows"));
  KNN_TRY(offsets.allocate(ctx, batch + 1, "large-k offsets"));
  KNN_TRY(temp.allocate(ctx, std::max<size_t>(temp_bytes, 1), "large-k sort"));

  TileValue value;
  value.kind = exact_kind(a.metric);
  value.query_norm = a.q.norm;
  value.target_norm = a.t.norm;

  for (int64_t b0 = 0; b0 < nq; b0 += batch) {
    KNN_TRY(ctx.cancel_point());
    const int64_t rows = std::min(batch, nq - b0);
    KNN_TRY(launch_exact_tile(ctx, a.metric, a.q.x + b0 * a.dim, static_cast<int>(rows), a.t.x,
                              static_cast<int>(nt), a.dim, values.get(), nt));
    make_keys_kernel<<<grid_stride_blocks(rows * nt, kThreads), kThreads, 0, ctx.stream>>>(
        values.get(), rows, nt, b0, value, a.q.keys, a.t.keys, keys_in.get(), rows_in.get(),
        offsets.get());
    CUDA_CHECK_LAUNCH(ctx, "make_keys_kernel");
    size_t bytes = temp.bytes();
    CUDA_CHECK(ctx, cub::DeviceSegmentedSort::StableSortPairs(
                        temp.get(), bytes, keys_in.get(), keys_out.get(), rows_in.get(),
                        rows_out.get(), rows * nt, rows, offsets.get(), offsets.get() + 1,
                        ctx.stream));
    take_best_kernel<<<grid_stride_blocks(rows * a.k, kThreads), kThreads, 0, ctx.stream>>>(
        a, b0, rows, keys_out.get(), rows_out.get());
    CUDA_CHECK_LAUNCH(ctx, "take_best_kernel");
    if (exact_pairs != nullptr) *exact_pairs += rows * nt;
    // Keep the queue short so that cancel is noticed soon.
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  }
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
