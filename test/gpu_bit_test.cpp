// gpu_bit_test.cpp -- bit rows (Hamming <~>, Jaccard <%>) on the GPU
// against the CPU bit engine, through the job API, bit for bit: the same
// neighbours in the same order and the same float8 values. Every GPU run
// must say it ran on the GPU (no silent fallback).
//
// Run with `make gputest` from the repository root (where knn_gpu_cuda.so
// is built). Without a usable GPU every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "knn_cuda_module.h"
#include "gpu_test_support.h"
#include "knn_engine.h"

namespace {

::testing::Environment *const kModuleDir =
    ::testing::AddGlobalTestEnvironment(new gpu_test::ModuleDir);

struct Result {
  KnnStatus status = KNN_INTERNAL_ERROR;
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
  KnnStats stats{};
  std::string message;
};

Result run(KnnProblem p, KnnDevice device) {
  p.device = device;
  Result r;
  r.neighbors.assign(static_cast<size_t>(p.n_queries * p.k), -2);
  r.distances.assign(r.neighbors.size(), -2.0);
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, r.neighbors.data(), r.distances.data(), err, sizeof err);
  if (job == nullptr) {
    r.message = err;
    return r;
  }
  r.status = knn_job_finish(job, &r.stats, err, sizeof err);
  r.message = err;
  return r;
}

// Rows of dim bits in PostgreSQL's layout. density: share of ones.
// stray: set the padding bits past dim (they must not count).
std::vector<uint8_t> random_bits(int64_t n, int dim, double density, std::mt19937_64 &rng,
                                 bool stray) {
  const int64_t row_bytes = (dim + 7) / 8;
  std::vector<uint8_t> rows(static_cast<size_t>(n * row_bytes), 0);
  std::bernoulli_distribution one(density);
  for (int64_t i = 0; i < n; i++)
    for (int b = 0; b < row_bytes * 8; b++)
      if (b >= dim ? stray : one(rng)) rows[i * row_bytes + b / 8] |= uint8_t(0x80u >> (b % 8));
  return rows;
}

// The GPU answer equals the CPU engine's, bit for bit, and ran on the GPU.
void expect_gpu_equals_cpu(const KnnProblem &p, const std::string &what) {
  const Result cpu = run(p, KNN_DEVICE_CPU);
  ASSERT_EQ(cpu.status, KNN_OK) << what << ": " << cpu.message;
  const Result gpu = run(p, KNN_DEVICE_GPU);
  ASSERT_EQ(gpu.status, KNN_OK) << what << ": " << gpu.message;
  EXPECT_EQ(gpu.stats.device, KNN_DEVICE_GPU) << what << ": " << gpu.stats.device_name;
  EXPECT_TRUE(gpu.message.empty()) << what << ": " << gpu.message;
  size_t bad = 0;
  for (size_t i = 0; i < cpu.neighbors.size(); i++) {
    const bool same = cpu.neighbors[i] == gpu.neighbors[i] &&
                      (std::memcmp(&cpu.distances[i], &gpu.distances[i], 8) == 0 ||
                       (std::isnan(cpu.distances[i]) && std::isnan(gpu.distances[i])));
    if (!same && bad++ < 5)
      ADD_FAILURE() << what << ": slot " << i << " (query " << i / p.k << "): CPU "
                    << cpu.neighbors[i] << " " << cpu.distances[i] << ", GPU " << gpu.neighbors[i]
                    << " " << gpu.distances[i];
  }
  EXPECT_EQ(bad, 0u) << what;
}

KnnProblem bit_problem(const std::vector<uint8_t> &q, int64_t nq, const std::vector<uint8_t> &t,
                       int64_t nt, int dim, int k, KnnMetric metric) {
  KnnProblem p{};
  p.element = KNN_ELEMENT_BIT;
  p.queries = q.data();
  p.n_queries = nq;
  p.targets = t.data();
  p.n_targets = nt;
  p.dim = dim;
  p.k = k;
  p.metric = metric;
  return p;
}

const KnnMetric kMetrics[] = {KNN_METRIC_HAMMING, KNN_METRIC_JACCARD};

std::string name(KnnMetric m) { return m == KNN_METRIC_HAMMING ? "hamming" : "jaccard"; }

