// group_engine_test.cpp -- unit tests of per-group joins (KnnProblem's
// query_groups/target_groups, kernels/group_split.cpp) through the job API
// (GoogleTest, no PostgreSQL). Run with `make unittest`.
//
// The reference is written here, independently: every pair of equal group
// (and unequal key when keys are given), its distance through
// kernels/knn_distance.h or a naive bit count, a full sort by (distance,
// row), padding. Every engine path the job layer takes (float32, float16
// widened, bit rows; TI, brute, auto) must reproduce it bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "knn_engine.h"
#include "reference_rows.h"

namespace {

struct Result {
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
};

using reference::Rows;
using reference::distance;
using reference::make_rows;

struct Case {
  Rows queries, targets;
  std::vector<int64_t> query_groups, target_groups, query_keys, target_keys;
  bool keyed = false;
  bool shared = false;  // one matrix on both sides
  int k = 1;
  KnnMetric metric = KNN_METRIC_L2;
  KnnMethod method = KNN_METHOD_AUTO;

  KnnProblem problem() const {
    KnnProblem p{};
    p.element = queries.element;
    p.queries = queries.data();
    p.n_queries = queries.n;
    p.targets = shared ? queries.data() : targets.data();
    p.n_targets = targets.n;
    p.dim = queries.dim;
    p.k = k;
    p.metric = metric;
    p.method = method;
    p.device = KNN_DEVICE_CPU;
    p.n_threads = 2;
    if (keyed) {
      p.query_keys = query_keys.data();
      p.target_keys = target_keys.data();
    }
    p.query_groups = query_groups.data();
    p.target_groups = target_groups.data();
    return p;
  }
};

Result reference(const Case &c) {
  Result r;
  r.neighbors.assign(c.queries.n * c.k, -1);
  r.distances.assign(c.queries.n * c.k, std::numeric_limits<double>::quiet_NaN());
  std::vector<std::pair<double, int64_t>> all;
  for (int64_t i = 0; i < c.queries.n; i++) {
    all.clear();
    for (int64_t j = 0; j < c.targets.n; j++) {
      if (c.query_groups[i] != c.target_groups[j]) continue;
      if (c.keyed && c.query_keys[i] == c.target_keys[j]) continue;
      all.emplace_back(distance(c.metric, c.queries, i, c.targets, j), j);
    }
    std::sort(all.begin(), all.end(), [](const auto &a, const auto &b) {
      return knn_result_before(a.first, a.second, b.first, b.second);
    });
    for (size_t s = 0; s < all.size() && static_cast<int64_t>(s) < c.k; s++) {
      r.neighbors[i * c.k + s] = all[s].second;
      r.distances[i * c.k + s] = all[s].first;
    }
  }
  return r;
}

struct JobRun {
  KnnStatus status = KNN_INTERNAL_ERROR;
  Result result;
  KnnStats stats{};
  std::string message;
};

JobRun run_job(const KnnProblem &p) {
  JobRun run;
  run.result.neighbors.assign(std::max<int64_t>(1, p.n_queries * p.k), -7);
  run.result.distances.assign(std::max<int64_t>(1, p.n_queries * p.k), -7.0);
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, run.result.neighbors.data(), run.result.distances.data(), err,
                              sizeof err);
  if (job == nullptr) {
    run.message = err;
    return run;
  }
  while (!knn_job_wait(job, 100)) {
  }
  run.status = knn_job_finish(job, &run.stats, err, sizeof err);
  run.message = err;
  run.result.neighbors.resize(p.n_queries * p.k);
  run.result.distances.resize(p.n_queries * p.k);
  return run;
}

