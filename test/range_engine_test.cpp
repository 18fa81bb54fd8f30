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
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

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
}

}  // namespace
