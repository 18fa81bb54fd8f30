// gpu_engine_test.cpp -- the GPU engine against the CPU engine, through
// the job API (knn_job_start with device GPU / CPU), bit for bit: the same
// neighbours in the same order with the same distances (NaN matches NaN).
// The variants the GPU engine otherwise picks for itself (SGEMM filter, TI
// list places, threads per query, partial filter, ...) are forced through
// the module's test entry (kernels/cuda/knn_cuda_testing.h) and compared
// the same way.
//
// Run with `make gputest`, from the repository root (where
// knn_gpu_cuda.so is built). Without a usable GPU every test is skipped
// with the reason.
#include <dlfcn.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/knn_cuda_testing.h"
#include "gpu_test_support.h"
#include "knn_engine.h"
#include "knn_vocabulary.h"

namespace {

::testing::Environment *const kModuleDir =
    ::testing::AddGlobalTestEnvironment(new gpu_test::ModuleDir);

// ---- data ----

struct Data {
  int dim = 0;
  std::vector<float> queries, targets;
  std::vector<int64_t> query_keys, target_keys;
  bool self = false;  // queries are the targets (same array), keys = row ids
  int64_t nq() const { return self ? nt() : static_cast<int64_t>(queries.size()) / dim; }
  int64_t nt() const { return static_cast<int64_t>(targets.size()) / dim; }
};

enum class Shape {
  kUniform,
  kIntegers,      // small integers: many exact ties
  kClustered,
  kFarClusters,   // tiny spread far from the origin: GEMM bounds are loose
  kFarGrid,       // a grid of step 1/8 around 1e5: large values, small distances
  kTiny,          // multiples of 1e-22: squares underflow to subnormals and zero
  kSignedZeros,   // -0, +0, 1 and 2
  kHuge           // multiples of 1e14: large, but every distance stays finite
};

std::vector<float> make_rows(int64_t n, int dim, Shape shape, std::mt19937_64 &rng) {
  std::vector<float> x(static_cast<size_t>(n) * dim);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::uniform_int_distribution<int> small_int(-3, 3);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  if (shape == Shape::kUniform) {
    for (float &v : x) v = uni(rng);
  } else if (shape == Shape::kIntegers) {
    for (float &v : x) v = static_cast<float>(small_int(rng));
  } else if (shape == Shape::kFarGrid) {
    for (float &v : x) v = 1.0e5f + static_cast<float>(rng() % 1000) * 0.125f;
  } else if (shape == Shape::kTiny) {
    for (float &v : x) v = static_cast<float>(rng() % 7) * 1.0e-22f;
  } else if (shape == Shape::kSignedZeros) {
    const float values[] = {-0.0f, 0.0f, 1.0f, 2.0f};
    for (float &v : x) v = values[rng() % 4];
  } else if (shape == Shape::kHuge) {
    for (float &v : x) v = static_cast<float>(rng() % 1000) * 1.0e14f;
  } else {
    // Gaussian blobs; kFarClusters puts them far from the origin with tiny
    // spread (large norms against small distances: GEMM bounds are loose).
    const int clusters = 12;
    const float centre_scale = shape == Shape::kFarClusters ? 1000.0f : 10.0f;
    const float spread = shape == Shape::kFarClusters ? 0.01f : 1.0f;
    std::vector<float> centres(static_cast<size_t>(clusters) * dim);
    for (float &c : centres) c = centre_scale * (1.0f + 0.1f * uni(rng));
    for (size_t i = 0; i < centres.size(); i++)
      if (i % 3 == 1) centres[i] = -centres[i];
    std::uniform_int_distribution<int> pick(0, clusters - 1);
    for (int64_t r = 0; r < n; r++) {
      const int c = pick(rng);
      for (int j = 0; j < dim; j++)
        x[r * dim + j] = centres[static_cast<size_t>(c) * dim + j] + spread * noise(rng);
    }
  }
  return x;
}

// Copies some rows over others, so that exact duplicates exist.
void add_duplicates(std::vector<float> *x, int dim, int64_t copies, std::mt19937_64 &rng) {
  const int64_t n = static_cast<int64_t>(x->size()) / dim;
  if (n < 2) return;
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  for (int64_t i = 0; i < copies; i++) {
    const int64_t from = pick(rng), to = pick(rng);
    std::memcpy(x->data() + to * dim, x->data() + from * dim, sizeof(float) * dim);
  }
}

Data make_data(int64_t nq, int64_t nt, int dim, Shape shape, uint64_t seed,
               bool duplicates = false) {
  std::mt19937_64 rng(seed);
  Data d;
  d.dim = dim;
  d.targets = make_rows(nt, dim, shape, rng);
  d.queries = make_rows(nq, dim, shape, rng);
  if (duplicates) {
    add_duplicates(&d.targets, dim, nt / 4, rng);
    // Some queries equal some targets.
    std::uniform_int_distribution<int64_t> pick(0, nt - 1);
    for (int64_t i = 0; i < nq; i += 3)
      std::memcpy(d.queries.data() + i * dim, d.targets.data() + pick(rng) * dim,
                  sizeof(float) * dim);
  }
  return d;
}

// One table joined with itself: same array, keys = row ids (self-match
// exclusion).
Data make_self(int64_t n, int dim, Shape shape, uint64_t seed, bool duplicates = false) {
  std::mt19937_64 rng(seed);
  Data d;
  d.dim = dim;
  d.self = true;
  d.targets = make_rows(n, dim, shape, rng);
  if (duplicates) add_duplicates(&d.targets, dim, n / 3, rng);
  d.target_keys.resize(n);
  for (int64_t i = 0; i < n; i++) d.target_keys[i] = 1000 + i;
  d.query_keys = d.target_keys;
  return d;
}

// Keys on two tables that collide: query i has key i % query_mod, target
// j key j % target_mod, so each query key stands on several targets.
void set_colliding_keys(Data *d, int64_t target_mod, int64_t query_mod) {
  d->target_keys.resize(d->nt());
  d->query_keys.resize(d->nq());
  for (int64_t i = 0; i < d->nt(); i++) d->target_keys[i] = i % target_mod;
  for (int64_t i = 0; i < d->nq(); i++) d->query_keys[i] = i % query_mod;
}

// ---- running a join ----

struct Outcome {
  KnnStatus status = KNN_INTERNAL_ERROR;
  std::string error;
  KnnStats stats{};
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
};

struct Options {
  int k = 10;
  KnnMetric metric = KNN_METRIC_L2;
  KnnMethod method = KNN_METHOD_BRUTE;
  int64_t gpu_memory_limit = 0;
  bool keys = false;  // pass the Data's keys (self-joins always do)
  // Non-null: run through the module's test entry with these choices forced.
  const KnnCudaTestOptions *forced = nullptr;
  // The method that must have run, a piece its variant must hold and one
  // it must not (null: any).
  KnnMethod expect_method = KNN_METHOD_AUTO;
  const char *expect_variant = nullptr;
  const char *reject_variant = nullptr;
};

KnnProblem make_problem(const Data &d, const Options &o, KnnDevice device) {
  KnnProblem p{};
  p.targets = d.targets.data();
  p.n_targets = d.nt();
  p.queries = d.self ? d.targets.data() : d.queries.data();
  p.n_queries = d.nq();
  p.dim = d.dim;
  p.k = o.k;
  p.metric = o.metric;
  p.method = o.method;
  p.device = device;
  if (d.self || o.keys) {
    p.query_keys = d.self ? d.target_keys.data() : d.query_keys.data();
    p.target_keys = d.target_keys.data();
  }
  p.n_threads = 0;
  p.gpu_memory_limit = o.gpu_memory_limit;
  return p;
}

Outcome run(const KnnProblem &p) {
  Outcome out;
  const size_t slots = static_cast<size_t>(p.n_queries) * p.k;
  out.neighbors.assign(slots, -7);  // poisoned: every slot must be written
  out.distances.assign(slots, -7.0);
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, out.neighbors.data(), out.distances.data(), err, sizeof err);
  if (job == nullptr) {
    out.error = err;
    return out;
  }
  while (!knn_job_wait(job, 100)) {
  }
  out.status = knn_job_finish(job, &out.stats, err, sizeof err);
  out.error = err;
  return out;
}

// The module's test entry (the job layer loads the same file, so this is
// the same module instance), or null when it is missing.
knn_cuda_run_tuned_fn tuned_entry() {
  static const knn_cuda_run_tuned_fn fn = [] {
    void *module = dlopen("./knn_gpu_cuda.so", RTLD_NOW | RTLD_LOCAL);
    return module == nullptr ? nullptr
                             : reinterpret_cast<knn_cuda_run_tuned_fn>(
                                   dlsym(module, KNN_CUDA_RUN_TUNED_SYMBOL));
  }();
  return fn;
}

// The GPU engine with `forced` choices, on this thread.
Outcome run_forced(const KnnProblem &p, const KnnCudaTestOptions &forced,
                   const int32_t *cancel = nullptr) {
  Outcome out;
  const size_t slots = static_cast<size_t>(p.n_queries) * p.k;
  out.neighbors.assign(slots, -7);
  out.distances.assign(slots, -7.0);
  const knn_cuda_run_tuned_fn entry = tuned_entry();
  if (entry == nullptr) {
    out.error = std::string("no ") + KNN_CUDA_RUN_TUNED_SYMBOL + " in ./knn_gpu_cuda.so";
    return out;
  }
  char err[512] = "";
  out.status = entry(&p, &forced, out.neighbors.data(), out.distances.data(), &out.stats, cancel,
                     err, sizeof err);
  out.error = err;
  return out;
}

bool same_distance(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;  // bit for bit (also the sign of 0)
}

// The CPU answer of a case, computed once and reused for several GPU runs.
Outcome cpu_answer(const Data &d, const Options &o) {
  Options cpu = o;
  cpu.method = KNN_METHOD_AUTO;
  cpu.gpu_memory_limit = 0;
  Outcome ref = run(make_problem(d, cpu, KNN_DEVICE_CPU));
  EXPECT_EQ(ref.status, KNN_OK) << ref.error;
  return ref;
}

std::string describe(const KnnProblem &p, const Options &o) {
  return std::string("metric ") + knn_metric_name(o.metric) + ", method " +
         knn_method_name(o.method) + ", |Q| " + std::to_string(p.n_queries) + ", |T| " +
         std::to_string(p.n_targets) + ", dim " + std::to_string(p.dim) + ", k " +
         std::to_string(p.k) +
         (o.gpu_memory_limit ? ", limit " + std::to_string(o.gpu_memory_limit) : std::string()) +
         (p.query_keys ? ", keys" : "") + (o.forced ? ", forced variant" : "");
}

