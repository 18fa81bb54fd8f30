// gpu_float16_test.cpp -- float16 rows (KNN_ELEMENT_FLOAT16, pgvector's
// halfvec) through the job API: where the GPU module takes them
// (knn_cuda_takes_float16) they travel to the GPU as float16 and are
// widened there, and the results are bit for bit the CPU engine's (which
// widens them on the host) and those of the float32 rows of the same
// values; the statistics' variant says "fp16-rows". Where the module
// wants float32 rows (TI) or the job is told to widen
// (knn_job_testing.h), the job widens them, with the same results.
//
// Run from the repository root (where knn_gpu_cuda.so is built); without a
// usable GPU every test is skipped with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_support.h"
#include "half_float.h"
#include "job_run.h"
#include "knn_engine.h"
#include "knn_job_testing.h"

namespace {

::testing::Environment *const kModuleDir =
    ::testing::AddGlobalTestEnvironment(new gpu_test::ModuleDir);

using job_run::JobResult;
using job_run::expect_identical;
using job_run::run_job;

enum class Values {
  kEmbedding,   // unit-length Gaussian rows (what halfvec columns hold)
  kIntegers,    // -3..3 and quarters: exact ties and duplicate rows
  kSubnormals   // fp16 subnormals, signed zeros and all-zero rows
};

std::vector<uint16_t> half_rows(int64_t n, int dim, Values values, std::mt19937_64 &rng) {
  std::vector<float> x(static_cast<size_t>(n) * dim);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (int64_t r = 0; r < n; r++) {
    float *row = x.data() + r * dim;
    if (values == Values::kEmbedding) {
      double sq = 0;
      for (int j = 0; j < dim; j++) {
        row[j] = gauss(rng);
        sq += static_cast<double>(row[j]) * row[j];
      }
      for (int j = 0; j < dim; j++) row[j] = static_cast<float>(row[j] / std::sqrt(sq));
    } else if (values == Values::kIntegers) {
      for (int j = 0; j < dim; j++)
        row[j] = static_cast<float>(static_cast<int>(rng() % 7) - 3) + (rng() % 4 == 0 ? 0.25f : 0.0f);
    } else {
      const bool zero_row = rng() % 8 == 0;
      for (int j = 0; j < dim; j++) {
        const int m = static_cast<int>(rng() % 9) - 4;  // -4 .. 4 times 2^-24, some 2^-14
        row[j] = zero_row ? (rng() % 2 ? -0.0f : 0.0f)
                          : std::ldexp(static_cast<float>(m), rng() % 3 == 0 ? -14 : -24);
      }
    }
  }
  // Some repeated rows: exact duplicates at distance zero.
  for (int64_t i = 0; i + 7 < n; i += 7)
    std::copy_n(x.data() + i * dim, dim, x.data() + (i + 3) * dim);
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); i++) h[i] = knn_float_to_half(x[i]);
  return h;
}

std::vector<float> widened(const std::vector<uint16_t> &h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); i++) x[i] = knn_half_to_float(h[i]);
  return x;
}

// Rows of one join: queries and targets, or one set joined with itself
// (self-matches excluded: keys are the row ids).
struct Case {
  int dim = 0;
  bool self = false;
  std::vector<uint16_t> queries, targets;
  std::vector<int64_t> keys;

  KnnProblem problem(KnnMetric metric, int k) const {
    KnnProblem p{};
    p.element = KNN_ELEMENT_FLOAT16;
    p.targets = targets.data();
    p.n_targets = static_cast<int64_t>(targets.size()) / dim;
    p.queries = self ? targets.data() : queries.data();
    p.n_queries = self ? p.n_targets : static_cast<int64_t>(queries.size()) / dim;
    p.dim = dim;
    p.k = k;
    p.metric = metric;
    if (self) p.query_keys = p.target_keys = keys.data();
    return p;
  }
};

