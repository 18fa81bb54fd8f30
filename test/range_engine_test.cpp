// range_engine_test.cpp -- unit tests of range joins (KnnProblem::range,
// kernels/cpu/range_join.cpp) through the job API and knn_job_take_pairs
// (GoogleTest, no PostgreSQL). Run with `make unittest`.
//
// The reference (range_cases.h) is written independently of the engine.
// Every path (float32, float16, bits; TI, brute, auto) must reproduce it
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "capped_range.h"
#include "cpu/cpu_engine.h"
#include "knn_engine.h"
#include "range_cases.h"
#include "reference_rows.h"

namespace {

using namespace range_cases;
using reference::Rows;
using reference::distance;
using reference::make_rows;

TEST(RangeJoin, EveryMetricMethodAndBoundary) {
  std::mt19937_64 rng(42);
  const KnnMetric floats[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP, KNN_METRIC_L1};
  const KnnMethod methods[] = {KNN_METHOD_AUTO, KNN_METHOD_TI, KNN_METHOD_BRUTE};
  for (KnnElement element : {KNN_ELEMENT_FLOAT32, KNN_ELEMENT_FLOAT16, KNN_ELEMENT_BIT}) {
    std::vector<KnnMetric> metrics(std::begin(floats), std::end(floats));
    if (element == KNN_ELEMENT_BIT) metrics = {KNN_METRIC_HAMMING, KNN_METRIC_JACCARD};
    for (KnnMetric metric : metrics)
      for (KnnMethod method : methods)
        for (int dim : {3, 13}) {
          Case c;
          c.queries = make_rows(element, 60, dim, rng);
          c.targets = make_rows(element, 90, dim, rng);
          c.metric = metric;
          c.method = method;
          c.radius = some_distance(c, rng);
          for (KnnRange range : {KNN_RANGE_BELOW, KNN_RANGE_AT_MOST})
            for (int cap : {0, 3}) {
              c.range = range;
              c.cap = cap;
              const std::string what = std::string(metric_name(metric)) + " element " +
                                       std::to_string(element) + " method " +
                                       std::to_string(method) + " dim " + std::to_string(dim) +
                                       " range " + std::to_string(range) + " cap " +
                                       std::to_string(cap) + " r " + std::to_string(c.radius);
              const Outcome o = run(c.problem(), 7);
              ASSERT_EQ(o.status, KNN_OK) << what << ": " << o.message;
              const std::vector<Triple> want = reference_pairs(c);
              expect_same(want, o.pairs, what);
              if (cap == 0 && range == KNN_RANGE_AT_MOST) {
                EXPECT_FALSE(want.empty()) << what;
              }
            }
        }
  }
}

// The distance at quantile `at` (0..1) of every pair's, in PostgreSQL's
// order: a radius exactly on a (usually tied) distance.
double quantile_distance(const Case &c, double at) {
  std::vector<double> all;
  for (int64_t i = 0; i < c.queries.n; i++)
    for (int64_t j = 0; j < c.targets.n; j++)
      all.push_back(distance(c.metric, c.queries, i, c.targets, j));
  std::sort(all.begin(), all.end(), [](double a, double b) { return pg_compare(a, b) < 0; });
  return all[static_cast<size_t>(at * static_cast<double>(all.size() - 1))];
}

// A cap that a wide radius overfills runs as the top-k join, one that a
// narrow radius leaves unfilled as the range join: the same pairs either
// way, for every element type and metric, < and <=, the radius and the
// cap on tied distances (small-integer rows), keys and groups.
TEST(RangeJoin, CapByTopKOrRangeEveryMetric) {
  std::mt19937_64 rng(29);
  const KnnMetric floats[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP, KNN_METRIC_L1};
  for (KnnElement element : {KNN_ELEMENT_FLOAT32, KNN_ELEMENT_FLOAT16, KNN_ELEMENT_BIT}) {
    std::vector<KnnMetric> metrics(std::begin(floats), std::end(floats));
    if (element == KNN_ELEMENT_BIT) metrics = {KNN_METRIC_HAMMING, KNN_METRIC_JACCARD};
    for (KnnMetric metric : metrics)
      for (int variant = 0; variant < 3; variant++) {
        Case c;
        c.queries = make_rows(element, 60, 13, rng);
        c.targets = make_rows(element, 90, 13, rng);
        c.metric = metric;
        if (variant == 1) {
          c.targets = c.queries;
          c.shared = true;
          exclude_self(&c);
        } else if (variant == 2) {
          add_groups_and_keys(&c, rng);
        }
        const double wide = quantile_distance(c, 0.6), narrow = quantile_distance(c, 0.005);
        for (KnnRange range : {KNN_RANGE_BELOW, KNN_RANGE_AT_MOST})
          for (int top_k = 0; top_k < 2; top_k++) {
            c.range = range;
            c.radius = top_k ? wide : narrow;
            c.cap = top_k ? 4 : 50;
            const std::string what = std::string(metric_name(metric)) + " element " +
                                     std::to_string(element) + " variant " +
                                     std::to_string(variant) + " range " +
                                     std::to_string(range) + " cap " + std::to_string(c.cap);
            const Outcome o = run(c.problem(), 7);
            ASSERT_EQ(o.status, KNN_OK) << what << ": " << o.message;
            expect_same(reference_pairs(c), o.pairs, what);
            EXPECT_EQ(ran_top_k(o), top_k == 1) << what << ": " << o.stats.variant;
          }
      }
  }
}

// Radii that hold every pair (huge, infinite, NaN) and none, at a cap.
TEST(RangeJoin, CapByTopKNonFiniteRadius) {
  std::mt19937_64 rng(31);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_IP, KNN_METRIC_COSINE}) {
    Case c;
    c.queries = make_rows(KNN_ELEMENT_FLOAT32, 30, 5, rng);
    c.targets = make_rows(KNN_ELEMENT_FLOAT32, 50, 5, rng);
    std::fill(c.queries.f32.begin(), c.queries.f32.begin() + 5, 0.0f);  // NaN cosines
    c.metric = metric;
    c.cap = 6;
    for (double radius : {1e300, std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::quiet_NaN(), -1.0})
      for (KnnRange range : {KNN_RANGE_BELOW, KNN_RANGE_AT_MOST}) {
        c.radius = radius;
        c.range = range;
        const Outcome o = run(c.problem(), 13);
        ASSERT_EQ(o.status, KNN_OK) << o.message;
        const std::string what = std::string(metric_name(metric)) + " r " + std::to_string(radius);
        expect_same(reference_pairs(c), o.pairs, what);
        // (negative inner products lie within -1)
        const bool none = radius == -1.0 && metric != KNN_METRIC_IP;
        EXPECT_EQ(ran_top_k(o), !none) << what << ": " << o.stats.variant;
      }
  }
}