// Runs the GPU engine on the case and compares with the CPU answer.
void expect_gpu_matches(const Data &d, const Options &o, const Outcome &ref) {
  const KnnProblem p = make_problem(d, o, KNN_DEVICE_GPU);
  const Outcome gpu = o.forced ? run_forced(p, *o.forced) : run(p);
  const std::string what = describe(p, o);
  ASSERT_EQ(gpu.status, KNN_OK) << what << ": " << gpu.error;
  ASSERT_EQ(gpu.stats.device, KNN_DEVICE_GPU)
      << what << ": the CPU engine answered (" << gpu.stats.device_name << ")";
  const std::string variant = gpu.stats.variant;
  if (o.expect_method != KNN_METHOD_AUTO) {
    EXPECT_EQ(gpu.stats.method, o.expect_method)
        << what << ": " << knn_method_name(gpu.stats.method) << " " << variant;
  }
  if (o.expect_variant != nullptr) {
    EXPECT_NE(variant.find(o.expect_variant), std::string::npos)
        << what << ": variant " << variant << ", wanted " << o.expect_variant;
  }
  if (o.reject_variant != nullptr) {
    EXPECT_EQ(variant.find(o.reject_variant), std::string::npos)
        << what << ": variant " << variant << ", not wanted " << o.reject_variant;
  }
  ASSERT_EQ(gpu.neighbors.size(), ref.neighbors.size());
  const int64_t k = p.k;
  int64_t bad = 0;
  for (size_t i = 0; i < ref.neighbors.size(); i++) {
    if (gpu.neighbors[i] == ref.neighbors[i] && same_distance(gpu.distances[i], ref.distances[i]))
      continue;
    if (bad++ < 3)
      ADD_FAILURE() << what << " [" << knn_method_name(gpu.stats.method) << " "
                    << gpu.stats.variant << "]: query " << i / k << " slot " << i % k
                    << ": gpu (" << gpu.neighbors[i] << ", " << gpu.distances[i] << ") cpu ("
                    << ref.neighbors[i] << ", " << ref.distances[i] << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " slots differ";
}

// The general brute-force path even where a tiny join would take
// small_join.cu's.
const KnnCudaTestOptions kGeneralPath = [] {
  KnnCudaTestOptions f{};
  f.no_small_join = 1;
  return f;
}();

void check(const Data &d, const Options &o) {
  const Outcome ref = cpu_answer(d, o);
  if (ref.status != KNN_OK) return;
  expect_gpu_matches(d, o, ref);
  // Joins small enough for small_join.cu: the general path too.
  if (o.forced == nullptr && o.method != KNN_METHOD_TI && d.nt() <= 32768) {
    Options general = o;
    general.forced = &kGeneralPath;
    general.expect_variant = nullptr;  // the default run checked it
    general.reject_variant = "small-join";
    expect_gpu_matches(d, general, ref);
  }
}

const KnnMetric kMetrics[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP, KNN_METRIC_L1};

// Every metric, with each k of ks.
void check_each_metric(const Data &d, std::initializer_list<int> ks) {
  for (KnnMetric m : kMetrics)
    for (int k : ks) {
      Options o;
      o.k = k;
      o.metric = m;
      check(d, o);
    }
}

// ---- brute force ----

TEST(GpuBrute, SweepOfShapes) {
  REQUIRE_GPU();
  const int dims[] = {1, 3, 8, 17, 64, 65, 130};
  struct Sizes { int64_t nq, nt; };
  const Sizes sizes[] = {{1, 500}, {37, 1000}, {300, 257}};
  uint64_t seed = 1;
  for (int dim : dims)
    for (const Sizes &s : sizes) {
      const Data d = make_data(s.nq, s.nt, dim, dim < 8 ? Shape::kIntegers : Shape::kUniform,
                               seed++, /*duplicates=*/true);
      check_each_metric(d, {1, 5, 20});
    }
}

TEST(GpuBrute, SelfJoinWithTiesAndDuplicates) {
  REQUIRE_GPU();
  for (int dim : {2, 3, 70})
    check_each_metric(make_self(3000, dim, Shape::kIntegers, 100 + dim, /*duplicates=*/true),
                      {1, 10, 64});
}

TEST(GpuBrute, KeysOnDifferentTables) {
  REQUIRE_GPU();
  Data d = make_data(400, 2000, 20, Shape::kUniform, 7, true);
  // Keys with collisions: each query key appears on several targets.
  set_colliding_keys(&d, 97, 101);
  for (KnnMetric m : kMetrics) {
    Options o;
    o.k = 15;
    o.metric = m;
    o.keys = true;
    check(d, o);
    o.k = 2000;  // more than the eligible targets of every query
    check(d, o);
  }
}

TEST(GpuBrute, LargeKAndKBeyondTargets) {
  REQUIRE_GPU();
  for (int dim : {16, 100}) {
    const Data small = make_data(50, 100, dim, Shape::kUniform, 11 + dim);
    const Data big = make_data(120, 3000, dim, Shape::kClustered, 13 + dim, true);
    for (KnnMetric m : kMetrics)
      for (int k : {99, 100, 101, 256, 300, 2048}) {
        Options o;
        o.k = k;
        o.metric = m;
        check(small, o);
        if (k >= 256) check(big, o);
      }
  }
}

TEST(GpuBrute, HighDimensions) {
  REQUIRE_GPU();
  for (int dim : {1000, 4096, 10000})
    check_each_metric(make_data(40, 300, dim, Shape::kUniform, 20 + dim, true), {7});
}

TEST(GpuBrute, ClusteredFarFromOriginNeedsFallback) {
  // Large norms against small distances: the GEMM bounds cannot certify
  // every query, so the exact fallback must take over.
  REQUIRE_GPU();
  check_each_metric(make_data(2000, 6000, 100, Shape::kFarClusters, 31, true), {20});
}

// On GPUs with fast FP64 the L2 filter is a DGEMM; the test entry forces
// the SGEMM filter, whose (norm-relative) bounds must hold as well.
TEST(GpuBrute, SgemmFilterForL2) {
  REQUIRE_GPU();
  const Data uniform = make_data(500, 4000, 100, Shape::kUniform, 35, true);
  const Data far = make_data(1500, 5000, 90, Shape::kFarClusters, 36, true);
  const Data self = make_self(4000, 300, Shape::kClustered, 37, true);
  KnnCudaTestOptions sgemm{};
  sgemm.sgemm_filter = 1;
  for (int k : {1, 20, 100}) {
    Options o;
    o.k = k;
    const Outcome a = cpu_answer(uniform, o), b = cpu_answer(far, o), c = cpu_answer(self, o);
    Options forced = o;
    forced.forced = &sgemm;
    forced.expect_variant = "sgemm-bound";
    expect_gpu_matches(uniform, forced, a);
    expect_gpu_matches(far, forced, b);
    expect_gpu_matches(self, forced, c);
    expect_gpu_matches(far, o, b);
    expect_gpu_matches(self, o, c);
  }
}

TEST(GpuBrute, CosineWithZeroVectors) {
  REQUIRE_GPU();
  for (int dim : {5, 90}) {
    Data d = make_data(300, 1500, dim, Shape::kIntegers, 40 + dim, true);
    for (int64_t r = 0; r < d.nt(); r += 17)
      std::fill(d.targets.begin() + r * dim, d.targets.begin() + (r + 1) * dim, 0.0f);
    for (int64_t r = 0; r < d.nq(); r += 29)
      std::fill(d.queries.begin() + r * dim, d.queries.begin() + (r + 1) * dim, 0.0f);
    for (int k : {3, 100, 1500}) {
      Options o;
      o.k = k;
      o.metric = KNN_METRIC_COSINE;
      check(d, o);
    }
  }
}

TEST(GpuBrute, SingleQueryManyTargets) {
  REQUIRE_GPU();
  for (int dim : {16, 128})
    check_each_metric(make_data(1, 200000, dim, Shape::kClustered, 50 + dim), {20});
}

TEST(GpuBrute, MediumSelfJoins) {
  REQUIRE_GPU();
  {
    const Data d = make_self(20000, 32, Shape::kClustered, 61, true);
    Options o;
    o.k = 20;
    check(d, o);
  }
  {
    const Data d = make_self(10000, 200, Shape::kClustered, 62, true);
    for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_COSINE}) {
      Options o;
      o.k = 20;
      o.metric = m;
      check(d, o);
    }
  }
}

TEST(GpuBrute, ForcedChunking) {
  // A small memory budget forces query and target chunks, the pinned
  // double-buffered uploads and the merging of per-chunk results.
  REQUIRE_GPU();
  struct Case { int dim; int k; KnnMetric metric; int64_t limit; };
  const Case cases[] = {
      {32, 20, KNN_METRIC_L2, 2 << 20},     {32, 20, KNN_METRIC_L1, 6 << 20},
      {128, 10, KNN_METRIC_L2, 3 << 20},    {128, 10, KNN_METRIC_COSINE, 8 << 20},
      {128, 30, KNN_METRIC_IP, 4 << 20},    {16, 300, KNN_METRIC_L2, 16 << 20},
  };
  for (const Case &c : cases) {
    const Data d = make_data(3000, 20000, c.dim, Shape::kClustered, 70 + c.dim + c.k, true);
    Options o;
    o.k = c.k;
    o.metric = c.metric;
    o.gpu_memory_limit = c.limit;
    check(d, o);
  }
  // The same with self-exclusion on a self-join.
  const Data self = make_self(15000, 24, Shape::kIntegers, 79, true);
  Options o;
  o.k = 12;
  o.gpu_memory_limit = 1 << 20;
  check(self, o);
}

// ---- the fp16 tensor-core filter (brute_filter = 3) ----

// Unit-norm rows of a Gaussian mixture, as embeddings are (bench's
// make_cpu_sets.py embedding, smaller).
std::vector<float> make_embeddings(int64_t n, int dim, int centres, double spread,
                                   std::mt19937_64 &rng) {
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<double> c(static_cast<size_t>(centres) * dim);
  for (double &v : c) v = g(rng);
  std::vector<float> x(static_cast<size_t>(n) * dim);
  std::vector<double> row(dim);
  for (int64_t r = 0; r < n; r++) {
    const int64_t k = static_cast<int64_t>(rng() % centres);
    double norm = 0;
    for (int j = 0; j < dim; j++) {
      row[j] = c[k * dim + j] / std::sqrt(dim) + spread * g(rng) / std::sqrt(dim);
      norm += row[j] * row[j];
    }
    for (int j = 0; j < dim; j++) x[r * dim + j] = static_cast<float>(row[j] / std::sqrt(norm));
  }
  return x;
}

Data make_embedding_data(int64_t nq, int64_t nt, int dim, uint64_t seed, double spread = 0.8) {
  std::mt19937_64 rng(seed);
  Data d;
  d.dim = dim;
  d.targets = make_embeddings(nt, dim, 20, spread, rng);
  d.queries = make_embeddings(nq, dim, 20, spread, rng);
  add_duplicates(&d.targets, dim, nt / 10, rng);
  for (int64_t i = 0; i < nq; i += 5)
    std::memcpy(d.queries.data() + i * dim, d.targets.data() + (rng() % nt) * dim,
                sizeof(float) * dim);
  return d;
}

KnnCudaTestOptions forced_filter(int filter) {
  KnnCudaTestOptions f{};
  f.brute_filter = filter;
  return f;
}

const KnnMetric kGemmMetrics[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP};

// Targets all alike: no query's GEMM bound can be certified, so every
// query is redone by the exact fallback, whose lists for 128 < k <= 240
// are beyond the fused selection and need a float tile (a DGEMM plan had
// none: "no distance tile planned", r13gpu). Each GEMM filter, forced.
TEST(GpuBrute, GemmFallbackBeyondTheFusedSelection) {
  REQUIRE_GPU();
  Data d = make_data(50, 40000, 100, Shape::kUniform, 41);
  for (int64_t r = 1; r < d.nt(); r++)
    std::memcpy(d.targets.data() + r * d.dim, d.targets.data(), sizeof(float) * d.dim);
  struct Filter { int code; const char *variant; };
  for (const Filter filter : {Filter{1, "sgemm-bound"}, Filter{2, "dgemm-bound"}, Filter{3, "hgemm-bound"}}) {
    KnnCudaTestOptions forced = forced_filter(filter.code);
    forced.no_small_join = 1;
    for (int k : {129, 200, 240}) {
      Options o;
      o.k = k;
      o.forced = &forced;
      o.expect_variant = filter.variant;
      check(d, o);
    }
  }
}

// The case with the fp16 filter forced (for every GEMM metric and k), and
// the engine's own choice, against one CPU answer each. `expect` and
// `reject` (null: none) are pieces both variants must hold and must not;
// without `expect` the forced one must say "hgemm-bound" where its lists
// hold k' = max(2k, k + 16) (beyond, the large-k path or the exact ones run).
void check_half(const Data &d, std::initializer_list<int> ks, bool also_auto = false,
                int64_t limit = 0, const char *expect = nullptr, const char *reject = nullptr) {
  static const KnnCudaTestOptions half = forced_filter(3);
  for (KnnMetric m : kGemmMetrics)
    for (int k : ks) {
      Options o;
      o.k = k;
      o.metric = m;
      o.gpu_memory_limit = limit;
      const Outcome ref = cpu_answer(d, o);
      if (ref.status != KNN_OK) continue;
      o.expect_variant = expect;
      o.reject_variant = reject;
      Options f = o;
      f.forced = &half;
      if (expect == nullptr && k + 16 <= 256) f.expect_variant = "hgemm-bound";
      expect_gpu_matches(d, f, ref);
      if (!also_auto) continue;
      // AUTO's choice where the tiny join (small_join.cu) is not taken, as
      // expected; and as it is, where that join may take the set.
      Options a = o;
      a.forced = &kGeneralPath;
      expect_gpu_matches(d, a, ref);
      if (d.nt() <= 32768) {
        Options plain = o;
        plain.expect_variant = nullptr;
        plain.reject_variant = nullptr;
        expect_gpu_matches(d, plain, ref);
      }
    }
}

TEST(GpuHalf, EmbeddingsEveryMetricAndDimension) {
  REQUIRE_GPU();
  for (int dim : {384, 768, 1536})
    check_half(make_embedding_data(300, 4000, dim, 300 + dim), {1, 10, 64, 200}, true);
}

TEST(GpuHalf, SelfJoinsWithTiesAndDuplicates) {
  REQUIRE_GPU();
  // Small integers: many exact ties (decided by row), duplicates.
  check_half(make_self(3000, 384, Shape::kIntegers, 401, true), {1, 10, 100});
  check_half(make_self(3000, 768, Shape::kUniform, 402, true), {10, 240});
  // Tight clusters: the k-th and k'-th neighbours are close, many queries
  // fail certification and are redone exactly.
  const Data tight = make_embedding_data(500, 5000, 768, 403, 0.02);
  check_half(tight, {10, 50});
}

TEST(GpuHalf, LargeKUsesTheExactPaths) {
  REQUIRE_GPU();
  check_half(make_embedding_data(60, 3000, 384, 404), {241, 1000, 3000, 5000});
}

// Targets that differ from the query in one element by one ulp (and
// copies of it): distances far below the fp16 filter's resolution.
TEST(GpuHalf, OneUlpApartAtTheCertificationBoundary) {
  REQUIRE_GPU();
  for (int dim : {384, 768}) {
    std::mt19937_64 rng(500 + dim);
    Data d;
    d.dim = dim;
    d.queries = make_embeddings(40, dim, 4, 0.5, rng);
    d.targets.clear();
    for (int64_t q = 0; q < 40; q++)
      for (int c = 0; c < 60; c++) {
        std::vector<float> row(d.queries.begin() + q * dim, d.queries.begin() + (q + 1) * dim);
        if (c % 3 != 0) {
          const int j = static_cast<int>(rng() % dim);
          row[j] = std::nextafter(row[j], c % 2 ? 2.0f : -2.0f);
          if (c % 5 == 0) {
            const int j2 = static_cast<int>(rng() % dim);
            row[j2] = std::nextafter(row[j2], 2.0f);
          }
        }
        d.targets.insert(d.targets.end(), row.begin(), row.end());
      }
    std::vector<float> extra = make_embeddings(1000, dim, 4, 0.5, rng);
    d.targets.insert(d.targets.end(), extra.begin(), extra.end());
    check_half(d, {1, 10, 30, 100});
  }
}

// Huge, tiny and mixed scales, zero rows, signed zeros, far clusters.
TEST(GpuHalf, ScalesZerosAndFarClusters) {
  REQUIRE_GPU();
  for (Shape shape : {Shape::kHuge, Shape::kTiny, Shape::kSignedZeros, Shape::kFarClusters,
                      Shape::kFarGrid})
    check_half(make_data(200, 2500, 384, shape, 600 + static_cast<int>(shape), true), {10, 40});
  // Rows of mixed magnitude: some elements 1e-30, some 1e30-scaled rows,
  // rows with fp16-subnormal elements after scaling, zero rows.
  std::mt19937_64 rng(610);
  Data d = make_data(150, 2000, 768, Shape::kUniform, 611, true);
  for (std::vector<float> *x : {&d.queries, &d.targets}) {
    const int64_t n = static_cast<int64_t>(x->size()) / 768;
    for (int64_t r = 0; r < n; r++) {
      float *row = x->data() + r * 768;
      switch (r % 7) {
        case 0: for (int j = 0; j < 768; j++) row[j] *= 1e30f; break;
        case 1: for (int j = 0; j < 768; j++) row[j] *= 1e-30f; break;
        case 2: for (int j = 0; j < 768; j += 2) row[j] *= 1e-9f; break;
        case 3: std::fill(row, row + 768, 0.0f); break;
        case 4: row[r % 768] = 3e4f; break;
        default: break;
      }
    }
  }
  check_half(d, {5, 20});
}