::testing::AssertionResult same_result(const Result &expected, const Result &actual, int k) {
  if (expected.neighbors.size() != actual.neighbors.size())
    return ::testing::AssertionFailure() << "result sizes differ";
  for (size_t i = 0; i < expected.neighbors.size(); i++)
    if (expected.neighbors[i] != actual.neighbors[i] ||
        std::memcmp(&expected.distances[i], &actual.distances[i], sizeof(double)) != 0)
      return ::testing::AssertionFailure()
             << "query " << i / k << " rank " << i % k << ": expected row "
             << expected.neighbors[i] << " at " << expected.distances[i] << ", got row "
             << actual.neighbors[i] << " at " << actual.distances[i];
  return ::testing::AssertionSuccess();
}

// Group ids drawn from a few values, far apart and negative too; some
// only on one side (queries whose group has no target, targets nobody
// asks for).
std::vector<int64_t> random_groups(int64_t n, int n_groups, int64_t offset, std::mt19937_64 &rng) {
  std::vector<int64_t> g(n);
  for (auto &x : g) {
    const int64_t pick = static_cast<int64_t>(rng() % n_groups) + offset;
    x = pick % 2 == 0 ? pick * 1000003 : -pick;
  }
  return g;
}

void expect_matches(const Case &c, const std::string &what) {
  const JobRun run = run_job(c.problem());
  ASSERT_EQ(run.status, KNN_OK) << what << ": " << run.message;
  EXPECT_TRUE(same_result(reference(c), run.result, c.k)) << what;
}

const KnnMetric kFloatMetrics[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP,
                                   KNN_METRIC_L1};
const KnnMetric kBitMetrics[] = {KNN_METRIC_HAMMING, KNN_METRIC_JACCARD};
const KnnMethod kMethods[] = {KNN_METHOD_AUTO, KNN_METHOD_TI, KNN_METHOD_BRUTE};

void run_shapes(KnnElement element, const KnnMetric *metrics, int n_metrics, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t sizes[][2] = {{1, 1}, {7, 30}, {60, 40}, {300, 500}};
  for (const auto &size : sizes) {
    for (int m = 0; m < n_metrics; m++) {
      for (KnnMethod method : kMethods) {
        for (int variant = 0; variant < 4; variant++) {
          Case c;
          const int dim = element == KNN_ELEMENT_BIT ? 1 + static_cast<int>(rng() % 70)
                                                     : 1 + static_cast<int>(rng() % 9);
          c.queries = make_rows(element, size[0], dim, rng);
          c.shared = variant == 3 && size[0] == size[1];
          c.targets = c.shared ? c.queries : make_rows(element, size[1], dim, rng);
          if (variant == 3 && !c.shared) c.targets = make_rows(element, size[1], dim, rng);
          const int n_groups = 1 + static_cast<int>(rng() % 6);
          // variant 1: query groups partly absent among the targets
          c.query_groups = random_groups(c.queries.n, n_groups, variant == 1 ? 2 : 0, rng);
          c.target_groups = c.shared ? c.query_groups : random_groups(c.targets.n, n_groups, 0, rng);
          // variant 2 and 3: self-exclusion by keys (duplicates of keys too)
          c.keyed = variant >= 2;
          if (c.keyed) {
            c.query_keys.resize(c.queries.n);
            c.target_keys.resize(c.targets.n);
            for (int64_t i = 0; i < c.queries.n; i++) c.query_keys[i] = i % 17;
            for (int64_t j = 0; j < c.targets.n; j++) c.target_keys[j] = c.shared ? j % 17 : j % 13;
          }
          c.k = 1 + static_cast<int>(rng() % (variant == 0 ? 3 : 40));  // often > group size
          c.metric = metrics[m];
          c.method = method;
          expect_matches(c, std::string("element ") + std::to_string(element) + " metric " +
                                std::to_string(c.metric) + " method " + std::to_string(method) +
                                " variant " + std::to_string(variant) + " |Q| " +
                                std::to_string(size[0]) + " k " + std::to_string(c.k));
        }
      }
    }
  }
}

