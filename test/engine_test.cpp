// engine_test.cpp -- unit tests of the CPU engine (GoogleTest, no
// PostgreSQL). Run with `make unittest`.
//
// The reference is written here, independently of the engine: every pair's
// distance through kernels/knn_distance.h, a full sort with
// knn_result_before, self-match exclusion, padding. TI, brute force and
// AUTO must reproduce it bit for bit (neighbours, order and the bits of
// every distance) on many shapes and kinds of data, duplicates and exact
// ties included.
#include <dirent.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "cpu/bit_join.h"
#include "cpu/blas_library.h"
#include "cpu/cpu_engine.h"
#include "cpu/cpu_tuning.h"
#include "cpu/gemm_join.h"
#include "cpu/lane_sums.h"
#include "cpu/parallel_for.h"
#include "cpu/top_k.h"
#include "entry_guard.h"
#include "gpu_cold_start.h"
#include "half_float.h"
#include "problem_check.h"
#include "knn_distance.h"
#include "knn_engine.h"
#include "knn_vocabulary.h"

namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- data ----

struct Matrix {
  std::vector<float> values;
  int64_t rows = 0;
  int dim = 0;
  const float *row(int64_t i) const { return values.data() + i * dim; }
  float *row(int64_t i) { return values.data() + i * dim; }
};

enum class DataKind {
  kUniform,        // independent uniform values
  kBlobs,          // gaussian clusters
  kDuplicates,     // blobs in which many rows are exact copies of others
  kGrid,           // small integers: exact ties everywhere
  kNearTies,       // a few base rows plus last-bit noise: near-ties
};

const char *kind_name(DataKind kind) {
  switch (kind) {
    case DataKind::kUniform: return "uniform";
    case DataKind::kBlobs: return "blobs";
    case DataKind::kDuplicates: return "duplicates";
    case DataKind::kGrid: return "grid";
    case DataKind::kNearTies: return "near-ties";
  }
  return "?";
}

Matrix make_data(DataKind kind, int64_t rows, int dim, std::mt19937_64 &rng) {
  Matrix m;
  m.rows = rows;
  m.dim = dim;
  m.values.resize(static_cast<size_t>(rows) * dim);
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (kind) {
    case DataKind::kUniform:
      for (float &v : m.values) v = uniform(rng);
      break;
    case DataKind::kBlobs:
    case DataKind::kDuplicates: {
      const int n_blobs = 1 + static_cast<int>(rng() % 8);
      std::vector<float> centres(static_cast<size_t>(n_blobs) * dim);
      for (float &v : centres) v = uniform(rng) * 5.0f;
      for (int64_t i = 0; i < rows; i++) {
        const int b = static_cast<int>(rng() % n_blobs);
        const float spread = 0.1f + static_cast<float>(b);
        for (int j = 0; j < dim; j++)
          m.row(i)[j] = centres[b * dim + j] + spread * normal(rng);
      }
      if (kind == DataKind::kDuplicates && rows > 1)
        for (int64_t i = 0; i < rows; i++)
          if (rng() % 3 != 0) {  // two rows in three copy an earlier one
            const int64_t from = static_cast<int64_t>(rng() % std::max<int64_t>(1, i / 4 + 1));
            std::memcpy(m.row(i), m.row(from), sizeof(float) * dim);
          }
      break;
    }
    case DataKind::kGrid:
      for (float &v : m.values) v = static_cast<float>(rng() % 3);
      break;
    case DataKind::kNearTies: {
      const int n_base = 1 + static_cast<int>(rng() % 4);
      std::vector<float> base(static_cast<size_t>(n_base) * dim);
      for (float &v : base) v = uniform(rng);
      for (int64_t i = 0; i < rows; i++) {
        const int b = static_cast<int>(rng() % n_base);
        for (int j = 0; j < dim; j++) {
          float v = base[b * dim + j];
          const int nudge = static_cast<int>(rng() % 5) - 2;  // a few ulps
          for (int s = 0; s < std::abs(nudge); s++)
            v = std::nextafter(v, nudge > 0 ? 1e30f : -1e30f);
          m.row(i)[j] = v;
        }
      }
      break;
    }
  }
  return m;
}

Matrix take_rows(const Matrix &from, int64_t first, int64_t count) {
  Matrix m;
  m.rows = count;
  m.dim = from.dim;
  m.values.resize(static_cast<size_t>(count) * from.dim);
  for (int64_t i = 0; i < count; i++)
    std::memcpy(m.row(i), from.row(first + i), sizeof(float) * from.dim);
  return m;
}

// ----------------------------------------------------------- reference ----

struct Result {
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
};

double reference_distance(KnnMetric metric, const float *a, const float *b, int dim) {
  switch (metric) {
    case KNN_METRIC_L2:
      return knn_l2_from_squared(knn_l2_squared(a, b, dim));
    case KNN_METRIC_COSINE:
      return knn_cosine_from_dot(knn_dot(a, b, dim), knn_dot(a, a, dim), knn_dot(b, b, dim));
    case KNN_METRIC_IP:
      return knn_ip_from_dot(knn_dot(a, b, dim));
    case KNN_METRIC_L1:
      return knn_l1_from_sum(knn_l1_sum(a, b, dim));
    default:  // bit metrics: not a float join
      break;
  }
  return 0;
}

// All pairs, full sort: the definition of the right answer.
Result reference_join(const KnnProblem &p) {
  Result r;
  r.neighbors.assign(p.n_queries * p.k, -1);
  r.distances.assign(p.n_queries * p.k, std::numeric_limits<double>::quiet_NaN());
  std::vector<std::pair<double, int64_t>> all;
  for (int64_t q = 0; q < p.n_queries; q++) {
    all.clear();
    const float *qr = knn::float_rows(p.queries) + q * p.dim;
    for (int64_t t = 0; t < p.n_targets; t++) {
      if (p.query_keys != nullptr && p.query_keys[q] == p.target_keys[t]) continue;
      all.emplace_back(reference_distance(p.metric, qr, knn::float_rows(p.targets) + t * p.dim, p.dim), t);
    }
    std::sort(all.begin(), all.end(), [](const auto &a, const auto &b) {
      return knn_result_before(a.first, a.second, b.first, b.second);
    });
    for (size_t i = 0; i < all.size() && static_cast<int64_t>(i) < p.k; i++) {
      r.neighbors[q * p.k + i] = all[i].second;
      r.distances[q * p.k + i] = all[i].first;
    }
  }
  return r;
}

// ------------------------------------------------------------- running ----

KnnProblem make_problem(const Matrix &queries, const Matrix &targets, int k,
                        KnnMetric metric, KnnMethod method, int threads) {
  KnnProblem p{};
  p.queries = queries.values.data();
  p.n_queries = queries.rows;
  p.targets = targets.values.data();
  p.n_targets = targets.rows;
  p.dim = queries.dim;
  p.k = k;
  p.metric = metric;
  p.method = method;
  p.device = KNN_DEVICE_CPU;
  p.n_threads = threads;
  return p;
}

struct EngineRun {
  KnnStatus status;
  Result result;
  KnnStats stats;
  std::string error;
};

EngineRun run_engine(const KnnProblem &p, const int32_t *cancel = nullptr) {
  EngineRun run;
  run.result.neighbors.assign(std::max<int64_t>(1, p.n_queries * p.k), -7);
  run.result.distances.assign(std::max<int64_t>(1, p.n_queries * p.k), -7.0);
  char error[256] = "";
  run.status = knn::cpu_run(p, run.result.neighbors.data(), run.result.distances.data(),
                            &run.stats, cancel, error, sizeof error);
  run.error = error;
  run.result.neighbors.resize(p.n_queries * p.k);
  run.result.distances.resize(p.n_queries * p.k);
  return run;
}

// Bit-for-bit equality, with the first difference in the message.
::testing::AssertionResult same_result(const Result &expected, const Result &actual,
                                       int k) {
  if (expected.neighbors.size() != actual.neighbors.size())
    return ::testing::AssertionFailure() << "result sizes differ";
  for (size_t i = 0; i < expected.neighbors.size(); i++) {
    if (expected.neighbors[i] != actual.neighbors[i] ||
        std::memcmp(&expected.distances[i], &actual.distances[i], sizeof(double)) != 0)
      return ::testing::AssertionFailure()
             << "query " << i / k << " rank " << i % k << ": expected row "
             << expected.neighbors[i] << " at " << expected.distances[i] << ", got row "
             << actual.neighbors[i] << " at " << actual.distances[i];
  }
  return ::testing::AssertionSuccess();
}

const KnnMetric kMetrics[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP,
                              KNN_METRIC_L1};

// Runs TI, brute force and AUTO (threads 1 or 2) and compares each with
// the reference.
void expect_all_methods_match(const KnnProblem &base, const std::string &what,
                              int threads) {
  const Result expected = reference_join(base);
  for (KnnMethod method : {KNN_METHOD_TI, KNN_METHOD_BRUTE, KNN_METHOD_AUTO}) {
    KnnProblem p = base;
    p.method = method;
    p.n_threads = threads;
    const EngineRun run = run_engine(p);
    ASSERT_EQ(run.status, KNN_OK) << what << ": " << run.error;
    EXPECT_TRUE(same_result(expected, run.result, p.k))
        << what << " method " << knn_method_name(method) << " (ran "
        << knn_method_name(run.stats.method) << "), threads "
        << threads;
  }
}

// -------------------------------------------------------- building blocks -

// lane_sums must return exactly what knn_distance.h returns, for every
// dimension (full lane groups and every tail length) and batch size.
TEST(LaneSums, BitIdenticalToCanonicalDistances) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-100.0f, 100.0f);
  for (int dim = 1; dim <= 300; dim += (dim < 40 ? 1 : 13)) {
    const int64_t count = 1 + static_cast<int64_t>(rng() % 21);
    std::vector<float> q(dim), t(count * dim);
    for (float &v : q) v = u(rng);
    for (float &v : t) v = u(rng);
    std::vector<const float *> rows(count);
    for (int64_t r = 0; r < count; r++) rows[r] = &t[r * dim];
    for (KnnMetric metric : kMetrics) {
      std::vector<float> stored(count), scattered(count);
      knn::cpu::lane_sums(metric, q.data(), t.data(), count, dim, stored.data());
      knn::cpu::lane_sums_scattered(metric, q.data(), rows.data(), count, dim,
                                    scattered.data());
      for (int64_t r = 0; r < count; r++) {
        const float *b = &t[r * dim];
        const float expected = metric == KNN_METRIC_L2 ? knn_l2_squared(q.data(), b, dim)
                               : metric == KNN_METRIC_L1 ? knn_l1_sum(q.data(), b, dim)
                                                         : knn_dot(q.data(), b, dim);
        ASSERT_EQ(0, std::memcmp(&expected, &stored[r], sizeof(float)))
            << "dim " << dim << " metric " << knn_metric_name(metric) << " row " << r;
        ASSERT_EQ(0, std::memcmp(&expected, &scattered[r], sizeof(float)))
            << "dim " << dim << " metric " << knn_metric_name(metric) << " row " << r;
      }
    }
  }
}