// The choice: a wide radius and a small cap, yes; a narrow radius and a
// large cap, a cap of every target, or no cap, no.
TEST(RangeJoin, CapByTopKChoice) {
  std::mt19937_64 rng(37);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 500, 8, rng, true);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 4000, 8, rng, true);
  c.range = KNN_RANGE_AT_MOST;
  const int32_t never = 0;
  c.radius = 1e300;
  c.cap = 10;
  EXPECT_TRUE(knn::capped_range_prefers_top_k(c.problem(), &never));
  c.cap = 4000;
  EXPECT_FALSE(knn::capped_range_prefers_top_k(c.problem(), &never));
  c.cap = 0;
  EXPECT_FALSE(knn::capped_range_prefers_top_k(c.problem(), &never));
  // 16 clusters of about 250 rows, 0.2 across, centres 2.8 apart or more:
  // about 250 pairs a query.
  c.radius = 1;
  c.cap = 100;
  EXPECT_TRUE(knn::capped_range_prefers_top_k(c.problem(), &never));
  c.cap = 1000;
  EXPECT_FALSE(knn::capped_range_prefers_top_k(c.problem(), &never));
  const int32_t cancelled = 1;
  c.cap = 10;
  EXPECT_FALSE(knn::capped_range_prefers_top_k(c.problem(), &cancelled));
  // A radius of about 2 pairs a query under a cap of 10: the range join's
  // bounds skip most pairs of these clusters, so the range join stays.
  c.radius = quantile_distance(c, 2.0 / 4000);
  EXPECT_FALSE(knn::capped_range_prefers_top_k(c.problem(), &never));
}