TEST(GpuBit, DimsMetricsAndK) {
  REQUIRE_GPU();
  std::mt19937_64 rng(11);
  for (int dim : {1, 7, 64, 65, 1000, 1024}) {
    for (bool stray : {false, true}) {
      const std::vector<uint8_t> q = random_bits(70, dim, 0.3, rng, stray);
      const std::vector<uint8_t> t = random_bits(300, dim, 0.3, rng, stray);
      for (KnnMetric m : kMetrics) {
        for (int k : {1, 5, 32, 33, 100, 256}) {
          const std::string what = name(m) + " dim " + std::to_string(dim) + " k " +
                                   std::to_string(k) + (stray ? " stray bits" : "");
          expect_gpu_equals_cpu(bit_problem(q, 70, t, 300, dim, k, m), what);
        }
      }
    }
  }
}

TEST(GpuBit, KLargerThanTargetsAndEmptySides) {
  REQUIRE_GPU();
  std::mt19937_64 rng(12);
  const std::vector<uint8_t> q = random_bits(9, 100, 0.5, rng, false);
  const std::vector<uint8_t> t = random_bits(20, 100, 0.5, rng, false);
  for (KnnMetric m : kMetrics) {
    expect_gpu_equals_cpu(bit_problem(q, 9, t, 20, 100, 50, m), name(m) + " k > |T|");
    expect_gpu_equals_cpu(bit_problem(q, 9, t, 1, 100, 3, m), name(m) + " one target");
    expect_gpu_equals_cpu(bit_problem(q, 9, t, 0, 100, 3, m), name(m) + " no targets");
    expect_gpu_equals_cpu(bit_problem(q, 0, t, 20, 100, 3, m), name(m) + " no queries");
  }
}

// Many equal distances: duplicated rows, few bits, all-zero rows (Jaccard
// 1 for a zero row against anything).
TEST(GpuBit, DuplicatesTiesAndZeroRows) {
  REQUIRE_GPU();
  std::mt19937_64 rng(13);
  std::vector<uint8_t> base = random_bits(40, 24, 0.1, rng, false);
  std::vector<uint8_t> rows;
  for (int copy = 0; copy < 25; copy++) rows.insert(rows.end(), base.begin(), base.end());
  std::fill(rows.begin(), rows.begin() + 3 * 10, 0);  // rows 0..9 all zero
  const int64_t n = 1000;
  for (KnnMetric m : kMetrics)
    for (int k : {1, 10, 64, 200})
      expect_gpu_equals_cpu(bit_problem(rows, n, rows, n, 24, k, m),
                            name(m) + " duplicates k " + std::to_string(k));
}

TEST(GpuBit, ExcludeSelfKeys) {
  REQUIRE_GPU();
  std::mt19937_64 rng(14);
  const int64_t n = 500;
  const std::vector<uint8_t> rows = random_bits(n, 40, 0.2, rng, false);
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; i++) keys[i] = i / 3;  // equal keys in threes
  for (KnnMetric m : kMetrics) {
    for (int k : {1, 7, 256}) {
      KnnProblem p = bit_problem(rows, n, rows, n, 40, k, m);
      p.query_keys = keys.data();
      p.target_keys = keys.data();
      expect_gpu_equals_cpu(p, name(m) + " exclude self k " + std::to_string(k));
    }
  }
}

TEST(GpuBit, GroupsRunOnTheGpu) {
  REQUIRE_GPU();
  std::mt19937_64 rng(15);
  const int64_t n = 400;
  const std::vector<uint8_t> rows = random_bits(n, 130, 0.4, rng, false);
  std::vector<int64_t> groups(n);
  for (int64_t i = 0; i < n; i++) groups[i] = (i * 7) % 5;
  for (KnnMetric m : kMetrics) {
    KnnProblem p = bit_problem(rows, n, rows, n, 130, 6, m);
    p.query_groups = groups.data();
    p.target_groups = groups.data();
    expect_gpu_equals_cpu(p, name(m) + " groups");
  }
}