TEST(GroupJoin, Float32MatchesReference) { run_shapes(KNN_ELEMENT_FLOAT32, kFloatMetrics, 4, 1); }

TEST(GroupJoin, Float16MatchesReference) { run_shapes(KNN_ELEMENT_FLOAT16, kFloatMetrics, 4, 2); }

TEST(GroupJoin, BitRowsMatchReference) { run_shapes(KNN_ELEMENT_BIT, kBitMetrics, 2, 3); }

// Groups present on one side only, and no group in common at all: those
// queries get empty slots, and the statistics say no group ran.
TEST(GroupJoin, GroupsWithoutTargetsGiveEmptySlots) {
  std::mt19937_64 rng(4);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 20, 3, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 30, 3, rng);
  c.query_groups.assign(20, 1);
  c.target_groups.assign(30, 2);
  c.k = 4;
  const JobRun none = run_job(c.problem());
  ASSERT_EQ(none.status, KNN_OK) << none.message;
  EXPECT_TRUE(same_result(reference(c), none.result, c.k));
  for (int64_t nb : none.result.neighbors) EXPECT_EQ(nb, -1);
  EXPECT_EQ(none.stats.pairs, 0);
  EXPECT_NE(std::string(none.stats.variant).find("groups: 0"), std::string::npos);

  for (int i = 0; i < 10; i++) c.query_groups[i] = 2;  // half of them meet every target
  const JobRun half = run_job(c.problem());
  ASSERT_EQ(half.status, KNN_OK) << half.message;
  EXPECT_TRUE(same_result(reference(c), half.result, c.k));
  EXPECT_EQ(half.stats.pairs, 10 * 30);
  EXPECT_EQ(half.stats.distance_computations > 0, true);
}

// Group arrays must come together.
TEST(GroupJoin, OneGroupArrayIsInvalid) {
  std::mt19937_64 rng(5);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 5, 2, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 5, 2, rng);
  c.query_groups.assign(5, 0);
  c.target_groups.assign(5, 0);
  KnnProblem p = c.problem();
  p.target_groups = nullptr;
  const JobRun run = run_job(p);
  EXPECT_EQ(run.status, KNN_INVALID_ARGUMENT);
  EXPECT_NE(run.message.find("together"), std::string::npos) << run.message;
}

// A cancel stops a grouped join within a fraction of a second, whether it
// lands in a group's engine run or between groups.
TEST(GroupJoin, CancelStopsQuickly) {
  std::mt19937_64 rng(6);
  const int64_t n = 40000;
  const int dim = 256;
  Rows rows;
  rows.element = KNN_ELEMENT_FLOAT32;
  rows.dim = dim;
  rows.n = n;
  rows.f32.resize(n * dim);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto &v : rows.f32) v = u(rng);
  for (int n_groups : {2, 20}) {
    Case c;
    c.queries = rows;
    c.targets = rows;
    c.shared = true;
    c.query_groups.resize(n);
    for (int64_t i = 0; i < n; i++) c.query_groups[i] = i % n_groups;
    c.target_groups = c.query_groups;
    c.k = 10;
    c.method = KNN_METHOD_BRUTE;
    const KnnProblem p = c.problem();
    std::vector<int64_t> nb(n * c.k);
    std::vector<double> d(n * c.k);
    char err[256] = "";
    KnnJob *job = knn_job_start(&p, nb.data(), d.data(), err, sizeof err);
    ASSERT_NE(job, nullptr) << err;
    EXPECT_EQ(knn_job_wait(job, 100), 0) << n_groups;
    knn_job_cancel(job);
    const auto at = std::chrono::steady_clock::now();
    EXPECT_EQ(knn_job_wait(job, 3000), 1);
    const double late_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - at).count();
    EXPECT_LT(late_ms, 250.0) << n_groups << " groups";
    EXPECT_EQ(knn_job_finish(job, nullptr, err, sizeof err), KNN_CANCELLED) << err;
  }
}

}  // namespace
