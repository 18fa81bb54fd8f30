// range_cases.h -- what the range-join tests share (GoogleTest, no
// PostgreSQL): a case (rows, radius, cap, keys, groups) as a KnnProblem,
// an independent reference of its pairs, a run through the job API and
// knn_job_take_pairs, and the comparison of two pair lists.
//
// The reference is written here, independently of the engines: every pair
// (of equal group and unequal key when given), its distance through
// kernels/knn_distance.h or a naive bit count (reference_rows.h), kept
// when PostgreSQL's float8 comparison says it is within the radius, sorted
// by (distance, target row), capped.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "knn_engine.h"
#include "reference_rows.h"

namespace range_cases {

// PostgreSQL's float8 order: NaN equal to itself and above every number.
inline int pg_compare(double a, double b) {
  if (std::isnan(a)) return std::isnan(b) ? 0 : 1;
  if (std::isnan(b)) return -1;
  return a < b ? -1 : (a > b ? 1 : 0);
}

// (query row, target row, distance)
using Triple = std::tuple<int64_t, int64_t, double>;

struct Case {
  reference::Rows queries, targets;
  bool shared = false;  // targets are the queries' array (a self-join)
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

inline std::vector<Triple> reference_pairs(const Case &c) {
  std::vector<Triple> out;
  for (int64_t i = 0; i < c.queries.n; i++) {
    std::vector<std::pair<double, int64_t>> list;
    for (int64_t j = 0; j < c.targets.n; j++) {
      if (!c.query_keys.empty() && c.query_keys[i] == c.target_keys[j]) continue;
      if (!c.query_groups.empty() && c.query_groups[i] != c.target_groups[j]) continue;
      const double d = reference::distance(c.metric, c.queries, i, c.targets, j);
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

// Runs a range job, taking its pairs in batches of `batch` (the engine's
// queue fills and drains).
inline Outcome run(const KnnProblem &p, int64_t batch = 1000) {
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

// Whether a capped range job ran as the top-k join (kernels/capped_range.h).
inline bool ran_top_k(const Outcome &o) {
  return std::string(o.stats.variant).rfind("range/top-k, ", 0) == 0;
}

// The same pairs in the same order, distances bit for bit (NaN equal to
// NaN, as PostgreSQL's float8 has one NaN).
inline void expect_same(const std::vector<Triple> &want, const std::vector<Triple> &got,
                        const std::string &what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); i++) {
    ASSERT_EQ(std::get<0>(want[i]), std::get<0>(got[i])) << what << " pair " << i;
    ASSERT_EQ(std::get<1>(want[i]), std::get<1>(got[i])) << what << " pair " << i;
    const double a = std::get<2>(want[i]), b = std::get<2>(got[i]);
    if (std::isnan(a) && std::isnan(b)) continue;
    ASSERT_EQ(0, std::memcmp(&a, &b, sizeof a)) << what << " pair " << i << ": " << a << " vs " << b;
  }
}

inline const char *metric_name(KnnMetric m) {
  static const char *names[] = {"l2", "cosine", "ip", "l1", "hamming", "jaccard"};
  return names[m];
}

// A radius that is exactly one pair's distance: the boundary between < and <=.
template <class Rng>
double some_distance(const Case &c, Rng &rng) {
  const int64_t i = rng() % c.queries.n, j = rng() % c.targets.n;
  return reference::distance(c.metric, c.queries, i, c.targets, j);
}

// A self-join of n small-integer rows of 2 dimensions (duplicates
// everywhere) at radius 0, <=: every row finds itself and its duplicates.
template <class Rng>
Case duplicates_case(KnnMetric metric, KnnMethod method, int64_t n, Rng &rng) {
  Case c;
  c.queries = reference::make_rows(KNN_ELEMENT_FLOAT32, n, 2, rng);
  c.targets = c.queries;
  c.shared = true;
  c.metric = metric;
  c.method = method;
  c.radius = 0;
  c.range = KNN_RANGE_AT_MOST;
  return c;
}

// Keys = row numbers on both sides: a self-join's self-exclusion.
inline void exclude_self(Case *c) {
  for (int64_t i = 0; i < c->queries.n; i++) c->query_keys.push_back(i);
  c->target_keys = c->query_keys;
}

// A group (0..3) and a key (0..49) for every row; targets also in group 4,
// which no query has, and keys repeat, so a query loses several targets.
template <class Rng>
void add_groups_and_keys(Case *c, Rng &rng) {
  for (int64_t i = 0; i < c->queries.n; i++) {
    c->query_groups.push_back(rng() % 4);
    c->query_keys.push_back(rng() % 50);
  }
  for (int64_t j = 0; j < c->targets.n; j++) {
    c->target_groups.push_back(rng() % 5);
    c->target_keys.push_back(rng() % 50);
  }
}

// For clustered rows (make_rows' spread): a radius within one cluster (most
// pairs lie far beyond it), moved down onto one pair's distance, the
// boundary between < and <=.
template <class Rng>
double radius_within_clusters(const Case &c, Rng &rng, int tries) {
  double radius = c.metric == KNN_METRIC_L2 ? 0.2 : 0.5;
  for (int i = 0; i < tries; i++) {
    const double d = some_distance(c, rng);
    if (d < radius && d > 0) radius = d;
  }
  return radius;
}

// A job with far more pairs than its queue holds, whose caller takes a
// few and stops: the engine must wait on the full queue (bounded memory),
// not finish, and a cancel must end it within a second.
inline void expect_prompt_cancel(const KnnProblem &p) {
  char err[256] = "";
  KnnJob *job = knn_job_start(&p, nullptr, nullptr, err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  std::vector<int64_t> q(100), t(100);
  std::vector<double> d(100);
  EXPECT_GT(knn_job_take_pairs(job, q.data(), t.data(), d.data(), 100, 10000), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(knn_job_wait(job, 0), 0);  // blocked on the full queue, not finished
  const auto start = std::chrono::steady_clock::now();
  knn_job_cancel(job);
  KnnStats stats{};
  EXPECT_EQ(knn_job_finish(job, &stats, err, sizeof err), KNN_CANCELLED) << err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

}  // namespace range_cases