// The cost rule: in 64 dimensions the range join's bounds keep nearly every
// pair, so a radius of about 1 pair a query under a cap of 10 runs as the
// top-k join (the count rule alone kept the range join); the same pairs.
// Not past kCostRuleMaxK (a cap of 200), nor where the join is small.
TEST(RangeJoin, CapByTopKWhereTheRangeBoundsKeepMostPairs) {
  std::mt19937_64 rng(43);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 1000, 64, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 2000, 64, rng);
  c.range = KNN_RANGE_AT_MOST;
  c.radius = quantile_distance(c, 1.0 / 2000);
  c.cap = 10;
  const Outcome o = run(c.problem(), 1000);
  ASSERT_EQ(o.status, KNN_OK) << o.message;
  const std::vector<Triple> want = reference_pairs(c);
  EXPECT_LT(want.size(), 2000u);  // few pairs a query: the count rule says range
  expect_same(want, o.pairs, "64-d, cap 10");
  EXPECT_TRUE(ran_top_k(o)) << o.stats.variant;
  const int32_t never = 0;
  c.cap = 200;
  EXPECT_FALSE(knn::capped_range_prefers_top_k(c.problem(), &never));
  c.cap = 10;
  c.queries.n = 400;  // 800000 pairs
  c.queries.f32.resize(400 * 64);
  EXPECT_FALSE(knn::capped_range_prefers_top_k(c.problem(), &never));
}

// Slices of the queries (a few slots each), keys, and a notice kept.
TEST(RangeJoin, CapByTopKInSlices) {
  std::mt19937_64 rng(41);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 70, 6, rng);
  c.targets = c.queries;
  c.shared = true;
  exclude_self(&c);
  c.range = KNN_RANGE_AT_MOST;
  c.radius = quantile_distance(c, 0.3);
  c.cap = 9;
  const KnnProblem p = c.problem();
  const int32_t never = 0;
  int runs = 0;
  std::vector<Triple> got;
  KnnStats stats{};
  char message[256] = "";
  const KnnStatus st = knn::capped_range_by_top_k(
      p,
      [&](const KnnProblem &slice, int64_t *n, double *d, KnnStats *s) {
        EXPECT_EQ(slice.range, KNN_RANGE_NONE);
        EXPECT_LE(slice.n_queries * slice.k, 40);
        const KnnStatus slice_st = knn::cpu_run(slice, n, d, s, &never, message, sizeof message);
        if (++runs == 2) std::snprintf(message, sizeof message, "a notice");
        return slice_st;
      },
      [&](int64_t q, const int64_t *t, const double *d, int64_t n) {
        for (int64_t i = 0; i < n; i++) got.emplace_back(q, t[i], d[i]);
        return true;
      },
      &stats, &never, message, sizeof message, 40);
  ASSERT_EQ(st, KNN_OK) << message;
  EXPECT_EQ(runs, 18);  // 4 queries of 9 slots each
  expect_same(reference_pairs(c), got, "slices");
  EXPECT_STREQ(message, "a notice");
  EXPECT_EQ(stats.pairs, 70 * 70);
  EXPECT_NE(std::string(stats.variant).find(std::to_string(got.size()) + " pairs within radius"),
            std::string::npos) << stats.variant;
}

// The slices' size follows the rows' memory: 5000 rows of 4096 floats
// (80 MB) at a cap of 1000 are 5 million slots, past kTopKSliceSlots, yet
// no more memory than the rows: one top-k run (the targets prepared once),
// not two. The run here only counts (no pairs within the radius).
TEST(RangeJoin, CapByTopKOneSliceWhereTheResultsFitBesideTheRows) {
  const int64_t n = 5000;
  const int dim = 4096;
  std::vector<float> rows(static_cast<size_t>(n * dim), 0.0f);
  KnnProblem p{};
  p.element = KNN_ELEMENT_FLOAT32;
  p.queries = p.targets = rows.data();
  p.n_queries = p.n_targets = n;
  p.dim = dim;
  p.k = 1000;
  p.metric = KNN_METRIC_L2;
  p.range = KNN_RANGE_BELOW;
  p.max_distance = 0;
  ASSERT_GT(p.n_queries * p.k, knn::kTopKSliceSlots);
  EXPECT_GE(knn::top_k_slice_slots(p), p.n_queries * p.k);
  const int32_t never = 0;
  std::vector<int64_t> slice_queries;
  KnnStats stats{};
  char message[256] = "";
  const KnnStatus st = knn::capped_range_by_top_k(
      p,
      [&](const KnnProblem &slice, int64_t *neighbors, double *distances, KnnStats *) {
        slice_queries.push_back(slice.n_queries);
        std::fill(neighbors, neighbors + slice.n_queries * slice.k, 0);
        std::fill(distances, distances + slice.n_queries * slice.k, 0.0);  // not < 0
        return KNN_OK;
      },
      [](int64_t, const int64_t *, const double *, int64_t) { return true; }, &stats, &never,
      message, sizeof message);
  ASSERT_EQ(st, KNN_OK) << message;
  EXPECT_EQ(slice_queries, std::vector<int64_t>{n});
}