TEST(TopK, KeepsTheBestInResultOrder) {
  std::mt19937_64 rng(2);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int trial = 0; trial < 200; trial++) {
    const int n = 1 + static_cast<int>(rng() % 60);
    const int k = 1 + static_cast<int>(rng() % 30);
    std::vector<std::pair<double, int64_t>> pairs;
    for (int i = 0; i < n; i++) {
      const int pick = static_cast<int>(rng() % 10);
      const double d = pick == 0 ? nan : static_cast<double>(rng() % 5);  // many ties
      pairs.emplace_back(d, i);
    }
    std::shuffle(pairs.begin(), pairs.end(), rng);
    knn::cpu::TopK top(std::min(k, n));
    for (const auto &[d, i] : pairs) top.offer(d, i);
    std::vector<int64_t> got(k);
    std::vector<double> got_d(k);
    top.write_sorted(k, got.data(), got_d.data(), [](double x) { return x; });

    std::sort(pairs.begin(), pairs.end(), [](const auto &a, const auto &b) {
      return knn_result_before(a.first, a.second, b.first, b.second);
    });
    for (int r = 0; r < k; r++) {
      if (r < n) {
        ASSERT_EQ(got[r], pairs[r].second) << "trial " << trial << " rank " << r;
        ASSERT_EQ(0, std::memcmp(&got_d[r], &pairs[r].first, sizeof(double)));
      } else {
        ASSERT_EQ(got[r], -1);
        ASSERT_TRUE(std::isnan(got_d[r]));
      }
    }
  }
}

// ------------------------------------------------------- the join itself --

// Many random shapes: every listed dimension x metric x kind of data, with
// |Q| != |T|, |Q| = 1, k from 1 to 100 and beyond |T|.
TEST(CpuEngine, MatchesReferenceOnRandomShapes) {
  const int dims[] = {1, 2, 3, 4, 7, 8, 9, 17, 28, 64, 128, 300};
  const DataKind kinds[] = {DataKind::kUniform, DataKind::kBlobs, DataKind::kDuplicates,
                            DataKind::kGrid, DataKind::kNearTies};
  std::mt19937_64 rng(3);
  int cases = 0;
  for (int dim : dims) {
    for (KnnMetric metric : kMetrics) {
      for (DataKind kind : kinds) {
        // Smaller sets in many dimensions keep the reference affordable.
        const int64_t max_rows = dim <= 32 ? 700 : dim <= 128 ? 300 : 150;
        int64_t n_targets = 1 + static_cast<int64_t>(rng() % max_rows);
        int64_t n_queries = rng() % 4 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % max_rows);
        int k;
        switch (rng() % 4) {
          case 0: k = 1; break;
          case 1: k = 1 + static_cast<int>(rng() % 20); break;
          case 2: k = 1 + static_cast<int>(rng() % 100); break;
          default: k = static_cast<int>(n_targets) + 1 + static_cast<int>(rng() % 5); break;
        }
        // Queries from the same distribution: draw both sets as one.
        Matrix all = make_data(kind, n_queries + n_targets, dim, rng);
        const Matrix queries = take_rows(all, 0, n_queries);
        const Matrix targets = take_rows(all, n_queries, n_targets);

        const KnnProblem p = make_problem(queries, targets, k, metric, KNN_METHOD_AUTO, 1);
        const std::string what = std::string(kind_name(kind)) + " dim " +
                                 std::to_string(dim) + " " + knn_metric_name(metric) + " |Q| " +
                                 std::to_string(n_queries) + " |T| " +
                                 std::to_string(n_targets) + " k " + std::to_string(k);
        expect_all_methods_match(p, what, 1 + cases % 2);
        cases++;
      }
    }
  }
  EXPECT_EQ(cases, 12 * 4 * 5);
}

// Larger low-dimensional sets, where TI forms many clusters and prunes a
// lot; the shapes the real data sets have (few dimensions, many copies).
TEST(CpuEngine, MatchesReferenceOnLargerClusteredSets) {
  std::mt19937_64 rng(4);
  struct Shape {
    DataKind kind;
    int dim;
    int64_t n;
    int k;
  };
  const Shape shapes[] = {
      {DataKind::kDuplicates, 4, 4000, 20}, {DataKind::kGrid, 3, 3000, 20},
      {DataKind::kBlobs, 28, 3000, 20},     {DataKind::kNearTies, 8, 2000, 10},
      {DataKind::kBlobs, 2, 5000, 50},      {DataKind::kUniform, 9, 2500, 5},
  };
  for (const Shape &s : shapes)
    for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1}) {
      const Matrix data = make_data(s.kind, s.n, s.dim, rng);
      const Matrix queries = make_data(s.kind, s.n / 3, s.dim, rng);
      const KnnProblem p = make_problem(queries, data, s.k, metric, KNN_METHOD_TI, 2);
      const Result expected = reference_join(p);
      for (int threads : {1, 2}) {
        KnnProblem ti = p;
        ti.n_threads = threads;
        const EngineRun run = run_engine(ti);
        ASSERT_EQ(run.status, KNN_OK) << run.error;
        EXPECT_EQ(run.stats.method, KNN_METHOD_TI);
        EXPECT_LT(run.stats.distance_computations, run.stats.pairs)
            << kind_name(s.kind) << ": TI pruned nothing";
        EXPECT_TRUE(same_result(expected, run.result, p.k))
            << kind_name(s.kind) << " dim " << s.dim << " " << knn_metric_name(metric)
            << " threads " << threads;
      }
    }
}

// Points on a line, at multiples of a large spacing: every triangle is
// degenerate, so the TI bounds are tight, and the squares are rounded, so
// a computed distance can exceed a computed bound by an ulp; symmetric
// positions give exact ties. This is where a missing rounding margin or a
// tie pruned too early shows.
TEST(CpuEngine, TightBoundsOnALine) {
  std::mt19937_64 rng(13);
  int cases = 0;
  for (int trial = 0; trial < 120; trial++) {
    const int dim = 1 + trial % 3;
    const float direction[3] = {1.0f, -2.0f, 3.0f};
    const double spacing = 1000.0 + static_cast<double>(rng() % 5000) / 7.0;
    const double origin = static_cast<double>(rng() % 100000);
    auto make_line = [&](int64_t rows, int64_t positions) {
      Matrix m;
      m.rows = rows;
      m.dim = dim;
      m.values.resize(rows * dim);
      for (int64_t i = 0; i < rows; i++) {
        const double at = origin + spacing * static_cast<double>(rng() % positions);
        for (int j = 0; j < dim; j++) m.row(i)[j] = static_cast<float>(at * direction[j]);
      }
      return m;
    };
    const int64_t positions = 20 + static_cast<int64_t>(rng() % 400);
    const Matrix targets = make_line(50 + static_cast<int64_t>(rng() % 600), positions);
    const Matrix queries = make_line(1 + static_cast<int64_t>(rng() % 300), positions);
    const int k = 1 + static_cast<int>(rng() % 4);
    for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1}) {
      const KnnProblem p = make_problem(queries, targets, k, metric, KNN_METHOD_TI, 1);
      const Result expected = reference_join(p);
      const EngineRun run = run_engine(p);
      ASSERT_EQ(run.status, KNN_OK) << run.error;
      EXPECT_TRUE(same_result(expected, run.result, k))
          << "trial " << trial << " dim " << dim << " " << knn_metric_name(metric);
      // And the self-join of the targets.
      std::vector<int64_t> keys(targets.rows);
      for (int64_t i = 0; i < targets.rows; i++) keys[i] = i;
      KnnProblem self = make_problem(targets, targets, k, metric, KNN_METHOD_TI, 2);
      self.query_keys = keys.data();
      self.target_keys = keys.data();
      const EngineRun self_run = run_engine(self);
      ASSERT_EQ(self_run.status, KNN_OK) << self_run.error;
      EXPECT_TRUE(same_result(reference_join(self), self_run.result, k))
          << "self-join trial " << trial << " dim " << dim << " " << knn_metric_name(metric);
      cases++;
    }
  }
  EXPECT_EQ(cases, 240);
}

// The all-kNN graph of one table: queries and targets are the same rows,
// each row's own key excluded.
TEST(CpuEngine, SelfJoinExcludesEqualKeys) {
  std::mt19937_64 rng(5);
  const DataKind kinds[] = {DataKind::kDuplicates, DataKind::kGrid, DataKind::kBlobs,
                            DataKind::kNearTies, DataKind::kUniform};
  int cases = 0;
  for (DataKind kind : kinds)
    for (KnnMetric metric : kMetrics)
      for (int dim : {1, 4, 17, 64}) {
        const int64_t n = 1 + static_cast<int64_t>(rng() % (dim <= 17 ? 1500 : 400));
        const Matrix data = make_data(kind, n, dim, rng);
        std::vector<int64_t> keys(n);
        for (int64_t i = 0; i < n; i++) keys[i] = 1000 + i;
        const int k = 1 + static_cast<int>(rng() % 25);
        KnnProblem p = make_problem(data, data, k, metric, KNN_METHOD_AUTO, 2);
        p.query_keys = keys.data();
        p.target_keys = keys.data();
        expect_all_methods_match(
            p, std::string("self-join ") + kind_name(kind) + " " + knn_metric_name(metric) +
                   " dim " + std::to_string(dim) + " n " + std::to_string(n) + " k " +
                   std::to_string(k),
            1 + cases % 2);
        cases++;
      }
}

// Keys need not be unique: a query then loses every target sharing its
// key, which level 1 of TI must allow for.
TEST(CpuEngine, RepeatedKeysExcludeEveryMatch) {
  std::mt19937_64 rng(6);
  for (int group : {2, 3, 7, 40}) {
    const int64_t n = 1200;
    const Matrix data = make_data(DataKind::kDuplicates, n, 3, rng);
    std::vector<int64_t> keys(n);
    for (int64_t i = 0; i < n; i++) keys[i] = i / group;  // runs of equal keys
    for (int k : {1, 5, 30}) {
      KnnProblem p = make_problem(data, data, k, KNN_METRIC_L2, KNN_METHOD_TI, 2);
      p.query_keys = keys.data();
      p.target_keys = keys.data();
      expect_all_methods_match(p, "keys in groups of " + std::to_string(group), 2);
    }
  }
  // Query keys that match no target exclude nothing.
  const Matrix q = make_data(DataKind::kBlobs, 300, 5, rng);
  const Matrix t = make_data(DataKind::kBlobs, 500, 5, rng);
  std::vector<int64_t> qk(300, -1), tk(500);
  for (int64_t i = 0; i < 500; i++) tk[i] = i;
  KnnProblem p = make_problem(q, t, 10, KNN_METRIC_L1, KNN_METHOD_TI, 1);
  p.query_keys = qk.data();
  p.target_keys = tk.data();
  expect_all_methods_match(p, "disjoint keys", 1);
}

