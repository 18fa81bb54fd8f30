// gpu_multi_test.cpp -- one join split across GPUs (knn_gpu.devices,
// kernels/cuda/multi_device.cuh), bit for bit against the same join on one
// GPU and on the CPU engine: the same neighbours in the same order with the
// same distances (NaN matches NaN).
//
// On a host with one GPU the split runs as the test mode of the setting: a
// list that names GPU 0 twice (or three times) runs two (three) engines on
// it, each with its own stream, handles and memory share, so the split,
// the placement of each engine's rows, a failure of one engine (the
// module's split test hook, knn_cuda_testing.h) and a cancel are tested
// there. TwoGpus.* runs on GPUs 0 and 1 and skips, saying so, where fewer
// than two are visible. Without a usable GPU every test skips with the
// reason.
//
// Run with `make gputest`, from the repository root (where
// knn_gpu_cuda.so is built).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/knn_cuda_testing.h"
#include "gpu_test_support.h"
#include "job_run.h"
#include "knn_engine.h"
#include "knn_vocabulary.h"
#include "output_prefault.h"
#include "reference_rows.h"

namespace {

::testing::Environment *const kModuleDir =
    ::testing::AddGlobalTestEnvironment(new gpu_test::ModuleDir);

// The module's entries that only tests use (the job layer loads the same
// file, so this is the same module instance).
struct TestEntries {
  knn_cuda_run_tuned_fn run_tuned = nullptr;
  knn_cuda_test_device_count_fn device_count = nullptr;
  knn_cuda_test_pool_used_fn pool_used = nullptr;
  knn_cuda_test_pool_used_fn pool_reserved = nullptr;  // the same signature
};

const TestEntries &entries() {
  static const TestEntries e = [] {
    TestEntries t;
    void *module = dlopen("./knn_gpu_cuda.so", RTLD_NOW | RTLD_LOCAL);
    if (module == nullptr) return t;
    t.run_tuned = reinterpret_cast<knn_cuda_run_tuned_fn>(dlsym(module, KNN_CUDA_RUN_TUNED_SYMBOL));
    t.device_count = reinterpret_cast<knn_cuda_test_device_count_fn>(
        dlsym(module, KNN_CUDA_TEST_DEVICE_COUNT_SYMBOL));
    t.pool_used =
        reinterpret_cast<knn_cuda_test_pool_used_fn>(dlsym(module, KNN_CUDA_TEST_POOL_USED_SYMBOL));
    t.pool_reserved = reinterpret_cast<knn_cuda_test_pool_used_fn>(
        dlsym(module, KNN_CUDA_TEST_POOL_RESERVED_SYMBOL));
    return t;
  }();
  return e;
}

#define REQUIRE_TEST_ENTRIES()                                                         \
  do {                                                                                 \
    REQUIRE_GPU();                                                                     \
    ASSERT_NE(entries().run_tuned, nullptr) << "knn_gpu_cuda.so lacks its test entry"; \
    ASSERT_NE(entries().device_count, nullptr);                                        \
    ASSERT_NE(entries().pool_used, nullptr);                                           \
  } while (0)

// ---- a case: rows, keys and the problem over them ----

struct Case {
  reference::Rows queries, targets;
  bool self = false;  // queries are the targets (one array), keys = row ids
  std::vector<int64_t> keys;
  KnnProblem problem{};
};

// Small integers (ties and duplicate rows everywhere) or clustered values
// (TI prunes), of any element type; a self-join excludes equal keys.
Case make_case(KnnElement element, int64_t nq, int64_t nt, int dim, bool spread, bool self,
               uint64_t seed) {
  std::mt19937_64 rng(seed);
  Case c;
  c.self = self;
  c.targets = reference::make_rows(element, nt, dim, rng, spread);
  if (!self) c.queries = reference::make_rows(element, nq, dim, rng, spread);
  KnnProblem &p = c.problem;
  p.element = element;
  p.dim = dim;
  p.targets = c.targets.data();
  p.n_targets = nt;
  p.queries = self ? c.targets.data() : c.queries.data();
  p.n_queries = self ? nt : nq;
  p.metric = element == KNN_ELEMENT_BIT ? KNN_METRIC_HAMMING : KNN_METRIC_L2;
  p.k = 10;
  if (self) {
    c.keys.resize(nt);
    for (int64_t i = 0; i < nt; i++) c.keys[i] = 5000 + i;
    p.query_keys = p.target_keys = c.keys.data();
  }
  return c;
}

KnnProblem on_devices(KnnProblem p, std::initializer_list<int> devices) {
  p.n_devices = 0;
  for (int d : devices) p.devices[p.n_devices++] = d;
  return p;
}

// ---- running ----

using Answer = job_run::JobResult;

// Through the job API, as the extension runs a join.
Answer job(KnnProblem p, KnnDevice device) {
  p.device = device;
  return job_run::run_job(p);
}

// Through the module's test entry on this thread (the split test hook).
Answer tuned(const KnnProblem &p, const KnnCudaTestOptions &options,
             const int32_t *cancel = nullptr) {
  Answer a;
  a.neighbors.assign(static_cast<size_t>(p.n_queries) * p.k, -2);  // every slot must be written
  a.distances.assign(a.neighbors.size(), -2.0);
  char message[512] = "";
  const auto t0 = std::chrono::steady_clock::now();
  a.status = entries().run_tuned(&p, &options, a.neighbors.data(), a.distances.data(), &a.stats,
                                 cancel, message, sizeof message);
  a.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  a.message = message;
  return a;
}

// Both answers OK and the same in every slot.
void expect_answers_identical(const Answer &got, const Answer &want, const std::string &what) {
  ASSERT_EQ(want.status, KNN_OK) << what << ": reference: " << want.message;
  ASSERT_EQ(got.status, KNN_OK) << what << ": " << got.message;
  job_run::expect_identical(got, want, what);
}

std::string describe(const KnnProblem &p, const char *devices) {
  return std::string(knn_element_name(p.element)) + " " + knn_metric_name(p.metric) + " " +
         knn_method_name(p.method) + " |Q| " + std::to_string(p.n_queries) + " |T| " +
         std::to_string(p.n_targets) + " dim " + std::to_string(p.dim) + " k " +
         std::to_string(p.k) + (p.query_keys ? " self" : "") +
         (p.gpu_memory_limit ? " limit " + std::to_string(p.gpu_memory_limit) : "") +
         " on GPUs " + devices;
}

// Each engine's rows: contiguous, in list order, together every query.
void expect_work_covers(const KnnStats &s, int64_t n_queries, int engines,
                        const std::string &what) {
  ASSERT_EQ(s.n_devices, engines) << what << ": " << s.device_name;
  int64_t rows = 0;
  for (int i = 0; i < s.n_devices; i++) {
    EXPECT_GT(s.device_work[i].queries, 0) << what << ": engine " << i + 1;
    EXPECT_GT(s.device_work[i].seconds, 0.0) << what << ": engine " << i + 1;
    rows += s.device_work[i].queries;
  }
  EXPECT_EQ(rows, n_queries) << what;
}

// The split on `devices` against GPU 0 alone and against the CPU engine.
// The split's answer goes to *split_answer where asked for.
void check_split(const KnnProblem &p, std::initializer_list<int> devices, const char *label,
                 int engines, Answer *split_answer = nullptr) {
  const std::string what = describe(p, label);
  const Answer cpu = job(p, KNN_DEVICE_CPU);
  const Answer one = job(on_devices(p, {0}), KNN_DEVICE_GPU);
  const Answer split = job(on_devices(p, devices), KNN_DEVICE_GPU);
  if (split_answer != nullptr) *split_answer = split;
  ASSERT_EQ(one.stats.device, KNN_DEVICE_GPU) << what << ": " << one.stats.device_name;
  ASSERT_EQ(split.stats.device, KNN_DEVICE_GPU) << what << ": " << split.stats.device_name;
  expect_answers_identical(one, cpu, what + " (one GPU against the CPU)");
  expect_answers_identical(split, one, what + " (split against one GPU)");
  expect_work_covers(split.stats, p.n_queries, engines, what);
  if (p.method != KNN_METHOD_AUTO) {
    EXPECT_EQ(split.stats.method, one.stats.method) << what;
  }
}

// ---- on one GPU: the test mode (GPU 0 listed several times) ----

TEST(SplitOnOneGpu, EveryMetricAndMethodMatchesOneGpuAndCpu) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (bool spread : {false, true})
    for (bool self : {false, true})
      for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP, KNN_METRIC_L1})
        for (KnnMethod method : {KNN_METHOD_BRUTE, KNN_METHOD_TI, KNN_METHOD_AUTO}) {
          Case c = make_case(KNN_ELEMENT_FLOAT32, 700, 900, spread ? 6 : 13, spread, self, seed++);
          c.problem.metric = metric;
          c.problem.method = method;
          c.problem.k = 12;
          check_split(c.problem, {0, 0}, "0,0", 2);
        }
}