// Dot products that overflow float: every such IP value is -inf (and the
// cosine value NaN), ties decided by row, while the fp16 filter's double
// row numbers stay finite and would rank the pairs by their true dots.
// Targets grow with the row, so those bounds favour the last rows while the
// answer is the first ones (the filter certified the last rows before its
// norm limit, tile_value.cuh). Set a: everything around 1e19 (all norms
// overflow); set b: queries of norm ~10 against targets around 2e36 (only
// the targets' norms overflow), some targets negated (dot -inf, IP +inf),
// some small (finite dots). Each GEMM filter, and the large-k path.
TEST(GpuHalf, OverflowingDotsTieByRow) {
  REQUIRE_GPU();
  const int dim = 384;
  std::mt19937_64 rng(620);
  std::uniform_real_distribution<float> pos(0.5f, 1.0f);
  auto grow = [&](int64_t n, float scale, bool mixed) {
    std::vector<float> base(dim), x;
    for (float &v : base) v = pos(rng);
    for (int64_t r = 0; r < n; r++) {
      float f = scale * (1.0f + static_cast<float>(r) / 64.0f);
      if (mixed && r % 5 == 4) f = -f;
      if (mixed && r % 7 == 6) f = 1.0f;
      for (int j = 0; j < dim; j++) x.push_back(base[j] * f);
    }
    return x;
  };
  Data a, b;
  a.dim = b.dim = dim;
  a.targets = grow(600, 1e19f, false);
  a.queries = grow(20, 1e19f, false);
  b.targets = grow(600, 2e36f, true);
  b.queries.resize(static_cast<size_t>(20) * dim);
  for (float &v : b.queries) v = pos(rng);
  for (const Data *d : {&a, &b}) {
    check_half(*d, {1, 10, 40, 300});
    // The SGEMM filter (its norms overflow too: bound -inf already).
    KnnCudaTestOptions sgemm = forced_filter(1);
    sgemm.no_small_join = 1;
    for (KnnMetric m : kGemmMetrics) {
      Options o;
      o.k = 10;
      o.metric = m;
      o.forced = &sgemm;
      o.expect_variant = "sgemm-bound";
      check(*d, o);
    }
  }
}

// The SGEMM IP bound where a query's squares all underflow: components
// 2^-80 make knn_dot(q, q) 0 though the row is not zero, and the error
// term rel sqrt(qn tn) was 0. The last target, (2^24, -2^24, -1/4, 0...),
// has the canonical lane sum 0 (lanes 0 and 2 fold first: 2^-56 - 2^-82
// rounds to 2^-56) while a sequential sum (cuBLAS) keeps -2^-82; the 40
// targets before it have exact dots in (-2^-82, 0). The last target
// (IP value -0) is the nearest, but its bound was 2^-82, above the other
// 40, and the filter certified them. (cosine: qn = 0 gives its bound -inf.)
TEST(GpuBrute, SgemmIpBoundWithUnderflowingSquares) {
  REQUIRE_GPU();
  const int dim = 72;  // above kGemmMinDim
  Data d;
  d.dim = dim;
  d.queries.assign(static_cast<size_t>(3) * dim, std::ldexp(1.0f, -80));
  for (int j = 0; j < 40; j++) {
    std::vector<float> row(dim, 0.0f);
    row[3] = -0.2f * static_cast<float>(j + 1) / 41.0f;
    d.targets.insert(d.targets.end(), row.begin(), row.end());
  }
  std::vector<float> last(dim, 0.0f);
  last[0] = 0x1p24f;
  last[1] = -0x1p24f;
  last[2] = -0.25f;
  d.targets.insert(d.targets.end(), last.begin(), last.end());
  KnnCudaTestOptions sgemm = forced_filter(1), half = forced_filter(3);
  sgemm.no_small_join = half.no_small_join = 1;
  for (int k : {1, 5}) {
    Options o;
    o.k = k;
    o.metric = KNN_METRIC_IP;
    const Outcome ref = cpu_answer(d, o);
    ASSERT_EQ(ref.status, KNN_OK);
    EXPECT_EQ(ref.neighbors[0], 40) << "the CPU engine's nearest target";
    Options f = o;
    f.forced = &sgemm;
    f.expect_variant = "sgemm-bound";
    expect_gpu_matches(d, f, ref);
    f.forced = &half;
    f.expect_variant = "hgemm-bound";
    expect_gpu_matches(d, f, ref);
    o.forced = &kGeneralPath;
    expect_gpu_matches(d, o, ref);
  }
}

TEST(GpuHalf, ChunkedAndSmallBatches) {
  REQUIRE_GPU();
  const Data d = make_embedding_data(3000, 20000, 384, 700);
  check_half(d, {10}, false, 24 << 20);
  check_half(make_embedding_data(1, 5000, 768, 701), {1, 10});
  check_half(make_embedding_data(5, 5000, 768, 702), {10});
  Options self;
  self.k = 10;
  self.gpu_memory_limit = 16 << 20;
  check(make_self(12000, 512, Shape::kClustered, 703, true), self);
}

// The fp16 filter with the next tile's GEMM beside the current selection
// (two tiles, a second stream): small budgets give many small tiles.
TEST(GpuHalf, PipelinedTiles) {
  REQUIRE_GPU();
  KnnCudaTestOptions pipelined = forced_filter(3);
  pipelined.brute_pipeline = 1;
  const Data big = make_embedding_data(3000, 20000, 384, 900);
  const Data self = make_self(6000, 768, Shape::kClustered, 901, true);
  for (KnnMetric m : kGemmMetrics)
    for (int64_t limit : {int64_t(0), int64_t(24) << 20}) {
      Options o;
      o.k = 10;
      o.metric = m;
      o.gpu_memory_limit = limit;
      o.forced = &pipelined;
      o.expect_variant = "hgemm-bound/pipelined";
      check(big, o);
      o.k = 40;
      check(self, o);
    }
}

// Targets in order of decreasing distance from their query: every step of
// the selection takes entries, so the warp lists' buffers fill and are
// sorted over and over (select_tiles.cu), with tile widths that end inside
// a group of 8 columns; and the same with the phase timer on
// (KNN_BRUTE_PHASES, brute_force.cu), which must not change a result.
TEST(GpuHalf, EveryTargetBeatsTheOnesBefore) {
  REQUIRE_GPU();
  const int dim = 384;
  std::mt19937_64 rng(950);
  std::normal_distribution<double> g(0.0, 1.0);
  Data d;
  d.dim = dim;
  d.queries = make_embeddings(6, dim, 3, 0.5, rng);
  const int64_t nt = 7001;
  d.targets.resize(static_cast<size_t>(nt) * dim);
  for (int64_t j = 0; j < nt; j++) {
    const float *q = d.queries.data() + (j % 6) * dim;
    const double radius = 2.0 - 1.9 * static_cast<double>(j) / nt;
    std::vector<double> u(dim);
    double norm = 0;
    for (double &v : u) {
      v = g(rng);
      norm += v * v;
    }
    for (int i = 0; i < dim; i++)
      d.targets[j * dim + i] = static_cast<float>(q[i] + radius * u[i] / std::sqrt(norm));
  }
  check_half(d, {1, 10, 100});
  setenv("KNN_BRUTE_PHASES", "1", 1);
  check_half(d, {10});
  unsetenv("KNN_BRUTE_PHASES");
}

// The engine's own choice at embedding dimensions, and the DGEMM filter
// still reachable for A/B.
TEST(GpuHalf, AutoPicksTensorCoresAndDgemmStaysForcible) {
  REQUIRE_GPU();
  const Data d = make_embedding_data(500, 6000, 768, 800);
  const KnnCudaTestOptions dgemm = forced_filter(2), sgemm = forced_filter(1);
  Options o;
  o.k = 10;
  const Outcome ref = cpu_answer(d, o);
  Options a = o;
  a.expect_variant = "hgemm-bound";
  expect_gpu_matches(d, a, ref);
  Options b = o;
  b.forced = &dgemm;
  b.expect_variant = "dgemm-bound";
  expect_gpu_matches(d, b, ref);
  Options c = o;
  c.forced = &sgemm;
  c.expect_variant = "sgemm-bound";
  expect_gpu_matches(d, c, ref);
  Options l1 = o;
  l1.metric = KNN_METRIC_L1;
  l1.reject_variant = "gemm";
  check(d, l1);
}

// ---- large k on the fp16 filter (large_k_select.cu) ----

// k past the lists up to 16384: the fp16 filter forced and the engine's own
// choice (the fp16 filter too at these dimensions), every GEMM metric,
// against one CPU answer each; `expect` must be in the variant.
void check_large_k(const Data &d, std::initializer_list<int> ks, int64_t limit = 0,
                   const char *expect = "hgemm-bound/large-k") {
  check_half(d, ks, true, limit, expect, "exact-tiles/full-sort");
}

// More targets than the sample (16384): the guess comes from every
// step-th target.
TEST(GpuLargeK, EveryMetricAndK) {
  REQUIRE_GPU();
  for (int dim : {384, 768})
    check_large_k(make_embedding_data(200, 40000, dim, 1100 + dim),
                  {241, 300, 1000, 4096, 16384});
}

// Small integers (exact ties decided by row), duplicated rows, self
// matches excluded.
TEST(GpuLargeK, SelfJoinsWithTiesAndDuplicates) {
  REQUIRE_GPU();
  check_large_k(make_self(6000, 384, Shape::kIntegers, 1201, true), {300, 1000, 4096});
  check_large_k(make_self(5000, 768, Shape::kClustered, 1202, true), {500, 4999});
}

// Keys that collide across tables; with 16500 targets and k = 16384 some
// queries have fewer eligible targets than k (the sample cannot bound k:
// every target is collected).
TEST(GpuLargeK, KeysAndFewerEligibleThanK) {
  REQUIRE_GPU();
  for (int64_t nt : {int64_t(30000), int64_t(16500)}) {
    Data d = make_embedding_data(150, nt, 384, 1300 + nt);
    set_colliding_keys(&d, 97, 101);
    const KnnCudaTestOptions half = forced_filter(3);
    for (KnnMetric m : kGemmMetrics)
      for (int k : {1000, 16384}) {
        Options o;
        o.k = k;
        o.metric = m;
        o.keys = true;
        const Outcome ref = cpu_answer(d, o);
        o.forced = &half;
        o.expect_variant = "hgemm-bound/large-k";
        expect_gpu_matches(d, o, ref);
      }
  }
}

// A small budget: query and target chunks, each target chunk's k best
// merged.
TEST(GpuLargeK, ChunkedTargets) {
  REQUIRE_GPU();
  check_large_k(make_embedding_data(1500, 30000, 384, 1400), {1000}, 48 << 20, "chunks");
  check_large_k(make_self(6000, 768, Shape::kClustered, 1401, true), {4096}, 96 << 20,
                "chunks");
}

// Each target row repeated 2500 times: every bound of a group is equal, so
// collecting under the guess takes whole groups and overflows; those
// queries are redone by the full sort.
TEST(GpuLargeK, IdenticalRowsForceTheFallback) {
  REQUIRE_GPU();
  std::mt19937_64 rng(1500);
  Data d;
  d.dim = 384;
  const std::vector<float> distinct = make_embeddings(8, 384, 4, 0.5, rng);
  for (int64_t r = 0; r < 20000; r++)
    d.targets.insert(d.targets.end(), distinct.begin() + (r % 8) * 384,
                     distinct.begin() + (r % 8 + 1) * 384);
  d.queries = make_embeddings(60, 384, 4, 0.5, rng);
  check_large_k(d, {300, 1000}, 0, "+fallback");
}

// Zero rows (cosine: NaN distances), fewer targets than k, k past 16384
// (the full sort), and the previous path still reachable.
TEST(GpuLargeK, ZeroRowsSmallSetsAndBeyond) {
  REQUIRE_GPU();
  Data d = make_embedding_data(80, 3000, 384, 1600);
  for (int64_t r = 0; r < d.nt(); r += 13)
    std::fill(d.targets.begin() + r * 384, d.targets.begin() + (r + 1) * 384, 0.0f);
  for (int64_t r = 0; r < d.nq(); r += 7)
    std::fill(d.queries.begin() + r * 384, d.queries.begin() + (r + 1) * 384, 0.0f);
  check_large_k(d, {241, 2999, 3000, 5000});
  const Data big = make_embedding_data(20, 20000, 384, 1601);
  KnnCudaTestOptions old = forced_filter(0);
  old.brute_no_large_k = 1;
  for (KnnMetric m : kGemmMetrics) {
    Options o;
    o.k = 16385;
    o.metric = m;
    o.expect_variant = "exact-tiles/full-sort";
    check(big, o);
    o.k = 5000;
    const Outcome ref = cpu_answer(big, o);
    o.forced = &old;
    expect_gpu_matches(big, o, ref);
  }
}

// ---- statuses ----

TEST(GpuEngine, TooSmallBudgetIsOutOfMemory) {
  REQUIRE_GPU();
  const Data d = make_data(100, 1000, 64, Shape::kUniform, 90);
  // Brute force cannot chunk that small; TI cannot cut parts that small (and
  // never hands a join to brute force for lack of memory).
  for (KnnMethod method : {KNN_METHOD_BRUTE, KNN_METHOD_TI}) {
    Options o;
    o.method = method;
    o.gpu_memory_limit = 1000;  // bytes
    const Outcome gpu = run(make_problem(d, o, KNN_DEVICE_GPU));
    EXPECT_EQ(gpu.status, KNN_OUT_OF_MEMORY) << knn_method_name(method) << ": " << gpu.error;
    EXPECT_FALSE(gpu.error.empty());
  }
}

TEST(GpuEngine, CancelStopsAJoin) {
  REQUIRE_GPU();
  const Data d = make_self(400000, 64, Shape::kUniform, 91);
  Options o;
  o.k = 20;
  const KnnProblem p = make_problem(d, o, KNN_DEVICE_GPU);
  std::vector<int64_t> nb(static_cast<size_t>(p.n_queries) * p.k);
  std::vector<double> dist(nb.size());
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, nb.data(), dist.data(), err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  knn_job_cancel(job);
  KnnStats stats{};
  const KnnStatus st = knn_job_finish(job, &stats, err, sizeof err);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Either it finished before the cancel arrived, or it stopped promptly.
  if (st != KNN_OK) {
    EXPECT_EQ(st, KNN_CANCELLED) << err;
    EXPECT_LT(waited, 2.0);
  }
}

TEST(GpuEngine, EmptySides) {
  REQUIRE_GPU();
  Data d = make_data(5, 0, 4, Shape::kUniform, 92);
  Options o;
  o.k = 3;
  const Outcome gpu = run(make_problem(d, o, KNN_DEVICE_GPU));
  ASSERT_EQ(gpu.status, KNN_OK) << gpu.error;
  for (size_t i = 0; i < gpu.neighbors.size(); i++) {
    EXPECT_EQ(gpu.neighbors[i], -1);
    EXPECT_TRUE(std::isnan(gpu.distances[i]));
  }
}

// ---- TI and AUTO (the triangle-inequality path) ----

TEST(GpuTi, MatchesCpu) {
  REQUIRE_GPU();
  const Data shapes[] = {
      make_data(2000, 30000, 3, Shape::kClustered, 101, true),
      make_data(1, 30000, 8, Shape::kClustered, 102),
      make_self(30000, 16, Shape::kClustered, 103, true),
      make_self(12000, 4, Shape::kIntegers, 104, true),
      make_data(3000, 5000, 40, Shape::kUniform, 105),
  };
  for (const Data &d : shapes)
    for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1})
      for (int k : {1, 20, 300}) {
        Options o;
        o.k = k;
        o.metric = m;
        const Outcome ref = cpu_answer(d, o);
        for (KnnMethod method : {KNN_METHOD_TI, KNN_METHOD_AUTO}) {
          o.method = method;
          expect_gpu_matches(d, o, ref);
        }
      }
}

