// range_engine_test.cpp -- unit tests of range joins (KnnProblem::range,
// kernels/cpu/range_join.cpp) through the job API and knn_job_take_pairs
// (GoogleTest, no PostgreSQL). Run with `make unittest`.
//
// The reference is written here, independently: every pair (of equal group
// and unequal key when given), its distance through kernels/knn_distance.h
// or a naive bit count, kept when PostgreSQL's float8 comparison says it is
// within the radius, sorted by (distance, target row), capped. Every path
// (float32, float16, bits; TI, brute, auto) must reproduce it bit for bit.
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
#include "reference_rows.h"

namespace {

using reference::Rows;
using reference::distance;
using reference::make_rows;

// PostgreSQL's float8 order: NaN equal to itself and above every number.
int pg_compare(double a, double b) {
  if (std::isnan(a)) return std::isnan(b) ? 0 : 1;
  if (std::isnan(b)) return -1;
  return a < b ? -1 : (a > b ? 1 : 0);
}

using Triple = std::tuple<int64_t, int64_t, double>;

struct Case {
  Rows queries, targets;
  bool shared = false;
  std::vector<int64_t> query_keys, target_keys, query_groups, target_groups;
  double radius = 1;
  KnnRange range = KNN_RANGE_BELOW;
  int cap = 0;
  KnnMetric metric = KNN_METRIC_L2;
  KnnMethod method = KNN_METHOD_AUTO;
  KnnDevice device = KNN_DEVICE_CPU;

  KnnProblem problem() const {
    KnnProblem p{};
    p.element = queries.element;
    p.queries = queries.data();
    p.n_queries = queries.n;
    p.targets = shared ? queries.data() : targets.data();
    p.n_targets = targets.n;
    p.dim = queries.dim;
    p.k = cap;
    p.metric = metric;
    p.method = method;
    p.device = device;
    p.n_threads = 2;
    if (!query_keys.empty()) {
      p.query_keys = query_keys.data();
      p.target_keys = target_keys.data();
    }
    if (!query_groups.empty()) {
      p.query_groups = query_groups.data();
      p.target_groups = target_groups.data();
    }
    p.max_distance = radius;
    p.range = range;
    return p;
  }
};

std::vector<Triple> reference(const Case &c) {
  std::vector<Triple> out;
  for (int64_t i = 0; i < c.queries.n; i++) {
    std::vector<std::pair<double, int64_t>> list;
    for (int64_t j = 0; j < c.targets.n; j++) {
      if (!c.query_keys.empty() && c.query_keys[i] == c.target_keys[j]) continue;
      if (!c.query_groups.empty() && c.query_groups[i] != c.target_groups[j]) continue;
      const double d = distance(c.metric, c.queries, i, c.targets, j);
      const int cmp = pg_compare(d, c.radius);
      if (cmp < 0 || (cmp == 0 && c.range == KNN_RANGE_AT_MOST)) list.push_back({d, j});
    }
    std::sort(list.begin(), list.end(), [](const auto &a, const auto &b) {
      const int cmp = pg_compare(a.first, b.first);
      return cmp != 0 ? cmp < 0 : a.second < b.second;
    });
    if (c.cap > 0 && list.size() > static_cast<size_t>(c.cap)) list.resize(c.cap);
    for (const auto &p : list) out.emplace_back(i, p.second, p.first);
  }
  return out;
}

struct Outcome {
  KnnStatus status = KNN_INTERNAL_ERROR;
  KnnStats stats{};
  std::string message;
  std::vector<Triple> pairs;
};

// Takes the pairs in small batches (the engine's queue fills and drains).
Outcome run(const KnnProblem &p, int64_t batch = 1000) {
  Outcome o;
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, nullptr, nullptr, err, sizeof err);
  EXPECT_NE(job, nullptr) << err;
  if (job == nullptr) return o;
  std::vector<int64_t> q(batch), t(batch);
  std::vector<double> d(batch);
  for (;;) {
    const int64_t n = knn_job_take_pairs(job, q.data(), t.data(), d.data(), batch, 50);
    if (n < 0) break;
    for (int64_t i = 0; i < n; i++) o.pairs.emplace_back(q[i], t[i], d[i]);
  }
  o.status = knn_job_finish(job, &o.stats, err, sizeof err);
  o.message = err;
  return o;
}

void expect_same(const std::vector<Triple> &want, const std::vector<Triple> &got,
                 const std::string &what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); i++) {
    ASSERT_EQ(std::get<0>(want[i]), std::get<0>(got[i])) << what << " pair " << i;
    ASSERT_EQ(std::get<1>(want[i]), std::get<1>(got[i])) << what << " pair " << i;
    const double a = std::get<2>(want[i]), b = std::get<2>(got[i]);
    ASSERT_EQ(0, std::memcmp(&a, &b, sizeof a)) << what << " pair " << i << ": " << a << " vs " << b;
  }
}