// Larger than one launch and than one selection buffer, a device memory
// budget that forces query chunks.
TEST(GpuBit, LargerSetsAndChunks) {
  REQUIRE_GPU();
  std::mt19937_64 rng(16);
  const std::vector<uint8_t> q = random_bits(3000, 1024, 0.5, rng, false);
  const std::vector<uint8_t> t = random_bits(20000, 1024, 0.5, rng, false);
  for (KnnMetric m : kMetrics) {
    expect_gpu_equals_cpu(bit_problem(q, 3000, t, 20000, 1024, 10, m), name(m) + " 3000 x 20000");
    KnnProblem p = bit_problem(q, 3000, t, 20000, 1024, 10, m);
    p.gpu_memory_limit = 20000 * 128 + 64 * 1024;  // the targets and a few queries
    expect_gpu_equals_cpu(p, name(m) + " chunked by the budget");
  }
}

TEST(GpuBit, LargeKGoesToTheCpuWithANotice) {
  REQUIRE_GPU();
  std::mt19937_64 rng(17);
  const std::vector<uint8_t> rows = random_bits(300, 50, 0.5, rng, false);
  const KnnProblem p = bit_problem(rows, 300, rows, 300, 50, KNN_CUDA_BIT_MAX_K + 1,
                                   KNN_METRIC_HAMMING);
  const Result cpu = run(p, KNN_DEVICE_CPU);
  const Result gpu = run(p, KNN_DEVICE_GPU);
  ASSERT_EQ(gpu.status, KNN_OK) << gpu.message;
  EXPECT_EQ(gpu.stats.device, KNN_DEVICE_CPU);
  EXPECT_NE(gpu.message.find("k up to 256"), std::string::npos) << gpu.message;
  EXPECT_EQ(gpu.neighbors, cpu.neighbors);
}

TEST(GpuBit, AutoRunsOnTheWarmGpu) {
  REQUIRE_GPU();
  std::mt19937_64 rng(18);
  const std::vector<uint8_t> rows = random_bits(2000, 256, 0.5, rng, false);
  const KnnProblem p = bit_problem(rows, 2000, rows, 2000, 256, 5, KNN_METRIC_JACCARD);
  (void)run(p, KNN_DEVICE_GPU);  // the runtime exists from here on
  const Result r = run(p, KNN_DEVICE_AUTO);
  ASSERT_EQ(r.status, KNN_OK) << r.message;
  EXPECT_EQ(r.stats.device, KNN_DEVICE_GPU) << r.stats.device_name;
}

TEST(GpuBit, CancelStopsSoon) {
  REQUIRE_GPU();
  std::mt19937_64 rng(19);
  const int64_t n = 300000;
  const std::vector<uint8_t> rows = random_bits(n, 1024, 0.5, rng, false);
  KnnProblem p = bit_problem(rows, n, rows, n, 1024, 10, KNN_METRIC_HAMMING);
  p.device = KNN_DEVICE_GPU;
  std::vector<int64_t> nb(static_cast<size_t>(n * 10));
  std::vector<double> ds(nb.size());
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, nb.data(), ds.data(), err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t = std::chrono::steady_clock::now();
  knn_job_cancel(job);
  KnnStats stats{};
  const KnnStatus st = knn_job_finish(job, &stats, err, sizeof err);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  std::printf("[ timing   ] bit join cancelled: %s after %.3f s\n", st == KNN_CANCELLED ? "stopped" : "finished", waited);
  if (st == KNN_OK) GTEST_SKIP() << "finished before the cancel (" << stats.seconds_total << " s)";
  EXPECT_EQ(st, KNN_CANCELLED) << err;
  EXPECT_LT(waited, 0.2);
}

// Throughput, for the report (not asserted).
TEST(GpuBit, Timing) {
  REQUIRE_GPU();
  std::mt19937_64 rng(20);
  const int64_t n = 100000;
  const std::vector<uint8_t> rows = random_bits(n, 1024, 0.5, rng, false);
  for (KnnMetric m : kMetrics) {
    const KnnProblem p = bit_problem(rows, n, rows, n, 1024, 10, m);
    for (KnnDevice d : {KNN_DEVICE_GPU, KNN_DEVICE_CPU}) {
      const auto t = std::chrono::steady_clock::now();
      const Result r = run(p, d);
      ASSERT_EQ(r.status, KNN_OK) << r.message;
      std::printf("[ timing   ] %s 100000 x 1024 bits k=10 self-join on %s: %.3f s (%s)\n",
                  name(m).c_str(), d == KNN_DEVICE_GPU ? "GPU" : "CPU",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(),
                  r.stats.variant);
    }
  }
}

}  // namespace