// Duplicate rows on two different sets, with keys that repeat on both (the
// TI join merges identical rows; each row then drops its own excluded
// targets), and a self-join whose groups of identical rows outnumber k + 1:
// lists full of distance 0, where the merged rows and the skip over equal
// distances must still give the reference's rows, in row order.
TEST(CpuEngine, DuplicateGroupsWithKeys) {
  std::mt19937_64 rng(11);
  for (int dim : {2, 9, 30}) {
    const Matrix q = make_data(DataKind::kDuplicates, 700, dim, rng);
    const Matrix t = make_data(DataKind::kDuplicates, 900, dim, rng);
    std::vector<int64_t> qk(700), tk(900);
    for (int64_t i = 0; i < 700; i++) qk[i] = i % 50;
    for (int64_t i = 0; i < 900; i++) tk[i] = i % 70;
    for (int k : {1, 8, 25}) {
      KnnProblem p = make_problem(q, t, k, KNN_METRIC_L2, KNN_METHOD_TI, 2);
      p.query_keys = qk.data();
      p.target_keys = tk.data();
      expect_all_methods_match(p, "separate sets with duplicates, dim " + std::to_string(dim) +
                                      " k " + std::to_string(k), 2);
    }
  }
  Matrix groups;
  groups.rows = 1200;
  groups.dim = 6;
  groups.values.resize(1200 * 6);
  for (int64_t i = 0; i < 1200; i++)
    for (int d = 0; d < 6; d++) groups.values[i * 6 + d] = static_cast<float>((i / 40) * 3 + d);
  std::vector<int64_t> ids(1200);
  for (int64_t i = 0; i < 1200; i++) ids[i] = i;
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1})
    for (int k : {5, 39, 45}) {
      KnnProblem p = make_problem(groups, groups, k, metric, KNN_METHOD_TI, 2);
      p.query_keys = ids.data();
      p.target_keys = ids.data();
      expect_all_methods_match(p, std::string("groups of 40 identical rows, ") +
                                      knn_metric_name(metric) + " k " + std::to_string(k), 2);
    }
}

// Every row the same point: every distance ties, order is by row alone.
TEST(CpuEngine, AllRowsIdentical) {
  for (int dim : {1, 5, 33}) {
    Matrix data;
    data.rows = 700;
    data.dim = dim;
    data.values.assign(700 * dim, 1.5f);
    std::vector<int64_t> keys(700);
    for (int i = 0; i < 700; i++) keys[i] = i;
    for (KnnMetric metric : kMetrics) {
      KnnProblem p = make_problem(data, data, 12, metric, KNN_METHOD_AUTO, 2);
      p.query_keys = keys.data();
      p.target_keys = keys.data();
      expect_all_methods_match(p, "identical rows", 2);
      // Expected by hand too: row 0 for every query but the first, etc.
      const Result r = reference_join(p);
      EXPECT_EQ(r.neighbors[0], 1);
      EXPECT_EQ(r.neighbors[12], 0);
    }
  }
}

TEST(CpuEngine, EdgeSizes) {
  std::mt19937_64 rng(7);
  const Matrix one = make_data(DataKind::kUniform, 1, 6, rng);
  const Matrix some = make_data(DataKind::kUniform, 9, 6, rng);
  for (KnnMetric metric : kMetrics) {
    // One target; one query; k far beyond |T|.
    expect_all_methods_match(make_problem(some, one, 1, metric, KNN_METHOD_AUTO, 1),
                             "one target", 1);
    expect_all_methods_match(make_problem(one, some, 3, metric, KNN_METHOD_AUTO, 2),
                             "one query", 2);
    expect_all_methods_match(make_problem(some, some, 1000, metric, KNN_METHOD_AUTO, 2),
                             "k > |T|", 2);
  }
  // k in the tens of thousands: the engines then hold fewer queries' lists
  // at a time.
  const Matrix many = make_data(DataKind::kDuplicates, 40000, 2, rng);
  const Matrix few = make_data(DataKind::kDuplicates, 3, 2, rng);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_COSINE})
    expect_all_methods_match(make_problem(few, many, 40000, metric, KNN_METHOD_AUTO, 2),
                             "k = |T| = 40000", 2);

  // No targets: every slot is padding.
  Matrix none;
  none.dim = 6;
  const EngineRun run = run_engine(make_problem(some, none, 4, KNN_METRIC_L2, KNN_METHOD_TI, 1));
  ASSERT_EQ(run.status, KNN_OK);
  for (size_t i = 0; i < run.result.neighbors.size(); i++) {
    EXPECT_EQ(run.result.neighbors[i], -1);
    EXPECT_TRUE(std::isnan(run.result.distances[i]));
  }
  // No queries: nothing to do, nothing written.
  const EngineRun empty = run_engine(make_problem(none, some, 4, KNN_METRIC_L2, KNN_METHOD_TI, 1));
  EXPECT_EQ(empty.status, KNN_OK);
}

// Values the TI bounds cannot use (non-finite, or so large that sums
// overflow) and cosine's zero vectors (NaN distances, sorted last).
TEST(CpuEngine, NonFiniteAndExtremeValues) {
  std::mt19937_64 rng(8);
  Matrix data = make_data(DataKind::kBlobs, 400, 7, rng);
  data.row(3)[0] = std::numeric_limits<float>::infinity();
  data.row(10)[2] = -std::numeric_limits<float>::infinity();
  data.row(17)[5] = std::numeric_limits<float>::quiet_NaN();
  for (KnnMetric metric : kMetrics) {
    const EngineRun ti = run_engine(make_problem(data, data, 9, metric, KNN_METHOD_TI, 2));
    EXPECT_EQ(ti.stats.method, KNN_METHOD_BRUTE);  // TI declines such data
    expect_all_methods_match(make_problem(data, data, 9, metric, KNN_METHOD_AUTO, 2),
                             "non-finite values", 2);
  }

  Matrix huge = make_data(DataKind::kUniform, 300, 9, rng);
  for (float &v : huge.values) v *= 1e36f;  // squares overflow to inf
  for (KnnMetric metric : kMetrics)
    expect_all_methods_match(make_problem(huge, huge, 7, metric, KNN_METHOD_AUTO, 1),
                             "huge values", 1);

  Matrix tiny = make_data(DataKind::kBlobs, 300, 9, rng);
  for (float &v : tiny.values) v *= 1e-40f;  // denormal values and sums
  for (KnnMetric metric : kMetrics)
    expect_all_methods_match(make_problem(tiny, tiny, 7, metric, KNN_METHOD_AUTO, 1),
                             "denormal values", 1);

  Matrix zeros = make_data(DataKind::kUniform, 200, 4, rng);
  for (int64_t i = 0; i < 200; i += 7) std::fill(zeros.row(i), zeros.row(i) + 4, 0.0f);
  expect_all_methods_match(make_problem(zeros, zeros, 15, KNN_METRIC_COSINE,
                                        KNN_METHOD_AUTO, 2),
                           "cosine with zero vectors", 2);
}

TEST(CpuEngine, StatsDescribeTheRun) {
  std::mt19937_64 rng(9);
  const Matrix data = make_data(DataKind::kBlobs, 3000, 3, rng);
  EngineRun ti = run_engine(make_problem(data, data, 10, KNN_METRIC_L2, KNN_METHOD_TI, 2));
  ASSERT_EQ(ti.status, KNN_OK);
  EXPECT_EQ(ti.stats.device, KNN_DEVICE_CPU);
  EXPECT_STREQ(ti.stats.device_name, "cpu (2 threads)");
  EXPECT_EQ(ti.stats.method, KNN_METHOD_TI);
  EXPECT_EQ(ti.stats.pairs, 3000 * 3000);
  EXPECT_GT(ti.stats.query_clusters, 1);
  EXPECT_GT(ti.stats.target_clusters, 1);
  EXPECT_GT(ti.stats.distance_computations, 0);
  EXPECT_LT(ti.stats.distance_computations, ti.stats.pairs);
  EXPECT_GT(ti.stats.seconds_total, 0.0);
  EXPECT_LE(ti.stats.seconds_cluster, ti.stats.seconds_total);

  EngineRun brute = run_engine(make_problem(data, data, 10, KNN_METRIC_L2, KNN_METHOD_BRUTE, 1));
  ASSERT_EQ(brute.status, KNN_OK);
  EXPECT_STREQ(brute.stats.device_name, "cpu (1 thread)");
  EXPECT_EQ(brute.stats.method, KNN_METHOD_BRUTE);
  // The AVX2 loop computes every pair; the SGEMM one re-ranks candidates.
  if (std::string(brute.stats.variant).rfind("blas", 0) == 0)
    EXPECT_LE(brute.stats.distance_computations, brute.stats.pairs);
  else
    EXPECT_EQ(brute.stats.distance_computations, brute.stats.pairs);

  // Inner product and cosine always run brute force.
  EngineRun ip = run_engine(make_problem(data, data, 10, KNN_METRIC_IP, KNN_METHOD_TI, 1));
  EXPECT_EQ(ip.stats.method, KNN_METHOD_BRUTE);

  // AUTO keeps TI where it prunes (clustered, few dimensions) ...
  EngineRun auto_ti = run_engine(make_problem(data, data, 10, KNN_METRIC_L2, KNN_METHOD_AUTO, 2));
  EXPECT_EQ(auto_ti.stats.method, KNN_METHOD_TI);
  // ... and hands over to brute force after sampling where it cannot
  // (uniform data in 64 dimensions), with the same results; where the
  // SGEMM brute force is far faster than the AVX2 one it skips sampling.
  const Matrix uniform = make_data(DataKind::kUniform, 1500, 64, rng);
  const KnnProblem p = make_problem(uniform, uniform, 10, KNN_METRIC_L2, KNN_METHOD_AUTO, 2);
  EngineRun declined = run_engine(p);
  ASSERT_EQ(declined.status, KNN_OK);
  EXPECT_EQ(declined.stats.method, KNN_METHOD_BRUTE);
  if (std::string(declined.stats.variant).rfind("blas", 0) != 0) {
    EXPECT_NE(std::string(declined.stats.variant).find("ti sample"), std::string::npos)
        << declined.stats.variant;
    EXPECT_GT(declined.stats.seconds_cluster, 0.0);
  }
  EXPECT_TRUE(same_result(reference_join(p), declined.result, p.k));
}

