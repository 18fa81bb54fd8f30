// ti_part_plan.cu -- how the out-of-core TI join cuts its rows into query
// and target parts (PartPlan of ti_parts.cuh).
//
// Ordered sides (the usual case) are cut by distinct points, greedily along
// the order: a part takes distinct points while what it holds fits its
// share. Bytes per distinct point (S = stride floats):
//  * a part being clustered: its padded distinct rows, the rows in cluster
//    order, the cluster and assignment arrays (2 S + 96 bytes; the cuBLAS
//    assignment adds S and a row of its Gram matrix), and 4 bytes per
//    original row;
//  * a target part copied back for a query part: S + 20, 4 per row;
//  * a query part while target parts are filtered: S + 24 plus its k'
//    lists (8 k'), and level 2's global list slots where k' > 32; with
//    mapped lists (PartPlan::mapped_lists, the default) the lists are in
//    pinned host memory and only their k'-th entries (8) count.
// The query resident bytes and the loaded target bytes share 96 % of the
// budget, 66 % and 30 % (the pair count falls with the product of the
// part sizes, and the level-2 kernel runs a thread per query of the part:
// larger query parts keep more of the device busy). The rest is level 1
// and level 2's scratch, small next to the parts; a join that finds it too
// small halves the shares (PartPlan::halve). Each build has the budget to
// itself (90 %). With one query part,
// the target parts are built beside it instead, never cached.
//
// Row ranges (sides without an order) keep the first scheme, in rows:
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
#include <cstdlib>
#include <cstring>

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

// KNN_TI_PART_SHARE=F (0.5..1) scales the query and target shares of
// ordered parts, for A/B benchmarks.
double part_share() {
  const char *forced = std::getenv("KNN_TI_PART_SHARE");
  const double f = forced != nullptr ? std::atof(forced) : 1.0;
  return f > 0 ? std::max(0.5, std::min(1.0, f)) : 1.0;
}

// KNN_TI_SHARED_PARTS=1 cuts a self-join's sides alike wherever it may
// (lists not in global memory), =0 never, for A/B benchmarks; unset, where
// the pairs it adds cost less than the query builds it saves.
int forced_shared_parts() {
  const char *forced = std::getenv("KNN_TI_SHARED_PARTS");
  return forced == nullptr ? -1 : forced[0] == '1' ? 1 : 0;
}

int64_t rows_within(double bytes, size_t per_row, int64_t n, int64_t floor_rows) {
  const double rows = std::floor(bytes / (double)per_row);
  return std::max<int64_t>(std::min<int64_t>(floor_rows, n),
                           (int64_t)std::min<double>((double)n, rows));
}

