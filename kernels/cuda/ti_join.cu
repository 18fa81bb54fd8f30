// ti_join.cu -- Sweet KNN on the GPU: the clustered triangle-inequality
// join, from host arrays to host results (knn::cuda::ti_join).
//
// Stages (each in its own file):
//   upload + padding        here
//   duplicate groups        ti_dedup.cu
//   clusters                ti_clustering.cu     (section III-A)
//   level-1 filter          ti_filter_level1.cu  (III-B)
//   level-2 filter          ti_filter_level2.cu  (III-C, IV)
//   rows, exclusion, float8 ti_output.cu
//
// The adaptive scheme of IV-D is decided here: the partial filter when
// k / dim exceeds a ratio (TiOptions says why it is off by default), the
// place of the top-k lists from the device's shared memory and register
// limits, and the threads per query from the number of distinct queries and
// the concurrency of the level-2 kernel.
//
// Exactness: every distance is computed by knn_distance.h (device build
// with --fmad=false), pruning keeps ties (ti_filter_level2.cu), and the
// results are ordered by (value, row) = knn_result_before. Inputs with
// non-finite values, or so large that a distance could overflow (the
// bounds need finite distances), go to brute_force_join instead.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "../cpu/rounding_margin.h"
#include "ti_common.cuh"
#include "ti_distance.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Copies rows of `dim` floats into rows of `stride` floats (zero padding)
// and records the largest |value| (as float bits: non-negative floats order
// like their bits, NaN above +inf).
__global__ void pad_rows_kernel(const float *raw, int64_t n, int dim, int stride, float *out,
                                unsigned *max_abs_bits) {
  unsigned local = 0;
  const int64_t total = n * stride;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / stride;
    int c = (int)(i % stride);
    float v = c < dim ? raw[r * dim + c] : 0.0f;
    if (raw != out) out[i] = v;
    local = max(local, __float_as_uint(fabsf(v)));
  }
  for (int off = kWarp / 2; off > 0; off /= 2)
    local = max(local, __shfl_down_sync(kFullMask, local, off));
  if (threadIdx.x % kWarp == 0) atomicMax(max_abs_bits, local);
}

// One point set on the device, padded.
struct UploadedSet {
  DeviceBuffer<float> padded;
  DevicePoints points;
};

KnnStatus upload_points(const float *host, int64_t n, int dim, int stride, UploadedSet &out,
                        unsigned *max_abs_bits, MemoryBudget &mem, DeviceContext &ctx) {
  KNN_TRY(mem.allocate(ctx, out.padded, (size_t)n * stride, "points"));
  if (dim == stride) {
    CUDA_CHECK(ctx, cudaMemcpyAsync(out.padded.get(), host, (size_t)n * dim * sizeof(float),
                                    cudaMemcpyHostToDevice, ctx.stream));
    pad_rows_kernel<<<grid_for(n * stride, 256 * 8), 256, 0, ctx.stream>>>(
        out.padded.get(), n, dim, stride, out.padded.get(), max_abs_bits);
  } else {
    DeviceBuffer<float> raw;
    KNN_TRY(mem.allocate(ctx, raw, (size_t)n * dim, "points"));
    CUDA_CHECK(ctx, cudaMemcpyAsync(raw.get(), host, (size_t)n * dim * sizeof(float),
                                    cudaMemcpyHostToDevice, ctx.stream));
    pad_rows_kernel<<<grid_for(n * stride, 256 * 8), 256, 0, ctx.stream>>>(
        raw.get(), n, dim, stride, out.padded.get(), max_abs_bits);
    CUDA_CHECK_LAUNCH(ctx, "pad_rows_kernel");
    mem.release(raw);
  }
  CUDA_CHECK_LAUNCH(ctx, "pad_rows_kernel");
  out.points.x = out.padded.get();
  out.points.n = n;
  out.points.dim = dim;
  out.points.stride = stride;
  return KNN_OK;
}

