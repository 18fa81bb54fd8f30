// ti_join.cpp -- the triangle-inequality join (ti_join.h): distinct
// points, clusters, then level 1 and level 2 (ti_filters.h) over slices of
// query clusters on all threads.
#include "ti_join.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_for.h"
#include "ti_distinct.h"
#include "ti_filters.h"
#include "../exclusion_runs.h"
#include "../value_range.h"
#include "../stopwatch.h"

namespace knn {
namespace cpu {
namespace {

// Level 2 walks the distinct queries of a cluster together in slices of at
// most this many (each holds a list of `capacity` pairs).
int64_t query_chunk(int64_t capacity) {
  return std::max<int64_t>(8, std::min<int64_t>(256, (int64_t{1} << 20) / capacity));
}

// Identical rows share one query list unless exclusion would make it
// longer than k + max(k, this).
constexpr int64_t kMaxMergedExclusion = 16;

// Distinct queries TI joins to judge whether it beats brute force (see
// ti_join.h), and how TiSample takes them.
constexpr int64_t kSampleQueries = 64;
constexpr int64_t kSampleStride = 4;          // first pass: every 4th
constexpr double kSampleClearMargin = 4.0;    // first pass decides below 1/4 of break-even

// Share of all pairs above which TI is slower than brute force. Per pair it
// computes, TI pays a fixed cost (bounds, scattered rows) on top of a
// distance somewhat dearer than brute force's; measured on uniform data
// (2 threads, k = 20), TI broke even at 25% of pairs computed in 16
// dimensions, 31% in 64 and 61% in 784. This fit stays a little below.
double brute_force_break_even(int dim) {
  return 0.2 + 0.4 * dim / (dim + 200.0);
}

// What ti_join builds before joining: distinct points and their clusters.
struct Prepared {
  DistinctRows own_queries, targets;
  Clustering own_query_clusters, target_clusters;
  TiSides sides;
};

// Merges identical rows unless exclusion forbids sharing one list among
// them (each row drops its own excluded targets from its group's list, so
// the list holds k + the most targets one key excludes). Returns false
// when cancelled.
bool prepare(const JoinInput &input, const ClusteringOptions &options, JoinReport *report,
             Prepared *p) {
  const int64_t excluded = max_rows_per_key(input.target_keys, input.n_targets);
  const bool merge = excluded <= std::max<int64_t>(input.k, kMaxMergedExclusion);
  auto distinct = [&](const float *matrix, int64_t n, DistinctRows *out) {
    if (merge) return find_distinct_rows(matrix, n, input.dim, input.cancel, out);
    every_row_distinct(matrix, n, input.dim, out);
    return true;
  };
  auto cluster = [&](const DistinctRows &d, Clustering *out) {
    return build_clustering(d.values, d.n_distinct, input.dim, input.metric, options,
                            input.n_threads, input.cancel, out, &report->landmark_distances);
  };
  if (!distinct(input.targets, input.n_targets, &p->targets) ||
      !cluster(p->targets, &p->target_clusters))
    return false;
  // A self-join groups and clusters its one matrix once.
  const bool shared = input.same_rows();
  if (!shared && (!distinct(input.queries, input.n_queries, &p->own_queries) ||
                  !cluster(p->own_queries, &p->own_query_clusters)))
    return false;
  p->sides.queries = shared ? &p->targets : &p->own_queries;
  p->sides.targets = &p->targets;
  p->sides.query_clusters = shared ? &p->target_clusters : &p->own_query_clusters;
  p->sides.target_clusters = &p->target_clusters;
  p->sides.excluded_at_output = merge ? excluded : 0;
  report->query_clusters = p->sides.query_clusters->n_clusters;
  report->target_clusters = p->target_clusters.n_clusters;
  const bool merged = p->sides.queries->n_distinct < input.n_queries ||
                      p->targets.n_distinct < input.n_targets;
  if (shared)
    report->variant = merged ? "two-level/shared-clusters/dedup" : "two-level/shared-clusters";
  else
    report->variant = merged ? "two-level/dedup" : "two-level";
  return !input.cancelled();
}

// Work items: slices of at most `chunk` distinct queries of one cluster.
// Each item runs level 1 for its own slice: members are sorted by
// descending distance to the centre, so a slice's radius is its first
// member's distance, and slices nearer the centre get tighter bounds.
// Items of the largest clusters go first.
struct Slice {
  int64_t cluster, first, last;
};

std::vector<Slice> make_slices(const Clustering &queries, int64_t chunk) {
  std::vector<Slice> slices;
  for (int64_t c = 0; c < queries.n_clusters; c++)
    for (int64_t j = queries.begin[c]; j < queries.begin[c + 1]; j += chunk)
      slices.push_back({c, j, std::min(j + chunk, queries.begin[c + 1])});
  std::stable_sort(slices.begin(), slices.end(), [&](const Slice &a, const Slice &b) {
    return queries.size(a.cluster) > queries.size(b.cluster);
  });
  return slices;
}

// Joins sample queries, each on its own (a one-query slice: its radius is
// its own distance to the centre), and returns the share of all pairs TI
// would compute at their rate. The sample is the distinct queries
// i * n / kSampleQueries; a first pass joins every kSampleStride-th of
// them and settles the question when their share is far from the
// break-even (the sample costs a level 1 per query, a noticeable part of
// small joins); otherwise the rest are joined too and all of them decide.
// Their results are exact and simply recomputed if TI goes on.
class TiSample {
 public:
  TiSample(const JoinInput &input, const TiFilters &filters, const TiSides &sides,
           std::vector<TiScratch> &scratch)
      : input_(input), filters_(filters), sides_(sides), scratch_(scratch),
        n_(sides.queries->n_distinct), n_sample_(std::min<int64_t>(kSampleQueries, n_)) {}