TEST(GpuTi, ChunkedAndOtherMetrics) {
  REQUIRE_GPU();
  const Data d = make_data(5000, 40000, 6, Shape::kClustered, 110, true);
  Options o;
  o.k = 10;
  o.method = KNN_METHOD_TI;
  o.gpu_memory_limit = 4 << 20;
  check(d, o);
  // TI on a metric it does not cover is answered by brute force.
  o.gpu_memory_limit = 0;
  o.metric = KNN_METRIC_COSINE;
  check(d, o);
}

// ---- TI variants (forced through the test entry) ----

// One TI case: data, k, metric, keys, the choices forced and a piece of the
// variant string that proves they ran.
struct TiCase {
  const char *name;
  Data data;
  int k;
  KnnMetric metric;
  KnnCudaTestOptions forced;
  const char *expect_variant;
  int64_t gpu_memory_limit;
  const char *reject_variant = nullptr;
};

KnnCudaTestOptions forced_ti(int filter, int list, int parts) {
  KnnCudaTestOptions f{};
  f.ti_filter = filter;
  f.ti_list = list;
  f.ti_threads_per_query = parts;
  return f;
}

void check_ti_case(const TiCase &c) {
  SCOPED_TRACE(c.name);
  Options o;
  o.k = c.k;
  o.metric = c.metric;
  o.method = KNN_METHOD_TI;
  o.keys = !c.data.query_keys.empty();
  o.gpu_memory_limit = c.gpu_memory_limit;
  o.forced = &c.forced;
  o.expect_method = KNN_METHOD_TI;
  o.expect_variant = c.expect_variant;
  o.reject_variant = c.reject_variant;
  check(c.data, o);
}

// Self-join keys other than row ids: shuffled ids, or two rows per key.
Data with_self_keys(Data d, bool shuffled, bool pairs, uint64_t seed) {
  for (int64_t i = 0; i < d.nt(); i++) d.target_keys[i] = pairs ? i / 2 : i;
  if (shuffled) {
    std::mt19937_64 rng(seed);
    std::shuffle(d.target_keys.begin(), d.target_keys.end(), rng);
  }
  d.query_keys = d.target_keys;
  return d;
}

TEST(GpuTi, ForcedFiltersListsAndThreads) {
  REQUIRE_GPU();
  const KnnMetric L2 = KNN_METRIC_L2, L1 = KNN_METRIC_L1;
  const Data grid = make_self(3000, 4, Shape::kIntegers, 201, true);
  const Data dups = make_self(3000, 8, Shape::kIntegers, 202, true);
  const Data blobs = make_self(3000, 24, Shape::kClustered, 203, true);
  const Data two_sets = make_data(2000, 2500, 3, Shape::kClustered, 204, true);
  const TiCase cases[] = {
      {"registers", dups, 20, L2, forced_ti(1, 1, 1), "full/registers", 0},
      {"shared", dups, 20, L2, forced_ti(1, 2, 1), "full/shared", 0},
      {"global", dups, 20, L2, forced_ti(1, 3, 1), "full/global", 0},
      {"parts 2", grid, 20, L2, forced_ti(1, 0, 2), "inside-query x2", 0},
      {"parts 3 L1", grid, 20, L1, forced_ti(1, 0, 3), "inside-query x3", 0},
      {"parts 8 shared", blobs, 20, L2, forced_ti(1, 2, 8), "shared/remap/inside-query x8", 0},
      {"parts 8 global", blobs, 20, L2, forced_ti(1, 3, 8), "global/remap/inside-query x8", 0},
      {"partial", grid, 20, L2, forced_ti(2, 0, 0), "partial/", 0},
      {"partial L1 two sets", two_sets, 40, L1, forced_ti(2, 0, 0), "partial/", 0},
      {"k64 global", grid, 64, L2, forced_ti(0, 3, 0), "full/global", 0},
      {"k100 full", dups, 100, L2, forced_ti(1, 0, 0), "full/", 0},
      {"small budget, output in chunks", dups, 20, L2, forced_ti(1, 0, 1), "full/", 2500000},
  };
  for (const TiCase &c : cases) check_ti_case(c);
}

TEST(GpuTi, ForcedClusteringAndDuplicates) {
  REQUIRE_GPU();
  const Data grid = make_self(3000, 4, Shape::kIntegers, 211, true);
  const Data dups = make_self(3000, 8, Shape::kIntegers, 213, true);
  const Data blobs = make_self(3000, 61, Shape::kClustered, 212, true);
  KnnCudaTestOptions no_dedup{}, assign_direct{}, assign_gemm{}, few{}, many{};
  no_dedup.ti_keep_duplicates = 1;
  assign_direct.ti_gemm_assign_min_stride = 1 << 30;
  assign_gemm.ti_gemm_assign_min_stride = 8;
  few.ti_landmark_factor = 1.5;
  many.ti_landmark_factor = 6.0;
  const TiCase cases[] = {
      {"no dedup", grid, 20, KNN_METRIC_L2, no_dedup, "/remap", 0, "/dedup"},
      {"assign direct", blobs, 20, KNN_METRIC_L2, assign_direct, "/dedup", 0},
      {"assign gemm", dups, 20, KNN_METRIC_L2, assign_gemm, "/dedup", 0},
      {"landmarks 1.5 sqrt", blobs, 20, KNN_METRIC_L2, few, "/dedup", 0},
      {"landmarks 6 sqrt", grid, 20, KNN_METRIC_L1, many, "/dedup", 0},
  };
  for (const TiCase &c : cases) check_ti_case(c);
}

// Shapes of data and keys the TI bounds and the exclusion must get right.
TEST(GpuTi, ValuesKeysAndSizes) {
  REQUIRE_GPU();
  const KnnCudaTestOptions defaults{};
  const KnnMetric L2 = KNN_METRIC_L2, L1 = KNN_METRIC_L1;
  Data two_sets_keys = make_data(1500, 1800, 4, Shape::kIntegers, 229, true);
  two_sets_keys.query_keys.resize(1500);
  two_sets_keys.target_keys.resize(1800);
  for (int64_t i = 0; i < 1500; i++) two_sets_keys.query_keys[i] = i;
  for (int64_t j = 0; j < 1800; j++) two_sets_keys.target_keys[j] = j % 1000;
  const TiCase cases[] = {
      {"far from the origin", make_self(2000, 61, Shape::kFarGrid, 221, false), 20, L2, defaults,
       nullptr, 0},
      {"generic stride", make_self(1500, 100, Shape::kUniform, 222, false), 10, L2, defaults,
       nullptr, 0},
      {"generic stride L1", make_self(1200, 130, Shape::kIntegers, 223, false), 7, L1, defaults,
       nullptr, 0},
      {"d1", make_self(2000, 1, Shape::kIntegers, 224, true), 20, L2, defaults, nullptr, 0},
      {"tiny values", make_self(2000, 5, Shape::kTiny, 225, false), 20, L2, defaults, nullptr, 0},
      {"tiny values L1", make_self(2000, 5, Shape::kTiny, 225, false), 20, L1, defaults, nullptr,
       0},
      {"signed zeros", make_self(2000, 6, Shape::kSignedZeros, 226, false), 20, L2, defaults,
       nullptr, 0},
      {"huge finite values", make_self(2000, 4, Shape::kHuge, 227, false), 20, L2, defaults,
       nullptr, 0},
      {"k beyond the targets", make_data(300, 15, 5, Shape::kUniform, 228), 20, L2, defaults,
       nullptr, 0},
      {"k = targets", make_self(21, 3, Shape::kIntegers, 230, false), 20, L2, defaults, nullptr,
       0},
      {"k1", make_self(3000, 4, Shape::kIntegers, 231, true), 1, L2, defaults, nullptr, 0},
      {"shuffled keys",
       with_self_keys(make_self(2000, 4, Shape::kIntegers, 232, true), true, false, 1), 20, L2,
       defaults, nullptr, 0},
      {"two rows per key",
       with_self_keys(make_self(2000, 4, Shape::kIntegers, 233, true), false, true, 2), 20, L2,
       defaults, nullptr, 0},
      {"two sets, colliding keys", two_sets_keys, 20, L2, defaults, nullptr, 0},
  };
  for (const TiCase &c : cases) check_ti_case(c);
}

// Distances that could overflow break the TI bounds: brute force answers.
TEST(GpuTi, OverflowingValuesGoToBruteForce) {
  REQUIRE_GPU();
  Data d = make_self(500, 4, Shape::kIntegers, 240, false);
  d.targets[17] = 1.0e30f;
  const KnnCudaTestOptions defaults{};
  Options o;
  o.k = 5;
  o.method = KNN_METHOD_TI;
  o.forced = &defaults;
  o.expect_method = KNN_METHOD_BRUTE;
  check(d, o);
}

// AUTO's second opinion: where TI's level 1 keeps most cluster pairs
// (uniform rows of 64 dimensions), brute force answers; on clustered rows
// of few dimensions TI keeps the join. Both exact.
TEST(GpuTi, AutoGivesUpWhereLevelOneCannotPrune) {
  REQUIRE_GPU();
  const Data uniform = make_data(2000, 60000, 64, Shape::kUniform, 260);
  Options o;
  o.k = 10;
  o.method = KNN_METHOD_AUTO;
  o.expect_method = KNN_METHOD_BRUTE;
  o.expect_variant = "(auto: TI's level 1 kept";
  check(uniform, o);
  // Forced TI still runs TI there.
  o.method = KNN_METHOD_TI;
  o.expect_method = KNN_METHOD_TI;
  o.expect_variant = "level-1 kept";
  check(uniform, o);

  const Data clustered = make_data(2000, 60000, 16, Shape::kClustered, 261);
  o.method = KNN_METHOD_AUTO;
  o.expect_method = KNN_METHOD_TI;
  o.expect_variant = nullptr;
  check(clustered, o);
}

TEST(GpuEngine, CancelledBeforeTheStart) {
  REQUIRE_GPU();
  const Data d = make_self(3000, 4, Shape::kIntegers, 250, false);
  const KnnCudaTestOptions defaults{};
  const int32_t cancel = 1;
  for (KnnMethod method : {KNN_METHOD_TI, KNN_METHOD_BRUTE}) {
    Options o;
    o.method = method;
    const Outcome gpu = run_forced(make_problem(d, o, KNN_DEVICE_GPU), defaults, &cancel);
    EXPECT_EQ(gpu.status, KNN_CANCELLED) << knn_method_name(method) << ": " << gpu.error;
  }
}

// ---- TI out of core (budgets below what the in-memory join needs) ----

// An environment variable set for one scope (the out-of-core join's A/B
// knobs), unset at its end, whatever way the test leaves.
class ScopedEnv {
 public:
  ScopedEnv(const char *name, const char *value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv &) = delete;
  ScopedEnv &operator=(const ScopedEnv &) = delete;

 private:
  const char *name_;
};

// The shape an out-of-core variant names: "ti/out-of-core QxT parts of
// RqxRt/..." (query parts x target parts, rows per part).
struct OutOfCoreShape {
  int query_parts = 0, target_parts = 0;
  long long query_rows = 0, target_rows = 0;
  bool cached = false;
  long long skipped = -1;  // pairs skipped by their bound (" skip S"); -1: not ordered
  long long gathered = -1; // parts of far clusters gathered (" gathered G"); -1: none
};

bool out_of_core_shape(const std::string &variant, OutOfCoreShape *s) {
  const size_t at = variant.find("ti/out-of-core ");
  if (at == std::string::npos) return false;
  if (std::sscanf(variant.c_str() + at, "ti/out-of-core %dx%d parts of %lldx%lld",
                  &s->query_parts, &s->target_parts, &s->query_rows, &s->target_rows) != 4)
    return false;
  s->cached = variant.find("/cached") != std::string::npos;
  const size_t skip = variant.find(" skip ");
  if (skip != std::string::npos) s->skipped = std::atoll(variant.c_str() + skip + 6);
  const size_t gathered = variant.find(" gathered ");
  if (gathered != std::string::npos) s->gathered = std::atoll(variant.c_str() + gathered + 10);
  return true;
}

// Bit-for-bit comparison of two answers (rows, distances, padding).
void expect_same_answer(const Outcome &got, const Outcome &want, const std::string &what) {
  ASSERT_EQ(got.neighbors.size(), want.neighbors.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < want.neighbors.size(); i++) {
    if (got.neighbors[i] == want.neighbors[i] &&
        same_distance(got.distances[i], want.distances[i]))
      continue;
    if (bad++ < 3)
      ADD_FAILURE() << what << ": slot " << i << ": (" << got.neighbors[i] << ", "
                    << got.distances[i] << ") instead of (" << want.neighbors[i] << ", "
                    << want.distances[i] << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " slots differ";
}

// The TI join of a case on the GPU at budget `limit` (0: none), through the
// job layer, or through the test entry when o.forced is set.
Outcome gpu_ti(const Data &d, Options o, int64_t limit) {
  o.method = KNN_METHOD_TI;
  o.gpu_memory_limit = limit;
  const KnnProblem p = make_problem(d, o, KNN_DEVICE_GPU);
  return o.forced ? run_forced(p, *o.forced) : run(p);
}

// Runs the case in memory and at each budget of `limits`; every answer
// must equal the CPU engine's and the in-memory GPU join's bit for bit,
// and each limited run at least `floor` bytes must have been the
// out-of-core TI join (below, brute force may answer a budget too small
// for the smallest parts). Returns the out-of-core shapes that ran
// (printed, so that a run shows what it covered).
std::vector<OutOfCoreShape> check_out_of_core(const Data &d, const Options &o,
                                              const std::vector<int64_t> &limits,
                                              const char *name, int64_t floor = 0) {
  std::vector<OutOfCoreShape> shapes;
  Options cpu = o;
  cpu.method = KNN_METHOD_TI;
  const Outcome ref = cpu_answer(d, cpu);
  if (ref.status != KNN_OK) return shapes;
  const std::string base = std::string(name) + " (" + knn_metric_name(o.metric) +
                           ", k " + std::to_string(o.k) + ")";
  const Outcome in_memory = gpu_ti(d, o, 0);
  EXPECT_EQ(in_memory.status, KNN_OK) << base << ": " << in_memory.error;
  if (in_memory.status != KNN_OK) return shapes;
  EXPECT_EQ(std::string(in_memory.stats.variant).find("out-of-core"), std::string::npos)
      << base << ": without a limit the join runs in memory: " << in_memory.stats.variant;
  expect_same_answer(in_memory, ref, base + " in memory vs cpu");
  for (int64_t limit : limits) {
    const std::string what = base + ", limit " + std::to_string(limit);
    const Outcome gpu = gpu_ti(d, o, limit);
    EXPECT_EQ(gpu.status, KNN_OK) << what << ": " << gpu.error;
    if (gpu.status != KNN_OK) continue;
    std::printf("  [out-of-core] %s: %s %s, %lld distances\n", what.c_str(),
                knn_method_name(gpu.stats.method), gpu.stats.variant,
                static_cast<long long>(gpu.stats.distance_computations));
    EXPECT_EQ(gpu.stats.device, KNN_DEVICE_GPU) << what;
    OutOfCoreShape shape;
    const bool out_of_core = out_of_core_shape(gpu.stats.variant, &shape);
    if (limit >= floor) {
      EXPECT_EQ(gpu.stats.method, KNN_METHOD_TI) << what << ": " << gpu.stats.variant;
      EXPECT_TRUE(out_of_core) << what << ": not the out-of-core join: " << gpu.stats.variant;
    }
    if (out_of_core) shapes.push_back(shape);
    expect_same_answer(gpu, ref, what + " vs cpu");
    expect_same_answer(gpu, in_memory, what + " vs in-memory gpu");
  }
  return shapes;
}

TEST(GpuTiOutOfCore, SelfJoinsWithDuplicatesL2AndL1) {
  REQUIRE_GPU();
  // 20000 x 8: the in-memory join needs several MB; the budgets leave it
  // 1/2 to 1/8 of that.
  const Data d = make_self(20000, 8, Shape::kClustered, 301, true);
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    for (int k : {1, 20}) {
      Options o;
      o.k = k;
      o.metric = m;
      const std::vector<OutOfCoreShape> shapes =
          check_out_of_core(d, o, {3 << 20, 3 << 19, 3 << 18}, "self 20000x8");
      ASSERT_EQ(shapes.size(), 3u);
      // The smallest budget needs several parts on both sides, and parts
      // cached between query parts.
      EXPECT_GT(shapes.back().query_parts, 1);
      EXPECT_GT(shapes.back().target_parts, 1);
      EXPECT_TRUE(shapes.back().cached);
    }
  }
}