TEST(SplitOnOneGpu, LargeKTiesAndDuplicates) {
  REQUIRE_GPU();
  // Small integers: every query has many targets at equal distance, and
  // many rows repeat; k up to more than there are targets (empty slots).
  for (int k : {1, 64, 300, 1200})
    for (KnnMethod method : {KNN_METHOD_BRUTE, KNN_METHOD_TI}) {
      Case c = make_case(KNN_ELEMENT_FLOAT32, 500, 1000, 4, false, false, 100 + k);
      c.problem.k = k;
      c.problem.method = method;
      check_split(c.problem, {0, 0, 0}, "0,0,0", 3);
    }
}

TEST(SplitOnOneGpu, HalfAndBitRows) {
  REQUIRE_GPU();
  Case half = make_case(KNN_ELEMENT_FLOAT16, 600, 800, 24, false, true, 200);
  half.problem.metric = KNN_METRIC_COSINE;
  check_split(half.problem, {0, 0}, "0,0", 2);
  for (KnnMetric metric : {KNN_METRIC_HAMMING, KNN_METRIC_JACCARD}) {
    Case bits = make_case(KNN_ELEMENT_BIT, 500, 700, 100, false, false, 201);
    bits.problem.metric = metric;
    bits.problem.k = 40;
    check_split(bits.problem, {0, 0}, "0,0", 2);
  }
}

// A TI self-join: each engine clusters the whole set and filters its own
// rows; duplicate rows of one point fall to several engines. Where that
// does not fit (a tiny limit) or cannot be exact in float (huge values),
// each engine joins its rows as a problem of their own instead.
TEST(SplitOnOneGpu, TiSelfJoinSharesTheClusters) {
  REQUIRE_GPU();
  for (int variant = 0; variant < 3; variant++) {
    Case c = make_case(KNN_ELEMENT_FLOAT32, 0, 3000, 2, false, true, 250 + variant);
    c.problem.method = KNN_METHOD_TI;
    c.problem.k = 30;
    if (variant == 1) c.problem.gpu_memory_limit = int64_t{1} << 20;
    if (variant == 2) c.targets.f32[7] = 1.0e30f;  // its squares overflow float
    check_split(c.problem, {0, 0, 0}, "0,0,0", 3);
    Case l1 = make_case(KNN_ELEMENT_FLOAT32, 0, 3000, 5, true, true, 260 + variant);
    l1.problem.method = KNN_METHOD_TI;
    l1.problem.metric = KNN_METRIC_L1;
    if (variant == 1) l1.problem.gpu_memory_limit = int64_t{1} << 20;
    if (variant == 2) l1.targets.f32[3] = 1.0e38f;
    check_split(l1.problem, {0, 0}, "0,0", 2);
  }
}

// Whether the split divided the TI self-join by whole query clusters
// (every engine agreed; the variant says so first).
bool divided_by_clusters(const Answer &a) {
  const std::string variant = a.stats.variant;
  return variant.rfind("cluster-split/", 0) == 0 || variant.rfind("cluster-batches/", 0) == 0;
}

// Clusters of very different sizes: most rows in one tight blob (half of
// them repeated: duplicate groups cut across the engines' row ranges), a
// few small blobs, and lone points; rows shuffled.
Case uneven_case(int64_t n, int dim, uint64_t seed) {
  Case c = make_case(KNN_ELEMENT_FLOAT32, 0, n, dim, true, true, seed);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> tight(0.0f, 0.01f), wide(0.0f, 0.3f);
  std::vector<float> &x = c.targets.f32;
  for (int64_t i = 0; i < n; i++) {
    float *row = &x[i * dim];
    const uint64_t kind = rng() % 10;
    for (int j = 0; j < dim; j++) {
      if (kind < 7) row[j] = 2.0f + tight(rng);  // the big blob
      else if (kind < 9) row[j] = static_cast<float>(5 * (rng() % 4)) + wide(rng);
      else row[j] = static_cast<float>(rng() % 1000) / 37.0f;  // lone points
    }
    if (kind < 7 && i > 0 && rng() % 2 == 0) {  // a duplicate of an earlier row
      const int64_t from = static_cast<int64_t>(rng() % i);
      std::copy(&x[from * dim], &x[from * dim] + dim, row);
    }
  }
  return c;
}