  // Returns the share the decision rests on.
  double share(double break_even) {
    join(0);
    if (first_share_ * kSampleClearMargin < break_even) return first_share_;
    for (int64_t pass = 1; pass < kSampleStride; pass++) join(pass);
    return share_of(computed(), n_sample_);
  }

 private:
  // Joins the sample queries i with i % kSampleStride == pass.
  void join(int64_t pass) {
    const int64_t count = (n_sample_ - pass + kSampleStride - 1) / kSampleStride;
    const Clustering &queries = *sides_.query_clusters;
    parallel_for(count, input_.n_threads, input_.cancel, [&](int64_t item, int worker) {
      const int64_t j = (item * kSampleStride + pass) * n_ / n_sample_;
      const int64_t cluster = std::upper_bound(queries.begin.begin(), queries.begin.end(), j) -
                              queries.begin.begin() - 1;
      const double ub = filters_.level1(cluster, queries.member_distance[j], scratch_[worker]);
      filters_.level2(j, j + 1, ub, scratch_[worker]);
    });
    if (pass == 0) first_share_ = share_of(computed(), count);
  }

  int64_t computed() const {
    int64_t sum = 0;
    for (const TiScratch &s : scratch_) sum += s.distances;
    return sum;
  }

  // Each distinct query serves n_queries / n of the query rows.
  double share_of(int64_t distances, int64_t queries) const {
    return static_cast<double>(distances) / static_cast<double>(queries) *
           static_cast<double>(n_) /
           (static_cast<double>(input_.n_queries) * static_cast<double>(input_.n_targets));
  }

  const JoinInput &input_;
  const TiFilters &filters_;
  const TiSides &sides_;
  std::vector<TiScratch> &scratch_;
  const int64_t n_, n_sample_;
  double first_share_ = 0;
};

// The bits of |x| for the largest |x| in x[0..count): compared as
// integers, which order non-negative floats as their values, put NaN and
// infinity at or above kInfinityBits and vectorise without branches.
constexpr uint32_t kInfinityBits = 0x7f800000u;

__attribute__((target_clones("avx2", "default"))) uint32_t largest_magnitude_bits(
    const float *x, int64_t count) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < count; i++) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bits &= 0x7fffffffu;
    largest = bits > largest ? bits : largest;
  }
  return largest;
}