Case make_case(int64_t nq, int64_t nt, int dim, Values values, bool self, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Case c;
  c.dim = dim;
  c.self = self;
  c.targets = half_rows(nt, dim, values, rng);
  if (self) {
    for (int64_t i = 0; i < nt; i++) c.keys.push_back(i);
  } else {
    c.queries = half_rows(nq, dim, values, rng);
  }
  return c;
}

bool has(const KnnStats &s, const char *word) {
  return std::string(s.variant).find(word) != std::string::npos;
}

// The float16 problem on the GPU against the CPU engine, bit for bit;
// fp16_rows: whether the GPU must have taken the rows as float16.
JobResult check(KnnProblem p, const std::string &what, bool fp16_rows = true) {
  p.device = KNN_DEVICE_CPU;
  const JobResult cpu = run_job(p);
  p.device = KNN_DEVICE_GPU;
  const JobResult gpu = run_job(p);
  EXPECT_EQ(cpu.status, KNN_OK) << what << ": " << cpu.message;
  EXPECT_EQ(gpu.status, KNN_OK) << what << ": " << gpu.message;
  EXPECT_EQ(gpu.stats.device, KNN_DEVICE_GPU) << what << ": " << gpu.stats.device_name;
  EXPECT_EQ(has(gpu.stats, "fp16-rows"), fp16_rows) << what << ": " << gpu.stats.variant;
  expect_identical(gpu, cpu, what);
  return gpu;
}

std::string name(KnnMetric m, int dim, int k, bool self) {
  const char *metric = m == KNN_METRIC_L2       ? "l2"
                       : m == KNN_METRIC_IP     ? "ip"
                       : m == KNN_METRIC_COSINE ? "cosine"
                                                : "l1";
  return std::string(metric) + " dim " + std::to_string(dim) + " k " + std::to_string(k) +
         (self ? " self" : " two sets");
}

constexpr KnnMetric kMetrics[] = {KNN_METRIC_L2, KNN_METRIC_IP, KNN_METRIC_COSINE, KNN_METRIC_L1};

// Every metric; embedding dimensions (the fp16 tensor-core filter, except
// L1) and odd small ones (exact tiles); k small and beyond the selection's
// 256 (the full sort); self-joins without self-matches and two sets.
TEST(GpuFloat16, EveryMetricDimensionAndK) {
  REQUIRE_GPU();
  for (int dim : {3, 17, 384, 1536})
    for (bool self : {true, false}) {
      const Values values = dim >= 384 ? Values::kEmbedding : Values::kIntegers;
      const int64_t n = dim >= 1536 ? 700 : 1200;
      const Case c = make_case(300, n, dim, values, self, 1000 + dim + self);
      for (KnnMetric metric : kMetrics)
        for (int k : {10, 300}) check(c.problem(metric, k), name(metric, dim, k, self));
    }
}

// Every finite binary16 value as a target of one dimension, all of them
// returned (k = |T|) with their distances to one query: each one widened on
// the device exactly as the CPU engine's host widening does.
TEST(GpuFloat16, EveryFiniteValueWidensExactly) {
  REQUIRE_GPU();
  Case c;
  c.dim = 1;
  for (uint32_t bits = 0; bits < 0x10000u; bits++)
    if (knn_half_is_finite(static_cast<uint16_t>(bits)))
      c.targets.push_back(static_cast<uint16_t>(bits));
  for (float query : {0.0f, -1.5f, 1000.0f}) {
    c.queries.assign(1, knn_float_to_half(query));
    const int k = static_cast<int>(c.targets.size());
    for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1, KNN_METRIC_IP})
      check(c.problem(metric, k), name(metric, 1, k, false) + " every value, query " +
                                      std::to_string(query));
  }
}