// The largest number of targets that share one key: a query loses at most
// that many targets to self-match exclusion.
int64_t max_rows_per_key(const int64_t *keys, int64_t n) {
  bool increasing = true;
  for (int64_t i = 1; i < n && increasing; i++) increasing = keys[i] > keys[i - 1];
  if (increasing) return n > 0 ? 1 : 0;
  std::vector<int64_t> sorted(keys, keys + n);
  std::sort(sorted.begin(), sorted.end());
  int64_t longest = 1, run = 1;
  for (int64_t i = 1; i < n; i++) {
    run = sorted[i] == sorted[i - 1] ? run + 1 : 1;
    longest = std::max(longest, run);
  }
  return longest;
}

// Values this large could make a computed distance overflow to +inf.
bool values_fit(KnnMetric metric, int dim, unsigned max_abs_bits) {
  if (max_abs_bits >= 0x7f800000u) return false;  // inf or NaN
  float m;
  std::memcpy(&m, &max_abs_bits, sizeof m);
  double span = 2.0 * (double)m;  // |a - b|
  double worst = metric == KNN_METRIC_L2 ? (double)dim * span * span : (double)dim * span;
  return worst < 3.4e38 / 64.0;
}

void fill_empty(int64_t n, int k, int64_t *neighbors, double *distances) {
  for (int64_t i = 0; i < n * k; i++) {
    neighbors[i] = -1;
    distances[i] = std::nan("");
  }
}

int32_t landmarks_for(double factor, int64_t n) {
  double m = std::floor(factor * std::sqrt((double)n) + 0.5);
  return (int32_t)std::max<double>(1.0, std::min<double>(m, (double)n));
}

ListPlace choose_list_place(const DeviceContext &ctx, int kprime, ListKind forced) {
  auto registers = [&]() {
    return kprime <= 16 ? ListPlace::Registers16 : ListPlace::Registers32;
  };
  switch (forced) {
    case ListKind::Registers:
      return kprime <= 32 ? registers() : ListPlace::Global;
    case ListKind::Shared: return ListPlace::Shared;
    case ListKind::Global: return ListPlace::Global;
    default: break;
  }
  // IV-D2: th1 = shared memory per SM / max threads per SM,
  //        th2 = registers a thread may hold (255) * 4 bytes.
  const size_t entry = sizeof(float) + sizeof(int32_t);
  const size_t bytes = (size_t)kprime * entry;
  const size_t th1 = ctx.prop.sharedMemPerMultiprocessor /
                     std::max(1, ctx.prop.maxThreadsPerMultiProcessor);
  const size_t th2 = 255 * 4;
  if (bytes <= th1) return ListPlace::Shared;
  // Register lists are instantiated up to 32 entries (compile-time size).
  if (bytes < th2 && kprime <= 32) return registers();
  return ListPlace::Global;
}

const char *place_name(ListPlace p) {
  switch (p) {
    case ListPlace::Registers16:
    case ListPlace::Registers32: return "registers";
    case ListPlace::Shared: return "shared";
    default: return "global";
  }
}