TEST(CpuEngine, InvalidArguments) {
  std::mt19937_64 rng(10);
  const Matrix data = make_data(DataKind::kUniform, 20, 4, rng);
  std::vector<int64_t> keys(20, 1);
  auto status_of = [&](KnnProblem p) {
    std::vector<int64_t> n(20 * 8);
    std::vector<double> d(20 * 8);
    char error[256] = "";
    const KnnStatus s = knn::cpu_run(p, n.data(), d.data(), nullptr, nullptr, error, sizeof error);
    if (s != KNN_OK) {
      EXPECT_NE(error[0], '\0');
    }
    return s;
  };
  const KnnProblem good = make_problem(data, data, 5, KNN_METRIC_L2, KNN_METHOD_AUTO, 1);
  EXPECT_EQ(status_of(good), KNN_OK);
  KnnProblem p = good;
  p.k = 0;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p = good;
  p.k = -3;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p = good;
  p.dim = 0;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p = good;
  p.n_targets = -1;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p = good;
  p.queries = nullptr;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p = good;
  p.query_keys = keys.data();  // without target_keys
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p = good;
  const int unknown = 9;  // as C may store it; no C++ enum holds it
  std::memcpy(&p.metric, &unknown, sizeof unknown);
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p = good;
  p.n_threads = -1;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p = good;
  p.n_threads = KNN_MAX_THREADS + 1;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p.n_threads = KNN_MAX_THREADS;
  EXPECT_EQ(status_of(p), KNN_OK);
  p = good;
  std::memcpy(&p.device, &unknown, sizeof unknown);
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  // The GPU list (knn_gpu.devices) is checked by every engine.
  p = good;
  p.n_devices = KNN_MAX_DEVICES + 1;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p.n_devices = -1;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p.n_devices = 2;
  p.devices[0] = 0;
  p.devices[1] = -4;
  EXPECT_EQ(status_of(p), KNN_INVALID_ARGUMENT);
  p.devices[1] = 0;  // a GPU listed twice: the test mode, valid
  EXPECT_EQ(status_of(p), KNN_OK);
  char error[256] = "";
  EXPECT_EQ(knn::cpu_run(good, nullptr, nullptr, nullptr, nullptr, error, sizeof error),
            KNN_INVALID_ARGUMENT);
}

// ------------------------------------------------------------ cancelling --

// A join that would run for many seconds stops soon after the flag is set,
// in whichever phase it is (clustering, level 1/2, brute force).
TEST(CpuEngine, CancelStopsQuickly) {
  std::mt19937_64 rng(11);
  const Matrix wide = make_data(DataKind::kUniform, 20000, 784, rng);
  const Matrix narrow = make_data(DataKind::kDuplicates, 300000, 4, rng);
  struct Case {
    const Matrix *data;
    KnnMethod method;
    int delay_ms;
  };
  const Case cases[] = {
      {&wide, KNN_METHOD_BRUTE, 30},  {&wide, KNN_METHOD_TI, 5},
      {&wide, KNN_METHOD_TI, 300},    {&narrow, KNN_METHOD_TI, 20},
      {&narrow, KNN_METHOD_TI, 250},  {&narrow, KNN_METHOD_BRUTE, 50},
  };
  for (const Case &c : cases) {
    const KnnProblem p = make_problem(*c.data, *c.data, 20, KNN_METRIC_L2, c.method, 2);
    int32_t cancel = 0;
    Clock::time_point cancelled_at;
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(c.delay_ms));
      cancelled_at = Clock::now();
      __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
    });
    const EngineRun run = run_engine(p, &cancel);
    const Clock::time_point returned = Clock::now();
    canceller.join();
    EXPECT_EQ(run.status, KNN_CANCELLED)
        << "method " << knn_method_name(c.method) << " delay " << c.delay_ms;
    const double late_ms =
        std::chrono::duration<double, std::milli>(returned - cancelled_at).count();
    // ~50 ms is the goal; allow for a loaded CI machine.
    EXPECT_LT(late_ms, 250.0) << "method " << knn_method_name(c.method) << " delay " << c.delay_ms;
    RecordProperty("cancel_latency_ms", std::to_string(late_ms));
  }
  // A flag set before the start: nothing runs.
  int32_t cancel = 1;
  const EngineRun run = run_engine(make_problem(wide, wide, 5, KNN_METRIC_L2, KNN_METHOD_AUTO, 2),
                             &cancel);
  EXPECT_EQ(run.status, KNN_CANCELLED);
}

// ---------------------------------------------------------- the job API ---

// Runs a problem through the job API, as the extension does.
struct JobRun {
  bool started = false;
  KnnStatus status = KNN_INTERNAL_ERROR;
  std::string message;
  KnnStats stats{};
  Result result;
};

JobRun run_job(const KnnProblem &p) {
  JobRun run;
  run.result.neighbors.assign(p.n_queries * p.k, -7);
  run.result.distances.assign(p.n_queries * p.k, -7.0);
  char err[256] = "";
  KnnJob *job = knn_job_start(&p, run.result.neighbors.data(), run.result.distances.data(), err,
                              sizeof err);
  run.message = err;
  if (job == nullptr) return run;
  run.started = true;
  while (!knn_job_wait(job, 100)) {
  }
  run.status = knn_job_finish(job, &run.stats, err, sizeof err);
  run.message = err;
  return run;
}

TEST(JobApi, CpuJobMatchesReferenceAndCancels) {
  std::mt19937_64 rng(12);
  const Matrix data = make_data(DataKind::kDuplicates, 2000, 6, rng);
  KnnProblem p = make_problem(data, data, 8, KNN_METRIC_L2, KNN_METHOD_AUTO, 2);
  const JobRun run = run_job(p);
  ASSERT_EQ(run.status, KNN_OK) << run.message;
  EXPECT_TRUE(same_result(reference_join(p), run.result, p.k));
  EXPECT_EQ(run.stats.device, KNN_DEVICE_CPU);
  EXPECT_EQ(run.stats.method, KNN_METHOD_TI);

  const Matrix wide = make_data(DataKind::kUniform, 20000, 784, rng);
  KnnProblem big = make_problem(wide, wide, 10, KNN_METRIC_L2, KNN_METHOD_BRUTE, 2);
  std::vector<int64_t> bn(big.n_queries * big.k);
  std::vector<double> bd(big.n_queries * big.k);
  char err[256] = "";
  KnnJob *job = knn_job_start(&big, bn.data(), bd.data(), err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  EXPECT_EQ(knn_job_wait(job, 50), 0);
  knn_job_cancel(job);
  const Clock::time_point cancelled_at = Clock::now();
  EXPECT_EQ(knn_job_wait(job, 2000), 1);
  const double late_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - cancelled_at).count();
  EXPECT_LT(late_ms, 250.0);
  EXPECT_EQ(knn_job_finish(job, nullptr, err, sizeof err), KNN_CANCELLED);
}

// Every fault the engine can be told to inject ends as a status and a
// message, frees the job, and leaves the engine working.
TEST(JobApi, InjectedFaultsBecomeStatuses) {
  std::mt19937_64 rng(14);
  const Matrix data = make_data(DataKind::kBlobs, 500, 4, rng);
  const KnnProblem p = make_problem(data, data, 5, KNN_METRIC_L2, KNN_METHOD_AUTO, 2);
  const Result expected = reference_join(p);
  struct Case {
    KnnFault fault;
    bool starts;
    KnnStatus status;
    const char *message;
  };
  const Case cases[] = {
      {KNN_FAULT_START, false, KNN_INTERNAL_ERROR, "knn_job_start: fault injection"},
      {KNN_FAULT_RUN, true, KNN_INTERNAL_ERROR, "engine: fault injection"},
      {KNN_FAULT_BAD_ALLOC, true, KNN_OUT_OF_MEMORY, "engine: out of memory"},
      {KNN_FAULT_FINISH, true, KNN_INTERNAL_ERROR, "knn_job_finish: fault injection"},
  };
  for (const Case &c : cases) {
    KnnProblem faulty = p;
    faulty.fault = c.fault;
    const JobRun run = run_job(faulty);
    EXPECT_EQ(run.started, c.starts) << knn_fault_name(c.fault);
    if (c.starts) {
      EXPECT_EQ(run.status, c.status) << knn_fault_name(c.fault);
    }
    EXPECT_EQ(run.message, c.message);
    const JobRun after = run_job(p);
    ASSERT_EQ(after.status, KNN_OK) << after.message;
    EXPECT_TRUE(same_result(expected, after.result, p.k)) << "after " << knn_fault_name(c.fault);
  }
}

// The entries take NULL without crashing and always say something.
TEST(JobApi, EntriesAcceptNull) {
  char err[128] = "";
  EXPECT_EQ(knn_job_start(nullptr, nullptr, nullptr, err, sizeof err), nullptr);
  EXPECT_NE(err[0], '\0');
  EXPECT_EQ(knn_job_wait(nullptr, 10), 1);
  knn_job_cancel(nullptr);
  EXPECT_EQ(knn_job_finish(nullptr, nullptr, err, sizeof err), KNN_INVALID_ARGUMENT);
  EXPECT_NE(err[0], '\0');
  knn_engine_describe(nullptr, 0);
  char line[8];
  knn_engine_describe(line, sizeof line);  // truncated, still terminated
  EXPECT_EQ(std::strlen(line), sizeof line - 1);
}

TEST(EntryGuard, EveryExceptionBecomesAStatus) {
  char msg[64];
  EXPECT_EQ(knn::guarded("here", msg, sizeof msg, []() -> KnnStatus { throw std::bad_alloc(); }),
            KNN_OUT_OF_MEMORY);
  EXPECT_STREQ(msg, "here: out of memory");
  EXPECT_EQ(knn::guarded("here", msg, sizeof msg,
                         []() -> KnnStatus { throw std::runtime_error("boom"); }),
            KNN_INTERNAL_ERROR);
  EXPECT_STREQ(msg, "here: boom");
  EXPECT_EQ(knn::guarded("here", msg, sizeof msg, []() -> KnnStatus { throw 42; }),
            KNN_INTERNAL_ERROR);
  EXPECT_STREQ(msg, "here: unknown exception");
  EXPECT_EQ(knn::guarded("here", nullptr, 0, [] { return KNN_CANCELLED; }), KNN_CANCELLED);
  char small[5];
  const std::string longer = "truncated";
  knn::copy_message(small, sizeof small, longer.c_str());
  EXPECT_STREQ(small, "trun");
}

// ------------------------------------------------------- engine threads --

// SigBlk of a thread's /proc status file.
std::string blocked_signals(const std::string &status_path) {
  std::ifstream status(status_path);
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("SigBlk:", 0) == 0) return line.substr(line.find_first_not_of(" \t", 7));
  return "";
}

// What SigBlk reads when a thread blocks every signal it can.
std::string every_signal_blocked() {
  std::string mask;
  std::thread probe([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    mask = blocked_signals("/proc/thread-self/status");
  });
  probe.join();
  return mask;
}