// A TI self-join divided by whole query clusters: each engine filters its
// run of clusters and writes those rows, scattered over the output.
// Duplicates across the shares, clusters of very different sizes, k above
// one share's rows, keys that exclude several targets, ties by row; all
// bit for bit against one GPU and the CPU engine.
TEST(SplitOnOneGpu, TiSelfJoinDividedByClusters) {
  REQUIRE_GPU();
  struct Variant {
    const char *what;
    int64_t n;
    int dim, k;
    bool spread, shared_keys, uneven;
    KnnMetric metric;
  };
  const Variant variants[] = {
      {"clustered", 20000, 6, 20, true, false, false, KNN_METRIC_L2},
      {"clustered L1", 12000, 5, 16, true, false, false, KNN_METRIC_L1},
      {"small integers: ties and duplicates", 8000, 3, 40, false, false, false, KNN_METRIC_L2},
      {"k above a share's rows", 1500, 4, 700, true, false, false, KNN_METRIC_L2},
      {"keys shared by several rows", 9000, 4, 12, false, true, false, KNN_METRIC_L2},
      {"clusters of very different sizes", 30000, 4, 25, true, false, true, KNN_METRIC_L2},
  };
  uint64_t seed = 270;
  for (const Variant &v : variants)
    for (int engines : {2, 3}) {
      Case c = v.uneven ? uneven_case(v.n, v.dim, seed++)
                        : make_case(KNN_ELEMENT_FLOAT32, 0, v.n, v.dim, v.spread, true, seed++);
      c.problem.method = KNN_METHOD_TI;
      c.problem.metric = v.metric;
      c.problem.k = v.k;
      if (v.shared_keys)
        for (int64_t i = 0; i < v.n; i++) c.keys[i] = i / 5;  // each row loses up to 4 targets
      Answer split;
      if (engines == 2) check_split(c.problem, {0, 0}, "0,0", 2, &split);
      else check_split(c.problem, {0, 0, 0}, "0,0,0", 3, &split);
      EXPECT_TRUE(divided_by_clusters(split))
          << v.what << ", " << engines << " engines: " << split.stats.variant;
    }
}

// A split join's result larger than OutputPrefault::kMinBytes, written into
// fresh pages (as a backend's palloc'd arrays are): the pages are populated
// on threads of their own while the engines write into them
// (output_prefault.h). The same rows as one GPU's, bit for bit, every slot
// written.
TEST(SplitOnOneGpu, ResultInFreshPagesPopulatedBesideTheEngines) {
  REQUIRE_GPU();
  Case c = make_case(KNN_ELEMENT_FLOAT32, 0, 600000, 4, true, true, 290);
  c.problem.method = KNN_METHOD_TI;
  c.problem.k = 8;
  const size_t slots = static_cast<size_t>(c.problem.n_queries) * c.problem.k;
  ASSERT_GE(slots * 16, knn::OutputPrefault::kMinBytes);
  const Answer one = job(on_devices(c.problem, {0}), KNN_DEVICE_GPU);
  ASSERT_EQ(one.status, KNN_OK) << one.message;
  const size_t bytes = slots * sizeof(int64_t);
  void *fresh_ids = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void *fresh_dists =
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(fresh_ids, MAP_FAILED);
  ASSERT_NE(fresh_dists, MAP_FAILED);
  KnnProblem p = on_devices(c.problem, {0, 0});
  p.device = KNN_DEVICE_GPU;
  char err[512] = "";
  KnnJob *running = knn_job_start(&p, static_cast<int64_t *>(fresh_ids),
                                  static_cast<double *>(fresh_dists), err, sizeof err);
  ASSERT_NE(running, nullptr) << err;
  while (knn_job_wait(running, 50) == 0) {
  }
  Answer split;
  split.status = knn_job_finish(running, &split.stats, err, sizeof err);
  split.message = err;
  split.neighbors.assign(static_cast<int64_t *>(fresh_ids), static_cast<int64_t *>(fresh_ids) + slots);
  split.distances.assign(static_cast<double *>(fresh_dists),
                         static_cast<double *>(fresh_dists) + slots);
  munmap(fresh_ids, bytes);
  munmap(fresh_dists, bytes);
  ASSERT_EQ(split.status, KNN_OK) << split.message;
  expect_answers_identical(split, one, "600000 x 4 TI self-join, k = 8, fresh result pages");
  expect_work_covers(split.stats, c.problem.n_queries, 2, "fresh result pages");
}

// Settings of the process environment for one scope (the engine reads
// them when a join runs; no join runs while they change).
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char *, const char *>> vars) {
    for (const auto &v : vars) {
      names_.push_back(v.first);
      setenv(v.first, v.second, 1);
    }
  }
  ~ScopedEnv() {
    for (const char *name : names_) unsetenv(name);
  }

 private:
  std::vector<const char *> names_;
};

// A divided share's batches of clusters run side by side, each on a stream
// of its own, their rows written as each ends (ti_query_share.cu).
// KNN_TI_BATCHED_WRITES=1 runs a one-GPU join the same way over every
// cluster; KNN_TI_SHARE_BATCHES sets the batches (at most the device's
// stream priorities: 16 asks for more) and KNN_TI_BATCH_STREAMS=1 queues
// them on one stream: every way bit for bit against the CPU engine, on one
// GPU and split.
TEST(SplitOnOneGpu, ClusterBatchesSideBySideMatchTheCpu) {
  REQUIRE_GPU();
  Case c = uneven_case(40000, 4, 330);
  c.problem.method = KNN_METHOD_TI;
  c.problem.k = 20;
  const Answer cpu = job(c.problem, KNN_DEVICE_CPU);
  const std::pair<const char *, const char *> settings[] = {
      {"6", "0"}, {"16", "0"}, {"3", "1"}, {"1", "0"}};
  for (const auto &s : settings) {
    const std::string what = std::string("batches ") + s.first + ", one stream " + s.second;
    Answer one, split;
    {
      ScopedEnv env({{"KNN_TI_BATCHED_WRITES", "1"},
                     {"KNN_TI_SHARE_BATCHES", s.first},
                     {"KNN_TI_BATCH_STREAMS", s.second}});
      one = job(on_devices(c.problem, {0}), KNN_DEVICE_GPU);
      split = job(on_devices(c.problem, {0, 0}), KNN_DEVICE_GPU);
    }
    expect_answers_identical(one, cpu, what + " (one GPU)");
    EXPECT_TRUE(divided_by_clusters(one)) << what << ": " << one.stats.variant;
    expect_answers_identical(split, cpu, what + " (GPU 0 twice)");
    EXPECT_TRUE(divided_by_clusters(split)) << what << ": " << split.stats.variant;
  }
}

// A one-GPU TI join whose output reaches kBatchedWritesMinSlots (rows x k,
// ti_cluster_share.cuh) runs as batches by itself, writing rows beside
// level 2, and answers exactly as the one launch does; below it, it keeps
// the one launch.
TEST(OneGpu, LargeOutputRunsAsBatches) {
  REQUIRE_GPU();
  Case c = make_case(KNN_ELEMENT_FLOAT32, 0, 2600000, 3, true, true, 331);
  c.problem.method = KNN_METHOD_TI;
  c.problem.k = 20;  // 52 M slots
  const KnnProblem one = on_devices(c.problem, {0});
  Answer plain;
  {
    ScopedEnv env({{"KNN_TI_BATCHED_WRITES", "0"}});
    plain = job(one, KNN_DEVICE_GPU);
  }
  const Answer batched = job(one, KNN_DEVICE_GPU);
  EXPECT_FALSE(divided_by_clusters(plain)) << plain.stats.variant;
  EXPECT_EQ(std::string(batched.stats.variant).rfind("cluster-batches/", 0), 0u)
      << batched.stats.variant;
  expect_answers_identical(batched, plain, "2600000 x 3, k 20: batches against one launch");

  KnnProblem fewer = one;
  fewer.k = 10;  // 26 M slots
  const Answer below = job(fewer, KNN_DEVICE_GPU);
  ASSERT_EQ(below.status, KNN_OK) << below.message;
  EXPECT_FALSE(divided_by_clusters(below)) << below.stats.variant;
}