KnnStatus run_join(const KnnProblem &problem, int64_t *neighbors, double *distances,
                   KnnStats *stats, DeviceContext &ctx, const TiOptions &options) {
  const Clock::time_point t_start = Clock::now();
  const int64_t nq = problem.n_queries, nt = problem.n_targets;
  const int dim = problem.dim, k = problem.k;
  const KnnMetric metric = problem.metric;
  if (metric != KNN_METRIC_L2 && metric != KNN_METRIC_L1) {
    ctx.error = "the TI join supports only the L2 and L1 metrics";
    return KNN_INVALID_ARGUMENT;
  }
  if (k < 1 || dim < 1 || nq < 0 || nt < 0) {
    ctx.error = "invalid problem (k, dim or sizes)";
    return KNN_INVALID_ARGUMENT;
  }
  if (stats != nullptr) {
    std::snprintf(stats->method, sizeof stats->method, "ti");
    stats->pairs = nq * nt;
  }
  if (nq == 0) return KNN_OK;
  if (nt == 0) {
    fill_empty(nq, k, neighbors, distances);
    return KNN_OK;
  }
  // Rows are int32 on the device (kNoRow = INT32_MAX marks an empty slot).
  if (nq >= INT32_MAX - 1 || nt >= INT32_MAX - 1)
    return brute_force_join(problem, neighbors, distances, stats, ctx);

  const bool self = problem.queries == problem.targets && nq == nt;
  const bool exclude = problem.query_keys != nullptr && problem.target_keys != nullptr;
  const int stride = padded_stride(dim);
  size_t budget = ctx.memory_budget;
  if (budget == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(ctx, cudaMemGetInfo(&free_bytes, &total_bytes));
    budget = free_bytes;
  }
  MemoryBudget mem(budget);
  cudaStream_t stream = ctx.stream;

  // ---- upload ----
  DeviceBuffer<unsigned> max_abs;
  KNN_TRY(mem.allocate(ctx, max_abs, 1, "value range"));
  CUDA_CHECK(ctx, cudaMemsetAsync(max_abs.get(), 0, sizeof(unsigned), stream));
  UploadedSet query_upload, target_upload;
  KNN_TRY(upload_points(problem.queries, nq, dim, stride, query_upload, max_abs.get(), mem, ctx));
  if (!self)
    KNN_TRY(upload_points(problem.targets, nt, dim, stride, target_upload, max_abs.get(), mem,
                          ctx));
  DeviceBuffer<int64_t> query_keys, target_keys;
  int64_t excluded = 0;
  if (exclude) {
    excluded = max_rows_per_key(problem.target_keys, nt);
    KNN_TRY(mem.allocate(ctx, query_keys, nq, "keys"));
    CUDA_CHECK(ctx, cudaMemcpyAsync(query_keys.get(), problem.query_keys, nq * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, stream));
    if (!(self && problem.query_keys == problem.target_keys)) {
      KNN_TRY(mem.allocate(ctx, target_keys, nt, "keys"));
      CUDA_CHECK(ctx, cudaMemcpyAsync(target_keys.get(), problem.target_keys,
                                      nt * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
    }
  }
  unsigned max_abs_bits = 0;
  CUDA_CHECK(ctx, cudaMemcpyAsync(&max_abs_bits, max_abs.get(), sizeof max_abs_bits,
                                  cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(stream));
  const Clock::time_point t_uploaded = Clock::now();
  if (!values_fit(metric, dim, max_abs_bits)) {
    // The bounds need finite distances; brute force handles everything.
    query_upload.padded.release();
    target_upload.padded.release();
    return brute_force_join(problem, neighbors, distances, stats, ctx);
  }
  if (ctx.cancelled()) return KNN_CANCELLED;
  const DevicePoints &query_points = query_upload.points;
  const DevicePoints &target_points = self ? query_upload.points : target_upload.points;

  // ---- duplicate groups and clusters ----
  DistinctSet query_set, target_set_own;
  KNN_TRY(build_distinct_set(query_points, options.dedup, query_set, mem, ctx));
  if (!self) KNN_TRY(build_distinct_set(target_points, options.dedup, target_set_own, mem, ctx));
  const DistinctSet &target_set = self ? query_set : target_set_own;
  if (ctx.cancelled()) return KNN_CANCELLED;

  int32_t mq = landmarks_for(options.landmark_factor, query_set.n_distinct);
  int32_t mt = landmarks_for(options.landmark_factor, target_set.n_distinct);
  // Cap by the budget: the cluster-pair matrices take about 32 bytes a pair.
  const double pair_bytes = 32.0;
  if (pair_bytes * mq * mt > budget / 4.0) {
    double scale = std::sqrt(budget / 4.0 / (pair_bytes * mq * mt));
    mq = std::max<int32_t>(1, (int32_t)(mq * scale));
    mt = std::max<int32_t>(1, (int32_t)(mt * scale));
  }
  if (self) mq = mt;
  ClusterSet query_clusters, target_clusters_own;
  KNN_TRY(build_clusters(query_set, metric, mq, options.landmark_candidate_sets,
                         options.gemm_assign_min_stride, query_clusters, mem, ctx));
  if (!self)
    KNN_TRY(build_clusters(target_set, metric, mt, options.landmark_candidate_sets,
                           options.gemm_assign_min_stride, target_clusters_own, mem, ctx));
  const ClusterSet &target_clusters = self ? query_clusters : target_clusters_own;
  // The rows and distinct points are no longer needed: the clusters hold
  // their own copies in position order.
  mem.release(query_upload.padded);
  mem.release(target_upload.padded);
  mem.release(query_set.x);
  mem.release(target_set_own.x);
  CUDA_CHECK(ctx, cudaStreamSynchronize(stream));
  const Clock::time_point t_clustered = Clock::now();
  if (ctx.cancelled()) return KNN_CANCELLED;

  // ---- filters ----
  const int kprime = (int)std::min<int64_t>(INT32_MAX / 4, (int64_t)k + excluded);
  const cpu::RoundingMargin rounding(metric, stride);
  Margin margin;
  margin.rel = (float)rounding.relative();
  margin.abs = (float)(rounding(0.0));
  Level1Result level1;
  KNN_TRY(level1_filter(query_clusters, target_clusters, metric, kprime, margin, level1, mem,
                        ctx));
  if (ctx.cancelled()) return KNN_CANCELLED;

  Level2Config config;
  config.kprime = kprime;
  config.partial = options.filter == FilterKind::Partial ||
                   (options.filter == FilterKind::Adaptive &&
                    (double)k / dim > options.partial_filter_ratio);
  config.place = choose_list_place(ctx, kprime, options.list);
  config.parts = options.threads_per_query > 0
                     ? options.threads_per_query
                     : level2_threads_per_query(ctx, metric, stride, config.place, kprime,
                                                query_set.n_distinct,
                                                options.cache_conflict_factor);
  DeviceBuffer<float> result_value;
  DeviceBuffer<int32_t> result_row;
  DeviceBuffer<unsigned long long> counter;
  KNN_TRY(mem.allocate(ctx, result_value, (size_t)query_set.n_distinct * kprime, "results"));
  KNN_TRY(mem.allocate(ctx, result_row, (size_t)query_set.n_distinct * kprime, "results"));
  KNN_TRY(mem.allocate(ctx, counter, 1, "distance counter"));
  CUDA_CHECK(ctx, cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), stream));
  Level2Config used = config;
  KNN_TRY(level2_filter(query_clusters, target_clusters, target_set, level1, metric, config,
                        margin, result_value.get(), result_row.get(), counter.get(), &used, mem,
                        ctx));
  CUDA_CHECK(ctx, cudaStreamSynchronize(stream));
  const Clock::time_point t_filtered = Clock::now();
  if (ctx.cancelled()) return KNN_CANCELLED;
  mem.release(level1.candidates);
  mem.release(level1.cand_count);
  mem.release(level1.upper_bound);

  // ---- rows, exclusion, float8 ----
  // Level-2 scratch is gone; the output (16 bytes a slot) is written and
  // copied in chunks of rows that fit what is left of the budget.
  const int64_t *target_key_ptr = nullptr;
  if (exclude) target_key_ptr = target_keys.get() != nullptr ? target_keys.get() : query_keys.get();
  const size_t slot_bytes = sizeof(int64_t) + sizeof(double);
  const size_t room = budget > mem.used() ? budget - mem.used() : 0;
  int64_t chunk = std::min<int64_t>(nq, (int64_t)(room / 2 / (slot_bytes * k)));
  if (chunk < 1) chunk = std::min<int64_t>(nq, 1024);  // let the allocation report it
  DeviceBuffer<int64_t> out_rows;
  DeviceBuffer<double> out_distances;
  KNN_TRY(mem.allocate(ctx, out_rows, (size_t)chunk * k, "results"));
  KNN_TRY(mem.allocate(ctx, out_distances, (size_t)chunk * k, "results"));
  unsigned long long computed = 0;
  CUDA_CHECK(ctx, cudaMemcpyAsync(&computed, counter.get(), sizeof computed,
                                  cudaMemcpyDeviceToHost, stream));
  double select_seconds = 0, download_seconds = 0;
  for (int64_t first = 0; first < nq; first += chunk) {
    if (ctx.cancelled()) return KNN_CANCELLED;
    const int64_t count = std::min(chunk, nq - first);
    const Clock::time_point t0 = Clock::now();
    KNN_TRY(expand_results(query_set, metric, first, count, k, kprime, result_value.get(),
                           result_row.get(), exclude ? query_keys.get() : nullptr,
                           target_key_ptr, out_rows.get(), out_distances.get(), ctx));
    CUDA_CHECK(ctx, cudaStreamSynchronize(stream));
    const Clock::time_point t1 = Clock::now();
    CUDA_CHECK(ctx, cudaMemcpyAsync(neighbors + first * k, out_rows.get(),
                                    (size_t)count * k * sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(ctx, cudaMemcpyAsync(distances + first * k, out_distances.get(),
                                    (size_t)count * k * sizeof(double), cudaMemcpyDeviceToHost,
                                    stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(stream));
    select_seconds += seconds_between(t0, t1);
    download_seconds += seconds_between(t1, Clock::now());
  }
  const Clock::time_point t_done = Clock::now();

  if (stats != nullptr) {
    char parts[32] = "";
    if (used.parts > 1) std::snprintf(parts, sizeof parts, "/inside-query x%d", used.parts);
    std::snprintf(stats->variant, sizeof stats->variant, "%s/%s/remap%s%s",
                  used.partial ? "partial" : "full",
                  used.partial ? "global" : place_name(used.place), parts,
                  options.dedup ? "/dedup" : "");
    stats->query_clusters = query_clusters.m;
    stats->target_clusters = target_clusters.m;
    stats->distance_computations = (int64_t)computed;
    stats->threads_per_query = used.parts;
    stats->seconds_transfer = seconds_between(t_start, t_uploaded) + download_seconds;
    stats->seconds_cluster = seconds_between(t_uploaded, t_clustered);
    stats->seconds_filter = seconds_between(t_clustered, t_filtered);
    stats->seconds_select = select_seconds;
    stats->seconds_total = seconds_between(t_start, t_done);
  }
  return KNN_OK;
}

}  // namespace

KnnStatus ti_join_with_options(const KnnProblem &problem, int64_t *neighbors, double *distances,
                               KnnStats *stats, DeviceContext &ctx, const TiOptions &options) {
  KnnStatus status = run_join(problem, neighbors, distances, stats, ctx, options);
  // Every buffer of the join has been handed to cudaFreeAsync by now; wait
  // for the frees and return the pool's memory to the device.
  cudaError_t err = cudaStreamSynchronize(ctx.stream);
  cudaMemPool_t pool;
  if (cudaDeviceGetMemPool(&pool, ctx.device) == cudaSuccess) (void)cudaMemPoolTrimTo(pool, 0);
  (void)cudaGetLastError();
  if (status == KNN_OK && err != cudaSuccess)
    return cuda_failure(ctx, err, "cudaStreamSynchronize", __FILE__, __LINE__);
  return status;
}

}  // namespace ti

KnnStatus ti_join(const KnnProblem &problem, int64_t *neighbors, double *distances,
                  KnnStats *stats, DeviceContext &ctx) {
  return ti::ti_join_with_options(problem, neighbors, distances, stats, ctx, ti::TiOptions());
}

}  // namespace cuda
}  // namespace knn