// A thread caught while pthread_create starts it blocks even glibc's
// internal signals for a moment: a superset of `all` counts as blocked.
bool blocks_at_least(const std::string &mask, const std::string &all) {
  if (mask.empty() || all.empty()) return false;
  const unsigned long long m = std::stoull(mask, nullptr, 16), a = std::stoull(all, nullptr, 16);
  return (m & a) == a;
}

bool same_mask(const sigset_t &a, const sigset_t &b) {
  for (int sig = 1; sig < NSIG; sig++)
    if (sigismember(&a, sig) != sigismember(&b, sig)) return false;
  return true;
}

// PostgreSQL's handlers must never run on an engine thread: the job
// thread and every worker start with all signals blocked, and the
// caller's own mask is left as it was.
TEST(EngineThreads, StartWithEverySignalBlocked) {
  const std::string all = every_signal_blocked();
  ASSERT_FALSE(all.empty());
  ASSERT_NE(blocked_signals("/proc/thread-self/status"), all);

  // parallel_for: each of three workers holds an item until all have one.
  std::atomic<int> holding{0};
  std::vector<std::string> worker_masks(3);
  knn::cpu::parallel_for(3, 3, nullptr, [&](int64_t, int worker) {
    holding++;
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(5);
    while (holding.load() < 3 && Clock::now() < give_up) std::this_thread::yield();
    worker_masks[worker] = blocked_signals("/proc/thread-self/status");
  });
  EXPECT_EQ(holding.load(), 3);
  EXPECT_NE(worker_masks[0], all);  // the caller's thread, unchanged
  EXPECT_EQ(worker_masks[1], all);
  EXPECT_EQ(worker_masks[2], all);

  // The job API: every thread but this one while a long join runs (L1:
  // the AVX2 loop, slow enough to look at), OpenBLAS's threads included.
  std::mt19937_64 rng(15);
  const Matrix wide = make_data(DataKind::kUniform, 6000, 256, rng);
  const KnnProblem p = make_problem(wide, wide, 10, KNN_METRIC_L1, KNN_METHOD_BRUTE, 2);
  std::vector<int64_t> n(p.n_queries * p.k);
  std::vector<double> d(p.n_queries * p.k);
  sigset_t before, after;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  char err[256] = "";
  KnnJob *job = knn_job_start(&p, n.data(), d.data(), err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  EXPECT_TRUE(same_mask(before, after));
  const std::string self = std::to_string(static_cast<long>(syscall(SYS_gettid)));
  std::vector<std::string> masks;
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(5);
  while (masks.size() < 2 && Clock::now() < give_up && !knn_job_wait(job, 1)) {
    masks.clear();
    DIR *tasks = opendir("/proc/self/task");
    ASSERT_NE(tasks, nullptr);
    while (const dirent *e = readdir(tasks)) {
      if (e->d_name[0] == '.' || self == e->d_name) continue;
      const std::string mask =
          blocked_signals(std::string("/proc/self/task/") + e->d_name + "/status");
      if (!mask.empty()) masks.push_back(mask);  // empty: the thread has just ended
    }
    closedir(tasks);
  }
  knn_job_cancel(job);
  knn_job_finish(job, nullptr, err, sizeof err);
  EXPECT_GE(masks.size(), 2u);  // the job thread and its second worker
  for (const std::string &mask : masks) EXPECT_TRUE(blocks_at_least(mask, all)) << mask;
}

// ------------------------------------------------- the SGEMM brute force --

EngineRun run_tuned(const KnnProblem &p, const knn::CpuTuning &tuning,
                    const int32_t *cancel = nullptr) {
  EngineRun run;
  run.result.neighbors.assign(std::max<int64_t>(1, p.n_queries * p.k), -7);
  run.result.distances.assign(std::max<int64_t>(1, p.n_queries * p.k), -7.0);
  char error[256] = "";
  run.status = knn::cpu_run_tuned(p, tuning, run.result.neighbors.data(),
                                  run.result.distances.data(), &run.stats, cancel, error,
                                  sizeof error);
  run.error = error;
  run.result.neighbors.resize(p.n_queries * p.k);
  run.result.distances.resize(p.n_queries * p.k);
  return run;
}

#define SKIP_WITHOUT_BLAS()                                                         \
  if (!knn::cpu::blas_library().usable()) {                                         \
    GTEST_SKIP() << "no optimised BLAS (apt-get install libopenblas0-pthread): "   \
                 << knn::cpu::blas_library().description;                          \
  }

knn::CpuTuning forced(knn::CpuTuning::Variant variant, bool symmetric = true,
                      int64_t block_rows = 0) {
  knn::CpuTuning t;
  t.variant = variant;
  t.symmetric = symmetric;
  t.block_rows = block_rows;
  return t;
}

// The SGEMM variant (symmetric or not, small and default tiles) against the
// reference and the AVX2 variant, bit for bit, on random shapes up to 2048
// dimensions, every metric, ties, duplicates, exclusion keys and k > n.
TEST(BlasBruteForce, MatchesReferenceAndAvx2) {
  SKIP_WITHOUT_BLAS();
  std::mt19937_64 rng(21);
  const DataKind kinds[] = {DataKind::kUniform, DataKind::kBlobs, DataKind::kDuplicates,
                            DataKind::kGrid, DataKind::kNearTies};
  const int dims[] = {1, 3, 8, 17, 64, 100, 300, 784, 2048};
  for (int round = 0; round < 24; round++) {
    const DataKind kind = kinds[round % 5];
    const int dim = dims[rng() % 9];
    const int64_t rows = 1 + static_cast<int64_t>(rng() % (dim > 500 ? 300 : 700));
    const Matrix data = make_data(kind, rows, dim, rng);
    const bool self = round % 3 != 0;
    const Matrix queries = self ? data : take_rows(data, 0, std::max<int64_t>(1, rows / 2));
    const int k = static_cast<int>(1 + rng() % (round % 4 == 0 ? rows + 5 : 25));
    std::vector<int64_t> keys(rows);
    for (int64_t i = 0; i < rows; i++) keys[i] = round % 2 ? i : i / 3;  // repeated keys too
    for (KnnMetric metric : kMetrics) {
      KnnProblem p = make_problem(queries, data, k, metric, KNN_METHOD_BRUTE, 2);
      if (self && round % 4 != 3) p.query_keys = p.target_keys = keys.data();
      const Result expected = reference_join(p);
      const EngineRun avx2 = run_tuned(p, forced(knn::CpuTuning::Variant::kAvx2));
      ASSERT_EQ(avx2.status, KNN_OK) << avx2.error;
      for (int v = 0; v < 3; v++) {
        const knn::CpuTuning t =
            forced(knn::CpuTuning::Variant::kBlas, v != 1, v == 2 ? 0 : 1 + rng() % 40);
        const EngineRun blas = run_tuned(p, t);
        ASSERT_EQ(blas.status, KNN_OK) << blas.error;
        const std::string what = std::string(kind_name(kind)) + " rows " +
                                 std::to_string(rows) + " dim " + std::to_string(dim) + " k " +
                                 std::to_string(k) + " " + knn_metric_name(metric) +
                                 " variant " + blas.stats.variant;
        EXPECT_TRUE(same_result(expected, blas.result, k)) << what;
        EXPECT_TRUE(same_result(avx2.result, blas.result, k)) << what;
        if (metric == KNN_METRIC_L1) {
          EXPECT_STREQ(blas.stats.variant, "blocked/avx2");
        }
      }
    }
  }
}

// Many exact copies: candidate lists overflow and those queries are redone
// exactly; huge values leave the bound's range and the AVX2 loop runs.
TEST(BlasBruteForce, OverflowAndRangeFallBackExactly) {
  SKIP_WITHOUT_BLAS();
  std::mt19937_64 rng(22);
  Matrix data = make_data(DataKind::kBlobs, 600, 40, rng);
  for (int64_t i = 1; i < 400; i++) std::memcpy(data.row(i), data.row(0), sizeof(float) * 40);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP}) {
    const KnnProblem p = make_problem(data, data, 3, metric, KNN_METHOD_BRUTE, 2);
    const EngineRun blas = run_tuned(p, forced(knn::CpuTuning::Variant::kBlas));
    ASSERT_EQ(blas.status, KNN_OK) << blas.error;
    EXPECT_TRUE(same_result(reference_join(p), blas.result, p.k)) << knn_metric_name(metric);
  }
  Matrix huge = make_data(DataKind::kUniform, 50, 16, rng);
  huge.row(7)[3] = 3e37f;
  Matrix zero = make_data(DataKind::kUniform, 50, 16, rng);
  std::fill(zero.row(5), zero.row(6), 0.0f);  // cosine: NaN distances
  Matrix tiny = make_data(DataKind::kUniform, 50, 16, rng);
  tiny.row(9)[2] = 1e-40f;  // subnormal: a BLAS may read it as 0
  for (const Matrix *m : {&huge, &zero, &tiny})
    for (KnnMetric metric : kMetrics) {
      const KnnProblem p = make_problem(*m, *m, 4, metric, KNN_METHOD_BRUTE, 2);
      const EngineRun blas = run_tuned(p, forced(knn::CpuTuning::Variant::kBlas));
      ASSERT_EQ(blas.status, KNN_OK) << blas.error;
      EXPECT_TRUE(same_result(reference_join(p), blas.result, p.k)) << knn_metric_name(metric);
      if (m == &tiny) {
        EXPECT_STREQ(blas.stats.variant, "blocked/avx2");
      }
    }
}

// A cancel stops a BLAS-heavy join between tiles, within 50 ms.
TEST(BlasBruteForce, CancelStopsWithin50ms) {
  SKIP_WITHOUT_BLAS();
  std::mt19937_64 rng(23);
  const Matrix wide = make_data(DataKind::kUniform, 20000, 784, rng);
  double best_ms = 1e9;
  for (int delay_ms : {20, 150, 400}) {
    for (bool symmetric : {true, false}) {
      const KnnProblem p = make_problem(wide, wide, 20, KNN_METRIC_L2, KNN_METHOD_BRUTE, 2);
      int32_t cancel = 0;
      Clock::time_point cancelled_at;
      std::thread canceller([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        cancelled_at = Clock::now();
        __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
      });
      const EngineRun run =
          run_tuned(p, forced(knn::CpuTuning::Variant::kBlas, symmetric), &cancel);
      const Clock::time_point returned = Clock::now();
      canceller.join();
      EXPECT_EQ(run.status, KNN_CANCELLED) << "delay " << delay_ms;
      const double ms = std::chrono::duration<double, std::milli>(returned - cancelled_at).count();
      RecordProperty("blas_cancel_latency_ms", std::to_string(ms));
      EXPECT_LT(ms, 250.0) << "delay " << delay_ms;  // a loaded CI machine
      best_ms = std::min(best_ms, ms);
    }
  }
  EXPECT_LT(best_ms, 50.0);
}