// Each engine plans its own memory: under a tiny limit brute force chunks
// the targets and TI streams them in parts on every engine.
TEST(SplitOnOneGpu, EnginesChunkTargetsThatDoNotFit) {
  REQUIRE_GPU();
  for (KnnMethod method : {KNN_METHOD_BRUTE, KNN_METHOD_TI}) {
    Case c = make_case(KNN_ELEMENT_FLOAT32, 3000, 20000, 8, true, false, 300);
    c.problem.method = method;
    c.problem.gpu_memory_limit = int64_t{3} << 20;
    check_split(c.problem, {0, 0}, "0,0", 2);
  }
}

// Fewer queries than engines: only engines with rows run.
TEST(SplitOnOneGpu, FewerQueriesThanEngines) {
  REQUIRE_GPU();
  for (int64_t nq : {1, 2, 3}) {
    Case c = make_case(KNN_ELEMENT_FLOAT32, nq, 500, 5, false, false, 400 + nq);
    c.problem.k = 7;
    check_split(c.problem, {0, 0, 0, 0}, "0,0,0,0", static_cast<int>(nq));
  }
  // No query at all: nothing runs, nothing fails.
  Case c = make_case(KNN_ELEMENT_FLOAT32, 0, 50, 5, false, false, 410);
  const Answer none = job(on_devices(c.problem, {0, 0}), KNN_DEVICE_GPU);
  EXPECT_EQ(none.status, KNN_OK) << none.message;
}

TEST(SplitOnOneGpu, StatisticsShowEachEngine) {
  REQUIRE_GPU();
  Case c = make_case(KNN_ELEMENT_FLOAT32, 4000, 4000, 16, true, true, 500);
  c.problem.method = KNN_METHOD_TI;
  const Answer one = job(on_devices(c.problem, {0}), KNN_DEVICE_GPU);
  const Answer split = job(on_devices(c.problem, {0, 0}), KNN_DEVICE_GPU);
  expect_answers_identical(split, one, "self-join, TI, 0,0");
  expect_work_covers(split.stats, 4000, 2, "self-join, TI, 0,0");
  EXPECT_EQ(split.stats.device_work[0].device, 0);
  EXPECT_EQ(split.stats.device_work[1].device, 0);
  // Equal engines take equal rows.
  EXPECT_EQ(split.stats.device_work[0].queries, 2000);
  EXPECT_NE(std::string(split.stats.device_name).find("x2 (GPUs 0,0)"), std::string::npos)
      << split.stats.device_name;
  EXPECT_EQ(split.stats.pairs, one.stats.pairs);
  EXPECT_GT(split.stats.distance_computations, 0);
  EXPECT_GE(split.stats.seconds_total, split.stats.device_work[0].seconds);
  // One GPU: one engine, every row.
  expect_work_covers(one.stats, 4000, 1, "self-join, TI, 0");
}

// Brute-force engines with resident targets upload them once between them
// and copy each other's slices GPU to GPU (peer_rows.cuh; " peer" in the variant);
// a self-join's shares read their query rows from those targets. The
// answers stay those of one GPU and of the CPU. Engines that chunk their
// targets share nothing.
bool shares_targets(const Answer &a) {
  return std::string(a.stats.variant).find(" peer") != std::string::npos;
}

TEST(SplitOnOneGpu, BruteForceEnginesShareOneUploadOfTheTargets) {
  REQUIRE_GPU();
  struct Shape {
    KnnElement element;
    KnnMetric metric;
    bool self;
    bool three;
  };
  uint64_t seed = 950;
  for (const Shape &s : {Shape{KNN_ELEMENT_FLOAT32, KNN_METRIC_L2, true, false},
                         Shape{KNN_ELEMENT_FLOAT32, KNN_METRIC_IP, false, true},
                         Shape{KNN_ELEMENT_FLOAT16, KNN_METRIC_COSINE, true, false},
                         Shape{KNN_ELEMENT_FLOAT32, KNN_METRIC_L1, true, true}}) {
    Case c = make_case(s.element, 20000, 40000, 48, true, s.self, seed++);
    c.problem.metric = s.metric;
    c.problem.method = KNN_METHOD_BRUTE;
    c.problem.k = 16;
    Answer split;
    if (s.three)
      check_split(c.problem, {0, 0, 0}, "0,0,0", 3, &split);
    else
      check_split(c.problem, {0, 0}, "0,0", 2, &split);
    EXPECT_TRUE(shares_targets(split)) << describe(c.problem, "") << ": " << split.stats.variant;
  }
  Case chunked = make_case(KNN_ELEMENT_FLOAT32, 3000, 20000, 8, true, false, 960);
  chunked.problem.method = KNN_METHOD_BRUTE;
  chunked.problem.gpu_memory_limit = int64_t{3} << 20;
  Answer split;
  check_split(chunked.problem, {0, 0}, "0,0", 2, &split);
  EXPECT_FALSE(shares_targets(split)) << split.stats.variant;
}

// A listed GPU that does not exist is an error naming it, not a CPU run.
TEST(SplitOnOneGpu, MissingGpuIsAnError) {
  REQUIRE_TEST_ENTRIES();
  const int count = entries().device_count();
  ASSERT_GE(count, 1);
  Case c = make_case(KNN_ELEMENT_FLOAT32, 50, 50, 4, false, false, 600);
  const Answer a = job(on_devices(c.problem, {0, count}), KNN_DEVICE_GPU);
  EXPECT_EQ(a.status, KNN_NO_DEVICE) << a.message;
  EXPECT_NE(a.message.find("lists GPU " + std::to_string(count)), std::string::npos) << a.message;
}

// A join long enough (about a second on an H100) that the first engine is
// mid-work when the second fails or the caller cancels.
Case long_case() {
  Case c = make_case(KNN_ELEMENT_FLOAT32, 0, 300000, 64, true, true, 700);
  c.problem.metric = KNN_METRIC_L1;  // no GEMM filter: exact tiles, the slow path
  c.problem.method = KNN_METHOD_BRUTE;
  return c;
}

// Where the join is too short for a stop to be told from an end, say so.
void note_if_short(double seconds, const char *what) {
  if (seconds < 1.0)
    std::printf("note: %s took %.3f s, too short to show a prompt stop\n", what, seconds);
}

// The split test hook on engine 2: it waits wait_ms (stopping on a
// cancel), then fails or joins its rows.
KnnCudaTestOptions second_engine(int wait_ms, bool fail) {
  KnnCudaTestOptions o{};
  o.split_test_engine = 2;
  o.split_test_wait_ms = wait_ms;
  o.split_test_fail = fail ? 1 : 0;
  return o;
}

void expect_pool_empty(int device, const std::string &what) {
  EXPECT_EQ(entries().pool_used(device), 0) << what << ": GPU " << device
                                            << " still holds memory of the join";
}