// Ties, duplicates, fp16 subnormals, signed zeros and zero rows (cosine's
// special case) on both the tensor-core filter's and the exact paths.
TEST(GpuFloat16, TiesSubnormalsAndZeros) {
  REQUIRE_GPU();
  for (Values values : {Values::kIntegers, Values::kSubnormals})
    for (int dim : {17, 384}) {
      const Case c = make_case(0, 1500, dim, values, true, 2000 + dim);
      for (KnnMetric metric : kMetrics)
        check(c.problem(metric, 12),
              name(metric, dim, 12, true) + (values == Values::kIntegers ? " integers" : " subnormals"));
    }
}

// The same values as float32 rows give the same results on the GPU.
TEST(GpuFloat16, SameAsTheFloat32RowsOfTheSameValues) {
  REQUIRE_GPU();
  const Case c = make_case(400, 2000, 1536, Values::kEmbedding, false, 3000);
  const std::vector<float> q = widened(c.queries), t = widened(c.targets);
  for (KnnMetric metric : kMetrics) {
    KnnProblem p = c.problem(metric, 10);
    p.device = KNN_DEVICE_GPU;
    const JobResult half = run_job(p);
    p.element = KNN_ELEMENT_FLOAT32;
    p.queries = q.data();
    p.targets = t.data();
    const JobResult wide = run_job(p);
    ASSERT_EQ(half.status, KNN_OK) << half.message;
    ASSERT_EQ(wide.status, KNN_OK) << wide.message;
    EXPECT_TRUE(has(half.stats, "fp16-rows")) << half.stats.variant;
    EXPECT_FALSE(has(wide.stats, "fp16-rows")) << wide.stats.variant;
    expect_identical(half, wide, name(metric, 1536, 10, false) + " float16 vs float32");
  }
}

// A small memory budget: targets and queries in chunks (the next target
// chunk uploaded and widened by a helper thread meanwhile).
TEST(GpuFloat16, ChunkedUploads) {
  REQUIRE_GPU();
  for (bool self : {true, false})
    for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_L1}) {
      const Case c = make_case(1500, 4000, 384, Values::kEmbedding, self, 4000 + self);
      KnnProblem p = c.problem(metric, 10);
      p.gpu_memory_limit = int64_t{6} << 20;
      const JobResult gpu = check(p, name(metric, 384, 10, self) + " in 6 MiB");
      EXPECT_TRUE(has(gpu.stats, "chunks")) << gpu.stats.variant;
    }
}

// Where the module wants float32 rows (TI, asked for) the job widens them;
// so it does for every job while knn_job_test_float16_upload(0) holds (a
// module without knn_cuda_takes_float16). Same results either way.
TEST(GpuFloat16, WidenedByTheJobWhereTheModuleWantsFloat32) {
  REQUIRE_GPU();
  const Case low = make_case(0, 5000, 3, Values::kIntegers, true, 5000);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    KnnProblem p = low.problem(metric, 16);
    p.method = KNN_METHOD_TI;
    const JobResult gpu = check(p, name(metric, 3, 16, true) + " TI", false);
    EXPECT_EQ(gpu.stats.method, KNN_METHOD_TI);
  }
  const Case high = make_case(300, 1000, 384, Values::kEmbedding, false, 5001);
  knn_job_test_float16_upload(0);
  for (KnnMetric metric : kMetrics)
    check(high.problem(metric, 10), name(metric, 384, 10, false) + " widened by the job", false);
  knn_job_test_float16_upload(1);
  check(high.problem(KNN_METRIC_L2, 10), "l2 dim 384 after the switch is back on");
}

// A join split across two engines (one GPU listed twice): each share's
// float16 rows go to its engine as they are.
TEST(GpuFloat16, SplitAcrossTwoEngines) {
  REQUIRE_GPU();
  const Case c = make_case(0, 2000, 384, Values::kEmbedding, true, 6000);
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_IP}) {
    KnnProblem p = c.problem(metric, 10);
    p.n_devices = 2;
    p.devices[0] = p.devices[1] = 0;
    const JobResult gpu = check(p, name(metric, 384, 10, true) + " split");
    EXPECT_EQ(gpu.stats.n_devices, 2) << gpu.stats.device_name;
  }
}

}  // namespace