// A large k: each query block's exact re-rank of its candidates (about 2k
// a query) is long, and a cancel used to wait for the whole block's (up to
// 0.6 s, review r13cancel); it now stops between queries.
TEST(BlasBruteForce, CancelStopsDuringTheRerankOfALargeK) {
  SKIP_WITHOUT_BLAS();
  std::mt19937_64 rng(25);
  const Matrix queries = make_data(DataKind::kUniform, 1024, 64, rng);
  const Matrix targets = make_data(DataKind::kUniform, 60000, 64, rng);
  const KnnProblem p = make_problem(queries, targets, 6000, KNN_METRIC_L2, KNN_METHOD_BRUTE, 2);
  // The whole join first: cancels at points of it.
  Clock::time_point t0 = Clock::now();
  const EngineRun whole = run_tuned(p, forced(knn::CpuTuning::Variant::kBlas, false));
  const double whole_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  ASSERT_EQ(whole.status, KNN_OK) << whole.error;
  for (double at : {0.3, 0.5, 0.7, 0.85}) {
    int32_t cancel = 0;
    Clock::time_point cancelled_at;
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(at * whole_ms));
      cancelled_at = Clock::now();
      __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
    });
    const EngineRun run = run_tuned(p, forced(knn::CpuTuning::Variant::kBlas, false), &cancel);
    const Clock::time_point returned = Clock::now();
    canceller.join();
    if (run.status == KNN_OK) continue;  // it ended first (a loaded machine)
    EXPECT_EQ(run.status, KNN_CANCELLED);
    const double ms = std::chrono::duration<double, std::milli>(returned - cancelled_at).count();
    std::printf("  [blas] whole %.0f ms, cancel at %.0f ms: returned after %.1f ms\n", whole_ms,
                at * whole_ms, ms);
    EXPECT_LT(ms, 200.0) << "at " << at;  // (the old code: 270-500 ms)
  }
}

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// knn_gpu.threads bounds the BLAS too: one thread uses one core, and every
// thread OpenBLAS started has every signal blocked.
TEST(BlasBruteForce, ThreadBoundAndSignalMasks) {
  SKIP_WITHOUT_BLAS();
  std::mt19937_64 rng(24);
  const Matrix data = make_data(DataKind::kUniform, 6000, 512, rng);
  const KnnProblem p = make_problem(data, data, 10, KNN_METRIC_L2, KNN_METHOD_BRUTE, 1);
  const double cpu0 = process_cpu_seconds();
  const Clock::time_point t0 = Clock::now();
  const EngineRun run = run_tuned(p, forced(knn::CpuTuning::Variant::kBlas));
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = process_cpu_seconds() - cpu0;
  ASSERT_EQ(run.status, KNN_OK) << run.error;
  EXPECT_STREQ(run.stats.device_name, "cpu (1 thread)");
  EXPECT_LT(cpu, 1.25 * wall + 0.02) << "cpu " << cpu << " s in " << wall << " s";

  const std::string all = every_signal_blocked();
  const std::string self = std::to_string(static_cast<long>(syscall(SYS_gettid)));
  DIR *tasks = opendir("/proc/self/task");
  ASSERT_NE(tasks, nullptr);
  while (const dirent *e = readdir(tasks))
    if (e->d_name[0] != '.' && self != e->d_name) {
      const std::string mask =
          blocked_signals(std::string("/proc/self/task/") + e->d_name + "/status");
      if (mask.empty()) continue;  // the thread ended between the listing and the read
      EXPECT_TRUE(blocks_at_least(mask, all)) << "thread " << e->d_name << ": " << mask;
    }
  closedir(tasks);
}

// knn_gpu_info()'s line names the BLAS.
TEST(BlasBruteForce, DescribeNamesTheBlas) {
  char line[512] = "";
  knn_engine_describe(line, sizeof line);
  EXPECT_NE(std::string(line).find("BLAS: "), std::string::npos) << line;
  EXPECT_NE(std::string(line).find(knn::cpu::blas_library().description), std::string::npos)
      << line;
}

// A self-join with fewer rows than one tile side (100 rows in 10000
// dimensions: the default tile is 192 rows) and self-exclusion keys: the
// tiles are sized to the join, and auto, the SGEMM (symmetric and general)
// and the AVX2 loop agree with the reference bit for bit.
TEST(BlasBruteForce, SelfJoinSmallerThanOneTile) {
  SKIP_WITHOUT_BLAS();
  constexpr int64_t kRows = 100;
  constexpr int kDim = 10000;
  ASSERT_GT(knn::cpu::gemm_block_rows(kDim), kRows);
  std::mt19937_64 rng(26);
  std::vector<int64_t> keys(kRows);
  for (int64_t i = 0; i < kRows; i++) keys[i] = 1000 + i;
  for (DataKind kind : {DataKind::kBlobs, DataKind::kDuplicates}) {
    const Matrix data = make_data(kind, kRows, kDim, rng);
    for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP}) {
      KnnProblem p = make_problem(data, data, 20, metric, KNN_METHOD_AUTO, 2);
      p.query_keys = p.target_keys = keys.data();
      const std::string what = std::string(kind_name(kind)) + " " + knn_metric_name(metric);
      const Result expected = reference_join(p);
      const EngineRun auto_run = run_engine(p);
      const EngineRun blas = run_tuned(p, forced(knn::CpuTuning::Variant::kBlas));
      const EngineRun general = run_tuned(p, forced(knn::CpuTuning::Variant::kBlas, false));
      const EngineRun avx2 = run_tuned(p, forced(knn::CpuTuning::Variant::kAvx2));
      for (const EngineRun *run : {&auto_run, &blas, &general, &avx2})
        ASSERT_EQ(run->status, KNN_OK) << what << ": " << run->error;
      // The SGEMM really ran (not its exact fallback), on one tile.
      EXPECT_STREQ(blas.stats.variant, "blas/symmetric") << what;
      EXPECT_STREQ(general.stats.variant, "blas") << what;
      EXPECT_STREQ(avx2.stats.variant, "blocked/avx2") << what;
      EXPECT_EQ(auto_run.stats.method, KNN_METHOD_BRUTE) << what;  // 10^4 pairs
      EXPECT_TRUE(same_result(expected, avx2.result, p.k)) << what << " avx2";
      EXPECT_TRUE(same_result(expected, blas.result, p.k)) << what << " blas/symmetric";
      EXPECT_TRUE(same_result(expected, general.result, p.k)) << what << " blas";
      EXPECT_TRUE(same_result(expected, auto_run.result, p.k))
          << what << " auto (ran " << auto_run.stats.variant << ")";
      EXPECT_TRUE(same_result(blas.result, avx2.result, p.k)) << what << " blas vs avx2";
      EXPECT_TRUE(same_result(auto_run.result, blas.result, p.k)) << what << " auto vs blas";
      for (int64_t i = 0; i < kRows * p.k; i++)  // the keys exclude each row's own match
        ASSERT_NE(blas.result.neighbors[i], i / p.k) << what;
    }
  }
}

// ------------------------------------ value checks in chunks of 2^18 ----

// TI's support check (ti_join_supports: NaN, infinity, huge values) and
// the SGEMM's subnormal check (gemm_join.cpp, has_subnormal) read the rows
// in parallel chunks of 2^18 values. A value in a later chunk must count as
// much as one in the first: at the first value of the second chunk and at
// the very last value, in the vectorised loop's scalar tail. 3001 x 127 =
// 381127 values: two chunks, the second 118983 long (not a multiple of 8).
constexpr int64_t kValueChunk = int64_t{1} << 18;
constexpr int64_t kChunkedRows = 3001;
constexpr int kChunkedDim = 127;
constexpr int64_t kChunkedValues = kChunkedRows * kChunkedDim;
static_assert(kChunkedValues > kValueChunk + 100000, "a second, long chunk");
static_assert(kChunkedValues < 2 * kValueChunk, "no third chunk");

// One odd value in the large side of a join (3001 x 127) against a small
// other side (64 rows): two separate matrices, so that each side is
// checked on its own (a self-join checks its one matrix once).
struct ChunkedJoin {
  Matrix queries, targets;
  std::string what;
};

ChunkedJoin chunked_join(bool in_queries, int64_t index, float value, std::mt19937_64 &rng) {
  ChunkedJoin j;
  Matrix large = make_data(DataKind::kBlobs, kChunkedRows, kChunkedDim, rng);
  Matrix small = make_data(DataKind::kBlobs, 64, kChunkedDim, rng);
  large.values[index] = value;
  j.queries = in_queries ? large : small;
  j.targets = in_queries ? small : large;
  char what[160];
  std::snprintf(what, sizeof what, "%g at value %lld (row %lld) of the %s", value,
                static_cast<long long>(index), static_cast<long long>(index / kChunkedDim),
                in_queries ? "queries" : "targets");
  j.what = what;
  return j;
}

// A NaN or an infinity beyond the first 2^18 values, in the targets or in
// the queries, still makes TI decline (even forced): brute force runs and
// matches the reference. Were only the first chunk read, TI would run.
TEST(CpuChunkedChecks, NonFiniteBeyondFirstChunkMakesTiDecline) {
  std::mt19937_64 rng(27);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Without the odd value TI runs on these shapes: the test is not vacuous.
  for (bool in_queries : {false, true}) {
    const ChunkedJoin clean = chunked_join(in_queries, 0, 1.0f, rng);
    const EngineRun ti =
        run_engine(make_problem(clean.queries, clean.targets, 5, KNN_METRIC_L2, KNN_METHOD_TI, 2));
    ASSERT_EQ(ti.status, KNN_OK) << ti.error;
    ASSERT_EQ(ti.stats.method, KNN_METHOD_TI) << clean.what;
  }
  const int64_t places[] = {kValueChunk, kChunkedValues - 1};
  int n = 0;
  for (float value : {nan, inf})
    for (bool in_queries : {false, true})
      for (int64_t index : places) {
        // Alternate signs and the two metrics TI supports.
        const float v = n % 2 ? -value : value;
        const KnnMetric metric = n % 3 == 2 ? KNN_METRIC_L1 : KNN_METRIC_L2;
        n++;
        const ChunkedJoin j = chunked_join(in_queries, index, v, rng);
        const std::string what = j.what + " " + knn_metric_name(metric);
        const KnnProblem p = make_problem(j.queries, j.targets, 5, metric, KNN_METHOD_TI, 2);
        const Result expected = reference_join(p);
        const EngineRun by_method = run_engine(p);
        const EngineRun by_tuning = run_tuned(p, forced(knn::CpuTuning::Variant::kTi));
        for (const EngineRun *run : {&by_method, &by_tuning}) {
          ASSERT_EQ(run->status, KNN_OK) << what << ": " << run->error;
          EXPECT_EQ(run->stats.method, KNN_METHOD_BRUTE) << what << " ran " << run->stats.variant;
          EXPECT_EQ(std::string(run->stats.variant).rfind("two-level", 0), std::string::npos)
              << what << " ran " << run->stats.variant;
          EXPECT_TRUE(same_result(expected, run->result, p.k)) << what;
        }
      }
}

