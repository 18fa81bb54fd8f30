// gpu_group_test.cpp -- per-group joins (KnnProblem's query_groups and
// target_groups) on the GPU, in one call of the module's grouped entry
// (kernels/cuda/group_join.cuh), against the CPU engine's grouped join
// through the job API, bit for bit: the same neighbours in the same order
// with the same distances (NaN matches NaN), padding included. Every GPU
// run must say it ran on the GPU, in one grouped call.
//
// Run with `make gputest` from the repository root (where knn_gpu_cuda.so
// is built). Without a usable GPU every test is skipped with the reason.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_support.h"
#include "knn_cuda_module.h"
#include "knn_engine.h"
#include "knn_vocabulary.h"
#include "reference_rows.h"

namespace {

::testing::Environment *const kModuleDir =
    ::testing::AddGlobalTestEnvironment(new gpu_test::ModuleDir);

using reference::Rows;
using reference::make_rows;

struct Case {
  Rows queries, targets;
  std::vector<int64_t> query_groups, target_groups, query_keys, target_keys;
  bool keyed = false;
  bool shared = false;  // one matrix (and one key array) on both sides
  int k = 1;
  KnnMetric metric = KNN_METRIC_L2;
  int64_t gpu_memory_limit = 0;

  KnnProblem problem(KnnDevice device) const {
    KnnProblem p{};
    p.element = queries.element;
    p.queries = queries.data();
    p.n_queries = queries.n;
    p.targets = shared ? queries.data() : targets.data();
    p.n_targets = shared ? queries.n : targets.n;
    p.dim = queries.dim;
    p.k = k;
    p.metric = metric;
    p.method = KNN_METHOD_AUTO;
    p.device = device;
    if (keyed) {
      p.query_keys = query_keys.data();
      p.target_keys = shared ? query_keys.data() : target_keys.data();
    }
    p.query_groups = query_groups.data();
    p.target_groups = shared ? query_groups.data() : target_groups.data();
    p.gpu_memory_limit = gpu_memory_limit;
    return p;
  }
};

struct Outcome {
  KnnStatus status = KNN_INTERNAL_ERROR;
  std::string message;
  KnnStats stats{};
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
};

Outcome run(const KnnProblem &p) {
  Outcome out;
  const size_t slots = static_cast<size_t>(p.n_queries) * p.k;
  out.neighbors.assign(std::max<size_t>(slots, 1), -7);  // poisoned: every slot must be written
  out.distances.assign(std::max<size_t>(slots, 1), -7.0);
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, out.neighbors.data(), out.distances.data(), err, sizeof err);
  if (job == nullptr) {
    out.message = err;
    return out;
  }
  out.status = knn_job_finish(job, &out.stats, err, sizeof err);
  out.message = err;
  out.neighbors.resize(slots);
  out.distances.resize(slots);
  return out;
}

bool same_distance(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;  // bit for bit (also the sign of 0)
}

std::string describe(const Case &c) {
  return std::string(knn_metric_name(c.metric)) + " element " + std::to_string(c.queries.element) +
         " |Q| " + std::to_string(c.queries.n) + " |T| " +
         std::to_string(c.shared ? c.queries.n : c.targets.n) + " dim " +
         std::to_string(c.queries.dim) + " k " + std::to_string(c.k) + (c.keyed ? " keyed" : "") +
         (c.shared ? " shared" : "");
}

// The GPU's grouped join against the CPU engine's; returns the GPU run.
Outcome expect_gpu_matches_cpu(const Case &c, const std::string &what = "") {
  const std::string name = describe(c) + (what.empty() ? "" : " (" + what + ")");
  const Outcome cpu = run(c.problem(KNN_DEVICE_CPU));
  EXPECT_EQ(cpu.status, KNN_OK) << name << ": " << cpu.message;
  const Outcome gpu = run(c.problem(KNN_DEVICE_GPU));
  EXPECT_EQ(gpu.status, KNN_OK) << name << ": " << gpu.message;
  if (cpu.status != KNN_OK || gpu.status != KNN_OK) return gpu;
  EXPECT_EQ(gpu.stats.device, KNN_DEVICE_GPU)
      << name << ": the CPU engine answered (" << gpu.stats.device_name << ")";
  const std::string variant = gpu.stats.variant;
  EXPECT_EQ(variant.rfind("groups: ", 0), 0u) << name << ": not one grouped call: " << variant;
  EXPECT_EQ(gpu.stats.pairs, cpu.stats.pairs) << name;
  int64_t bad = 0;
  for (size_t i = 0; i < cpu.neighbors.size(); i++) {
    if (gpu.neighbors[i] == cpu.neighbors[i] && same_distance(gpu.distances[i], cpu.distances[i]))
      continue;
    if (bad++ < 3)
      ADD_FAILURE() << name << " [" << variant << "]: query " << i / c.k << " slot " << i % c.k
                    << ": gpu (" << gpu.neighbors[i] << ", " << gpu.distances[i] << ") cpu ("
                    << cpu.neighbors[i] << ", " << cpu.distances[i] << ")";
  }
  EXPECT_EQ(bad, 0) << name << " [" << variant << "]: " << bad << " slots differ";
  return gpu;
}