TEST(SplitOnOneGpu, FailureOfSecondEngineEndsTheJoinAndFreesEveryEngine) {
  REQUIRE_TEST_ENTRIES();
  Case c = long_case();
  const KnnProblem p = on_devices(c.problem, {0, 0});
  const Answer failed = tuned(p, second_engine(100, true));  // engine 1 joins meanwhile
  EXPECT_EQ(failed.status, KNN_DEVICE_ERROR) << failed.message;
  EXPECT_NE(failed.message.find("GPU 0 (engine 2 of 2)"), std::string::npos) << failed.message;
  EXPECT_NE(failed.message.find("forced failure"), std::string::npos) << failed.message;
  expect_pool_empty(0, "after the failure");

  // The runtimes still work: the same join, and its rows, without the hook.
  const Answer whole = tuned(p, KnnCudaTestOptions{});
  const Answer one = tuned(on_devices(c.problem, {0}), KnnCudaTestOptions{});
  expect_answers_identical(whole, one, "after a failed split");
  expect_work_covers(whole.stats, c.problem.n_queries, 2, "after a failed split");
  // Engine 1 was stopped, not left to finish its half: the failure came
  // after 0.1 s, the stop within 0.5 s of it.
  note_if_short(whole.stats.device_work[0].seconds, "the first engine's half");
  EXPECT_LT(failed.seconds, 0.6) << "the first engine ran on after the second failed (its half "
                                 << "takes " << whole.stats.device_work[0].seconds << " s)";
  expect_pool_empty(0, "after the rerun");
}

TEST(SplitOnOneGpu, CancelStopsEveryEngine) {
  REQUIRE_TEST_ENTRIES();
  Case c = long_case();
  const KnnProblem p = on_devices(c.problem, {0, 0});
  int32_t cancel = 0;
  std::chrono::steady_clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancelled_at = std::chrono::steady_clock::now();
    __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
  });
  const Answer a = tuned(p, second_engine(60000, false), &cancel);  // engine 2 would wait a minute
  const auto returned = std::chrono::steady_clock::now();
  canceller.join();
  EXPECT_EQ(a.status, KNN_CANCELLED) << a.message;
  const double after = std::chrono::duration<double>(returned - cancelled_at).count();
  EXPECT_LT(after, 0.5) << "the split join took " << after << " s to stop after the cancel";
  expect_pool_empty(0, "after the cancel");

  // The job API's cancel reaches every engine too.
  KnnProblem jp = p;
  jp.device = KNN_DEVICE_GPU;
  std::vector<int64_t> rows(static_cast<size_t>(jp.n_queries) * jp.k);
  std::vector<double> values(rows.size());
  char message[256] = "";
  KnnJob *j = knn_job_start(&jp, rows.data(), values.data(), message, sizeof message);
  ASSERT_NE(j, nullptr) << message;
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const auto t0 = std::chrono::steady_clock::now();
  knn_job_cancel(j);
  while (knn_job_wait(j, 10) == 0) {
  }
  const double stop_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const KnnStatus st = knn_job_finish(j, nullptr, message, sizeof message);
  // A fast GPU may have finished first; a stopped join stops within 0.5 s.
  if (st != KNN_OK) {
    EXPECT_EQ(st, KNN_CANCELLED) << message;
    EXPECT_LT(stop_seconds, 0.5);
  }
  expect_pool_empty(0, "after the job's cancel");
}

// The engines of a TI self-join vote on dividing it by clusters
// (share_vote.cuh): an engine held up past the vote's patience (3 s) does
// not hold the other, which answers its rows; the late one then finds the
// vote closed and does the same. The result is still the single GPU's.
// (The prompt engine first waits 1 s for the late one's offer of the
// shared upload, then 1 s for that of the shared cluster assignment, and
// does both alone: 7 s is past all three waits.)
TEST(SplitOnOneGpu, TiVoteThatWaitsTooLongFallsBackToRows) {
  REQUIRE_TEST_ENTRIES();
  Case c = uneven_case(20000, 4, 720);
  c.problem.method = KNN_METHOD_TI;
  const Answer one = tuned(on_devices(c.problem, {0}), KnnCudaTestOptions{});
  const Answer late = tuned(on_devices(c.problem, {0, 0}), second_engine(7000, false));
  expect_answers_identical(late, one, "second engine 7 s late");
  EXPECT_FALSE(divided_by_clusters(late)) << late.stats.variant;
  const Answer prompt = tuned(on_devices(c.problem, {0, 0}), KnnCudaTestOptions{});
  expect_answers_identical(prompt, one, "no engine late");
  EXPECT_TRUE(divided_by_clusters(prompt)) << prompt.stats.variant;
  expect_pool_empty(0, "after the late vote");
}

// A cancel reaches an engine waiting for the others: 300 ms in, engine 1
// waits for engine 2 (held 60 s by the test hook) at the offer of the
// shared upload, or, with that off, at the offer of the shared cluster
// assignment, or, with both off, at the vote.
void cancel_while_waiting(const char *what, uint64_t seed) {
  Case c = uneven_case(20000, 4, seed);
  c.problem.method = KNN_METHOD_TI;
  int32_t cancel = 0;
  std::chrono::steady_clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancelled_at = std::chrono::steady_clock::now();
    __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
  });
  const Answer a = tuned(on_devices(c.problem, {0, 0}), second_engine(60000, false), &cancel);
  const auto returned = std::chrono::steady_clock::now();
  canceller.join();
  EXPECT_EQ(a.status, KNN_CANCELLED) << what << ": " << a.message;
  const double after = std::chrono::duration<double>(returned - cancelled_at).count();
  EXPECT_LT(after, 0.5) << what << ": the split TI join took " << after
                        << " s to stop after the cancel";
  expect_pool_empty(0, std::string("after the cancel at ") + what);
}

TEST(SplitOnOneGpu, CancelReachesAnEngineWaitingForTheVote) {
  REQUIRE_TEST_ENTRIES();
  const ScopedEnv nothing_shared({{"KNN_TI_SHARED_ASSIGN", "0"}, {"KNN_TI_SHARED_UPLOAD", "0"}});
  cancel_while_waiting("the vote", 721);
}

TEST(SplitOnOneGpu, CancelReachesAnEngineWaitingToShareTheAssignment) {
  REQUIRE_TEST_ENTRIES();
  const ScopedEnv no_shared_upload({{"KNN_TI_SHARED_UPLOAD", "0"}});
  cancel_while_waiting("the assignment's offer", 722);
}

TEST(SplitOnOneGpu, CancelReachesAnEngineWaitingToShareTheUpload) {
  REQUIRE_TEST_ENTRIES();
  cancel_while_waiting("the upload's offer", 723);
}

// A TI self-join of 20000 uneven rows of `dim` floats, k = 15: what the
// tests of the split's sharing run.
Case ti_share_case(int dim, uint64_t seed) {
  Case c = uneven_case(20000, dim, seed);
  c.problem.method = KNN_METHOD_TI;
  c.problem.k = 15;
  return c;
}

