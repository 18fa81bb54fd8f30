// ti_out_of_core.cu -- the TI join for sets whose clusters and kNN lists do
// not fit the join's memory budget (knn::cuda::ti::out_of_core_join).
//
// The rows are cut into query parts and target parts (row ranges) sized
// from the budget (ti_part_plan.cu). For each query part:
//   1. its points go up, are deduplicated and clustered (as in ti_join.cu),
//      and its k' lists are allocated;
//   2. the target parts come one after the other (ti_target_parts.cu: with
//      one query part each is clustered beside it; with several, all of
//      them are clustered first, kept in pinned host memory, and copied
//      back for each query part). For each: level 1 against that part
//      alone, then level 2 with every query's list and theta carried over
//      from the parts before (Level2Config::resume);
//   3. the lists become rows and float8 distances, as in ti_join.cu.
//
// Exactness: the level-1 bound of one target part is an upper bound of the
// k'-th distance within that part, hence of the k'-th over all targets; the
// carried list's k'-th is one too. Pruning with either keeps every target
// that can be among the final k' (ties included), and a list holds the k'
// smallest (value, row) of all it was offered, whatever the order. Target
// rows are global on the device (each part's rows are shifted by its first
// row), so ties across parts are broken by target row as in memory.
//
// Order: for a self-join the target part with the query part's own rows
// goes first, where each query's nearest neighbours most likely are, so
// theta is tight before the other parts are filtered.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "../exclusion_runs.h"
#include "../problem_check.h"
#include "../rounding_margin.h"
#include "../value_range.h"
#include "ti_common.cuh"
#include "ti_distance.cuh"
#include "ti_parts.cuh"
#include "../stopwatch.h"

namespace knn {
namespace cuda {
namespace ti {
namespace {

// One query part against every target part.
class OutOfCoreJoin {
 public:
  OutOfCoreJoin(const KnnProblem &p, const TiOptions &options, const PartPlan &plan,
                DeviceContext &ctx)
      : p_(p),
        options_(options),
        plan_(plan),
        ctx_(ctx),
        exclude_(p.query_keys != nullptr && p.target_keys != nullptr),
        stride_(padded_stride(p.dim)),
        fixed_mem_(plan.budget),
        targets_(p, options, plan, ctx) {
    const RoundingMargin rounding(p.metric, stride_);
    margin_.rel = (float)rounding.relative();
    margin_.abs = (float)rounding(0.0);
  }

  // *finite: false when some distance could overflow (nothing written).
  KnnStatus run(int64_t *neighbors, double *distances, KnnStats *stats, bool *finite);

 private:
  KnnStatus upload_target_keys();
  KnnStatus query_part(int64_t first, int64_t count, bool *finite, int64_t *neighbors,
                       double *distances);
  KnnStatus filter_part(const ClusterSet &queries, const DistinctSet &query_set,
                        const TargetPart &part, bool resume, MemoryBudget &mem);
  KnnStatus output_part(const DistinctSet &query_set, int64_t first, const int64_t *query_keys,
                        MemoryBudget &mem, int64_t *neighbors, double *distances);
  void describe(KnnStats *stats) const;

  const KnnProblem &p_;
  const TiOptions &options_;
  const PartPlan &plan_;
  DeviceContext &ctx_;
  const bool exclude_;
  const int stride_;
  Margin margin_;
  MemoryBudget fixed_mem_;  // what stays for the whole join (keys, counter)
  TargetParts targets_;

  DeviceBuffer<int64_t> target_keys_;  // all target keys (rows are global)
  DeviceBuffer<int64_t> query_keys_;   // the current query part's keys
  DeviceBuffer<unsigned long long> counter_;
  DeviceBuffer<float> result_value_;
  DeviceBuffer<int32_t> result_row_;