TEST(GpuTiOutOfCore, TwoSetsTiesAndCollidingKeys) {
  REQUIRE_GPU();
  // Integers: many exact ties, broken by target row across parts. Target
  // keys j % 1000 exclude up to 15 rows a query (k' = k + 15 > 32: level 2's
  // lists in global memory).
  Data keyed = make_data(6000, 15000, 3, Shape::kIntegers, 311, true);
  keyed.query_keys.resize(6000);
  keyed.target_keys.resize(15000);
  for (int64_t i = 0; i < 6000; i++) keyed.query_keys[i] = i;
  for (int64_t j = 0; j < 15000; j++) keyed.target_keys[j] = j % 1000;
  const Data blobs = make_data(8000, 16000, 5, Shape::kClustered, 312, true);
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Options o;
    o.k = 20;
    o.metric = m;
    o.keys = true;
    check_out_of_core(keyed, o, {1 << 20, 1 << 19}, "two sets, colliding keys");
    o.keys = false;
    check_out_of_core(blobs, o, {1 << 20, 1 << 19}, "two sets, clustered");
  }
}

TEST(GpuTiOutOfCore, DuplicateGroupSpanningParts) {
  REQUIRE_GPU();
  // Every other row is the same point: a duplicate group of 5000 rows, k'
  // ties at distance 0 for half the queries, which must come out as the
  // smallest target rows. Parts are cut by distinct points, so the group
  // is whole in one part (its rows spread over the whole row range), and
  // at the smaller budget other parts hold the remaining points.
  Data d = make_self(10000, 4, Shape::kUniform, 321, false);
  for (int64_t i = 2; i < d.nt(); i += 2)
    std::memcpy(d.targets.data() + i * 4, d.targets.data(), 4 * sizeof(float));
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Options o;
    o.k = 50;
    o.metric = m;
    const std::vector<OutOfCoreShape> shapes =
        check_out_of_core(d, o, {1 << 20, 1 << 19}, "duplicate group across parts");
    ASSERT_EQ(shapes.size(), 2u);
    EXPECT_GT(shapes.back().target_parts, 1);
  }
}

TEST(GpuTiOutOfCore, KLargerThanATargetPart) {
  REQUIRE_GPU();
  // Wide rows (the build of a target part holds two or three copies of its
  // distinct rows) and a few queries (one query part): at 500 kB the target
  // parts hold fewer rows than k (60: lists in global memory), so every
  // list is filled across parts.
  const Data d = make_data(40, 2000, 1000, Shape::kClustered, 331, true);
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Options o;
    o.k = 60;
    o.metric = m;
    const std::vector<OutOfCoreShape> shapes =
        check_out_of_core(d, o, {500000}, "40 x 2000 x 1000");
    ASSERT_EQ(shapes.size(), 1u);
    EXPECT_LT(shapes[0].target_rows, o.k);
  }
}

TEST(GpuTiOutOfCore, BudgetSweep) {
  REQUIRE_GPU();
  // A sweep of budgets with k = 100 (k' = 101: global-memory lists): every
  // one must be the out-of-core TI join, exact.
  const Data d = make_self(3000, 2, Shape::kIntegers, 332, true);
  std::vector<int64_t> limits;
  for (double b = 6e6; b > 2e5; b *= 0.85) limits.push_back(static_cast<int64_t>(b));
  Options o;
  o.k = 100;
  check_out_of_core(d, o, limits, "k 100, sweep");
}

TEST(GpuTiOutOfCore, TinyBudgetsAreExactOrOutOfMemory) {
  REQUIRE_GPU();
  // Below the sweep: each budget gives the out-of-core TI join's exact
  // answer or KNN_OUT_OF_MEMORY with a message, never brute force, and the
  // smallest is out of memory.
  const Data d = make_self(3000, 2, Shape::kIntegers, 333, true);
  Options o;
  o.k = 100;
  o.method = KNN_METHOD_TI;
  const Outcome ref = cpu_answer(d, o);
  ASSERT_EQ(ref.status, KNN_OK);
  KnnStatus last = KNN_OK;
  for (int64_t limit : {160000, 100000, 60000, 30000, 10000, 2000}) {
    const Outcome gpu = gpu_ti(d, o, limit);
    const std::string what = "limit " + std::to_string(limit);
    std::printf("  [out-of-core] tiny budget %s: status %d %s\n", what.c_str(),
                static_cast<int>(gpu.status),
                gpu.status == KNN_OK ? gpu.stats.variant : gpu.error.c_str());
    last = gpu.status;
    if (gpu.status == KNN_OUT_OF_MEMORY) {
      EXPECT_FALSE(gpu.error.empty()) << what;
      continue;
    }
    ASSERT_EQ(gpu.status, KNN_OK) << what << ": " << gpu.error;
    OutOfCoreShape shape;
    EXPECT_TRUE(out_of_core_shape(gpu.stats.variant, &shape)) << what << ": " << gpu.stats.variant;
    expect_same_answer(gpu, ref, what + " vs cpu");
  }
  EXPECT_EQ(last, KNN_OUT_OF_MEMORY);
}

TEST(GpuTiOutOfCore, ForcedListsAndThreads) {
  REQUIRE_GPU();
  const Data d = make_self(12000, 6, Shape::kClustered, 341, true);
  const KnnCudaTestOptions forced[] = {forced_ti(1, 1, 1), forced_ti(1, 2, 1),
                                       forced_ti(1, 3, 1), forced_ti(1, 0, 4),
                                       forced_ti(2, 0, 0)};
  for (const KnnCudaTestOptions &f : forced) {
    Options o;
    o.k = 20;
    o.forced = &f;
    const std::string name = "forced filter " + std::to_string(f.ti_filter) + " list " +
                             std::to_string(f.ti_list) + " threads " +
                             std::to_string(f.ti_threads_per_query);
    check_out_of_core(d, o, {1 << 20}, name.c_str());
  }
  // Several threads per query asked for (inside-query parallelism) while
  // lists are carried across target parts: few queries, many targets.
  const Data wide = make_data(2000, 400000, 4, Shape::kClustered, 342, true);
  Options wide_options;
  wide_options.k = 20;
  const Outcome wide_ref = cpu_answer(wide, wide_options);
  // The P lists of a query are merged in the block's shared memory: from
  // register lists (stored there), shared lists (in place) and global ones.
  for (const KnnCudaTestOptions &f : {forced_ti(1, 0, 4), forced_ti(1, 3, 2), forced_ti(1, 2, 3),
                                      forced_ti(1, 1, 8), forced_ti(0, 0, 0)}) {
    Options o = wide_options;
    o.forced = &f;
    const std::string name = "2000 x 400000, threads " + std::to_string(f.ti_threads_per_query);
    const Outcome &ref = wide_ref;
    const Outcome gpu = gpu_ti(wide, o, 16 << 20);
    ASSERT_EQ(gpu.status, KNN_OK) << name << ": " << gpu.error;
    std::printf("  [out-of-core] %s: %s\n", name.c_str(), gpu.stats.variant);
    OutOfCoreShape shape;
    EXPECT_TRUE(out_of_core_shape(gpu.stats.variant, &shape)) << name << ": " << gpu.stats.variant;
    EXPECT_GT(shape.target_parts, 1) << name;
    // Carried lists split over the threads asked for (part 0 seeds them).
    if (f.ti_threads_per_query > 1) {
      EXPECT_NE(std::string(gpu.stats.variant).find("/x" + std::to_string(f.ti_threads_per_query)),
                std::string::npos)
          << name << ": " << gpu.stats.variant;
    }
    expect_same_answer(gpu, ref, name + " vs cpu");
  }
  // No duplicate merging: every copy is its own target.
  KnnCudaTestOptions no_dedup{};
  no_dedup.ti_keep_duplicates = 1;
  Options o;
  o.k = 20;
  o.forced = &no_dedup;
  check_out_of_core(d, o, {1 << 20}, "no dedup");
}

// Two clustered sets with duplicates (20000 queries, 40000 targets, 4
// dimensions) whose keys take 700 values on each side: a query excludes
// about 57 targets, so k' > 32 for k 25.
Data with_colliding_keys(uint64_t seed) {
  Data keyed = make_data(20000, 40000, 4, Shape::kClustered, seed, true);
  keyed.query_keys.resize(20000);
  keyed.target_keys.resize(40000);
  for (int64_t i = 0; i < 20000; i++) keyed.query_keys[i] = i % 700;
  for (int64_t j = 0; j < 40000; j++) keyed.target_keys[j] = j % 700;
  return keyed;
}

TEST(GpuTiOutOfCore, SpatialPartsSkipFarPairs) {
  REQUIRE_GPU();
  // The pairs part by part (the far clusters not gathered).
  const ScopedEnv part_by_part("KNN_TI_GATHER", "0");
  // 12 blobs with duplicates: at these budgets a part is much smaller than
  // a blob, so most (query part, target part) pairs are skipped by their
  // bound, while query parts at a blob's edge still visit parts other than
  // their own (a target part skipped for some query parts, not others).
  const Data d = make_self(60000, 8, Shape::kClustered, 371, true);
  // Two sets with colliding keys (k' > 32) and integer ties across parts.
  const Data keyed = with_colliding_keys(372);
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Options o;
    o.k = 10;
    o.metric = m;
    std::vector<OutOfCoreShape> shapes =
        check_out_of_core(d, o, {2 << 20, 1 << 20}, "spatial parts, self 60000x8");
    ASSERT_EQ(shapes.size(), 2u);
    for (const OutOfCoreShape &s : shapes) {
      ASSERT_GT(s.query_parts, 1);
      EXPECT_GT(s.skipped, 0);
      EXPECT_LT(s.skipped, (long long)s.query_parts * (s.target_parts - 1));
    }
    o.keys = true;
    o.k = 25;
    shapes = check_out_of_core(keyed, o, {2 << 20, 1 << 20}, "spatial parts, two sets, keys");
    for (const OutOfCoreShape &s : shapes) {
      if (s.query_parts > 1) {
        EXPECT_GT(s.skipped, 0);
      }
    }
  }
}

// Past each query part's nearest target part, the clusters it still needs
// from all the other parts are gathered into few parts (GatheredTargets):
// every answer must equal the CPU engine's and the in-memory join's bit for
// bit, as part by part (KNN_TI_GATHER=0), for L2 and L1, a self-join with
// duplicates (the gathered parts renumber their rows) and two sets with
// colliding keys (k' > 32: level 2's lists in global memory).
TEST(GpuTiOutOfCore, GatheredFarClustersAnswerAsPartByPart) {
  REQUIRE_GPU();
  const Data d = make_self(60000, 8, Shape::kClustered, 375, true);
  const Data keyed = with_colliding_keys(376);
  const std::vector<int64_t> limits = {2 << 20, 1 << 20};
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Options o;
    o.k = 10;
    o.metric = m;
    for (const char *gather : {"1", "0"}) {
      const ScopedEnv knob("KNN_TI_GATHER", gather);
      const bool on = gather[0] == '1';
      const std::string what = std::string("self 60000x8, gather ") + gather;
      const std::vector<OutOfCoreShape> shapes = check_out_of_core(d, o, limits, what.c_str());
      ASSERT_EQ(shapes.size(), limits.size()) << what;
      for (const OutOfCoreShape &s : shapes) {
        ASSERT_GT(s.query_parts, 1) << what;
        if (on) {
          EXPECT_GT(s.gathered, 0) << what;
        } else {
          EXPECT_EQ(s.gathered, -1) << what;
        }
      }
      // At the smaller budget some round fills a gathered part and leaves
      // clusters still needed to the next (more gathered parts than query
      // parts: a round that is not full leaves none).
      if (on) {
        EXPECT_GT(shapes.back().gathered, shapes.back().query_parts) << what;
      }
      Options keys = o;
      keys.keys = true;
      keys.k = 25;
      const std::string keyed_what = std::string("two sets, keys, gather ") + gather;
      for (const OutOfCoreShape &s : check_out_of_core(keyed, keys, limits, keyed_what.c_str())) {
        if (on) {
          EXPECT_GT(s.gathered, 0) << keyed_what;
        } else {
          EXPECT_EQ(s.gathered, -1) << keyed_what;
        }
      }
    }
  }
}