// The engines of a split TI self-join upload the points and assign them to
// their clusters once between them (each its slice, the rest copied from
// the others), unless told not to; every way the answer is one GPU's.
// Rows of 4 floats are uploaded as they are; rows of 6 are padded to 8.
TEST(SplitOnOneGpu, TiSelfJoinSharesTheUploadAndTheAssignment) {
  REQUIRE_TEST_ENTRIES();
  uint64_t seed = 730;
  for (int dim : {4, 6}) {
    const Case c = ti_share_case(dim, seed++);
    const Answer one = tuned(on_devices(c.problem, {0}), KnnCudaTestOptions{});
    struct Way {
      const char *upload, *assign;
      int32_t shared;  // the probe's bits: 1 upload, 2 assignment
    };
    for (const Way &w : {Way{"1", "1", 3}, Way{"0", "1", 2}, Way{"1", "0", 1}, Way{"0", "0", 0}}) {
      const ScopedEnv ways({{"KNN_TI_SHARED_UPLOAD", w.upload}, {"KNN_TI_SHARED_ASSIGN", w.assign}});
      for (std::initializer_list<int> devices : {std::initializer_list<int>{0, 0},
                                                 std::initializer_list<int>{0, 0, 0}}) {
        int32_t probe = 0;
        KnnCudaTestOptions o{};
        o.ti_shared_probe = &probe;
        const Answer split = tuned(on_devices(c.problem, devices), o);
        const std::string what = "dim " + std::to_string(dim) + ", " +
                                 std::to_string(devices.size()) + " engines, upload " + w.upload +
                                 ", assignment " + w.assign;
        expect_answers_identical(split, one, what);
        EXPECT_TRUE(divided_by_clusters(split)) << what << ": " << split.stats.variant;
        EXPECT_EQ(probe, w.shared) << what;
      }
    }
  }
  expect_pool_empty(0, "after the shared uploads");
}

// An engine whose own slice of the shared upload fails after the engines
// agreed to share (the test hook: as for want of device memory) answers its
// rows another way, and declines the assignment and the vote; the other
// engine uploads the failed slice from the host. The answer is still one
// GPU's, and no cancel is made up.
TEST(SplitOnOneGpu, TiSharedUploadSurvivesAFailedSlice) {
  REQUIRE_TEST_ENTRIES();
  for (int dim : {4, 6}) {
    const Case c = ti_share_case(dim, 740 + dim);
    const Answer one = tuned(on_devices(c.problem, {0}), KnnCudaTestOptions{});
    for (int failing : {1, 2}) {
      int32_t probe = 0;
      KnnCudaTestOptions o{};
      o.ti_shared_probe = &probe;
      o.ti_upload_slice_fail = failing;
      const Answer split = tuned(on_devices(c.problem, {0, 0}), o);
      const std::string what =
          "dim " + std::to_string(dim) + ", engine " + std::to_string(failing) + "'s slice failed";
      expect_answers_identical(split, one, what);
      EXPECT_EQ(probe, 1) << what << ": only the other engine's upload was shared";
      EXPECT_FALSE(divided_by_clusters(split)) << what << ": " << split.stats.variant;
    }
  }
  expect_pool_empty(0, "after the failed slices");
}

// Divided by whole clusters, each engine runs level 1 over its own query
// clusters only (it votes first): the engines' ranges together are the
// clusters once, where every engine used to filter all of them. Answering
// rows instead (KNN_TI_SPLIT_ROWS=1), or with the old order kept
// (KNN_TI_LEVEL1_ALL=1), each filters all of them. Every way the answer is
// one GPU's, bit for bit.
TEST(SplitOnOneGpu, TiLevel1RunsOverEachEnginesOwnClusters) {
  REQUIRE_TEST_ENTRIES();
  uint64_t seed = 750;
  for (int dim : {4, 6}) {
    const Case c = ti_share_case(dim, seed++);
    int32_t clusters = 0;
    KnnCudaTestOptions single{};
    single.ti_level1_probe = &clusters;
    const Answer one = tuned(on_devices(c.problem, {0}), single);
    ASSERT_EQ(one.status, KNN_OK) << one.message;
    ASSERT_GT(clusters, 1) << "one GPU's level 1 ran over no clusters";
    EXPECT_EQ(clusters, one.stats.query_clusters);
    struct Way {
      const char *env, *value;
      bool by_clusters, own_only;
    };
    for (const Way &w : {Way{"KNN_TI_LEVEL1_ALL", "0", true, true},
                         Way{"KNN_TI_LEVEL1_ALL", "1", true, false},
                         Way{"KNN_TI_SPLIT_ROWS", "1", false, false}}) {
      const ScopedEnv way({{w.env, w.value}});
      for (int engines : {2, 3}) {
        int32_t probe = 0;
        KnnCudaTestOptions o{};
        o.ti_level1_probe = &probe;
        const Answer split =
            tuned(on_devices(c.problem, engines == 2 ? std::initializer_list<int>{0, 0}
                                                     : std::initializer_list<int>{0, 0, 0}),
                  o);
        const std::string what = "dim " + std::to_string(dim) + ", " + std::to_string(engines) +
                                 " engines, " + w.env + "=" + w.value;
        expect_answers_identical(split, one, what);
        EXPECT_EQ(divided_by_clusters(split), w.by_clusters) << what << ": " << split.stats.variant;
        EXPECT_EQ(probe, w.own_only ? clusters : engines * clusters)
            << what << ": query clusters level 1 ran over, all engines together";
      }
    }
  }
  expect_pool_empty(0, "after the shares' level 1");
}

// An engine that runs out of memory in its level 1 (the test hook: as for
// want of device memory; its share's largest allocation) has not agreed to
// divide by clusters yet: it declines, answers its rows another way, and
// every other engine answers its own rows, without waiting out the vote's
// patience (3 s). The answer is one GPU's, and no memory is left behind.
TEST(SplitOnOneGpu, TiLevel1OutOfMemoryHandsTheRowsBack) {
  REQUIRE_TEST_ENTRIES();
  const Case c = ti_share_case(4, 760);
  const Answer one = tuned(on_devices(c.problem, {0}), KnnCudaTestOptions{});
  for (int engines : {2, 3})
    for (int failing = 1; failing <= engines; failing++) {
      KnnCudaTestOptions o{};
      o.ti_level1_fail = failing;
      const Answer split =
          tuned(on_devices(c.problem, engines == 2 ? std::initializer_list<int>{0, 0}
                                                   : std::initializer_list<int>{0, 0, 0}),
                o);
      const std::string what = std::to_string(engines) + " engines, engine " +
                               std::to_string(failing) + "'s level 1 out of memory";
      expect_answers_identical(split, one, what);
      EXPECT_FALSE(divided_by_clusters(split)) << what << ": " << split.stats.variant;
      EXPECT_LT(split.seconds, 2.5) << what << ": an engine waited out the vote";
      expect_pool_empty(0, what);
    }
}