  Level2Config used_;
  int64_t query_clusters_ = 0;
  Clock::time_point t_start_ = Clock::now();
  double cluster_seconds_ = 0, filter_seconds_ = 0, output_seconds_ = 0;
  unsigned long long computed_ = 0;
};

KnnStatus OutOfCoreJoin::upload_target_keys() {
  if (!exclude_) return KNN_OK;
  KNN_TRY(fixed_mem_.allocate(ctx_, target_keys_, p_.n_targets, "keys"));
  CUDA_CHECK(ctx_, cudaMemcpyAsync(target_keys_.get(), p_.target_keys,
                                   p_.n_targets * sizeof(int64_t), cudaMemcpyHostToDevice,
                                   ctx_.stream));
  return KNN_OK;
}

// Level 1 and level 2 of the query part against one target part.
KnnStatus OutOfCoreJoin::filter_part(const ClusterSet &queries, const DistinctSet &query_set,
                                     const TargetPart &part, bool resume, MemoryBudget &mem) {
  Level1Result level1;
  KNN_TRY(level1_filter(queries, part.clusters, p_.metric, plan_.kprime, margin_, level1, mem,
                        ctx_));
  KNN_TRY(ctx_.cancel_point());
  Level2Config config;
  config.kprime = plan_.kprime;
  config.partial = false;  // the partial filter cannot carry lists over
  config.resume = resume;
  config.place = choose_list_place(ctx_, plan_.kprime, options_.list);
  // One thread per query: a list carried from part to part then belongs to
  // exactly one thread. Several threads per query (the in-memory join's
  // inside-query parallelism) would each carry a partial list, merged only
  // at the end, a path not yet proven on a GPU against the CPU engine.
  config.parts = 1;
  KNN_TRY(level2_filter(queries, part.clusters, part.set, level1, p_.metric, config, margin_,
                        result_value_.get(), result_row_.get(), counter_.get(), &used_, mem,
                        ctx_));
  mem.release(level1.candidates);
  mem.release(level1.cand_count);
  mem.release(level1.upper_bound);
  return KNN_OK;
}

// Rows, exclusion and float8 of the query part, written at row `first`.
KnnStatus OutOfCoreJoin::output_part(const DistinctSet &query_set, int64_t first,
                                     const int64_t *query_keys, MemoryBudget &mem,
                                     int64_t *neighbors, double *distances) {
  const int64_t n = query_set.n_rows;
  const int k = p_.k;
  const size_t slot_bytes = sizeof(int64_t) + sizeof(double);
  const size_t room = mem.budget() > mem.used() ? mem.budget() - mem.used() : 0;
  int64_t chunk = std::min<int64_t>(n, (int64_t)(room / 2 / (slot_bytes * k)));
  if (chunk < 1) chunk = std::min<int64_t>(n, 1024);  // let the allocation report it
  DeviceBuffer<int64_t> rows;
  DeviceBuffer<double> dist;
  KNN_TRY(mem.allocate(ctx_, rows, (size_t)chunk * k, "results"));
  KNN_TRY(mem.allocate(ctx_, dist, (size_t)chunk * k, "results"));
  for (int64_t c = 0; c < n; c += chunk) {
    KNN_TRY(ctx_.cancel_point());
    const int64_t count = std::min(chunk, n - c);
    KNN_TRY(expand_results(query_set, p_.metric, c, count, k, plan_.kprime, result_value_.get(),
                           result_row_.get(), query_keys, exclude_ ? target_keys_.get() : nullptr,
                           rows.get(), dist.get(), ctx_));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(neighbors + (first + c) * k, rows.get(),
                                     (size_t)count * k * sizeof(int64_t),
                                     cudaMemcpyDeviceToHost, ctx_.stream));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(distances + (first + c) * k, dist.get(),
                                     (size_t)count * k * sizeof(double), cudaMemcpyDeviceToHost,
                                     ctx_.stream));
    // The buffers are reused by the next chunk's kernel, which the stream
    // orders after these copies; the host waits once, at the end.
  }
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  mem.release(rows);
  mem.release(dist);
  return KNN_OK;
}

// Query rows [first, first + count) against all target parts.
KnnStatus OutOfCoreJoin::query_part(int64_t first, int64_t count, bool *finite,
                                    int64_t *neighbors, double *distances) {
  // The query part's own accounting: what it leaves behind goes with it.
  MemoryBudget mem(plan_.budget - std::min(plan_.budget, fixed_mem_.used()));
  Clock::time_point t0 = Clock::now();
  DeviceBuffer<unsigned> max_abs;
  KNN_TRY(mem.allocate(ctx_, max_abs, 1, "value range"));
  CUDA_CHECK(ctx_, cudaMemsetAsync(max_abs.get(), 0, sizeof(unsigned), ctx_.stream));
  UploadedSet upload;
  KNN_TRY(upload_points(float_rows(p_.queries) + first * p_.dim, count, p_.dim, stride_, upload,
                        max_abs.get(), mem, ctx_));
  float query_max_abs;
  KNN_TRY(read_max_abs(max_abs.get(), &query_max_abs, ctx_));
  if (!distances_stay_finite(p_.metric, p_.dim, query_max_abs)) {
    *finite = false;
    return KNN_OK;
  }
  mem.release(max_abs);

  DistinctSet query_set;
  ClusterSet queries;
  KNN_TRY(build_distinct_set(upload.points, options_.dedup, query_set, mem, ctx_));
  KNN_TRY(ctx_.cancel_point());
  const int32_t mq = plan_.query_clusters_for(query_set.n_distinct);
  KNN_TRY(build_clusters(query_set, p_.metric, mq, options_.landmark_candidate_sets,
                         options_.gemm_assign_min_stride, queries, mem, ctx_));
  mem.release(upload.padded);
  mem.release(query_set.x);
  query_clusters_ += queries.m;

  const int64_t *query_keys = nullptr;
  if (exclude_) {
    if (p_.query_keys == p_.target_keys && p_.queries == p_.targets) {
      query_keys = target_keys_.get() + first;  // the same rows' keys
    } else {
      KNN_TRY(mem.allocate(ctx_, query_keys_, count, "keys"));
      CUDA_CHECK(ctx_, cudaMemcpyAsync(query_keys_.get(), p_.query_keys + first,
                                       count * sizeof(int64_t), cudaMemcpyHostToDevice,
                                       ctx_.stream));
      query_keys = query_keys_.get();
    }
  }
  const size_t slots = (size_t)query_set.n_distinct * plan_.kprime;
  KNN_TRY(mem.allocate(ctx_, result_value_, slots, "results"));
  KNN_TRY(mem.allocate(ctx_, result_row_, slots, "results"));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  cluster_seconds_ += seconds_since(t0);
  KNN_TRY(ctx_.cancel_point());

  t0 = Clock::now();
  const int query_index = (int)(first / plan_.query_rows);
  // The host queues part i while the device works on part i - 1, and waits
  // for that one before going on: no gap between parts, and a cancel is
  // seen within about two parts' work.
  Event done[2];
  KNN_TRY(done[0].create(ctx_));
  KNN_TRY(done[1].create(ctx_));
  for (int i = 0; i < plan_.target_parts(); i++) {
    KNN_TRY(ctx_.cancel_point());
    const int index = plan_.target_order(query_index, i);
    {
      // Each target part's memory is its own, released (in stream order)
      // before the next part's is allocated.
      MemoryBudget part_mem(mem.budget() - std::min(mem.budget(), mem.used()));
      TargetPart part;
      KNN_TRY(targets_.get(index, query_max_abs, part, finite, part_mem));
      if (!*finite) return KNN_OK;
      KNN_TRY(filter_part(queries, query_set, part, /*resume=*/i > 0, part_mem));
    }
    CUDA_CHECK(ctx_, cudaEventRecord(done[i % 2].get(), ctx_.stream));
    if (i > 0) CUDA_CHECK(ctx_, cudaEventSynchronize(done[(i - 1) % 2].get()));
  }
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  filter_seconds_ += seconds_since(t0);
  KNN_TRY(ctx_.cancel_point());

  t0 = Clock::now();
  KNN_TRY(output_part(query_set, first, query_keys, mem, neighbors, distances));
  output_seconds_ += seconds_since(t0);
  mem.release(result_value_);
  mem.release(result_row_);
  mem.release(query_keys_);
  return KNN_OK;
}

void OutOfCoreJoin::describe(KnnStats *stats) const {
  stats->method = KNN_METHOD_TI;
  stats->pairs = p_.n_queries * p_.n_targets;
  // "ti/out-of-core QxT parts of RqxRt/<list place>[/xP][/cached]": query
  // parts x target parts, rows per query part x rows per target part, P
  // threads per query (of the last level-2 launch).
  char parts[16] = "";
  if (used_.parts > 1) std::snprintf(parts, sizeof parts, "/x%d", used_.parts);
  std::snprintf(stats->variant, sizeof stats->variant,
                "ti/out-of-core %dx%d parts of %lldx%lld/%s%s%s", plan_.query_parts(),
                plan_.target_parts(), (long long)plan_.query_rows, (long long)plan_.target_rows,
                place_name(used_.place), parts, targets_.cached() ? "/cached" : "");
  stats->query_clusters = query_clusters_;
  stats->target_clusters = targets_.clusters();
  stats->distance_computations = (int64_t)computed_;
  stats->threads_per_query = used_.parts;
  stats->seconds_transfer = 0;  // uploads overlap the stages; counted in them
  stats->seconds_cluster = cluster_seconds_ + targets_.cluster_seconds();
  stats->seconds_filter = filter_seconds_;
  stats->seconds_select = output_seconds_;
  stats->seconds_total = seconds_since(t_start_);
}

KnnStatus OutOfCoreJoin::run(int64_t *neighbors, double *distances, KnnStats *stats,
                             bool *finite) {
  *finite = true;
  KNN_TRY(upload_target_keys());
  KNN_TRY(fixed_mem_.allocate(ctx_, counter_, 1, "distance counter"));
  CUDA_CHECK(ctx_, cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), ctx_.stream));
  if (plan_.cache_targets) {
    // Every target part built and cached first, each with the whole budget
    // (ti_part_plan.cu). Their own values are checked here; the queries'
    // are checked against each part as it is copied back.
    for (int i = 0; i < plan_.target_parts(); i++) {
      KNN_TRY(ctx_.cancel_point());
      MemoryBudget mem(plan_.budget - std::min(plan_.budget, fixed_mem_.used()));
      TargetPart part;
      KNN_TRY(targets_.get(i, 0.0f, part, finite, mem));
      if (!*finite) return KNN_OK;
    }
  }
  for (int64_t first = 0; first < p_.n_queries; first += plan_.query_rows) {
    KNN_TRY(ctx_.cancel_point());
    const int64_t count = std::min(plan_.query_rows, p_.n_queries - first);
    KNN_TRY(query_part(first, count, finite, neighbors, distances));
    if (!*finite) return KNN_OK;
  }
  CUDA_CHECK(ctx_, cudaMemcpyAsync(&computed_, counter_.get(), sizeof computed_,
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  if (stats != nullptr) describe(stats);
  return KNN_OK;
}

}  // namespace

KnnStatus out_of_core_join(const KnnProblem &problem, const TiOptions &options,
                           int64_t *neighbors, double *distances, KnnStats *stats, bool *finite,
                           DeviceContext &ctx) {
  size_t budget = ctx.memory_budget;
  if (budget == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(ctx, cudaMemGetInfo(&free_bytes, &total_bytes));
    budget = free_bytes;
  }
  PartPlan plan(problem, options, budget);
  // The plan's sizes are estimates: where a part still does not fit, the
  // join starts again with parts half as large, down to a floor.
  for (;;) {
    KnnStatus status;
    {
      OutOfCoreJoin join(problem, options, plan, ctx);
      status = join.run(neighbors, distances, stats, finite);
    }
    if (status != KNN_OUT_OF_MEMORY || ctx.cancelled() || !plan.halve()) return status;
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));  // the failed try's frees
    ctx.error.clear();
  }
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