// Many blobs of very uneven sizes (a few large, most tiny; rows in random
// order), as bench/make_cpu_sets.py's clustered sets: landmarks sampled
// evenly from the rows miss most tiny blobs, whose rows then widen the
// groups of far landmarks. With the widest groups split
// (KNN_TI_ORDER_SPLIT=1) the bounds must skip more (query part, target
// part) pairs over both budgets than with the sampled landmarks alone (the
// default), the answers unchanged. Summed: at the larger budget the parts
// are few (11 x 11) and the two counts within a pair or two of each other.
TEST(GpuTiOutOfCore, SplitGroupsSkipMorePairsOnUnevenBlobs) {
  REQUIRE_GPU();
  const ScopedEnv part_by_part("KNN_TI_GATHER", "0");
  const int dim = 8, blobs = 300;
  const int64_t n = 60000;
  std::mt19937_64 rng(381);
  std::uniform_real_distribution<float> uni(0.0f, 100.0f);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> centre(static_cast<size_t>(blobs) * dim);
  for (float &c : centre) c = uni(rng);
  std::vector<double> weight(blobs);
  for (int b = 0; b < blobs; b++) weight[b] = 1.0 / (b + 1);
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  Data d;
  d.dim = dim;
  d.self = true;
  d.targets.resize(static_cast<size_t>(n) * dim);
  for (int64_t r = 0; r < n; r++) {
    const int b = pick(rng);
    const float spread = 0.2f + 0.2f * static_cast<float>(b % 4);
    for (int j = 0; j < dim; j++)
      d.targets[r * dim + j] = centre[static_cast<size_t>(b) * dim + j] + spread * noise(rng);
  }
  add_duplicates(&d.targets, dim, n / 20, rng);
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Options o;
    o.k = 10;
    o.metric = m;
    const std::vector<int64_t> limits = {1 << 20, 512 << 10};
    const std::vector<OutOfCoreShape> sampled =
        check_out_of_core(d, o, limits, "uneven blobs, sampled landmarks");
    std::vector<OutOfCoreShape> split;
    {
      ScopedEnv knob("KNN_TI_ORDER_SPLIT", "1");
      split = check_out_of_core(d, o, limits, "uneven blobs, split groups");
    }
    ASSERT_EQ(split.size(), limits.size());
    ASSERT_EQ(sampled.size(), limits.size());
    long long split_skipped = 0, sampled_skipped = 0;
    for (size_t i = 0; i < limits.size(); i++) {
      ASSERT_GT(split[i].query_parts, 1);
      ASSERT_GE(split[i].skipped, 0);
      ASSERT_GE(sampled[i].skipped, 0);
      split_skipped += split[i].skipped;
      sampled_skipped += sampled[i].skipped;
    }
    EXPECT_GT(split_skipped, sampled_skipped);
  }
}

TEST(GpuTiOutOfCore, RowRangePartsSkippedByTheirClusters) {
  REQUIRE_GPU();
  // Row ranges (KNN_TI_ROW_RANGES=1: no spatial order, so no part bound):
  // only the cluster test (part_needed_kernel) can skip a pair. 12 blobs
  // 100 apart along one axis, rows blob by blob, so that row-range parts
  // far apart in rows are far apart in space; every 7th row repeats the
  // row before it (duplicates).
  const int dim = 8;
  const int64_t n = 60000;
  std::mt19937_64 rng(393);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  Data d = make_self(n, dim, Shape::kUniform, 393, false);
  for (int64_t r = 0; r < n; r++)
    for (int j = 0; j < dim; j++)
      d.targets[r * dim + j] = (j == 0 ? 100.0f * static_cast<float>(r * 12 / n) : 0.0f) + noise(rng);
  for (int64_t r = 7; r < n; r += 7)
    std::memcpy(d.targets.data() + r * dim, d.targets.data() + (r - 1) * dim, dim * sizeof(float));
  const ScopedEnv row_ranges("KNN_TI_ROW_RANGES", "1");
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Options o;
    o.k = 10;
    o.metric = m;
    const std::vector<OutOfCoreShape> shapes =
        check_out_of_core(d, o, {2 << 20, 1 << 20}, "row ranges, 12 blobs in a line");
    ASSERT_FALSE(shapes.empty());
    for (const OutOfCoreShape &s : shapes) {
      if (!s.cached) continue;
      EXPECT_GT(s.skipped, 0) << s.query_parts << "x" << s.target_parts;
    }
  }
}

TEST(GpuTiOutOfCore, TargetCacheBlocksPinnedEachWay) {
  REQUIRE_GPU();
  // The cached target parts' pinned blocks: allocated as each part is
  // stored (KNN_TI_PIN_AHEAD=0), by cudaMallocHost on a host thread ahead
  // (1), as registered pages on that thread (2) or as registered 2 MB pages
  // (3, the default): the same answers, and the parts cached each way.
  const Data d = make_self(20000, 8, Shape::kClustered, 301, true);
  for (const char *mode : {"0", "1", "2", "3"}) {
    const ScopedEnv pin_ahead("KNN_TI_PIN_AHEAD", mode);
    Options o;
    o.k = 20;
    const std::vector<OutOfCoreShape> shapes =
        check_out_of_core(d, o, {3 << 18}, (std::string("pin ahead ") + mode).c_str());
    ASSERT_EQ(shapes.size(), 1u);
    EXPECT_TRUE(shapes[0].cached) << mode;
  }
}

TEST(GpuTiOutOfCore, MappedListsAndDeviceLists) {
  REQUIRE_GPU();
  // The query parts' k' lists in mapped pinned host memory (the default)
  // or on the device (KNN_TI_LISTS=device): the same answers. 3000 queries
  // against 200000 targets at 1 MB: the mapped lists leave all queries in
  // one query part, filtered against many target parts (each pair reads
  // and writes the lists through the bus), where lists on the device need
  // several query parts. k 40 (k' > 32): level 2's own lists in global
  // memory, the carried ones mapped.
  const Data few = make_data(3000, 200000, 4, Shape::kClustered, 351, true);
  const Data self = make_self(20000, 8, Shape::kClustered, 352, true);
  for (const char *lists : {"mapped", "device"}) {
    const ScopedEnv place("KNN_TI_LISTS", lists);
    const bool mapped = std::string(lists) == "mapped";
    Options o;
    o.k = 20;
    const std::string name = std::string("lists ") + lists;
    std::vector<OutOfCoreShape> shapes = check_out_of_core(few, o, {1 << 20}, name.c_str());
    ASSERT_EQ(shapes.size(), 1u) << lists;
    EXPECT_GT(shapes[0].target_parts, 1) << lists;
    if (mapped) EXPECT_EQ(shapes[0].query_parts, 1) << lists;
    else EXPECT_GT(shapes[0].query_parts, 1) << lists;
    o.k = 40;
    check_out_of_core(few, o, {4 << 20}, (name + ", global lists").c_str());
    // Several query parts, each in its own mapped block while the host
    // expands the part before; with k 40 too (both blocks alternate with
    // k' > 32).
    o.k = 20;
    shapes = check_out_of_core(self, o, {3 << 18}, (name + ", self").c_str());
    ASSERT_EQ(shapes.size(), 1u) << lists;
    EXPECT_GT(shapes[0].query_parts, 1) << lists;
    o.k = 40;
    shapes = check_out_of_core(self, o, {1 << 20}, (name + ", self, global lists").c_str());
    ASSERT_EQ(shapes.size(), 1u) << lists;
    EXPECT_GT(shapes[0].query_parts, 2) << lists;
  }
}

TEST(GpuTiOutOfCore, LazyAndEagerCarriedLists) {
  REQUIRE_GPU();
  // A carried list is read and written back only by the warps whose visit
  // can change it (the default), or by every warp of a visited cluster
  // (KNN_TI_LAZY_LISTS=0): the same answers as the CPU's, with one thread
  // per query and with several (whose lists merge with the carried one
  // where only the other threads took entries), lists in registers, shared
  // and global memory, mapped and on the device. Duplicates make entries
  // tie across parts; few queries against many targets make many carried
  // visits.
  const Data wide = make_data(2000, 400000, 4, Shape::kClustered, 361, true);
  const Data self = make_self(30000, 6, Shape::kClustered, 362, true);
  const Data ties = make_data(1500, 200000, 8, Shape::kIntegers, 363, true);
  Options base;
  base.k = 20;
  const Outcome wide_ref = cpu_answer(wide, base);
  for (const char *lazy : {"1", "0"}) {
    const ScopedEnv lazy_env("KNN_TI_LAZY_LISTS", lazy);
    for (const char *lists : {"mapped", "device"}) {
      const ScopedEnv place("KNN_TI_LISTS", lists);
      for (const KnnCudaTestOptions &f : {forced_ti(1, 1, 1), forced_ti(1, 0, 4),
                                          forced_ti(1, 3, 2), forced_ti(1, 2, 3)}) {
        Options o = base;
        o.forced = &f;
        const std::string name = std::string("lazy ") + lazy + ", lists " + lists +
                                 ", list place " + std::to_string(f.ti_list) + ", threads " +
                                 std::to_string(f.ti_threads_per_query);
        const Outcome gpu = gpu_ti(wide, o, 16 << 20);
        ASSERT_EQ(gpu.status, KNN_OK) << name << ": " << gpu.error;
        OutOfCoreShape shape;
        EXPECT_TRUE(out_of_core_shape(gpu.stats.variant, &shape)) << name << ": " << gpu.stats.variant;
        EXPECT_GT(shape.target_parts, 1) << name;
        expect_same_answer(gpu, wide_ref, name + " vs cpu");
      }
      // Integer rows: exact ties across target parts at the carried k'-th
      // entry; k 40 (k' > 32: strided lists) with several threads per query,
      // merged from shared and from global memory; L1.
      struct TieCase {
        KnnMetric metric;
        int k;
        KnnCudaTestOptions forced;
      };
      for (const TieCase &t : {TieCase{KNN_METRIC_L2, 40, forced_ti(1, 2, 2)},
                               TieCase{KNN_METRIC_L2, 40, forced_ti(1, 2, 4)},
                               TieCase{KNN_METRIC_L2, 40, forced_ti(1, 3, 2)},
                               TieCase{KNN_METRIC_L1, 20, forced_ti(1, 0, 4)}}) {
        Options o = base;
        o.k = t.k;
        o.metric = t.metric;
        o.forced = &t.forced;
        const std::string name = std::string("ties, lazy ") + lazy + ", lists " + lists + ", " +
                                 knn_metric_name(t.metric) + ", k " + std::to_string(t.k) +
                                 ", list place " + std::to_string(t.forced.ti_list) +
                                 ", threads " + std::to_string(t.forced.ti_threads_per_query);
        Options cpu = o;
        cpu.forced = nullptr;
        const Outcome gpu = gpu_ti(ties, o, 4 << 20);
        ASSERT_EQ(gpu.status, KNN_OK) << name << ": " << gpu.error;
        OutOfCoreShape shape;
        EXPECT_TRUE(out_of_core_shape(gpu.stats.variant, &shape)) << name << ": " << gpu.stats.variant;
        EXPECT_GT(shape.target_parts, 1) << name;
        EXPECT_NE(std::string(gpu.stats.variant)
                      .find("/x" + std::to_string(t.forced.ti_threads_per_query)),
                  std::string::npos)
            << name << ": " << gpu.stats.variant;
        expect_same_answer(gpu, cpu_answer(ties, cpu), name + " vs cpu");
      }
      Options o = base;
      check_out_of_core(self, o, {1 << 20}, (std::string("self, lazy ") + lazy + ", " + lists).c_str());
      o.k = 40;
      check_out_of_core(self, o, {2 << 20}, (std::string("self k 40, lazy ") + lazy + ", " + lists).c_str());
    }
  }
}

TEST(GpuTi, TiledAssignmentPicksCentresAsWellAsDirect) {
  REQUIRE_GPU();
  // Rows of stride 4, 8 and 16 go to their centres through a tiled kernel
  // (centres in shared memory, several points a thread) unless
  // KNN_TI_ASSIGN=direct. Both compute the same sums in the same order, so
  // they pick the same centres, and answers match the CPU's. A poorer choice
  // would show in the distances level 2 computes (which vary a little from
  // run to run: the threads of a query share their bound as they go; an
  // expanded |c|^2 - 2 x.c took 12 % more on the tiny far clusters). Sizes
  // that are not multiples of a block's points, centres over two tiles, rows
  // far from the origin, tiny clusters far apart.
  struct Case {
    const char *name;
    int64_t n;
    int dim;
    KnnMetric metric;
    Shape shape;
    uint64_t seed;
  };
  const Case cases[] = {{"d3 L2", 20011, 3, KNN_METRIC_L2, Shape::kClustered, 371},
                        {"d8 L2", 20011, 8, KNN_METRIC_L2, Shape::kClustered, 372},
                        {"d13 L2", 15013, 13, KNN_METRIC_L2, Shape::kClustered, 373},
                        {"d8 L1", 20011, 8, KNN_METRIC_L1, Shape::kClustered, 374},
                        {"d6 far grid", 12007, 6, KNN_METRIC_L2, Shape::kFarGrid, 375},
                        {"d7 far clusters", 12007, 7, KNN_METRIC_L2, Shape::kFarClusters, 376}};
  for (const Case &c : cases) {
    const Data d = make_self(c.n, c.dim, c.shape, c.seed, true);
    Options o;
    o.k = 20;
    o.metric = c.metric;
    Options cpu = o;
    cpu.method = KNN_METHOD_TI;
    const Outcome ref = cpu_answer(d, cpu);
    int64_t computed[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
      const char *kernel = i == 0 ? "tiled" : "direct";
      const ScopedEnv env("KNN_TI_ASSIGN", kernel);
      const std::string name = std::string(c.name) + ", " + kernel;
      const Outcome gpu = gpu_ti(d, o, 0);
      ASSERT_EQ(gpu.status, KNN_OK) << name << ": " << gpu.error;
      ASSERT_EQ(gpu.stats.method, KNN_METHOD_TI) << name << ": " << gpu.stats.variant;
      expect_same_answer(gpu, ref, name + " vs cpu");
      computed[i] = gpu.stats.distance_computations;
    }
    std::printf("  [assignment] %s: %lld distances tiled, %lld direct\n", c.name,
                static_cast<long long>(computed[0]), static_cast<long long>(computed[1]));
    EXPECT_LT(std::fabs(static_cast<double>(computed[0]) - static_cast<double>(computed[1])),
              0.02 * static_cast<double>(computed[1]) + 1000.0)
        << c.name;
  }
}