TEST(RangeJoin, RadiusZeroFindsDuplicatesOnly) {
  std::mt19937_64 rng(7);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1})
    for (KnnMethod method : {KNN_METHOD_TI, KNN_METHOD_BRUTE}) {
      Case c = duplicates_case(metric, method, 200, rng);
      const Outcome inclusive = run(c.problem());
      ASSERT_EQ(inclusive.status, KNN_OK) << inclusive.message;
      expect_same(reference_pairs(c), inclusive.pairs, "radius 0 <=");
      EXPECT_GT(inclusive.pairs.size(), 200u);  // every row finds itself, and duplicates
      c.range = KNN_RANGE_BELOW;
      const Outcome strict = run(c.problem());
      ASSERT_EQ(strict.status, KNN_OK) << strict.message;
      EXPECT_TRUE(strict.pairs.empty());
      // Self-exclusion by key: the row itself is gone, its duplicates stay.
      c.range = KNN_RANGE_AT_MOST;
      exclude_self(&c);
      const Outcome excluded = run(c.problem());
      ASSERT_EQ(excluded.status, KNN_OK) << excluded.message;
      expect_same(reference_pairs(c), excluded.pairs, "radius 0, keys");
      EXPECT_EQ(excluded.pairs.size() + 200, inclusive.pairs.size());
    }
}

TEST(RangeJoin, HugeAndNonFiniteRadius) {
  std::mt19937_64 rng(9);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_IP, KNN_METRIC_COSINE}) {
    Case c;
    c.queries = make_rows(KNN_ELEMENT_FLOAT32, 30, 5, rng);
    c.targets = make_rows(KNN_ELEMENT_FLOAT32, 50, 5, rng);
    c.queries.f32[0] = c.queries.f32[1] = c.queries.f32[2] = c.queries.f32[3] = c.queries.f32[4] = 0;
    c.metric = metric;
    c.method = KNN_METHOD_TI;
    for (double radius : {1e300, std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::quiet_NaN(), -1.0})
      for (KnnRange range : {KNN_RANGE_BELOW, KNN_RANGE_AT_MOST}) {
        c.radius = radius;
        c.range = range;
        const Outcome o = run(c.problem(), 13);
        ASSERT_EQ(o.status, KNN_OK) << o.message;
        const std::vector<Triple> want = reference_pairs(c);
        expect_same(want, o.pairs, std::string(metric_name(metric)) + " r " + std::to_string(radius));
        if (radius == 1e300 && metric != KNN_METRIC_COSINE) {
          EXPECT_EQ(want.size(), 30u * 50u);  // every pair
        }
      }
  }
}

TEST(RangeJoin, GroupsKeysAndCap) {
  std::mt19937_64 rng(11);
  for (KnnMethod method : {KNN_METHOD_TI, KNN_METHOD_BRUTE}) {
    Case c;
    c.queries = make_rows(KNN_ELEMENT_FLOAT32, 120, 4, rng);
    c.targets = make_rows(KNN_ELEMENT_FLOAT32, 150, 4, rng);
    add_groups_and_keys(&c, rng);
    c.method = method;
    c.radius = 4.5;
    c.range = KNN_RANGE_AT_MOST;
    for (int cap : {0, 1, 5}) {
      c.cap = cap;
      const Outcome o = run(c.problem());
      ASSERT_EQ(o.status, KNN_OK) << o.message;
      expect_same(reference_pairs(c), o.pairs, "groups, keys, cap " + std::to_string(cap));
    }
  }
}

