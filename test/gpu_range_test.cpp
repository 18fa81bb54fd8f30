// gpu_range_test.cpp -- the GPU range join (kernels/cuda/range_join.cu)
// through the job API, against the CPU range engine bit for bit: the same
// pairs in the same order with the same float8 values, for every metric,
// float32, float16 and bit rows, duplicates, radius 0, huge and non-finite
// radii, the per-query cap, keys and groups; an output far larger than the
// job's queue and than the GPU's chunk buffers (backpressure), a cancel
// while the queue is full. Every GPU run must say it ran on the GPU (no
// silent fallback).
//
// Run with `make gputest` from the repository root (where knn_gpu_cuda.so
// is built). Without a usable GPU every test is skipped with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_support.h"
#include "knn_engine.h"
#include "range_cases.h"
#include "reference_rows.h"

namespace {

using namespace range_cases;
using reference::make_rows;
using reference::Rows;

::testing::Environment *const kModuleDir =
    ::testing::AddGlobalTestEnvironment(new gpu_test::ModuleDir);

// The case on the GPU and on the CPU engine: both OK, the GPU's run on the
// GPU without a notice, the same pairs. Returns the GPU's outcome.
Outcome expect_gpu_as_cpu(Case c, const std::string &what, int64_t batch = 1000) {
  c.device = KNN_DEVICE_CPU;
  const Outcome cpu = run(c.problem(), batch);
  c.device = KNN_DEVICE_GPU;
  Outcome gpu = run(c.problem(), batch);
  EXPECT_EQ(cpu.status, KNN_OK) << what << ": " << cpu.message;
  EXPECT_EQ(gpu.status, KNN_OK) << what << ": " << gpu.message;
  EXPECT_EQ(gpu.stats.device, KNN_DEVICE_GPU) << what << ": " << gpu.stats.device_name;
  EXPECT_EQ(gpu.message, "") << what;
  expect_same(cpu.pairs, gpu.pairs, what);
  return gpu;
}

std::string describe(const Case &c, int dim) {
  return std::string(metric_name(c.metric)) + " element " + std::to_string(c.queries.element) +
         " method " + std::to_string(c.method) + " dim " + std::to_string(dim) + " range " +
         std::to_string(c.range) + " cap " + std::to_string(c.cap) + " r " +
         std::to_string(c.radius);
}

// Small integer rows (duplicates and exact ties everywhere) and, for L2
// and L1, clustered real rows that let the clusters prune; dimensions
// below 8, in the register buckets, and past 64 (the generic path).
TEST(GpuRangeJoin, EveryMetricElementMethodAndBoundary) {
  REQUIRE_GPU();
  std::mt19937_64 rng(42);
  const KnnMetric floats[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP, KNN_METRIC_L1};
  for (KnnElement element : {KNN_ELEMENT_FLOAT32, KNN_ELEMENT_FLOAT16, KNN_ELEMENT_BIT}) {
    std::vector<KnnMetric> metrics(std::begin(floats), std::end(floats));
    if (element == KNN_ELEMENT_BIT) metrics = {KNN_METRIC_HAMMING, KNN_METRIC_JACCARD};
    for (KnnMetric metric : metrics)
      for (KnnMethod method : {KNN_METHOD_AUTO, KNN_METHOD_TI, KNN_METHOD_BRUTE})
        for (int dim : {3, 13, 70})
          for (bool spread : {false, true}) {
            if (spread && (element == KNN_ELEMENT_BIT || method == KNN_METHOD_BRUTE)) continue;
            Case c;
            c.queries = make_rows(element, 70, dim, rng, spread);
            c.targets = make_rows(element, 110, dim, rng, spread);
            c.metric = metric;
            c.method = method;
            c.radius = some_distance(c, rng);
            for (KnnRange range : {KNN_RANGE_BELOW, KNN_RANGE_AT_MOST})
              for (int cap : {0, 3}) {
                c.range = range;
                c.cap = cap;
                const std::string what = describe(c, dim) + (spread ? " spread" : "");
                const Outcome gpu = expect_gpu_as_cpu(c, what, 7);
                if (HasFailure()) return;
                // The reference of range_cases.h too, independently.
                expect_same(reference_pairs(c), gpu.pairs, what + " (reference)");
                if (HasFailure()) return;
                if (cap == 0 && range == KNN_RANGE_AT_MOST) {
                  EXPECT_FALSE(gpu.pairs.empty()) << what;
                }
                // (a cap the radius overfills runs as the GPU's top-k join)
                const bool prunable = metric == KNN_METRIC_L2 || metric == KNN_METRIC_L1;
                if (!ran_top_k(gpu)) {
                  EXPECT_EQ(gpu.stats.method,
                            prunable && method == KNN_METHOD_TI ? KNN_METHOD_TI : KNN_METHOD_BRUTE)
                      << what << ": " << gpu.stats.variant;
                }
              }
          }
  }
}

TEST(GpuRangeJoin, RadiusZeroFindsDuplicates) {
  REQUIRE_GPU();
  std::mt19937_64 rng(7);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1, KNN_METRIC_COSINE})
    for (KnnMethod method : {KNN_METHOD_TI, KNN_METHOD_BRUTE}) {
      Case c = duplicates_case(metric, method, 300, rng);
      const std::string what = std::string("radius 0 ") + metric_name(metric);
      const Outcome inclusive = expect_gpu_as_cpu(c, what + " <=");
      if (metric != KNN_METRIC_COSINE) {
        EXPECT_GT(inclusive.pairs.size(), 300u);
      }
      c.range = KNN_RANGE_BELOW;
      const Outcome strict = expect_gpu_as_cpu(c, what + " <");
      if (metric != KNN_METRIC_COSINE) {
        EXPECT_TRUE(strict.pairs.empty());
      }
      c.range = KNN_RANGE_AT_MOST;
      exclude_self(&c);
      const Outcome excluded = expect_gpu_as_cpu(c, what + ", keys");
      if (metric != KNN_METRIC_COSINE) {
        EXPECT_EQ(excluded.pairs.size() + 300, inclusive.pairs.size());
      }
    }
}