TEST(GpuTiOutOfCore, LargeDuplicateGroupsPinnedOrPageableParts) {
  REQUIRE_GPU();
  // Order groups larger than a duplicates piece (16384 positions:
  // ti_spatial_order.cu) of a few points copied many times, among distinct
  // rows and near-copies one ulp away: found in pieces and merged. The
  // cached target parts gathered into their pinned blocks (the default) or
  // into pageable stagings (KNN_TI_PINNED_PARTS=0): the same answers. At
  // the larger budget the two large groups (24000 and 12000 rows) go into
  // gathered parts by copies of their own, and the near-copies' groups
  // (about 250 and 125 rows) by the whole block (GatheredTargets::gather;
  // counted in the trace); at the smaller one all clusters' centres take
  // more than their share of it, and the parts are visited one by one.
  Data d = make_self(60000, 6, Shape::kClustered, 371, false);
  for (int64_t i = 2; i < d.nt(); i++) {
    const int64_t from = i % 5 < 2 ? 0 : i % 5 == 2 ? 1 : -1;
    if (from < 0) continue;
    std::memcpy(d.targets.data() + i * 6, d.targets.data() + from * 6, 6 * sizeof(float));
    if (i % 97 == 0) d.targets[i * 6 + 5] = std::nextafter(d.targets[i * 6 + 5], INFINITY);
  }
  for (const char *pinned : {"1", "0"}) {
    const ScopedEnv env("KNN_TI_PINNED_PARTS", pinned);
    Options o;
    o.k = 30;
    const std::string name = std::string("large duplicate groups, pinned ") + pinned;
    std::vector<OutOfCoreShape> shapes;
    std::string trace;
    {
      const ScopedEnv traced("KNN_TI_TRACE", "1");
      testing::internal::CaptureStderr();
      shapes = check_out_of_core(d, o, {1 << 20, 1 << 19}, name.c_str());
      trace = testing::internal::GetCapturedStderr();
    }
    ASSERT_EQ(shapes.size(), 2u);
    EXPECT_TRUE(shapes.back().cached) << pinned;
    EXPECT_GT(shapes.front().query_parts, 1) << pinned;
    EXPECT_GT(shapes.front().gathered, 0) << pinned;
    EXPECT_EQ(shapes.back().gathered, -1) << pinned;
    // The trace's count of rows gathered each way, over the joins.
    long long copied = 0, by_block = 0;
    const std::string mark = "(rows of large duplicate groups: ";
    for (size_t at = trace.find(mark); at != std::string::npos; at = trace.find(mark, at + 1)) {
      long long c = 0, b = 0;
      if (std::sscanf(trace.c_str() + at + mark.size(), "%lld by copies of their own, %lld by the block",
                      &c, &b) == 2) {
        copied += c;
        by_block += b;
      }
    }
    std::printf("  [out-of-core] %s: rows of large groups gathered %lld by copies, %lld by the block\n",
                name.c_str(), copied, by_block);
    EXPECT_GT(copied, 0) << pinned;
    EXPECT_GT(by_block, 0) << pinned;
  }
}

// An out-of-core TI join of d (k 20, 16 MB unless told) started as a job
// and cancelled after `ms`: its status, the seconds the cancel took, and
// what it said. With ms < 0 it runs to its end, and `waited` is its time.
// The budget of the 12M x 2, k 31 joins below: about 3 GB of their lists
// are pinned and mapped.
constexpr int64_t kPinnedListsBudget = int64_t(3) << 29;

struct CancelledJoin {
  KnnStatus status = KNN_OK;
  double waited = 0;
  std::string said;
};
CancelledJoin cancel_out_of_core_join(const Data &d, int ms, int k = 20,
                                      int64_t limit = 16 << 20) {
  Options o;
  o.k = k;
  o.method = KNN_METHOD_TI;
  o.gpu_memory_limit = limit;
  const KnnProblem p = make_problem(d, o, KNN_DEVICE_GPU);
  // Left untouched by a cancelled join (it writes none of it): then large
  // joins cost no memory here.
  const size_t slots = static_cast<size_t>(p.n_queries) * p.k;
  std::unique_ptr<int64_t[]> nb(new int64_t[slots]);
  std::unique_ptr<double[]> dist(new double[slots]);
  char err[512] = "";
  CancelledJoin out;
  KnnJob *job = knn_job_start(&p, nb.get(), dist.get(), err, sizeof err);
  if (job == nullptr) {
    out.status = KNN_INVALID_ARGUMENT;
    out.said = err;
    return out;
  }
  auto t0 = std::chrono::steady_clock::now();
  if (ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    t0 = std::chrono::steady_clock::now();
    knn_job_cancel(job);
  }
  KnnStats stats{};
  out.status = knn_job_finish(job, &stats, err, sizeof err);
  out.waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.said = out.status == KNN_OK ? stats.variant : err;
  if (ms >= 0)
    std::printf("  [out-of-core] cancel after %d ms: status %d after %.3f s (%s)\n", ms,
                static_cast<int>(out.status), out.waited, out.said.c_str());
  else
    std::printf("  [out-of-core] the whole join: status %d, %.3f s (%s)\n",
                static_cast<int>(out.status), out.waited, out.said.c_str());
  return out;
}

// An out-of-core TI join of d (k, budget `limit`) through the module's
// test entry, on a thread of its own, with `forced`'s hooks
// (knn_cuda_testing.h) and a cancel flag; the output arrays are left
// untouched (a join that ends early writes none of them).
class JoinOnAThread {
 public:
  JoinOnAThread(const Data &d, int k, int64_t limit, const KnnCudaTestOptions &forced)
      : forced_(forced) {
    Options o;
    o.k = k;
    o.method = KNN_METHOD_TI;
    o.gpu_memory_limit = limit;
    p_ = make_problem(d, o, KNN_DEVICE_GPU);
    // One engine on GPU 0: the hooks watch one join, not a split's engines.
    p_.n_devices = 1;
    p_.devices[0] = 0;
    const size_t slots = static_cast<size_t>(p_.n_queries) * p_.k;
    neighbors_.reset(new int64_t[slots]);
    distances_.reset(new double[slots]);
    thread_ = std::thread([this] {
      const knn_cuda_run_tuned_fn entry = tuned_entry();
      if (entry == nullptr) {
        std::snprintf(error_, sizeof error_, "no %s", KNN_CUDA_RUN_TUNED_SYMBOL);
        status_ = KNN_INTERNAL_ERROR;
      } else {
        status_ = entry(&p_, &forced_, neighbors_.get(), distances_.get(), &stats_, &cancel_,
                        error_, sizeof error_);
      }
      __atomic_store_n(&done_, 1, __ATOMIC_RELEASE);
    });
  }
  ~JoinOnAThread() {
    cancel();
    finish();
  }
  JoinOnAThread(const JoinOnAThread &) = delete;
  JoinOnAThread &operator=(const JoinOnAThread &) = delete;

  // Waits until *flag (one of the hooks) holds `value` or more, or the join
  // has ended: whether it does.
  bool wait_for(const int32_t *flag, int32_t value) const {
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < value) {
      if (__atomic_load_n(&done_, __ATOMIC_ACQUIRE) != 0)
        return __atomic_load_n(flag, __ATOMIC_ACQUIRE) >= value;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
  }
  void cancel() { __atomic_store_n(&cancel_, 1, __ATOMIC_RELAXED); }
  // The join's status, once its thread is done; said(): its message (its
  // variant where it succeeded).
  KnnStatus finish() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  std::string said() const { return status_ == KNN_OK ? stats_.variant : error_; }

 private:
  const KnnCudaTestOptions forced_;
  KnnProblem p_{};
  std::unique_ptr<int64_t[]> neighbors_;
  std::unique_ptr<double[]> distances_;
  KnnStats stats_{};
  char error_[512] = "";
  KnnStatus status_ = KNN_INTERNAL_ERROR;
  int32_t cancel_ = 0, done_ = 0;
  std::thread thread_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(GpuTiOutOfCore, CancelDuringTheOrder) {
  REQUIRE_GPU();
  // A cancel while the rows are being ordered (the pipelined assignment,
  // the host's passes) ends the join inside the order, as promptly as
  // between parts. The order's probe (knn_cuda_testing.h) says when the
  // order starts and whether it ran to its end: an order that ignored the
  // cancel would run on, and the join would see the cancel only after it.
  const Data d = make_self(2000000, 8, Shape::kClustered, 381, false);
  const int64_t limit = 16 << 20;
  // The order's own time: a join cancelled once its rows are ordered.
  double order_seconds = 0;
  {
    int32_t probe = 0;
    KnnCudaTestOptions forced{};
    forced.ti_order_probe = &probe;
    JoinOnAThread join(d, 20, limit, forced);
    ASSERT_TRUE(join.wait_for(&probe, 1)) << "the order never started: " << join.said();
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(join.wait_for(&probe, 2)) << "the order never ended: " << join.said();
    order_seconds = seconds_since(t0);
    join.cancel();
    EXPECT_EQ(join.finish(), KNN_CANCELLED) << join.said();
  }
  std::printf("  [out-of-core] the order of 2M x 8 took %.3f s\n", order_seconds);
  int inside = 0;
  for (double share : {0.1, 0.3, 0.5}) {
    int32_t probe = 0;
    KnnCudaTestOptions forced{};
    forced.ti_order_probe = &probe;
    JoinOnAThread join(d, 20, limit, forced);
    ASSERT_TRUE(join.wait_for(&probe, 1)) << join.said();
    std::this_thread::sleep_for(std::chrono::duration<double>(share * order_seconds));
    const bool ordering = __atomic_load_n(&probe, __ATOMIC_ACQUIRE) == 1;
    const auto t0 = std::chrono::steady_clock::now();
    join.cancel();
    const KnnStatus status = join.finish();
    const double waited = seconds_since(t0);
    const int32_t ended = __atomic_load_n(&probe, __ATOMIC_ACQUIRE);
    std::printf("  [out-of-core] cancel at %.0f%% of the order (%s): status %d after %.3f s, "
                "probe %d (%s)\n",
                100 * share, ordering ? "ordering" : "already ordered",
                static_cast<int>(status), waited, ended, join.said().c_str());
    EXPECT_EQ(status, KNN_CANCELLED) << share << ": " << join.said();
    EXPECT_LT(waited, 0.5) << share;
    if (!ordering) continue;  // (a faster order than the first: nothing to tell)
    inside++;
    EXPECT_EQ(ended, 1) << "cancelled at " << share << " of the order, which ran to its end";
  }
  EXPECT_GT(inside, 0) << "no cancel came inside the order";
}

TEST(GpuTiOutOfCore, PartsCutByDistinctPoints) {
  REQUIRE_GPU();
  // Parts are cut by distinct points, each duplicate group whole in one
  // part. 24000 rows of 300 distinct points, with one point holding a
  // third of all rows (a part may be that one distinct point): k = 120
  // exceeds what most parts hold distinct, ties at equal distances are
  // broken by row across parts, and the self-join's keys drop each row
  // itself. Then keys shared by up to 40 rows (k' = k + 40: global lists)
  // across duplicate groups.
  std::mt19937_64 rng(381);
  const int dim = 3;
  const std::vector<float> points = make_rows(300, dim, Shape::kIntegers, rng);
  Data d = make_self(24000, dim, Shape::kUniform, 382, false);
  std::uniform_int_distribution<int> pick(0, 299);
  for (int64_t i = 0; i < d.nt(); i++) {
    const int p = i % 3 == 0 ? 7 : pick(rng);
    std::memcpy(d.targets.data() + i * dim, points.data() + p * dim, dim * sizeof(float));
  }
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_L1}) {
    Options o;
    o.k = 120;
    o.metric = m;
    std::vector<OutOfCoreShape> shapes =
        check_out_of_core(d, o, {1 << 20, 1 << 18}, "300 distinct of 24000");
    ASSERT_FALSE(shapes.empty());
    EXPECT_GT(shapes.back().target_parts, 1);
    Data keyed = d;
    for (int64_t i = 0; i < keyed.nt(); i++) keyed.target_keys[i] = i % 600;
    keyed.query_keys = keyed.target_keys;
    o.k = 10;
    check_out_of_core(keyed, o, {1 << 20, 1 << 18}, "300 distinct, shared keys");
  }
}

TEST(GpuTiOutOfCore, OneQueryRowAgainstDuplicateTargets) {
  REQUIRE_GPU();
  // One query row has no spatial order of its own, so the plan counts
  // target ROWS: the target parts must then be row ranges, never the
  // target side's ordered distinct points (duplicates make the two differ).
  for (int k : {1, 20}) {
    Data d = make_data(1, 20000, 8, Shape::kClustered, 341, true);
    Options o;
    o.k = k;
    const std::vector<OutOfCoreShape> shapes =
        check_out_of_core(d, o, {1 << 19, 3 << 17}, "one query row, duplicate targets");
    ASSERT_EQ(shapes.size(), 2u);
    EXPECT_GT(shapes.back().target_parts, 1);
  }
}

TEST(GpuTiOutOfCore, OverflowingValuesStillGoToBruteForce) {
  REQUIRE_GPU();
  // The non-finite target sits in the last target part: found only after
  // earlier parts were filtered.
  Data d = make_self(6000, 4, Shape::kIntegers, 351, false);
  d.targets[(d.nt() - 3) * 4] = 1.0e30f;
  Options o;
  o.k = 5;
  o.method = KNN_METHOD_TI;
  o.gpu_memory_limit = 1 << 19;
  o.expect_method = KNN_METHOD_BRUTE;
  check(d, o);
}

TEST(GpuTiOutOfCore, CancelStopsBetweenParts) {
  REQUIRE_GPU();
  // 5M rows at 16 MB (300000 rows there made 5 x 5 parts): dozens of parts
  // a side, over a second of pairs on an H200 (5M x 8 at a quarter of its
  // in-memory budget, 55 x 29 parts, took 1.8 s), its order about 0.1 s:
  // the cancel comes between parts, never after the end.
  const Data d = make_self(5000000, 8, Shape::kClustered, 361, false);
  const CancelledJoin c = cancel_out_of_core_join(d, 400);
  EXPECT_EQ(c.status, KNN_CANCELLED) << c.said;
  EXPECT_LT(c.waited, 1.0);
}

// A cancel while level 2 runs (a pair of parts' launch took about a second
// here, and ran to its end: its blocks now end once the cancel is seen,
// cancel_watch.cuh) or while a query part's lists are expanded on the host
// (their arrays were zeroed first, on one thread, for 1.7 s). Cancels at
// three points of the join (timed whole first) answer within 0.75 s, most
// of it giving back the pinned memory (they took 0.5-1.6 s; now 0.16-0.45
// s on an H200).
TEST(GpuTiOutOfCore, CancelEndsTheQueuedLevel2) {
  REQUIRE_GPU();
  const Data d = make_self(12000000, 2, Shape::kUniform, 391, false);
  const CancelledJoin run = cancel_out_of_core_join(d, -1, 31, kPinnedListsBudget);
  ASSERT_EQ(run.status, KNN_OK) << run.said;
  const double whole = run.waited;
  int cancelled = 0;
  for (double at : {0.3, 0.45, 0.6}) {
    const int ms = static_cast<int>(at * whole * 1000);
    const CancelledJoin c = cancel_out_of_core_join(d, ms, 31, kPinnedListsBudget);
    if (c.status == KNN_OK) continue;  // it ended first (its first run was slower)
    EXPECT_EQ(c.status, KNN_CANCELLED) << ms << " ms: " << c.said;
    EXPECT_LT(c.waited, 0.75) << ms << " ms";
    cancelled++;
  }
  EXPECT_GT(cancelled, 0);
}