uint32_t largest_magnitude_bits(const float *x, int64_t count, const JoinInput &input) {
  constexpr int64_t kPerItem = int64_t{1} << 18;
  const int64_t n_items = (count + kPerItem - 1) / kPerItem;
  std::vector<uint32_t> largest(static_cast<size_t>(std::max<int64_t>(1, n_items)), 0);
  parallel_for(n_items, input.n_threads, nullptr, [&](int64_t item, int) {
    const int64_t begin = item * kPerItem;
    largest[item] = largest_magnitude_bits(x + begin, std::min(count - begin, kPerItem));
  });
  return *std::max_element(largest.begin(), largest.end());
}

}  // namespace

bool ti_join_supports(const JoinInput &input) {
  if (input.metric != KNN_METRIC_L2 && input.metric != KNN_METRIC_L1) return false;
  // Level 2 packs a target row into 32 bits (ti_top_k.h).
  if (input.n_targets > int64_t{0xffffffff}) return false;
  uint32_t largest_bits = largest_magnitude_bits(input.queries, input.n_queries * input.dim, input);
  if (!input.same_rows())
    largest_bits = std::max(largest_bits, largest_magnitude_bits(
                                              input.targets, input.n_targets * input.dim, input));
  if (largest_bits >= kInfinityBits) return false;  // NaN or infinity
  float largest;
  std::memcpy(&largest, &largest_bits, sizeof largest);
  return distances_stay_finite(input.metric, input.dim, largest);
}

TiOutcome ti_join(const JoinInput &input, const JoinOutput &output,
                  const ClusteringOptions &options, bool may_decline,
                  JoinReport *report) {
  const Clock::time_point start = Clock::now();
  Prepared prepared;
  if (!prepare(input, options, report, &prepared)) return TiOutcome::kCancelled;
  const TiSides &sides = prepared.sides;
  report->seconds_cluster = seconds_since(start);

  const TiFilters filters(input, output, sides);
  const int64_t chunk = query_chunk(filters.capacity());
  const std::vector<Slice> slices = make_slices(*sides.query_clusters, chunk);
  const int64_t n_slices = static_cast<int64_t>(slices.size());
  // Enough scratch for the sample's workers too (fewer slices than sampled
  // queries when identical rows merge into few clusters).
  const int64_t n_sampled =
      may_decline ? std::min<int64_t>(kSampleQueries, sides.queries->n_distinct) : 0;
  std::vector<TiScratch> scratch(
      parallel_workers(std::max(n_slices, n_sampled), input.n_threads));
  for (TiScratch &s : scratch) filters.prepare_scratch(chunk, &s);

  const Clock::time_point join_start = Clock::now();
  if (may_decline) {
    const double break_even = brute_force_break_even(input.dim);
    report->ti_sample_share = TiSample(input, filters, sides, scratch).share(break_even);
    if (input.cancelled()) return TiOutcome::kCancelled;
    if (report->ti_sample_share > break_even) return TiOutcome::kBruteForceIsFaster;
  }
  parallel_for(n_slices, input.n_threads, input.cancel, [&](int64_t item, int worker) {
    TiScratch &s = scratch[worker];
    const Slice &slice = slices[item];
    const Clock::time_point t0 = Clock::now();
    const double ub =
        filters.level1(slice.cluster, sides.query_clusters->member_distance[slice.first], s);
    const Clock::time_point t1 = Clock::now();
    filters.level2(slice.first, slice.last, ub, s);
    s.seconds_level1 += std::chrono::duration<double>(t1 - t0).count();
    s.seconds_level2 += seconds_since(t1);
  });
  const double join_seconds = seconds_since(join_start);

  double level1 = 0, level2 = 0;
  for (const TiScratch &s : scratch) {
    report->distance_computations += s.distances;
    report->landmark_distances += s.landmark_distances;
    level1 += s.seconds_level1;
    level2 += s.seconds_level2;
  }
  // The phases interleave on every thread; split the wall time in the
  // proportion of the time the threads spent in each.
  const double total = level1 + level2;
  report->seconds_filter = total > 0 ? join_seconds * level1 / total : 0;
  report->seconds_select = total > 0 ? join_seconds * level2 / total : 0;
  return input.cancelled() ? TiOutcome::kCancelled : TiOutcome::kDone;
}

}  // namespace cpu
}  // namespace knn