// Under knn_gpu.gpu_memory_limit an engine of a split has level 1 behind
// it when it votes (over its own clusters: fewer pairs than one GPU's over
// all of them), so it divides by clusters wherever one GPU, under the same
// limit, runs its join as cluster batches (KNN_TI_BATCHED_WRITES=1: the
// same room check after level 1 over all clusters). Many clusters (landmark
// factor 8) make level 1 a large part of the budget.
TEST(SplitOnOneGpu, TiSplitDividesByClustersUnderALimitWhereOneGpuBatches) {
  REQUIRE_TEST_ENTRIES();
  Case c = ti_share_case(4, 770);
  c.problem.k = 4;
  KnnCudaTestOptions o{};
  o.ti_landmark_factor = 8;
  const ScopedEnv batched({{"KNN_TI_BATCHED_WRITES", "1"}});
  // The smallest limit (in MiB) at which one GPU batches: every limit is
  // tried (the cluster count follows the limit, so whether one GPU batches
  // need not fall off at one point).
  int64_t lowest = 0;
  Answer one;
  for (int64_t mib = 48; mib >= 4; mib--) {
    KnnProblem p = on_devices(c.problem, {0});
    p.gpu_memory_limit = mib << 20;
    const Answer a = tuned(p, o);
    ASSERT_EQ(a.status, KNN_OK) << mib << " MiB: " << a.message;
    if (std::string(a.stats.variant).rfind("cluster-batches/", 0) != 0) continue;
    lowest = mib;
    one = a;
  }
  ASSERT_GT(lowest, 0) << "one GPU did not batch even under 48 MiB";
  ASSERT_LT(lowest, 48) << "one GPU batched at every limit scanned";
  for (std::initializer_list<int> devices :
       {std::initializer_list<int>{0, 0}, std::initializer_list<int>{0, 0, 0}}) {
    KnnProblem p = on_devices(c.problem, devices);
    p.gpu_memory_limit = lowest << 20;
    const Answer split = tuned(p, o);
    const std::string what = std::to_string(devices.size()) + " engines under " +
                             std::to_string(lowest) + " MiB";
    expect_answers_identical(split, one, what);
    EXPECT_TRUE(divided_by_clusters(split)) << what << ": " << split.stats.variant;
  }
  expect_pool_empty(0, "after the limited splits");
}

// ---- on two GPUs ----

#define REQUIRE_TWO_GPUS()                                                               \
  do {                                                                                   \
    REQUIRE_TEST_ENTRIES();                                                              \
    const int count_ = entries().device_count();                                         \
    if (count_ < 2)                                                                      \
      GTEST_SKIP() << "needs 2 GPUs, " << count_ << " visible (CUDA_VISIBLE_DEVICES)";   \
  } while (0)

TEST(TwoGpus, SplitMatchesOneGpuAndCpu) {
  REQUIRE_TWO_GPUS();
  uint64_t seed = 800;
  for (KnnMetric metric : {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP, KNN_METRIC_L1})
    for (KnnMethod method : {KNN_METHOD_BRUTE, KNN_METHOD_TI}) {
      Case c = make_case(KNN_ELEMENT_FLOAT32, 3000, 5000, 12, true, seed % 2 == 0, seed);
      seed++;
      c.problem.metric = metric;
      c.problem.method = method;
      c.problem.k = 25;
      check_split(c.problem, {0, 1}, "0,1", 2);
      check_split(c.problem, {1, 0, 1}, "1,0,1", 3);
    }
  Case ties = make_case(KNN_ELEMENT_FLOAT32, 2, 400, 3, false, false, 850);
  ties.problem.k = 500;
  check_split(ties.problem, {0, 1, 0}, "0,1,0", 2);
}

TEST(TwoGpus, EachGpuDoesItsShare) {
  REQUIRE_TWO_GPUS();
  Case c = make_case(KNN_ELEMENT_FLOAT32, 6000, 6000, 32, true, true, 900);
  const Answer a = job(on_devices(c.problem, {0, 1}), KNN_DEVICE_GPU);
  ASSERT_EQ(a.status, KNN_OK) << a.message;
  expect_work_covers(a.stats, 6000, 2, "0,1");
  EXPECT_EQ(a.stats.device_work[0].device, 0);
  EXPECT_EQ(a.stats.device_work[1].device, 1);
  // "all" splits a join this large (query rows x target rows x dims: 2.4e13,
  // above twice the module's threshold) across every GPU.
  Case big = make_case(KNN_ELEMENT_FLOAT32, 0, 110000, 2000, false, true, 901);
  big.problem.k = 5;
  big.problem.method = KNN_METHOD_BRUTE;
  const Answer all = job(big.problem, KNN_DEVICE_GPU);
  const Answer one = job(on_devices(big.problem, {0}), KNN_DEVICE_GPU);
  expect_answers_identical(all, one, "all against GPU 0");
  EXPECT_EQ(all.stats.n_devices, std::min(entries().device_count(), 2)) << all.stats.device_name;
}

// The shared upload of the targets across two GPUs (peer links), and with
// three engines on two GPUs (a GPU's two engines copy within it).
TEST(TwoGpus, BruteForceEnginesShareTheTargetsAcrossGpus) {
  REQUIRE_TWO_GPUS();
  uint64_t seed = 970;
  for (KnnElement element : {KNN_ELEMENT_FLOAT32, KNN_ELEMENT_FLOAT16})
    for (bool self : {true, false}) {
      Case c = make_case(element, 30000, 60000, 64, true, self, seed++);
      c.problem.metric = self ? KNN_METRIC_L2 : KNN_METRIC_COSINE;
      c.problem.method = KNN_METHOD_BRUTE;
      c.problem.k = 20;
      Answer split;
      check_split(c.problem, {0, 1}, "0,1", 2, &split);
      EXPECT_TRUE(shares_targets(split)) << describe(c.problem, "0,1") << ": "
                                         << split.stats.variant;
      check_split(c.problem, {1, 0, 1}, "1,0,1", 3, &split);
      EXPECT_TRUE(shares_targets(split)) << describe(c.problem, "1,0,1") << ": "
                                         << split.stats.variant;
    }
}