// n group ids drawn from `groups` values spread far apart (negative too).
std::vector<int64_t> random_groups(int64_t n, int64_t groups, std::mt19937_64 &rng,
                                   int64_t offset = 0) {
  std::vector<int64_t> g(static_cast<size_t>(n));
  for (auto &x : g) {
    const int64_t pick = static_cast<int64_t>(rng() % groups) + offset;
    x = pick % 2 == 0 ? pick * 1000003 : -pick;
  }
  return g;
}

void set_keys(Case *c, int64_t query_mod, int64_t target_mod) {
  c->keyed = true;
  c->query_keys.resize(c->queries.n);
  for (int64_t i = 0; i < c->queries.n; i++) c->query_keys[i] = i % query_mod;
  c->target_keys.resize(c->targets.n);
  for (int64_t j = 0; j < c->targets.n; j++) c->target_keys[j] = j % target_mod;
}

// The case without keys (whose GPU run is returned), then with
// self-exclusion keys (17 and 13 distinct values, so duplicate keys too).
Outcome expect_plain_and_keyed(Case c) {
  c.keyed = false;
  const Outcome plain = expect_gpu_matches_cpu(c);
  set_keys(&c, 17, 13);
  expect_gpu_matches_cpu(c, "keyed");
  return plain;
}

// How many groups the statistics say were segmented / ran alone.
int64_t count_in(const std::string &variant, const char *word) {
  const size_t at = variant.find(word);
  return at == std::string::npos ? -1 : std::atoll(variant.c_str() + at + std::strlen(word));
}

const KnnMetric kFloatMetrics[] = {KNN_METRIC_L2, KNN_METRIC_COSINE, KNN_METRIC_IP,
                                   KNN_METRIC_L1};

// Many tiny groups (a few rows each, ties and duplicate rows everywhere),
// every float metric, k below, at and above the group sizes, with and
// without self-exclusion keys: all segmented, in one launch or a few.
TEST(GpuGroups, ManyTinyGroupsEveryMetric) {
  REQUIRE_GPU();
  std::mt19937_64 rng(1);
  for (int dim : {1, 3, 17, 40, 130}) {
    Case c;
    c.queries = make_rows(KNN_ELEMENT_FLOAT32, 3000, dim, rng);
    c.targets = make_rows(KNN_ELEMENT_FLOAT32, 4000, dim, rng);
    c.query_groups = random_groups(c.queries.n, 1000, rng);
    c.target_groups = random_groups(c.targets.n, 1000, rng);
    for (KnnMetric m : kFloatMetrics)
      for (int k : {1, 5, 40}) {
        c.metric = m;
        c.k = k;
        const Outcome gpu = expect_plain_and_keyed(c);
        EXPECT_GT(count_in(gpu.stats.variant, "segmented "), 800) << gpu.stats.variant;
        EXPECT_EQ(count_in(gpu.stats.variant, "alone "), 0) << gpu.stats.variant;
      }
  }
}

// 10000 groups of a query or two: still one grouped call, few launches.
TEST(GpuGroups, TenThousandGroupsInFewLaunches) {
  REQUIRE_GPU();
  std::mt19937_64 rng(2);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 15000, 24, rng, true);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 60000, 24, rng, true);
  c.query_groups = random_groups(c.queries.n, 10000, rng);
  c.target_groups = random_groups(c.targets.n, 10000, rng);
  c.k = 8;
  const Outcome gpu = expect_gpu_matches_cpu(c);
  const int64_t launches = count_in(gpu.stats.variant, " in ");
  EXPECT_GE(launches, 1) << gpu.stats.variant;
  EXPECT_LE(launches, 3) << gpu.stats.variant;
}