TEST(RangeJoin, TiPrunesAndStaysExact) {
  std::mt19937_64 rng(13);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Case c;
    c.queries = make_rows(KNN_ELEMENT_FLOAT32, 400, 8, rng, true);
    c.targets = make_rows(KNN_ELEMENT_FLOAT32, 3000, 8, rng, true);
    c.metric = metric;
    c.method = KNN_METHOD_TI;
    c.radius = radius_within_clusters(c, rng, 20);
    c.range = KNN_RANGE_AT_MOST;
    const Outcome o = run(c.problem());
    ASSERT_EQ(o.status, KNN_OK) << o.message;
    const std::vector<Triple> want = reference_pairs(c);
    expect_same(want, o.pairs, metric_name(metric));
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(o.stats.method, KNN_METHOD_TI);
    EXPECT_GT(o.stats.target_clusters, 1);
    EXPECT_LT(o.stats.distance_computations, o.stats.pairs / 4) << o.stats.variant;
  }
}

TEST(RangeJoin, EmptySidesAndBadProblems) {
  std::mt19937_64 rng(17);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 10, 3, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 0, 3, rng);
  Outcome o = run(c.problem());
  EXPECT_EQ(o.status, KNN_OK);
  EXPECT_TRUE(o.pairs.empty());
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 10, 3, rng);
  c.cap = -1;
  o = run(c.problem());
  EXPECT_EQ(o.status, KNN_INVALID_ARGUMENT);
  c.cap = 0;
  KnnProblem p = c.problem();
  p.range = 7;
  o = run(p);
  EXPECT_EQ(o.status, KNN_INVALID_ARGUMENT);
  p = c.problem();
  p.metric = KNN_METRIC_HAMMING;
  o = run(p);
  EXPECT_EQ(o.status, KNN_INVALID_ARGUMENT);
}

// Without the GPU module (a directory that has none), a GPU request runs
// on the CPU engine with a notice; a small AUTO job runs on the CPU
// without looking for a GPU. (test/gpu_range_test.cpp covers the GPU.)
TEST(RangeJoin, GpuRequestWithoutGpuRunsOnCpuWithNotice) {
  knn_engine_set_module_dir("/nonexistent-knn-gpu-module-dir");
  std::mt19937_64 rng(19);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 20, 3, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 20, 3, rng);
  c.radius = 3;
  c.device = KNN_DEVICE_AUTO;
  Outcome o = run(c.problem());
  ASSERT_EQ(o.status, KNN_OK) << o.message;
  expect_same(reference_pairs(c), o.pairs, "device auto");
  EXPECT_EQ(o.message, "");
  EXPECT_NE(std::string(o.stats.device_name).find("[small, CPU answers sooner]"),
            std::string::npos) << o.stats.device_name;
  c.device = KNN_DEVICE_GPU;
  o = run(c.problem());
  ASSERT_EQ(o.status, KNN_OK) << o.message;
  expect_same(reference_pairs(c), o.pairs, "device gpu");
  EXPECT_NE(o.message.find("no usable GPU"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("the CPU engine ran"), std::string::npos) << o.message;
  EXPECT_NE(std::string(o.stats.device_name).find("[no GPU]"), std::string::npos)
      << o.stats.device_name;
  EXPECT_EQ(o.stats.device, KNN_DEVICE_CPU);
  // The top-k join of a capped job says the same.
  c.cap = 2;
  o = run(c.problem());
  ASSERT_EQ(o.status, KNN_OK) << o.message;
  expect_same(reference_pairs(c), o.pairs, "device gpu, cap");
  EXPECT_TRUE(ran_top_k(o)) << o.stats.variant;
  EXPECT_NE(o.message.find("no usable GPU"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("the CPU engine ran"), std::string::npos) << o.message;
  EXPECT_EQ(o.stats.device, KNN_DEVICE_CPU);
}

// A huge result whose caller stops taking pairs: the engine waits on its
// full queue (bounded memory) and a cancel ends it promptly.
TEST(RangeJoin, CancelWhileTheQueueIsFull) {
  std::mt19937_64 rng(23);
  Rows rows = make_rows(KNN_ELEMENT_FLOAT32, 3000, 4, rng);
  Case c;
  c.queries = rows;
  c.targets = rows;
  c.shared = true;
  c.radius = std::numeric_limits<double>::infinity();  // 9 million pairs
  expect_prompt_cancel(c.problem());
  // ... and as the top-k join (300000 pairs, capped at 100 a query).
  c.cap = 100;
  const int32_t never = 0;
  ASSERT_TRUE(knn::capped_range_prefers_top_k(c.problem(), &never));
  expect_prompt_cancel(c.problem());
}

}  // namespace