// A float subnormal beyond the first 2^18 values, in the targets or in the
// queries, still sends the SGEMM brute force to the exact AVX2 one (a BLAS
// may read subnormals as 0: gemm_bound.h). The bit patterns at both ends
// of the subnormal range (1 and 0x7fffff) are used.
TEST(CpuChunkedChecks, SubnormalBeyondFirstChunkAvoidsBlas) {
  SKIP_WITHOUT_BLAS();
  std::mt19937_64 rng(28);
  const float smallest = std::numeric_limits<float>::denorm_min();
  const float largest = std::nextafter(std::numeric_limits<float>::min(), 0.0f);
  ASSERT_EQ(std::fpclassify(largest), FP_SUBNORMAL);
  // Without the subnormal the SGEMM runs on these shapes.
  for (bool in_queries : {false, true}) {
    const ChunkedJoin clean = chunked_join(in_queries, 0, 1.0f, rng);
    const EngineRun blas = run_tuned(
        make_problem(clean.queries, clean.targets, 5, KNN_METRIC_L2, KNN_METHOD_BRUTE, 2),
        forced(knn::CpuTuning::Variant::kBlas));
    ASSERT_EQ(blas.status, KNN_OK) << blas.error;
    ASSERT_STREQ(blas.stats.variant, "blas") << clean.what;
  }
  const int64_t places[] = {kValueChunk, kChunkedValues - 1};
  const KnnMetric metrics[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP};
  int n = 0;
  for (float value : {smallest, -largest})
    for (bool in_queries : {false, true})
      for (int64_t index : places) {
        const KnnMetric metric = metrics[n++ % 3];
        const ChunkedJoin j = chunked_join(in_queries, index, value, rng);
        const std::string what = j.what + " " + knn_metric_name(metric);
        const KnnProblem p = make_problem(j.queries, j.targets, 5, metric, KNN_METHOD_BRUTE, 2);
        const EngineRun blas = run_tuned(p, forced(knn::CpuTuning::Variant::kBlas));
        ASSERT_EQ(blas.status, KNN_OK) << what << ": " << blas.error;
        EXPECT_STREQ(blas.stats.variant, "blocked/avx2") << what;
        EXPECT_TRUE(same_result(reference_join(p), blas.result, p.k)) << what;
      }
}

// ------------------------------------------------------------ vocabulary --

template <class Enum>
void expect_round_trip(const KnnName *table, int (*parse)(const char *, Enum *),
                       const char *(*name)(Enum)) {
  for (const KnnName *n = table; n->name != nullptr; n++) {
    Enum value{};
    ASSERT_TRUE(parse(n->name, &value)) << n->name;
    EXPECT_EQ(static_cast<int>(value), n->value);
    Enum again{};
    EXPECT_TRUE(parse(name(value), &again)) << name(value);
    EXPECT_EQ(again, value);
  }
  Enum unused{};
  EXPECT_FALSE(parse("no such name", &unused));
  EXPECT_FALSE(parse(nullptr, &unused));
}

TEST(Vocabulary, NamesAndParsersAgree) {
  expect_round_trip(knn_metric_names, knn_metric_parse, knn_metric_name);
  expect_round_trip(knn_method_names, knn_method_parse, knn_method_name);
  expect_round_trip(knn_device_names, knn_device_parse, knn_device_name);
  expect_round_trip(knn_fault_names, knn_fault_parse, knn_fault_name);
  KnnMetric metric;
  EXPECT_TRUE(knn_metric_parse("Cosine", &metric));
  EXPECT_EQ(metric, KNN_METRIC_COSINE);
  EXPECT_STREQ(knn_status_name(KNN_OUT_OF_MEMORY), "out of memory");
}

TEST(Vocabulary, DeviceListsParse) {
  int32_t devices[KNN_MAX_DEVICES];
  int32_t n = -1;
  char why[128];
  EXPECT_TRUE(knn_device_list_parse(" All ", devices, &n, why, sizeof why));
  EXPECT_EQ(n, 0);
  EXPECT_TRUE(knn_device_list_parse("1, 0 ,1", devices, &n, why, sizeof why));
  ASSERT_EQ(n, 3);
  EXPECT_EQ(devices[0], 1);
  EXPECT_EQ(devices[1], 0);
  EXPECT_EQ(devices[2], 1);
  EXPECT_TRUE(knn_device_list_parse("255", devices, &n, why, sizeof why));
  EXPECT_EQ(devices[0], 255);
  std::string sixteen = "0";
  for (int i = 1; i < KNN_MAX_DEVICES; i++) sixteen += "," + std::to_string(i);
  EXPECT_TRUE(knn_device_list_parse(sixteen.c_str(), devices, &n, why, sizeof why));
  EXPECT_EQ(n, KNN_MAX_DEVICES);
  for (const char *bad : {"", " ", "none", "-1", "0,,1", "0,", ",0", "1.5", "gpu0", "256",
                          "99999999999999999999", "all,0", "0 1"}) {
    why[0] = '\0';
    EXPECT_FALSE(knn_device_list_parse(bad, devices, &n, why, sizeof why)) << bad;
    EXPECT_NE(why[0], '\0') << bad;
  }
  EXPECT_FALSE(knn_device_list_parse((sixteen + ",0").c_str(), devices, &n, why, sizeof why));
  EXPECT_NE(std::string(why).find("more than 16"), std::string::npos) << why;
  EXPECT_FALSE(knn_device_list_parse(nullptr, devices, &n, why, sizeof why));
}

// ---------------------------------------------------- float16 and bits ----

// binary16 -> binary32 against the definition: (-1)^s * 2^(e-15) * 1.m, or
// 2^-14 * 0.m for subnormals (exact in double), for all 65536 patterns.
TEST(HalfFloat, WidensEveryPatternExactly) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = knn_half_to_float(static_cast<uint16_t>(h));
    const int sign = (h & 0x8000) ? -1 : 1;
    const int e = (h >> 10) & 0x1F;
    const int m = h & 0x3FF;
    if (e == 0x1F) {
      if (m == 0) {
        EXPECT_TRUE(std::isinf(f) && std::signbit(f) == (sign < 0)) << h;
      } else {
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        // pgvector's portable HalfToFloat4: the quiet NaN of the sign
        EXPECT_EQ(bits, (sign < 0 ? 0x80000000u : 0u) | 0x7FC00000u) << h;
      }
      continue;
    }
    const double expected =
        sign * (e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25));
    EXPECT_EQ(static_cast<double>(f), expected) << h;
    EXPECT_EQ(std::signbit(f), sign < 0) << h;
    // and back: every binary16 value narrows to itself
    EXPECT_EQ(knn_float_to_half(f), static_cast<uint16_t>(h)) << h;
  }
}

// float -> binary16 rounds to the nearest, ties to even, against a
// reference that picks the nearer of the two neighbouring halves in double.
TEST(HalfFloat, NarrowsToNearestEven) {
  std::mt19937_64 rng(81);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; i++) {
    float f;
    const uint32_t bits = any(rng);
    std::memcpy(&f, &bits, sizeof f);
    if (!std::isfinite(f)) continue;
    const uint16_t h = knn_float_to_half(f);
    if (std::fabs(static_cast<double>(f)) >= 65520.0) {  // 65504 + half an ulp
      EXPECT_EQ(h & 0x7FFF, 0x7C00) << f;
      continue;
    }
    const double got = knn_half_to_float(h);
    // neighbours of got: the error must be at most half the gap, and a tie
    // must land on an even mantissa
    const uint16_t up = static_cast<uint16_t>((h & 0x7FFF) + 1);
    const double gap = std::fabs(static_cast<double>(knn_half_to_float(up)) -
                                 std::fabs(got));
    const double err = std::fabs(got - static_cast<double>(f));
    EXPECT_LE(err, gap / 2) << f;
    if (err == gap / 2 && err > 0) {
      EXPECT_EQ(h & 1, 0) << f;
    }
    if (got != 0) {
      EXPECT_EQ(std::signbit(got), std::signbit(f)) << f;
    }
  }
  EXPECT_EQ(knn_float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(knn_float_to_half(65519.99f), 0x7BFF);
  EXPECT_EQ(knn_float_to_half(65520.0f), 0x7C00);
  EXPECT_EQ(knn_float_to_half(std::ldexp(1.0f, -25)), 0);       // tie to even: 0
  EXPECT_EQ(knn_float_to_half(std::ldexp(1.5f, -25)), 1);       // above the tie
  EXPECT_EQ(knn_float_to_half(std::ldexp(3.0f, -25)), 2);       // 1.5 ulp: tie to even
}

// A float16 job is the float32 job of the widened values, bit for bit, on
// random shapes with duplicates, ties and self-exclusion.
TEST(JobApi, Float16RowsAreWidenedExactly) {
  std::mt19937_64 rng(82);
  for (int trial = 0; trial < 24; trial++) {
    const int dim = 1 + static_cast<int>(rng() % 40);
    const int64_t nq = 1 + static_cast<int64_t>(rng() % 60);
    const int64_t nt = 1 + static_cast<int64_t>(rng() % 90);
    const int k = 1 + static_cast<int>(rng() % 12);  // at times above nt
    // few distinct small values: many duplicate rows and tied distances
    std::uniform_int_distribution<int> value(-4, 4);
    auto make = [&](int64_t rows) {
      std::vector<uint16_t> h(rows * dim);
      for (auto &x : h) x = knn_float_to_half(value(rng) * 0.375f);
      return h;
    };
    const std::vector<uint16_t> hq = make(nq);
    const bool self = trial % 3 == 0;
    const std::vector<uint16_t> ht = self ? hq : make(nt);
    const int64_t n_targets = self ? nq : nt;
    std::vector<float> fq(hq.size()), ft(ht.size());
    for (size_t i = 0; i < hq.size(); i++) fq[i] = knn_half_to_float(hq[i]);
    for (size_t i = 0; i < ht.size(); i++) ft[i] = knn_half_to_float(ht[i]);
    std::vector<int64_t> qkeys(nq), tkeys(n_targets);
    for (int64_t i = 0; i < nq; i++) qkeys[i] = i / 2;  // repeated keys too
    for (int64_t i = 0; i < n_targets; i++) tkeys[i] = i / 2;
    for (KnnMetric metric : kMetrics) {
      KnnProblem half{};
      half.element = KNN_ELEMENT_FLOAT16;
      half.queries = hq.data();
      half.n_queries = nq;
      half.targets = self ? static_cast<const void *>(hq.data()) : ht.data();
      half.n_targets = n_targets;
      half.dim = dim;
      half.k = k;
      half.metric = metric;
      half.device = KNN_DEVICE_CPU;
      half.n_threads = 2;
      if (trial % 2 == 1) {
        half.query_keys = qkeys.data();
        half.target_keys = tkeys.data();
      }
      KnnProblem wide = half;
      wide.element = KNN_ELEMENT_FLOAT32;
      wide.queries = fq.data();
      wide.targets = self ? fq.data() : ft.data();
      const JobRun run = run_job(half);
      ASSERT_EQ(run.status, KNN_OK) << run.message;
      EXPECT_TRUE(same_result(reference_join(wide), run.result, k))
          << "trial " << trial << " metric " << knn_metric_name(metric);
    }
  }
}