// The process's resident memory in bytes (/proc/self/statm), or -1.
int64_t resident_bytes() {
  std::FILE *f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long size = 0, resident = -1;
  if (std::fscanf(f, "%lld %lld", &size, &resident) != 2) resident = -1;
  std::fclose(f);
  return resident < 0 ? -1 : resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// Waits up to `seconds` for the resident memory to fall to `bytes`.
bool resident_falls_to(int64_t bytes, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const int64_t now = resident_bytes();
    if (now >= 0 && now <= bytes) return true;
    if (seconds_since(t0) > seconds) {
      std::printf("  resident %.0f MB, wanted at most %.0f MB\n", now / 1048576.0,
                  bytes / 1048576.0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(GpuTiOutOfCore, CancelDuringThePinning) {
  REQUIRE_GPU();
  // 12M distinct points, k 31 (k' 32 with the self-join's keys): about 3 GB
  // of mapped lists (one block of the part, or two of half), pinned by a
  // host thread from the join's start while the target parts are built.
  // Cancels at several points of it (the last once it is done) end the
  // join within half a second -- the pinning stops between 2 MB pieces and
  // 256 MB registrations, level 2 between its blocks -- and give back what
  // was locked.
  const Data d = make_self(12000000, 2, Shape::kUniform, 391, false);
  (void)cancel_out_of_core_join(d, 0, 31, kPinnedListsBudget);  // the context first
  const int64_t before = resident_bytes();
  ASSERT_GT(before, 0);
  for (int ms : {200, 400, 700, 1000}) {
    const CancelledJoin c = cancel_out_of_core_join(d, ms, 31, kPinnedListsBudget);
    EXPECT_EQ(c.status, KNN_CANCELLED) << ms << " ms: " << c.said;
    EXPECT_LT(c.waited, 0.5) << ms << " ms";
    EXPECT_TRUE(resident_falls_to(before + (int64_t(1) << 30), 10.0)) << ms << " ms";
  }
}

// The join of CancelDuringThePinning with the pinning hook
// (knn_cuda_testing.h), told `how` (2: fail now; 3: fail once the pinning
// is done) `ms` after its pinning started: its status, its message and
// the seconds from the word to its return.
CancelledJoin fail_during_the_pinning(const Data &d, int ms, int32_t how) {
  int32_t hook = 0;
  KnnCudaTestOptions forced{};
  forced.ti_pinning_hook = &hook;
  JoinOnAThread join(d, 31, kPinnedListsBudget, forced);
  CancelledJoin out;
  if (!join.wait_for(&hook, 1)) {
    out.status = join.finish();
    out.said = "no mapped lists were pinned: " + join.said();
    return out;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  const auto t0 = std::chrono::steady_clock::now();
  __atomic_store_n(&hook, how, __ATOMIC_RELEASE);
  out.status = join.finish();
  out.waited = seconds_since(t0);
  out.said = join.said();
  std::printf("  [out-of-core] failure %s, %d ms into the pinning: status %d after %.3f s (%s)\n",
              how == 2 ? "at once" : "after the pinning", ms, static_cast<int>(out.status),
              out.waited, out.said.c_str());
  return out;
}

TEST(GpuTiOutOfCore, FailureDuringThePinning) {
  REQUIRE_GPU();
  // A join that fails for a reason of its own (the hook's device error)
  // 100 ms into the pinning of its 3 GB of mapped lists stops the pinning
  // within a piece, as a cancel does, and returns its own status and
  // message: far sooner than a failure once the pinning is done, which
  // waits for all of it (and no sooner than that before the fix).
  const Data d = make_self(12000000, 2, Shape::kUniform, 391, false);
  const CancelledJoin whole = fail_during_the_pinning(d, 100, 3);
  const CancelledJoin early = fail_during_the_pinning(d, 100, 2);
  for (const CancelledJoin *c : {&whole, &early}) {
    EXPECT_EQ(c->status, KNN_DEVICE_ERROR) << c->said;
    EXPECT_EQ(c->said, KNN_CUDA_TEST_PINNING_FAILURE);
  }
  EXPECT_LT(early.waited, 0.5);
  EXPECT_LT(4 * early.waited, whole.waited) << "the failure waited for the pinning";
}

// ---- tiny joins (small_join.cu) ----

// Every metric and k (up to the lists' 256 and beyond the eligible
// targets), through the tiny-join path and against the CPU engine: few
// dimensions (each lane computes its pair) and many (eight threads per
// pair), ties, duplicates, signed zeros, zero rows, huge and tiny values,
// self-joins and keys with collisions.
TEST(GpuSmallJoin, MatchesCpuEveryMetric) {
  REQUIRE_GPU();
  struct Case { int64_t nq, nt; int dim; Shape shape; bool self; };
  const Case cases[] = {
      {1, 1, 1, Shape::kUniform, false},        {7, 300, 1, Shape::kIntegers, false},
      {200, 500, 3, Shape::kIntegers, true},    {64, 257, 8, Shape::kSignedZeros, false},
      {33, 1000, 31, Shape::kUniform, false},   {40, 700, 32, Shape::kTiny, false},
      {50, 600, 33, Shape::kIntegers, false},   {100, 100, 300, Shape::kHuge, true},
      {30, 120, 1000, Shape::kFarClusters, false}, {100, 100, 10000, Shape::kUniform, true},
  };
  uint64_t seed = 1000;
  for (const Case &c : cases) {
    Data d = c.self ? make_self(c.nt, c.dim, c.shape, seed++, true)
                    : make_data(c.nq, c.nt, c.dim, c.shape, seed++, true);
    // A zero row on each side (cosine: NaN distances, ordered after numbers).
    std::fill(d.targets.begin(), d.targets.begin() + c.dim, 0.0f);
    if (!c.self) std::fill(d.queries.begin(), d.queries.begin() + c.dim, 0.0f);
    for (KnnMetric m : kMetrics)
      for (int k : {1, 20, 33, 256, 600}) {
        Options o;
        o.k = k;
        o.metric = m;
        if (k <= 256) o.expect_variant = c.dim > 32 ? "small-join/lane-sums" : "small-join/direct";
        check(d, o);
      }
  }
}

// Keys on two tables, with collisions (several targets share a query's
// key), and more k than any query has eligible targets.
TEST(GpuSmallJoin, KeysWithCollisions) {
  REQUIRE_GPU();
  for (int dim : {4, 200}) {
    Data d = make_data(90, 1500, dim, Shape::kIntegers, 1100 + dim, true);
    set_colliding_keys(&d, 37, 41);
    for (KnnMetric m : kMetrics)
      for (int k : {5, 256}) {
        Options o;
        o.k = k;
        o.metric = m;
        o.keys = true;
        o.expect_variant = "small-join/";
        check(d, o);
      }
  }
}

// Rows holding NaN and infinities: NaN values order after every number,
// ties by row, as on the CPU.
TEST(GpuSmallJoin, NanAndInfinityRows) {
  REQUIRE_GPU();
  for (int dim : {5, 64}) {
    Data d = make_data(60, 400, dim, Shape::kIntegers, 1200 + dim, true);
    for (int64_t r = 0; r < d.nt(); r += 13) d.targets[r * dim + r % dim] = NAN;
    for (int64_t r = 5; r < d.nt(); r += 17) d.targets[r * dim] = INFINITY;
    for (int64_t r = 0; r < d.nq(); r += 11) d.queries[r * dim + (r + 1) % dim] = NAN;
    for (KnnMetric m : kMetrics) {
      Options o;
      o.k = 30;
      o.metric = m;
      o.expect_variant = "small-join/";
      const Outcome ref = cpu_answer(d, o);
      if (ref.status != KNN_OK) continue;
      expect_gpu_matches(d, o, ref);
    }
  }
}

// Where the tiny-join path is taken, and where the general path stays.
TEST(GpuSmallJoin, ChosenForTinyJoinsOnly) {
  REQUIRE_GPU();
  auto variant_of = [](const Data &d, const Options &o) {
    const Outcome gpu = run(make_problem(d, o, KNN_DEVICE_GPU));
    EXPECT_EQ(gpu.status, KNN_OK) << gpu.error;
    return std::string(gpu.stats.variant);
  };
  Options o;
  o.k = 20;
  // The two tiny benchmark sets' shapes (arcene, 3DNet's first rows).
  EXPECT_EQ(variant_of(make_self(100, 10000, Shape::kUniform, 1300), o).rfind("small-join/lane-sums", 0), 0u);
  EXPECT_EQ(variant_of(make_self(5000, 3, Shape::kUniform, 1301), o).rfind("small-join/direct", 0), 0u);
  // Too many targets for one warp's walk, too much work, k past the lists,
  // a forced filter, a budget below its memory: the general path.
  const Data wide = make_data(4, 40000, 16, Shape::kUniform, 1302);
  EXPECT_EQ(variant_of(wide, o).find("small-join"), std::string::npos);
  const Data heavy = make_self(12000, 64, Shape::kUniform, 1303);
  EXPECT_EQ(variant_of(heavy, o).find("small-join"), std::string::npos);
  const Data tiny = make_self(2000, 16, Shape::kUniform, 1304);
  Options big_k = o;
  big_k.k = 257;
  EXPECT_EQ(variant_of(tiny, big_k).find("small-join"), std::string::npos);
  const KnnCudaTestOptions dgemm = forced_filter(2);
  Options forced = o;
  forced.forced = &dgemm;
  const Outcome f = run_forced(make_problem(tiny, forced, KNN_DEVICE_GPU), dgemm);
  EXPECT_EQ(std::string(f.stats.variant).find("small-join"), std::string::npos) << f.stats.variant;
  Options budget = o;
  budget.gpu_memory_limit = 512 << 10;  // below the tiny join's 784 KB, enough for chunks
  EXPECT_EQ(variant_of(tiny, budget).find("small-join"), std::string::npos);
}

// The module's pool hooks (knn_cuda_testing.h) on GPU 0; -2 where the
// module or the hook is missing.
int64_t pool_hook(const char *symbol) {
  static void *const module = dlopen("./knn_gpu_cuda.so", RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) return -2;
  const auto fn = reinterpret_cast<knn_cuda_test_pool_used_fn>(dlsym(module, symbol));
  return fn == nullptr ? -2 : fn(0);
}

int64_t pool_used() { return pool_hook(KNN_CUDA_TEST_POOL_USED_SYMBOL); }
int64_t pool_reserved() { return pool_hook(KNN_CUDA_TEST_POOL_RESERVED_SYMBOL); }

// A tiny join leaves nothing of its own on the device (its one allocation
// goes back to the pool when it ends).
TEST(GpuSmallJoin, FreesItsMemory) {
  REQUIRE_GPU();
  Options o;
  o.k = 10;
  for (int dim : {16, 40}) {  // each lane its pair; the lane-sum matrix
    const Data d = make_self(1500, dim, Shape::kUniform, 1400 + dim);
    const Outcome gpu = run(make_problem(d, o, KNN_DEVICE_GPU));
    ASSERT_EQ(gpu.status, KNN_OK) << gpu.error;
    EXPECT_EQ(std::string(gpu.stats.variant).rfind("small-join/", 0), 0u) << gpu.stats.variant;
    EXPECT_EQ(pool_used(), 0);
  }
}

// A join without a memory limit leaves what it freed in the pool for the
// next join (fresh device memory costs a page mapping per allocation);
// one under a limit gives it back, all but a small reserve, as it ends.
// The answers are the same either way.
TEST(GpuPool, KeepsWhatAnUnlimitedJoinFreedAndGivesItBackUnderALimit) {
  REQUIRE_GPU();
  const int64_t reserve = int64_t{64} << 20;  // device_runtime.cu's kPoolKeepBytes
  const Data d = make_self(400000, 32, Shape::kClustered, 77);  // 51 MB of points
  for (KnnMethod method : {KNN_METHOD_TI, KNN_METHOD_BRUTE}) {
    Options o;
    o.k = 10;
    o.method = method;
    const Outcome held = run(make_problem(d, o, KNN_DEVICE_GPU));
    ASSERT_EQ(held.status, KNN_OK) << held.error;
    EXPECT_EQ(pool_used(), 0);
    EXPECT_GT(pool_reserved(), reserve) << "method " << method << ": nothing kept";

    Options limited = o;
    limited.gpu_memory_limit = int64_t{4} << 30;  // in memory all the same
    const Outcome given_back = run(make_problem(d, limited, KNN_DEVICE_GPU));
    ASSERT_EQ(given_back.status, KNN_OK) << given_back.error;
    EXPECT_EQ(pool_used(), 0);
    EXPECT_LE(pool_reserved(), reserve) << "method " << method << ": kept under a limit";
    expect_same_answer(given_back, held, "limited vs unlimited");

    const Outcome again = run(make_problem(d, o, KNN_DEVICE_GPU));
    ASSERT_EQ(again.status, KNN_OK) << again.error;
    expect_same_answer(again, held, "the next unlimited join, from the kept memory");
  }
}

// With the idle release on, what a join without a limit left in the pool
// goes back (all but the small reserve) 2 s after the process's last join;
// the runtime itself stays until the idle release.
TEST(GpuPool, GivesBackWhatItKeptTwoSecondsAfterTheLastJoin) {
  REQUIRE_GPU();
  const int64_t reserve = int64_t{64} << 20;  // device_runtime.cu's kPoolKeepBytes
  const Data d = make_self(400000, 32, Shape::kClustered, 78);
  Options o;
  o.k = 10;
  o.method = KNN_METHOD_TI;
  knn_engine_set_gpu_idle_release(60000);  // the module takes it at the next join
  const Outcome first = run(make_problem(d, o, KNN_DEVICE_GPU));
  ASSERT_EQ(first.status, KNN_OK) << first.error;
  const std::chrono::steady_clock::time_point end = std::chrono::steady_clock::now();
  EXPECT_GT(pool_reserved(), reserve) << "nothing kept after the join";
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_GT(pool_reserved(), reserve) << "given back within 1 s";
  double given_back = -1;
  while (seconds_since(end) < 6) {
    if (pool_reserved() <= reserve) {
      given_back = seconds_since(end);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  knn_engine_set_gpu_idle_release(0);
  const Outcome after = run(make_problem(d, o, KNN_DEVICE_GPU));  // hands the 0 over
  ASSERT_EQ(after.status, KNN_OK) << after.error;
  expect_same_answer(after, first, "a join after the pool was trimmed");
  ASSERT_GE(given_back, 0) << "still kept 6 s after the join";
  std::printf("[ timing   ] the pool's reserve given back %.2f s after the join\n", given_back);
  EXPECT_GE(given_back, 1.9);
}

}  // namespace
