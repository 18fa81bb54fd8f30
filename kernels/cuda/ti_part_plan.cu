// ti_part_plan.cu -- how the out-of-core TI join cuts its rows into query
// and target parts (PartPlan of ti_parts.cuh).
//
// Bytes, from the arrays of ti_common.cuh (stride floats a row):
//  * a side being deduplicated and clustered (the peak of one part): per
//    row the padded rows, the distinct rows and the rows in cluster order,
//    plus the hash, sort and cluster arrays;
//  * a query part while target parts are filtered: its rows in cluster
//    order, its cluster and group arrays and its k' lists; where the lists
//    of level 2 are in global memory (k' > 32), one per thread slot of its
//    warp groups, which are up to 32 slots more per cluster than rows; and
//    level 1's bound lists, k' + 1 per query cluster.
// With one query part, half the budget goes to it and most of the rest to
// one target part being built beside it. With several, the target parts
// are built (and cached) first, and the query parts get most of the budget
// less one cached part; the remainder is level 1 and level 2's scratch.
#include <algorithm>
#include <cmath>

#include "../exclusion_runs.h"
#include "ti_distance.cuh"
#include "ti_parts.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

// Parts never get smaller than this (rows): below it the pair count of
// parts explodes and a budget that small is better told it is too small.
constexpr int64_t kMinQueryRows = 64;
constexpr int64_t kMinTargetRows = 16;

size_t build_bytes_per_row(int stride) { return 3 * (size_t)stride * sizeof(float) + 112; }

int64_t rows_within(double bytes, size_t per_row, int64_t n, int64_t floor_rows) {
  const double rows = std::floor(bytes / (double)per_row);
  return std::max<int64_t>(std::min<int64_t>(floor_rows, n),
                           (int64_t)std::min<double>((double)n, rows));
}

}  // namespace

size_t in_memory_join_bytes(const KnnProblem &p, int kprime) {
  const bool self = p.queries == p.targets && p.n_queries == p.n_targets;
  const int64_t rows = p.n_queries + (self ? 0 : p.n_targets);
  const size_t stride_bytes = (size_t)padded_stride(p.dim) * sizeof(float);
  const bool exclude = p.query_keys != nullptr && p.target_keys != nullptr;
  return (size_t)rows * (3 * stride_bytes + 64 + (exclude ? sizeof(int64_t) : 0)) +
         (size_t)p.n_queries * kprime * (sizeof(float) + sizeof(int32_t));
}

PartPlan::PartPlan(const KnnProblem &p, const TiOptions &options, size_t budget_bytes)
    : budget(budget_bytes),
      n_queries_(p.n_queries),
      n_targets_(p.n_targets),
      self_(p.queries == p.targets && p.n_queries == p.n_targets),
      landmark_factor_(options.landmark_factor) {
  const bool exclude = p.query_keys != nullptr && p.target_keys != nullptr;
  const int64_t excluded = exclude ? max_rows_per_key(p.target_keys, p.n_targets) : 0;
  kprime = (int)std::min<int64_t>(INT32_MAX / 4, (int64_t)p.k + excluded);
  const int stride = padded_stride(p.dim);
  // What stays for the whole join: every target key (rows are global).
  const size_t fixed = (exclude ? (size_t)p.n_targets * sizeof(int64_t) : 0) + 4096;
  const double avail = budget > fixed ? (double)(budget - fixed) : 0.0;
  const size_t build_row = build_bytes_per_row(stride);
  global_lists_ = kprime > 32;
  auto query_bytes = [&](int64_t n) {
    const double entry = sizeof(float) + sizeof(int32_t);
    const double clusters = query_clusters_for(n);
    const bool global_lists = global_lists_;
    const double slots = global_lists ? n + kWarp * (clusters + 1) : 0.0;
    return n * ((double)stride * sizeof(float) + 32 + kprime * entry) + slots * kprime * entry +
           clusters * (kprime + 1) * entry;
  };
  // The most query rows whose resident bytes fit `bytes`.
  auto query_rows_within = [&](double bytes) {
    int64_t lo = std::min(kMinQueryRows, n_queries_), hi = n_queries_;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (query_bytes(mid) <= bytes) lo = mid;
      else hi = mid - 1;
    }
    return std::min(lo, rows_within(avail * 0.9, build_row, n_queries_, kMinQueryRows));
  };
  // One query part: each target part is built beside it, once.
  query_rows = query_rows_within(avail * 0.5);
  const double rest = std::max(0.0, avail - query_bytes(query_rows));
  target_rows = rows_within(rest * 0.6, build_row, n_targets_, kMinTargetRows);
  if (query_parts() > 1) {
    // Several query parts: the target parts are built first, each with the
    // device to itself (the build peak holds three copies of the rows), and
    // kept in pinned host memory; each query part then shares the device
    // with one part copied back, which holds one copy of its distinct rows
    // and a few arrays. Far fewer and larger parts on both sides.
    cache_targets = true;
    target_rows = rows_within(avail * 0.8, build_row, n_targets_, kMinTargetRows);
    const double loaded = (double)target_rows * ((double)stride * sizeof(float) + 24);
    query_rows = query_rows_within(std::max(0.0, avail - loaded) * 0.6);
  }
  // Level 1 holds about 32 bytes per (query cluster, target cluster): keep
  // that within an eighth of the budget.
  const double mq = landmark_factor_ * std::sqrt((double)query_rows);
  const double mt = landmark_factor_ * std::sqrt((double)target_rows);
  const double pair_bytes = 32.0 * std::max(1.0, mq) * std::max(1.0, mt);
  if (pair_bytes > budget / 8.0) cluster_scale_ = std::sqrt(budget / 8.0 / pair_bytes);
}

int64_t PartPlan::target_count(int index) const {
  return std::min(target_rows, n_targets_ - target_first(index));
}

int PartPlan::target_order(int q, int i) const {
  int first = 0;
  if (self_) {
    const int64_t middle = std::min(n_queries_ - 1, q * query_rows + query_rows / 2);
    first = (int)std::min<int64_t>(target_parts() - 1, middle / target_rows);
  }
  if (i == 0) return first;
  return i <= first ? i - 1 : i;  // the others in row order
}

int32_t PartPlan::clusters_for(int64_t n_distinct) const {
  const int32_t m = landmarks_for(landmark_factor_, n_distinct);
  return std::max<int32_t>(1, (int32_t)(m * cluster_scale_));
}

int32_t PartPlan::query_clusters_for(int64_t n_distinct) const {
  const int32_t m = clusters_for(n_distinct);
  // Global-memory lists take a slot per lane of each cluster's last, partly
  // filled warp group: with many small clusters that is many times the
  // queries' own lists.
  if (!global_lists_) return m;
  return std::max<int32_t>(1, std::min<int32_t>(m, (int32_t)(n_distinct / 16)));
}

bool PartPlan::halve() {
  const int64_t q = std::max<int64_t>(std::min(kMinQueryRows, n_queries_), query_rows / 2);
  const int64_t t = std::max<int64_t>(std::min(kMinTargetRows, n_targets_), target_rows / 2);
  if (q == query_rows && t == target_rows) return false;
  query_rows = q;
  target_rows = t;
  cache_targets = query_parts() > 1;
  return true;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