// Naive bit reference: bit i of a row is bit 7 - i % 8 of byte i / 8.
bool bit_at(const std::vector<uint8_t> &rows, int64_t row, int dim, int i) {
  const int64_t bytes = (dim + 7) / 8;
  return (rows[row * bytes + i / 8] >> (7 - i % 8)) & 1;
}

double reference_bit_distance(KnnMetric metric, const std::vector<uint8_t> &a, int64_t ra,
                              const std::vector<uint8_t> &b, int64_t rb, int dim) {
  uint64_t differ = 0, both = 0, ones_a = 0, ones_b = 0;
  for (int i = 0; i < dim; i++) {
    const bool x = bit_at(a, ra, dim, i), y = bit_at(b, rb, dim, i);
    differ += x != y;
    both += x && y;
    ones_a += x;
    ones_b += y;
  }
  if (metric == KNN_METRIC_HAMMING) return static_cast<double>(differ);
  // pgvector: 1 when no bit is shared (two all-zero strings included)
  return both == 0 ? 1.0 : 1.0 - static_cast<double>(both) / (ones_a + ones_b - both);
}

Result reference_bit_join(const KnnProblem &p, const std::vector<uint8_t> &q,
                          const std::vector<uint8_t> &t) {
  Result r;
  r.neighbors.assign(p.n_queries * p.k, -1);
  r.distances.assign(p.n_queries * p.k, std::numeric_limits<double>::quiet_NaN());
  for (int64_t i = 0; i < p.n_queries; i++) {
    std::vector<std::pair<double, int64_t>> all;
    for (int64_t j = 0; j < p.n_targets; j++) {
      if (p.query_keys != nullptr && p.query_keys[i] == p.target_keys[j]) continue;
      all.emplace_back(reference_bit_distance(p.metric, q, i, t, j, p.dim), j);
    }
    std::sort(all.begin(), all.end());  // distance, then row: the result order
    for (size_t r2 = 0; r2 < all.size() && static_cast<int64_t>(r2) < p.k; r2++) {
      r.neighbors[i * p.k + r2] = all[r2].second;
      r.distances[i * p.k + r2] = all[r2].first;
    }
  }
  return r;
}

std::vector<uint8_t> random_bits(int64_t rows, int dim, int density_percent, std::mt19937_64 &rng,
                                 bool stray_padding) {
  const int64_t bytes = (dim + 7) / 8;
  std::vector<uint8_t> out(rows * bytes, 0);
  for (int64_t r = 0; r < rows; r++)
    for (int i = 0; i < dim; i++)
      if (static_cast<int>(rng() % 100) < density_percent)
        out[r * bytes + i / 8] |= static_cast<uint8_t>(0x80 >> (i % 8));
  // bits past dim must not count, whatever a caller leaves there
  if (stray_padding && dim % 8 != 0)
    for (int64_t r = 0; r < rows; r++) out[r * bytes + bytes - 1] |= 0xFF >> (dim % 8);
  return out;
}

TEST(BitEngine, MatchesNaiveReferenceOnRandomShapes) {
  std::mt19937_64 rng(83);
  for (int trial = 0; trial < 40; trial++) {
    const int dim = 1 + static_cast<int>(rng() % 200);
    const int64_t nq = static_cast<int64_t>(rng() % 50);
    const bool self = trial % 4 == 0;
    const int64_t nt = self ? nq : static_cast<int64_t>(rng() % 80);
    const int k = 1 + static_cast<int>(rng() % 15);
    // low density on short rows: many duplicates, ties and all-zero rows
    const int density = trial % 3 == 0 ? 5 : 50;
    const std::vector<uint8_t> q = random_bits(nq, dim, density, rng, trial % 5 == 1);
    const std::vector<uint8_t> t = self ? q : random_bits(nt, dim, density, rng, false);
    std::vector<int64_t> qkeys(nq), tkeys(nt);
    for (int64_t i = 0; i < nq; i++) qkeys[i] = i % 7;
    for (int64_t i = 0; i < nt; i++) tkeys[i] = i % 5;
    for (KnnMetric metric : {KNN_METRIC_HAMMING, KNN_METRIC_JACCARD}) {
      KnnProblem p{};
      p.element = KNN_ELEMENT_BIT;
      p.queries = q.data();
      p.n_queries = nq;
      p.targets = self ? static_cast<const void *>(q.data()) : t.data();
      p.n_targets = nt;
      p.dim = dim;
      p.k = k;
      p.metric = metric;
      p.device = trial % 2 == 0 ? KNN_DEVICE_CPU : KNN_DEVICE_AUTO;
      p.n_threads = 1 + trial % 3;
      if (trial % 3 == 2) {
        p.query_keys = qkeys.data();
        p.target_keys = tkeys.data();
      }
      // padding bits cleared for the reference, as the engine masks them
      std::vector<uint8_t> clean_q = q, clean_t = t;
      const int64_t bytes = (dim + 7) / 8;
      if (dim % 8 != 0) {
        for (int64_t r = 0; r < nq; r++) clean_q[r * bytes + bytes - 1] &= 0xFF << (8 - dim % 8);
        for (int64_t r = 0; r < nt; r++) clean_t[r * bytes + bytes - 1] &= 0xFF << (8 - dim % 8);
      }
      const Result expected = reference_bit_join(p, clean_q, self ? clean_q : clean_t);
      const JobRun run = run_job(p);
      ASSERT_EQ(run.status, KNN_OK) << run.message;
      EXPECT_TRUE(same_result(expected, run.result, k))
          << "trial " << trial << " " << knn_metric_name(metric) << " dim " << dim << " nq "
          << nq << " nt " << nt << " k " << k;
      if (nq > 0) {
        EXPECT_STREQ(run.stats.variant, "bit popcount");
      }
    }
  }
}

TEST(BitEngine, PgvectorFormulas) {
  EXPECT_EQ(knn::cpu::jaccard_from_counts(0, 0, 0), 1.0);  // two all-zero strings
  EXPECT_EQ(knn::cpu::jaccard_from_counts(0, 3, 2), 1.0);
  EXPECT_EQ(knn::cpu::jaccard_from_counts(2, 3, 2), 1 - 2.0 / 3.0);
  EXPECT_EQ(knn::cpu::hamming_from_count(17), 17.0);
}

TEST(BitEngine, RejectsFloatMetricsAndCancels) {
  std::mt19937_64 rng(84);
  const std::vector<uint8_t> rows = random_bits(6000, 1024, 50, rng, false);
  KnnProblem p{};
  p.element = KNN_ELEMENT_BIT;
  p.queries = p.targets = rows.data();
  p.n_queries = p.n_targets = 6000;
  p.dim = 1024;
  p.k = 5;
  p.metric = KNN_METRIC_L2;
  p.device = KNN_DEVICE_CPU;
  JobRun bad = run_job(p);
  EXPECT_EQ(bad.status, KNN_INVALID_ARGUMENT);
  // float rows with a bit metric are refused too
  KnnProblem floats = p;
  floats.element = KNN_ELEMENT_FLOAT32;
  floats.metric = KNN_METRIC_HAMMING;
  EXPECT_NE(knn::problem_invalid_reason(floats, nullptr, nullptr), nullptr);

  p.metric = KNN_METRIC_HAMMING;
  p.n_threads = 1;
  std::vector<int64_t> n(p.n_queries * p.k);
  std::vector<double> d(p.n_queries * p.k);
  char err[256] = "";
  KnnJob *job = knn_job_start(&p, n.data(), d.data(), err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  EXPECT_EQ(knn_job_wait(job, 20), 0);
  knn_job_cancel(job);
  const Clock::time_point at = Clock::now();
  EXPECT_EQ(knn_job_wait(job, 2000), 1);
  const double late_ms = std::chrono::duration<double, std::milli>(Clock::now() - at).count();
  EXPECT_LT(late_ms, 250.0);
  EXPECT_EQ(knn_job_finish(job, nullptr, err, sizeof err), KNN_CANCELLED);
}

// A GPU asked for: the CPU bit engine runs and says so in the notice.
// Without a usable GPU, device = gpu runs bit rows on the CPU engine and says so.
TEST(BitEngine, GpuDeviceRunsOnCpuWithNotice) {
  std::mt19937_64 rng(85);
  const std::vector<uint8_t> rows = random_bits(30, 70, 40, rng, false);
  KnnProblem p{};
  p.element = KNN_ELEMENT_BIT;
  p.queries = p.targets = rows.data();
  p.n_queries = p.n_targets = 30;
  p.dim = 70;
  p.k = 4;
  p.metric = KNN_METRIC_JACCARD;
  p.device = KNN_DEVICE_GPU;
  char line[512];
  if (knn_engine_describe(line, sizeof line))
    GTEST_SKIP() << "a GPU is usable here: test/gpu_bit_test covers bit rows on it";
  const JobRun run = run_job(p);
  ASSERT_EQ(run.status, KNN_OK) << run.message;
  EXPECT_NE(run.message.find("the CPU engine ran"), std::string::npos) << run.message;
  EXPECT_EQ(run.stats.device, KNN_DEVICE_CPU);
  EXPECT_TRUE(same_result(reference_bit_join(p, rows, rows), run.result, p.k));
}

}  // namespace

// The cold-start rule's contention factor: runnable threads over cores, at
// least 1, and 1 where /proc/loadavg's text cannot be read.
TEST(GpuColdStart, ContentionFromLoadavg) {
  EXPECT_DOUBLE_EQ(knn::cpu_contention_from_loadavg("0.20 0.18 0.12 1/80 11206\n", 16), 1.0);
  EXPECT_DOUBLE_EQ(knn::cpu_contention_from_loadavg("9.00 4.00 1.00 16/900 11206\n", 16), 1.0);
  EXPECT_DOUBLE_EQ(knn::cpu_contention_from_loadavg("60.1 30.0 9.0 64/900 11206\n", 16), 4.0);
  EXPECT_DOUBLE_EQ(knn::cpu_contention_from_loadavg("", 16), 1.0);
  EXPECT_DOUBLE_EQ(knn::cpu_contention_from_loadavg("garbage", 16), 1.0);
  EXPECT_DOUBLE_EQ(knn::cpu_contention_from_loadavg("1 1 1 0/10 5", 16), 1.0);
  EXPECT_DOUBLE_EQ(knn::cpu_contention_from_loadavg("1 1 1 8/10 5", 0), 1.0);
  EXPECT_GE(knn::cpu_contention(), 1.0);
}