const char *metric_name(KnnMetric m) {
  static const char *names[] = {"l2", "cosine", "ip", "l1", "hamming", "jaccard"};
  return names[m];
}

// A radius that is exactly one pair's distance: the boundary between < and <=.
double some_distance(const Case &c, std::mt19937_64 &rng) {
  const int64_t i = rng() % c.queries.n, j = rng() % c.targets.n;
  return distance(c.metric, c.queries, i, c.targets, j);
}

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
              const std::vector<Triple> want = reference(c);
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
      Case c;
      c.queries = make_rows(KNN_ELEMENT_FLOAT32, 200, 2, rng);
      c.targets = c.queries;
      c.shared = true;
      c.metric = metric;
      c.method = method;
      c.radius = 0;
      c.range = KNN_RANGE_AT_MOST;
      const Outcome inclusive = run(c.problem());
      ASSERT_EQ(inclusive.status, KNN_OK) << inclusive.message;
      expect_same(reference(c), inclusive.pairs, "radius 0 <=");
      EXPECT_GT(inclusive.pairs.size(), 200u);  // every row finds itself, and duplicates
      c.range = KNN_RANGE_BELOW;
      const Outcome strict = run(c.problem());
      ASSERT_EQ(strict.status, KNN_OK) << strict.message;
      EXPECT_TRUE(strict.pairs.empty());
      // Self-exclusion by key: the row itself is gone, its duplicates stay.
      c.range = KNN_RANGE_AT_MOST;
      for (int64_t i = 0; i < c.queries.n; i++) c.query_keys.push_back(i);
      c.target_keys = c.query_keys;
      const Outcome excluded = run(c.problem());
      ASSERT_EQ(excluded.status, KNN_OK) << excluded.message;
      expect_same(reference(c), excluded.pairs, "radius 0, keys");
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
        const std::vector<Triple> want = reference(c);
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
    for (int64_t i = 0; i < c.queries.n; i++) {
      c.query_groups.push_back(rng() % 4);
      c.query_keys.push_back(rng() % 50);
    }
    for (int64_t j = 0; j < c.targets.n; j++) {
      c.target_groups.push_back(rng() % 5);  // group 4 has no query
      c.target_keys.push_back(rng() % 50);
    }
    c.method = method;
    c.radius = 4.5;
    c.range = KNN_RANGE_AT_MOST;
    for (int cap : {0, 1, 5}) {
      c.cap = cap;
      const Outcome o = run(c.problem());
      ASSERT_EQ(o.status, KNN_OK) << o.message;
      expect_same(reference(c), o.pairs, "groups, keys, cap " + std::to_string(cap));
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
    c.radius = some_distance(c, rng);
    // A radius from within one cluster: most pairs lie far beyond it.
    c.radius = metric == KNN_METRIC_L2 ? 0.2 : 0.5;
    for (int i = 0; i < 20; i++) {
      const double d = some_distance(c, rng);
      if (d < c.radius && d > 0) c.radius = d;  // one pair exactly on the boundary
    }
    c.range = KNN_RANGE_AT_MOST;
    const Outcome o = run(c.problem());
    ASSERT_EQ(o.status, KNN_OK) << o.message;
    const std::vector<Triple> want = reference(c);
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

TEST(RangeJoin, GpuRequestRunsOnCpuWithNotice) {
  std::mt19937_64 rng(19);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 20, 3, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 20, 3, rng);
  c.radius = 3;
  c.device = KNN_DEVICE_GPU;
  const Outcome o = run(c.problem());
  ASSERT_EQ(o.status, KNN_OK) << o.message;
  expect_same(reference(c), o.pairs, "device gpu");
  EXPECT_NE(o.message.find("no range join"), std::string::npos) << o.message;
  EXPECT_NE(std::string(o.stats.device_name).find("range join: CPU engine"), std::string::npos);
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
  const KnnProblem p = c.problem();
  char err[256] = "";
  KnnJob *job = knn_job_start(&p, nullptr, nullptr, err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  std::vector<int64_t> q(100), t(100);
  std::vector<double> d(100);
  EXPECT_GT(knn_job_take_pairs(job, q.data(), t.data(), d.data(), 100, 5000), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(knn_job_wait(job, 0), 0);  // blocked on the full queue, not finished
  const auto start = std::chrono::steady_clock::now();
  knn_job_cancel(job);
  KnnStats stats;
  EXPECT_EQ(knn_job_finish(job, &stats, err, sizeof err), KNN_CANCELLED);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

}  // namespace