// One group far larger than the others runs alone through the ordinary
// methods (TI for L2 and L1, brute force otherwise), the small ones
// segmented, in the same call.
TEST(GpuGroups, OneHugeGroupAmongSmallOnes) {
  REQUIRE_GPU();
  std::mt19937_64 rng(3);
  const int64_t huge = 13000, small = 3000;
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, huge + small, 8, rng, true);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, huge + small, 8, rng, true);
  c.query_groups.assign(c.queries.n, 7);
  c.target_groups.assign(c.targets.n, 7);
  // Small groups interleaved with the huge one's rows.
  for (int64_t i = 0; i < small; i++) {
    c.query_groups[i * 5] = 100 + i % 300;
    c.target_groups[i * 5 + 1] = 100 + i % 300;
  }
  for (KnnMetric m : kFloatMetrics) {
    c.metric = m;
    c.k = 10;
    const Outcome gpu = expect_gpu_matches_cpu(c);
    EXPECT_EQ(count_in(gpu.stats.variant, "alone "), 1) << gpu.stats.variant;
    EXPECT_EQ(count_in(gpu.stats.variant, "segmented "), 300) << gpu.stats.variant;
  }
}

// A group of few queries and many targets: its targets are split into
// ranges (one list each, merged by the rerank), with exact ties across the
// ranges' borders (small integers in 2 dimensions).
TEST(GpuGroups, LongGroupSplitIntoRanges) {
  REQUIRE_GPU();
  std::mt19937_64 rng(4);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 45, 2, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 150000, 2, rng);
  c.query_groups.assign(c.queries.n, 1);
  c.target_groups.assign(c.targets.n, 1);
  c.query_groups[3] = 2;
  c.target_groups[5] = 2;
  for (KnnMetric m : kFloatMetrics)
    for (int k : {1, 10, 100, 128}) {
      c.metric = m;
      c.k = k;
      expect_gpu_matches_cpu(c);
    }
}

// k above the segmented lists (128): every group runs alone; k beyond
// every group's size pads.
TEST(GpuGroups, LargeKRunsGroupsAlone) {
  REQUIRE_GPU();
  std::mt19937_64 rng(5);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 600, 6, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 2000, 6, rng);
  c.query_groups = random_groups(c.queries.n, 8, rng);
  c.target_groups = random_groups(c.targets.n, 8, rng);
  for (KnnMetric m : kFloatMetrics) {
    c.metric = m;
    c.k = 129;
    Outcome gpu = expect_gpu_matches_cpu(c);
    EXPECT_EQ(count_in(gpu.stats.variant, "segmented "), 0) << gpu.stats.variant;
    c.k = 400;  // more than any group holds
    gpu = expect_gpu_matches_cpu(c);
    EXPECT_EQ(std::count(gpu.neighbors.begin(), gpu.neighbors.end(), -1) > 0, true);
  }
}

// Queries whose group has no target get empty slots; targets nobody asks
// for are ignored; no group in common at all gives only empty slots.
TEST(GpuGroups, GroupsWithoutTargetsOrQueries) {
  REQUIRE_GPU();
  std::mt19937_64 rng(6);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 500, 5, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 700, 5, rng);
  c.query_groups = random_groups(c.queries.n, 20, rng, 10);  // ids 10..29
  c.target_groups = random_groups(c.targets.n, 20, rng);     // ids 0..19
  c.k = 6;
  for (KnnMetric m : kFloatMetrics) {
    c.metric = m;
    const Outcome gpu = expect_gpu_matches_cpu(c);
    EXPECT_EQ(std::count(gpu.neighbors.begin(), gpu.neighbors.end(), -1) > 0, true);
  }
  std::fill(c.target_groups.begin(), c.target_groups.end(), -5);
  c.metric = KNN_METRIC_L2;
  const Outcome none = expect_gpu_matches_cpu(c, "no group in common");
  EXPECT_EQ(std::count(none.neighbors.begin(), none.neighbors.end(), -1),
            static_cast<long>(none.neighbors.size()));
  EXPECT_EQ(none.stats.pairs, 0);
}

// halfvec rows: widened once by the job layer, then the same grouped call.
TEST(GpuGroups, HalfvecRows) {
  REQUIRE_GPU();
  std::mt19937_64 rng(7);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT16, 2000, 33, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT16, 5000, 33, rng);
  c.query_groups = random_groups(c.queries.n, 50, rng);
  c.target_groups = random_groups(c.targets.n, 50, rng);
  for (KnnMetric m : kFloatMetrics)
    for (int k : {1, 20}) {
      c.metric = m;
      c.k = k;
      expect_gpu_matches_cpu(c);
    }
}