// Divided by clusters across two GPUs (and three engines on two GPUs):
// clusters of very different sizes, duplicates, keys that exclude several
// targets.
TEST(TwoGpus, TiSelfJoinDividedByClusters) {
  REQUIRE_TWO_GPUS();
  for (bool shared_keys : {false, true}) {
    Case c = uneven_case(40000, 4, 960 + shared_keys);
    c.problem.method = KNN_METHOD_TI;
    c.problem.k = 25;
    if (shared_keys)
      for (int64_t i = 0; i < c.problem.n_queries; i++) c.keys[i] = i / 3;
    Answer split;
    check_split(c.problem, {0, 1}, "0,1", 2, &split);
    EXPECT_TRUE(divided_by_clusters(split)) << split.stats.variant;
    check_split(c.problem, {1, 0, 1}, "1,0,1", 3, &split);
    EXPECT_TRUE(divided_by_clusters(split)) << split.stats.variant;
  }
  // Rows padded from 6 floats to 8, their upload and assignment shared
  // across the two GPUs (peer copies), the largest value in GPU 1's slice:
  // where its square overflows float, GPU 0 must see it too (both engines
  // then leave TI for brute force, as one GPU does).
  for (float largest : {1.0e3f, 1.0e30f}) {
    Case wide = uneven_case(40000, 6, 962);
    wide.problem.method = KNN_METHOD_TI;
    wide.problem.k = 25;
    wide.targets.f32[39000 * 6 + 5] = largest;
    const bool finite = largest < 1.0e10f;
    const std::string what = std::string("dim 6 on GPUs 0,1, largest ") + (finite ? "1e3" : "1e30");
    const Answer one = tuned(on_devices(wide.problem, {0}), KnnCudaTestOptions{});
    int32_t probe = 0, level1 = 0;
    KnnCudaTestOptions o{};
    o.ti_shared_probe = &probe;
    o.ti_level1_probe = &level1;
    const Answer split = tuned(on_devices(wide.problem, {0, 1}), o);
    expect_answers_identical(split, one, what);
    EXPECT_EQ(probe, finite ? 3 : 1) << what << ": what was shared across GPUs 0 and 1";
    EXPECT_EQ(divided_by_clusters(split), finite) << what << ": " << split.stats.variant;
    if (finite) {
      EXPECT_EQ(level1, one.stats.query_clusters)
          << what << ": each GPU's level 1 over its own query clusters only";
    }
  }
}

// An engine whose buffer for the shared upload came from the default pool
// (its GPU's pool of shared rows could not be made), the pool then made by
// another join before the buffer was offered (the test hook), grants the
// other GPU the default pool, the one the buffer is in: the peer copies
// read it, and the answer is one GPU's. (Granting the pool found at grant
// time instead fails the copies where nothing granted the default pool
// before, e.g. this test alone.)
TEST(TwoGpus, TiSharedUploadGrantsThePoolItsBufferCameFrom) {
  REQUIRE_TWO_GPUS();
  const Case c = ti_share_case(4, 980);
  const Answer one = tuned(on_devices(c.problem, {0}), KnnCudaTestOptions{});
  for (int late : {1, 2}) {
    int32_t probe = 0;
    KnnCudaTestOptions o{};
    o.ti_shared_probe = &probe;
    o.ti_shared_pool_late = late;
    const Answer split = tuned(on_devices(c.problem, {0, 1}), o);
    const std::string what = "GPUs 0,1, engine " + std::to_string(late) + "'s buffer from the default pool";
    expect_answers_identical(split, one, what);
    EXPECT_EQ(probe & 1, 1) << what << ": the upload was not shared";
    EXPECT_TRUE(divided_by_clusters(split)) << what << ": " << split.stats.variant;
  }
  expect_pool_empty(0, "after the shared uploads");
  expect_pool_empty(1, "after the shared uploads");
}

// The split's "level-1 kept" figure speaks for every engine's clusters:
// each engine's level 1 ran over its own, and the figure is theirs
// weighted by their clusters, which is one GPU's over all of them (to the
// rounding of the engines' figures). (Lists in registers, one thread a
// query: a longer variant loses the figure to the 64 bytes of the field.)
TEST(SplitOnOneGpu, TiSplitLevel1KeptIsAllEngines) {
  REQUIRE_TEST_ENTRIES();
  const Case c = uneven_case(30000, 4, 790);
  KnnProblem p = c.problem;
  p.method = KNN_METHOD_TI;
  p.k = 10;
  KnnCudaTestOptions o{};
  o.ti_list = 1;
  o.ti_threads_per_query = 1;
  const Answer one = tuned(on_devices(p, {0}), o);
  const Answer split = tuned(on_devices(p, {0, 0, 0}), o);
  expect_answers_identical(split, one, "GPU 0 three times");
  ASSERT_TRUE(divided_by_clusters(split)) << split.stats.variant;
  auto kept = [](const Answer &a) {
    const char *at = std::strstr(a.stats.variant, "level-1 kept ");
    return at == nullptr ? -1.0 : std::atof(at + std::strlen("level-1 kept "));
  };
  ASSERT_GE(kept(one), 0.0) << one.stats.variant;
  EXPECT_NEAR(kept(split), kept(one), 0.11) << split.stats.variant << " against "
                                            << one.stats.variant;
}

// What a split TI self-join without a memory limit kept in the pools (the
// shared upload's rows in the pool of shared rows, the rest in the default
// pool) goes back, all but the small reserve, 2 s after the GPU's last
// join, also where that last join had a limit and was not TI (it lowers
// the pools' threshold, and gives back nothing of the shared rows' pool
// itself).
TEST(SplitOnOneGpu, WhatAnUnlimitedSplitKeptGoesBackAfterALimitedJoin) {
  REQUIRE_TEST_ENTRIES();
  ASSERT_NE(entries().pool_reserved, nullptr);
  const int64_t reserve = int64_t{64} << 20;  // device_runtime.cu's kPoolKeepBytes
  // 2500000 rows of 8 floats: 80 MB of shared upload.
  Case big = make_case(KNN_ELEMENT_FLOAT32, 0, 2500000, 8, true, true, 990);
  big.problem.method = KNN_METHOD_TI;
  Case small = make_case(KNN_ELEMENT_FLOAT32, 3000, 3000, 8, false, false, 991);
  small.problem.method = KNN_METHOD_BRUTE;
  small.problem.gpu_memory_limit = int64_t{1} << 30;
  knn_engine_set_gpu_idle_release(60000);  // the module takes it at the next join
  const Answer split = job(on_devices(big.problem, {0, 0}), KNN_DEVICE_GPU);
  ASSERT_EQ(split.status, KNN_OK) << split.message;
  EXPECT_GT(entries().pool_reserved(0), reserve) << "nothing kept after the split";
  const Answer limited = job(on_devices(small.problem, {0}), KNN_DEVICE_GPU);
  ASSERT_EQ(limited.status, KNN_OK) << limited.message;
  const auto end = std::chrono::steady_clock::now();
  double given_back = -1;
  for (double waited = 0; waited < 6; ) {
    if (entries().pool_reserved(0) <= reserve) {
      given_back = waited;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - end).count();
  }
  knn_engine_set_gpu_idle_release(0);
  const Answer after = job(on_devices(small.problem, {0}), KNN_DEVICE_GPU);  // hands the 0 over
  expect_answers_identical(after, limited, "a join after the pools were trimmed");
  EXPECT_GE(given_back, 0) << "still " << entries().pool_reserved(0)
                           << " bytes reserved 6 s after the last join";
}

TEST(TwoGpus, FailureNamesTheGpu) {
  REQUIRE_TWO_GPUS();
  Case c = long_case();
  const Answer a = tuned(on_devices(c.problem, {0, 1}), second_engine(50, true));
  EXPECT_EQ(a.status, KNN_DEVICE_ERROR) << a.message;
  EXPECT_NE(a.message.find("GPU 1 (engine 2 of 2)"), std::string::npos) << a.message;
  expect_pool_empty(0, "after the failure");
  expect_pool_empty(1, "after the failure");
}

}  // namespace