// Zero rows make cosine NaN; NaN, infinite and negative radii; a radius
// that takes every pair.
TEST(GpuRangeJoin, HugeAndNonFiniteRadius) {
  REQUIRE_GPU();
  std::mt19937_64 rng(9);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1, KNN_METRIC_IP, KNN_METRIC_COSINE}) {
    Case c;
    c.queries = make_rows(KNN_ELEMENT_FLOAT32, 40, 5, rng);
    c.targets = make_rows(KNN_ELEMENT_FLOAT32, 60, 5, rng);
    for (int j = 0; j < 5; j++) c.queries.f32[j] = c.targets.f32[5 + j] = 0;
    c.metric = metric;
    c.method = KNN_METHOD_TI;
    for (double radius : {1e300, std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::quiet_NaN(), -1.0, 0.0})
      for (KnnRange range : {KNN_RANGE_BELOW, KNN_RANGE_AT_MOST})
        for (int cap : {0, 2}) {
          c.radius = radius;
          c.range = range;
          c.cap = cap;
          const std::string what = describe(c, 5);
          const Outcome o = expect_gpu_as_cpu(c, what, 13);
          if (radius == 1e300 && cap == 0 && metric != KNN_METRIC_COSINE) {
            EXPECT_EQ(o.pairs.size(), 40u * 60u) << what;  // every pair
          }
        }
  }
}

TEST(GpuRangeJoin, GroupsKeysAndCap) {
  REQUIRE_GPU();
  std::mt19937_64 rng(11);
  for (KnnElement element : {KNN_ELEMENT_FLOAT32, KNN_ELEMENT_BIT})
    for (KnnMethod method : {KNN_METHOD_TI, KNN_METHOD_BRUTE}) {
      Case c;
      c.queries = make_rows(element, 150, 6, rng);
      c.targets = make_rows(element, 200, 6, rng);
      add_groups_and_keys(&c, rng);
      c.metric = element == KNN_ELEMENT_BIT ? KNN_METRIC_HAMMING : KNN_METRIC_L2;
      c.method = method;
      c.radius = element == KNN_ELEMENT_BIT ? 3 : 4.5;
      c.range = KNN_RANGE_AT_MOST;
      for (int cap : {0, 1, 5}) {
        c.cap = cap;
        const Outcome o = expect_gpu_as_cpu(c, "groups, keys, cap " + std::to_string(cap));
        expect_same(reference_pairs(c), o.pairs, "groups, keys, cap (reference)");
      }
    }
}