// Bit rows: every group through the GPU bit join, in the same call.
TEST(GpuGroups, BitRows) {
  REQUIRE_GPU();
  std::mt19937_64 rng(8);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_BIT, 800, 70, rng);
  c.targets = make_rows(KNN_ELEMENT_BIT, 1500, 70, rng);
  c.query_groups = random_groups(c.queries.n, 30, rng);
  c.target_groups = random_groups(c.targets.n, 30, rng);
  for (KnnMetric m : {KNN_METRIC_HAMMING, KNN_METRIC_JACCARD})
    for (int k : {1, 9, 100}) {
      c.metric = m;
      c.k = k;
      const Outcome gpu = expect_plain_and_keyed(c);
      EXPECT_GT(count_in(gpu.stats.variant, "alone "), 0) << gpu.stats.variant;
    }
}

// One table joined with itself within groups, keys = row ids: the pair of
// a row with itself never comes back; duplicate rows tie by row.
TEST(GpuGroups, ExcludeSelfWithDuplicates) {
  REQUIRE_GPU();
  std::mt19937_64 rng(9);
  Case c;
  c.shared = true;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 6000, 12, rng);
  for (int64_t i = 0; i < c.queries.n; i += 3)  // every third row repeats an earlier one
    std::memcpy(c.queries.f32.data() + i * 12, c.queries.f32.data() + (rng() % (i + 1)) * 12,
                12 * sizeof(float));
  c.query_groups = random_groups(c.queries.n, 40, rng);
  c.keyed = true;
  c.query_keys.resize(c.queries.n);
  for (int64_t i = 0; i < c.queries.n; i++) c.query_keys[i] = 1000 + i;
  for (KnnMetric m : kFloatMetrics)
    for (int k : {1, 7, 64}) {
      c.metric = m;
      c.k = k;
      expect_gpu_matches_cpu(c);
    }
}

// A small memory budget: several batches, and groups that do not fit a
// batch run alone in chunks.
TEST(GpuGroups, SmallBudgetSplitsBatches) {
  REQUIRE_GPU();
  std::mt19937_64 rng(10);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 6000, 130, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 8000, 130, rng);
  c.query_groups = random_groups(c.queries.n, 60, rng);
  c.target_groups = random_groups(c.targets.n, 60, rng);
  // One group too large for a batch (2000 x 4000 rows), and one of one pair.
  for (int64_t j = 0; j < 4000; j++) c.target_groups[j * 2] = 7;
  for (int64_t i = 0; i < 2000; i++) c.query_groups[i * 3] = 7;
  c.query_groups[1] = c.target_groups[1] = 424242;
  c.gpu_memory_limit = int64_t(6) << 20;
  for (KnnMetric m : {KNN_METRIC_L2, KNN_METRIC_COSINE})
    for (int k : {3, 30}) {
      c.metric = m;
      c.k = k;
      expect_gpu_matches_cpu(c, "6 MiB budget");
    }
}

// Under AUTO a warm GPU takes the grouped join, with the CPU's answer.
// (A tiny memory budget is no way to make it fail: the grouped join then
// runs its groups alone through paths that chunk to any budget.)
TEST(GpuGroups, AutoUsesTheWarmGpu) {
  REQUIRE_GPU();
  std::mt19937_64 rng(12);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 3000, 16, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 9000, 16, rng);
  c.query_groups = random_groups(c.queries.n, 30, rng);
  c.target_groups = random_groups(c.targets.n, 30, rng);
  c.k = 5;
  const Outcome cpu = run(c.problem(KNN_DEVICE_CPU));
  ASSERT_EQ(cpu.status, KNN_OK) << cpu.message;
  (void)run(c.problem(KNN_DEVICE_GPU));  // the runtime exists from here on
  const Outcome warm = run(c.problem(KNN_DEVICE_AUTO));
  ASSERT_EQ(warm.status, KNN_OK) << warm.message;
  EXPECT_EQ(warm.stats.device, KNN_DEVICE_GPU) << warm.stats.device_name;
  EXPECT_EQ(std::string(warm.stats.variant).rfind("groups: ", 0), 0u) << warm.stats.variant;
  EXPECT_EQ(warm.neighbors, cpu.neighbors);
  EXPECT_EQ(warm.distances, cpu.distances);
}