// Equal row ranges of `rows` over n rows: part bounds.
void row_bounds(int64_t n, int64_t rows, std::vector<int64_t> *at) {
  at->clear();
  for (int64_t f = 0; f < n; f += rows) at->push_back(f);
  at->push_back(n);
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
      exclude_(p.query_keys != nullptr && p.target_keys != nullptr),
      stride_(padded_stride(p.dim)),
      gemm_build_(p.metric == KNN_METRIC_L2 && stride_ >= options.gemm_assign_min_stride),
      landmark_factor_(options.landmark_factor) {
  const int64_t excluded = exclude_ ? max_rows_per_key(p.target_keys, p.n_targets) : 0;
  kprime = (int)std::min<int64_t>(INT32_MAX / 4, (int64_t)p.k + excluded);
  global_lists_ = kprime > 32;
  mapped_lists = false;  // row ranges: on the device (cut_distinct may map them)
  plan_rows();
}

double PartPlan::query_resident_bytes(int64_t n, int64_t rows) const {
  const double entry = sizeof(float) + sizeof(int32_t);
  const double clusters = query_clusters_for(n);
  const double slots = global_lists_ ? n + kWarp * (clusters + 1) : 0.0;
  // Mapped lists: the k'-th entry of each list on the device.
  const double lists = mapped_lists ? entry : kprime * entry;
  return n * ((double)stride_ * sizeof(float) + 32 + lists) + 4.0 * rows +
         slots * kprime * entry + clusters * (kprime + 1) * entry;
}

void PartPlan::plan_rows() {
  const int stride = stride_;
  // What stays for the whole join: every target key (rows are global).
  const size_t fixed = (exclude_ ? (size_t)n_targets_ * sizeof(int64_t) : 0) + 4096;
  avail_ = budget > fixed ? (double)(budget - fixed) : 0.0;
  const double avail = avail_;
  const size_t build_row = build_bytes_per_row(stride);
  auto query_bytes = [&](int64_t n) { return query_resident_bytes(n, 0); };
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
  cache_targets = false;
  if ((n_queries_ + query_rows - 1) / query_rows > 1) {
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
  row_bounds(n_queries_, query_rows, &query_at_);
  row_bounds(n_targets_, target_rows, &target_at_);
  query_units_ = query_at_;
  target_units_ = target_at_;
  cap_clusters(query_rows, target_rows);
}

// Level 1 holds about 32 bytes per (query cluster, target cluster): keep
// that within an eighth of the budget.
void PartPlan::cap_clusters(int64_t query_units, int64_t target_units) {
  cluster_scale_ = 1.0;
  const double mq = landmark_factor_ * std::sqrt((double)query_units);
  const double mt = landmark_factor_ * std::sqrt((double)target_units);
  const double pair_bytes = 32.0 * std::max(1.0, mq) * std::max(1.0, mt);
  if (pair_bytes > budget / 8.0) cluster_scale_ = std::sqrt(budget / 8.0 / pair_bytes);
}

void PartPlan::cut_distinct(const SpatialOrder &queries, const SpatialOrder &targets) {
  by_distinct_ = true;
  query_order_ = &queries;
  target_order_ = &targets;
  // Nothing but a counter and the theta words stays: keys are applied on
  // the host.
  avail_ = budget > 4096 ? (double)(budget - 4096) : 0.0;
  // Ordered parts' lists are mapped (KNN_TI_LISTS=device: on the device).
  const char *lists = std::getenv("KNN_TI_LISTS");
  mapped_lists = lists == nullptr || std::strcmp(lists, "device") != 0;
  plan_distinct();
}

namespace {

// Greedy cut of [0, n) distinct points of `order` into parts whose
// bytes(distinct points, rows) stay within the limit (at least one
// distinct point a part); bounds in distinct points and positions.
template <class Bytes>
void cut_parts(const SpatialOrder &order, Bytes bytes, std::vector<int64_t> *units,
               std::vector<int64_t> *at, int64_t *largest_rows, int64_t *largest_units) {
  const std::vector<int64_t> &begin = order.distinct_begin;
  const int64_t n = order.n_distinct();
  units->assign(1, 0);
  *largest_rows = *largest_units = 0;
  int64_t first = 0;
  while (first < n) {
    auto fits = [&](int64_t c) { return bytes(c, begin[first + c] - begin[first]); };
    // The largest count that fits (at least one), by doubling then bisection.
    const int64_t left = n - first;
    int64_t lo = 1;
    while (lo < left && fits(std::min(2 * lo, left))) lo = std::min(2 * lo, left);
    int64_t hi = lo < left ? std::min(2 * lo, left) - 1 : lo;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (fits(mid)) lo = mid;
      else hi = mid - 1;
    }
    *largest_units = std::max(*largest_units, lo);
    *largest_rows = std::max(*largest_rows, begin[first + lo] - begin[first]);
    first += lo;
    units->push_back(first);
  }
  at->clear();
  for (int64_t u : *units) at->push_back(begin[u]);
}

}  // namespace

void PartPlan::plan_distinct() {
  const double s = (double)stride_ * sizeof(float);
  const double avail = avail_ * scale_;
  // The cuBLAS assignment adds a copy of the rows and a (rows x clusters)
  // Gram matrix.
  auto build = [&](int64_t d, int64_t r) {
    const double gemm = gemm_build_ ? s + 4.0 * clusters_for(d) : 0.0;
    return d * (2 * s + 96 + gemm) + 4.0 * r;
  };
  auto loaded = [&](int64_t d, int64_t r) { return d * (s + 20) + 4.0 * r; };
  const SpatialOrder &q = *query_order_, &t = *target_order_;
  const int64_t nq = q.n_distinct(), rows_q = q.distinct_begin.back();
  int64_t largest_query = 0, largest_target = 0;
  shared_parts = false;
  if (query_resident_bytes(nq, rows_q) <= avail * 0.5 && build(nq, rows_q) <= avail * 0.9) {
    // One query part; each target part is built beside it, once.
    cache_targets = false;
    const double rest = std::max(0.0, avail - query_resident_bytes(nq, rows_q)) * 0.7;
    query_units_ = {0, nq};
    query_at_ = {0, rows_q};
    query_rows = rows_q;
    largest_query = nq;
    cut_parts(t, [&](int64_t d, int64_t r) { return build(d, r) <= rest; }, &target_units_,
              &target_at_, &target_rows, &largest_target);
  } else {
    // Query resident and target loaded bytes share 96 %: more to the
    // queries, whose count is the level-2 kernel's parallelism.
    const double query_share = avail * 0.66 * part_share(),
                 target_share = avail * 0.30 * part_share(), whole = avail * 0.9;
    cut_parts(q,
              [&](int64_t d, int64_t r) {
                return query_resident_bytes(d, r) <= query_share && build(d, r) <= whole;
              },
              &query_units_, &query_at_, &query_rows, &largest_query);
    cut_parts(t,
              [&](int64_t d, int64_t r) {
                return loaded(d, r) <= target_share && build(d, r) <= whole;
              },
              &target_units_, &target_at_, &target_rows, &largest_target);
    // A self-join whose query parts would have as many clusters as its
    // target parts (lists not in global memory) may cut both sides alike,
    // under both limits: query part i is then target part i, copied back
    // instead of built again (shared_parts). Taken where the pairs it adds
    // cost less than the query builds it saves (a build is some five
    // pairs' work).
    const int forced_shared = forced_shared_parts();
    if (self_ && !global_lists_ && forced_shared != 0) {
      std::vector<int64_t> units, at;
      int64_t rows = 0, largest = 0;
      cut_parts(q,
                [&](int64_t d, int64_t r) {
                  return query_resident_bytes(d, r) <= query_share && loaded(d, r) <= target_share &&
                         build(d, r) <= whole;
                },
                &units, &at, &rows, &largest);
      const double parts = (double)units.size() - 1;
      if (forced_shared == 1 || parts * parts <= (double)query_parts() * (target_parts() + 5)) {
        shared_parts = true;
        query_units_ = target_units_ = units;
        query_at_ = target_at_ = at;
        query_rows = target_rows = rows;
        largest_query = largest_target = largest;
      }
    }
    cache_targets = query_parts() > 1;
    shared_parts = shared_parts && cache_targets;
  }
  cap_clusters(largest_query, largest_target);
}

int64_t PartPlan::query_distinct_count(int index) const {
  return query_units_[index + 1] - query_units_[index];
}

int64_t PartPlan::target_distinct_count(int index) const {
  return target_units_[index + 1] - target_units_[index];
}

int PartPlan::target_order(int q, int i) const {
  int first = 0;
  if (self_) {
    const int64_t middle = std::min(n_queries_ - 1, query_first(q) + query_count(q) / 2);
    first = (int)(std::upper_bound(target_at_.begin(), target_at_.end(), middle) -
                  target_at_.begin() - 1);
    first = std::max(0, std::min(target_parts() - 1, first));
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
  if (by_distinct_) {
    // Half the share, cut again; no smaller once parts hold about as few
    // distinct points as the row-range floors, or the cut did not change.
    const int qp = query_parts(), tp = target_parts();
    const int64_t qr = query_rows, tr = target_rows;
    const int64_t q_units = qp > 0 ? query_units_.back() / qp : 0;
    const int64_t t_units = tp > 0 ? target_units_.back() / tp : 0;
    if (q_units <= kMinQueryRows && t_units <= kMinTargetRows) return false;
    scale_ *= 0.5;
    plan_distinct();
    return !(qp == query_parts() && tp == target_parts() && qr == query_rows &&
             tr == target_rows);
  }
  const int64_t q = std::max<int64_t>(std::min(kMinQueryRows, n_queries_), query_rows / 2);
  const int64_t t = std::max<int64_t>(std::min(kMinTargetRows, n_targets_), target_rows / 2);
  if (q == query_rows && t == target_rows) return false;
  query_rows = q;
  target_rows = t;
  row_bounds(n_queries_, query_rows, &query_at_);
  row_bounds(n_targets_, target_rows, &target_at_);
  query_units_ = query_at_;
  target_units_ = target_at_;
  cache_targets = query_parts() > 1;
  shared_parts = false;
  return true;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