// Clustered rows and a radius within a cluster: the clusters prune most
// pairs, and the statistics show it.
TEST(GpuRangeJoin, PruningIsVisibleAndExact) {
  REQUIRE_GPU();
  std::mt19937_64 rng(13);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Case c;
    c.queries = make_rows(KNN_ELEMENT_FLOAT32, 2000, 8, rng, true);
    c.targets = make_rows(KNN_ELEMENT_FLOAT32, 20000, 8, rng, true);
    c.metric = metric;
    c.method = KNN_METHOD_AUTO;  // 4e7 pairs: AUTO prunes
    c.radius = radius_within_clusters(c, rng, 50);
    c.range = KNN_RANGE_AT_MOST;
    const Outcome o = expect_gpu_as_cpu(c, metric_name(metric));
    EXPECT_FALSE(o.pairs.empty());
    EXPECT_EQ(o.stats.method, KNN_METHOD_TI) << o.stats.variant;
    EXPECT_GT(o.stats.target_clusters, 1);
    EXPECT_EQ(o.stats.pairs, 2000 * 20000);
    EXPECT_LT(o.stats.distance_computations, o.stats.pairs / 4) << o.stats.variant;
    std::printf("    %s: %lld distances for %lld pairs (%s)\n", metric_name(metric),
                static_cast<long long>(o.stats.distance_computations),
                static_cast<long long>(o.stats.pairs), o.stats.variant);
  }
}

// Far more pairs than the job's queue (65536) and than the GPU's chunk
// buffers: a memory limit makes each query's pairs alone larger than the
// buffers (which then grow), and a slow consumer keeps the queue full, so
// the engine waits for it.
TEST(GpuRangeJoin, OutputLargerThanQueueAndBuffers) {
  REQUIRE_GPU();
  std::mt19937_64 rng(17);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 12, 2, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 200000, 2, rng);
  c.radius = std::numeric_limits<double>::infinity();  // 2.4 million pairs
  c.range = KNN_RANGE_AT_MOST;
  KnnProblem p = c.problem();
  p.gpu_memory_limit = int64_t{24} << 20;
  c.device = KNN_DEVICE_CPU;
  const Outcome cpu = run(c.problem(), 50000);
  ASSERT_EQ(cpu.status, KNN_OK) << cpu.message;
  ASSERT_EQ(cpu.pairs.size(), 12u * 200000u);

  p.device = KNN_DEVICE_GPU;
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, nullptr, nullptr, err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  std::vector<int64_t> q(5000), t(5000);
  std::vector<double> d(5000);
  std::vector<Triple> got;
  bool waited = false;
  for (int batches = 0;; batches++) {
    const int64_t n = knn_job_take_pairs(job, q.data(), t.data(), d.data(), 5000, 1000);
    if (n < 0) break;
    for (int64_t i = 0; i < n; i++) got.emplace_back(q[i], t[i], d[i]);
    if (batches == 3) {  // the consumer dawdles: the engine must wait, not finish
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      waited = knn_job_wait(job, 0) == 0;
    }
  }
  KnnStats stats{};
  EXPECT_EQ(knn_job_finish(job, &stats, err, sizeof err), KNN_OK) << err;
  EXPECT_TRUE(waited) << "the job finished while most of its pairs were not taken";
  EXPECT_EQ(stats.device, KNN_DEVICE_GPU) << stats.device_name;
  expect_same(cpu.pairs, got, "2.4 million pairs through the queue");
}

// A huge result whose caller stops taking pairs: the engine waits on its
// full queue (bounded memory) and a cancel ends it promptly; the next job
// runs normally.
TEST(GpuRangeJoin, CancelWhileTheQueueIsFull) {
  REQUIRE_GPU();
  std::mt19937_64 rng(23);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 3000, 4, rng);
  c.targets = c.queries;
  c.shared = true;
  c.radius = std::numeric_limits<double>::infinity();  // 9 million pairs
  c.device = KNN_DEVICE_GPU;
  expect_prompt_cancel(c.problem());

  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 50, 4, rng);
  c.targets = c.queries;
  c.radius = 2;
  expect_gpu_as_cpu(c, "after a cancel");
}

// AUTO: a large job goes to the (warm) GPU, a small one stays on the CPU.
TEST(GpuRangeJoin, AutoChoosesByProblemSize) {
  REQUIRE_GPU();
  std::mt19937_64 rng(29);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 4000, 3, rng, true);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 5000, 3, rng, true);
  c.radius = 0.1;
  c.device = KNN_DEVICE_GPU;
  run(c.problem());  // the runtime exists from here on
  c.device = KNN_DEVICE_AUTO;
  const Outcome large = run(c.problem());
  ASSERT_EQ(large.status, KNN_OK) << large.message;
  EXPECT_EQ(large.stats.device, KNN_DEVICE_GPU) << large.stats.device_name;
  c.device = KNN_DEVICE_CPU;
  expect_same(run(c.problem()).pairs, large.pairs, "auto, large");
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 100, 3, rng, true);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 100, 3, rng, true);
  c.device = KNN_DEVICE_AUTO;
  const Outcome small = run(c.problem());
  ASSERT_EQ(small.status, KNN_OK) << small.message;
  EXPECT_EQ(small.stats.device, KNN_DEVICE_CPU) << small.stats.device_name;
}

}  // namespace