// The module checks the layout it is handed: offsets from 0, within the
// rows, rows in range and ascending in a group.
TEST(GpuGroups, ModuleRejectsABadLayout) {
  REQUIRE_GPU();
  void *module = dlopen("./knn_gpu_cuda.so", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(module, nullptr) << dlerror();
  const auto entry =
      reinterpret_cast<knn_cuda_run_groups_fn>(dlsym(module, KNN_CUDA_RUN_GROUPS_SYMBOL));
  ASSERT_NE(entry, nullptr) << "no " << KNN_CUDA_RUN_GROUPS_SYMBOL;
  std::mt19937_64 rng(13);
  Case c;
  c.queries = make_rows(KNN_ELEMENT_FLOAT32, 4, 3, rng);
  c.targets = make_rows(KNN_ELEMENT_FLOAT32, 4, 3, rng);
  c.query_groups.assign(4, 0);
  c.target_groups.assign(4, 0);
  c.k = 2;
  const KnnProblem p = c.problem(KNN_DEVICE_GPU);
  std::vector<int64_t> nb(8);
  std::vector<double> d(8);
  struct Bad {
    std::vector<int64_t> q_rows, q_begin, t_rows, t_begin;
    const char *why;
  };
  const Bad bad[] = {
      {{0, 1, 2, 3}, {1, 4}, {0, 1, 2, 3}, {0, 4}, "offsets must start at 0"},
      {{0, 1, 2, 3}, {0, 5}, {0, 1, 2, 3}, {0, 4}, "bad offsets"},
      {{0, 1, 2, 3}, {0, 4}, {0, 1, 2, 4}, {0, 4}, "row out of range"},
      {{0, 1, 2, 3}, {0, 4}, {0, -1, 2, 3}, {0, 4}, "row out of range"},
      {{0, 2, 1, 3}, {0, 4}, {0, 1, 2, 3}, {0, 4}, "not ascending"},
      {{0, 1, 1, 3}, {0, 4}, {0, 1, 2, 3}, {0, 4}, "not ascending"},
  };
  for (const Bad &b : bad) {
    const KnnGroupLayout layout{1, b.q_rows.data(), b.q_begin.data(), b.t_rows.data(),
                                b.t_begin.data()};
    char err[256] = "";
    KnnStats stats{};
    EXPECT_EQ(entry(&p, &layout, nb.data(), d.data(), &stats, nullptr, err, sizeof err),
              KNN_INVALID_ARGUMENT)
        << b.why;
    EXPECT_NE(std::string(err).find(b.why), std::string::npos) << err;
  }
  const std::vector<int64_t> rows = {0, 1, 2, 3}, begin = {0, 4};
  const KnnGroupLayout good{1, rows.data(), begin.data(), rows.data(), begin.data()};
  char err[256] = "";
  KnnStats stats{};
  EXPECT_EQ(entry(&p, &good, nb.data(), d.data(), &stats, nullptr, err, sizeof err), KNN_OK)
      << err;
  EXPECT_EQ(entry(&p, nullptr, nb.data(), d.data(), &stats, nullptr, err, sizeof err),
            KNN_INVALID_ARGUMENT);
}

// A cancel stops a long grouped join between launches.
TEST(GpuGroups, CancelStopsSoon) {
  REQUIRE_GPU();
  const int64_t nq = 100000, nt = 400000;
  const int dim = 128;
  Rows q, t;
  for (Rows *r : {&q, &t}) {
    r->element = KNN_ELEMENT_FLOAT32;
    r->dim = dim;
  }
  q.n = nq;
  t.n = nt;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  q.f32.resize(nq * dim);
  t.f32.resize(nt * dim);
  for (float &v : q.f32) v = u(rng);
  for (float &v : t.f32) v = u(rng);
  Case c;
  c.queries = std::move(q);
  c.targets = std::move(t);
  c.query_groups.resize(nq);
  c.target_groups.resize(nt);
  for (int64_t i = 0; i < nq; i++) c.query_groups[i] = i % 20;  // 5000 x 20000 a group
  for (int64_t j = 0; j < nt; j++) c.target_groups[j] = j % 20;
  c.k = 100;
  c.metric = KNN_METRIC_COSINE;
  const KnnProblem p = c.problem(KNN_DEVICE_GPU);
  std::vector<int64_t> nb(static_cast<size_t>(nq) * c.k);
  std::vector<double> ds(nb.size());
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, nb.data(), ds.data(), err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto at = std::chrono::steady_clock::now();
  knn_job_cancel(job);
  KnnStats stats{};
  const KnnStatus st = knn_job_finish(job, &stats, err, sizeof err);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
  std::printf("[ timing   ] grouped join cancelled: %s after %.3f s\n",
              st == KNN_CANCELLED ? "stopped" : "finished", waited);
  if (st == KNN_OK) GTEST_SKIP() << "finished before the cancel (" << stats.seconds_total << " s)";
  EXPECT_EQ(st, KNN_CANCELLED) << err;
  EXPECT_LT(waited, 0.2);
}

}  // namespace
