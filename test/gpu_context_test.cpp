// gpu_context_test.cpp -- the bound on GPU contexts (knn_gpu.max_gpu_contexts,
// knn_engine_set_gpu_contexts): with one permit, held by another process,
// an AUTO join runs on the CPU engine and says why, and a GPU join waits
// (cancellably) until the permit comes free; a process that holds a
// runtime holds the permit, and gives it back when the module releases the
// runtime (explicitly or by the idle timer).
//
// Its own binary: the process must not have a GPU runtime when it starts.
// Run from the repository root (where knn_gpu_cuda.so is built). Without a
// usable GPU the tests are skipped with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_cold_start.h"
#include "gpu_context_permit.h"
#include "job_run.h"
#include "knn_cuda_module.h"
#include "knn_engine.h"
#include "loaded_module.h"
#include "permit_holder.h"

namespace {

using Clock = std::chrono::steady_clock;
using job_run::JobResult;
using knn::GpuContextPermit;
using permit_test::PermitDir;
using permit_test::PermitHolder;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

PermitDir &permit_dir() {
  static PermitDir dir;
  return dir;
}

using gpu_test::loaded_module;

bool runtime_ready() {
  const gpu_test::Module m = loaded_module();
  return m.ready != nullptr && m.ready() != 0;
}

// Whether the process's permit is free: one look with a permit of our own
// (flock conflicts between two descriptors of one process too).
bool permit_free() {
  GpuContextPermit probe;
  return probe.try_take(permit_dir().path.c_str(), 1, nullptr, 0) ==
         GpuContextPermit::Outcome::kTaken;
}

class GpuContexts : public ::testing::Test {
 protected:
  void SetUp() override {
    knn_engine_set_module_dir(".");
    ASSERT_FALSE(permit_dir().path.empty());
    knn_engine_set_gpu_contexts(permit_dir().path.c_str(), 1);
    knn_engine_set_gpu_idle_release(0);
    char why[512] = "";
    if (knn_engine_describe(why, sizeof why) != 1)
      GTEST_SKIP() << "no GPU is available (" << why << ")";
    const gpu_test::Module m = loaded_module();
    ASSERT_NE(m.ready, nullptr);
    ASSERT_NE(m.release, nullptr);
  }
};

KnnProblem float_problem(const std::vector<float> &rows, int dim, int k, KnnDevice device) {
  KnnProblem p{};
  p.element = KNN_ELEMENT_FLOAT32;
  p.queries = p.targets = rows.data();
  p.n_queries = p.n_targets = static_cast<int64_t>(rows.size()) / dim;
  p.dim = dim;
  p.k = k;
  p.metric = KNN_METRIC_L2;
  p.device = device;
  return p;
}

std::vector<float> random_rows(int64_t n, int dim) {
  std::vector<float> v(static_cast<size_t>(n) * dim);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (float &x : v) x = u(rng);
  return v;
}

// Rows of a self-join that AUTO would run on a cold GPU (the CPU is not
// predicted to answer before the runtime's creation), so that what keeps
// it off the GPU is the permit alone.
std::vector<float> rows_for_a_cold_gpu(int dim) {
  for (int64_t n = 4000;; n *= 2) {
    std::vector<float> rows = random_rows(n, dim);
    if (!knn::cpu_answers_before_cold_gpu(float_problem(rows, dim, 10, KNN_DEVICE_AUTO)) ||
        n >= 256000)
      return rows;
  }
}

// ---- the tests run in this order: the first needs a process without a runtime ----

TEST_F(GpuContexts, AutoJoinRunsOnTheCpuWhenNoPermitIsFree) {
  ASSERT_FALSE(runtime_ready()) << "the process must start without a GPU runtime";
  PermitHolder holder;
  ASSERT_TRUE(holder.start(permit_dir().path, 1));
  const int dim = 128;
  const std::vector<float> rows = rows_for_a_cold_gpu(dim);
  const KnnProblem auto_p = float_problem(rows, dim, 10, KNN_DEVICE_AUTO);
  ASSERT_FALSE(knn::cpu_answers_before_cold_gpu(auto_p));
  const JobResult cpu = job_run::run_job(float_problem(rows, dim, 10, KNN_DEVICE_CPU));
  ASSERT_EQ(cpu.status, KNN_OK) << cpu.message;
  const JobResult a = job_run::run_job(auto_p);
  ASSERT_EQ(a.status, KNN_OK) << a.message;
  EXPECT_EQ(a.stats.device, KNN_DEVICE_CPU);
  EXPECT_NE(std::strstr(a.stats.device_name, "[no GPU context free: CPU engine]"), nullptr)
      << a.stats.device_name;
  EXPECT_TRUE(a.message.empty()) << "AUTO sends no notice: " << a.message;
  job_run::expect_identical(a, cpu, "AUTO without a permit vs CPU engine");
  std::printf("[ info     ] %lld x %d: AUTO without a permit %.3f s on %s\n",
              static_cast<long long>(auto_p.n_queries), dim, a.seconds, a.stats.device_name);
  // No runtime was created, and no warm-up either.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(runtime_ready());
}

TEST_F(GpuContexts, GpuJoinWaitsForAPermitAndIsCancellable) {
  ASSERT_FALSE(runtime_ready());
  PermitHolder holder;
  ASSERT_TRUE(holder.start(permit_dir().path, 1));
  const std::vector<float> rows = random_rows(2000, 32);
  const KnnProblem p = float_problem(rows, 32, 5, KNN_DEVICE_GPU);
  std::vector<int64_t> neighbors(static_cast<size_t>(p.n_queries) * p.k);
  std::vector<double> distances(neighbors.size());
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, neighbors.data(), distances.data(), err, sizeof err);
  ASSERT_NE(job, nullptr) << err;
  EXPECT_EQ(knn_job_wait(job, 400), 0) << "the join must wait while the permit is held";
  const Clock::time_point cancelled = Clock::now();
  knn_job_cancel(job);
  while (knn_job_wait(job, 5) == 0) {
  }
  const double stop_seconds = seconds_since(cancelled);
  KnnStats stats{};
  const KnnStatus st = knn_job_finish(job, &stats, err, sizeof err);
  EXPECT_EQ(st, KNN_CANCELLED) << err;
  EXPECT_NE(std::strstr(err, "GPU context permit"), nullptr) << err;
  EXPECT_LT(stop_seconds, 0.2) << "a cancel must end the wait within a fraction of a second";
  EXPECT_FALSE(runtime_ready());
  std::printf("[ timing   ] cancel ended the wait after %.3f s\n", stop_seconds);
}

TEST_F(GpuContexts, GpuJoinRunsOnceThePermitComesFreeAndHoldsIt) {
  ASSERT_FALSE(runtime_ready());
  PermitHolder holder;
  ASSERT_TRUE(holder.start(permit_dir().path, 1));
  const std::vector<float> rows = random_rows(2000, 32);
  const KnnProblem p = float_problem(rows, 32, 5, KNN_DEVICE_GPU);
  const JobResult cpu = job_run::run_job(float_problem(rows, 32, 5, KNN_DEVICE_CPU));
  ASSERT_EQ(cpu.status, KNN_OK) << cpu.message;
  JobResult r;
  std::thread runner([&] { r = job_run::run_job(p); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  holder.let_go();  // the other process exits: its permit comes free
  runner.join();
  ASSERT_EQ(r.status, KNN_OK) << r.message;
  EXPECT_EQ(r.stats.device, KNN_DEVICE_GPU) << r.stats.device_name;
  job_run::expect_identical(r, cpu, "GPU join after the wait vs CPU engine");
  EXPECT_GE(r.stats.seconds_queued, 0.25) << "the wait counts as queued time";
  EXPECT_LT(r.stats.seconds_queued, r.seconds);
  std::printf("[ timing   ] queued %.3f s for the permit, %.3f s in all\n",
              r.stats.seconds_queued, r.seconds);
  // The process holds a runtime and the permit; another join needs no new one.
  EXPECT_TRUE(runtime_ready());
  EXPECT_FALSE(permit_free());
  const JobResult again = job_run::run_job(p);
  ASSERT_EQ(again.status, KNN_OK) << again.message;
  EXPECT_EQ(again.stats.device, KNN_DEVICE_GPU) << again.stats.device_name;
  EXPECT_EQ(again.stats.seconds_queued, 0.0);
  // Releasing the runtime gives the permit back.
  char err[512] = "";
  ASSERT_EQ(loaded_module().release(err, sizeof err), KNN_OK) << err;
  EXPECT_FALSE(runtime_ready());
  EXPECT_TRUE(permit_free());
}

TEST_F(GpuContexts, IdleReleaseGivesThePermitBack) {
  ASSERT_TRUE(permit_free());
  knn_engine_set_gpu_idle_release(200);
  const std::vector<float> rows = random_rows(2000, 32);
  const JobResult r = job_run::run_job(float_problem(rows, 32, 5, KNN_DEVICE_GPU));
  ASSERT_EQ(r.status, KNN_OK) << r.message;
  EXPECT_EQ(r.stats.device, KNN_DEVICE_GPU) << r.stats.device_name;
  EXPECT_FALSE(permit_free());
  const Clock::time_point start = Clock::now();
  while (!permit_free() && seconds_since(start) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(permit_free()) << "the idle release must give the permit back";
  EXPECT_FALSE(runtime_ready());
  std::printf("[ timing   ] permit back %.3f s after the join (idle release 0.2 s)\n",
              seconds_since(start));
  knn_engine_set_gpu_idle_release(0);
}

}  // namespace

// The GPU service's setting (knn_cuda_set_concurrent_joins): joins of one
// process that have budgets of their own run side by side, each on a
// runtime replica of its own under the one context; every answer must be
// the join's answer alone, bit for bit.
TEST_F(GpuContexts, ConcurrentJoinsOnReplicasAnswerAsAlone) {
  void *h = dlopen("./knn_gpu_cuda.so", RTLD_NOW);
  ASSERT_NE(h, nullptr) << dlerror();
  const auto set_concurrent = reinterpret_cast<knn_cuda_set_concurrent_joins_fn>(
      dlsym(h, KNN_CUDA_SET_CONCURRENT_JOINS_SYMBOL));
  const auto run = reinterpret_cast<knn_cuda_run_fn>(dlsym(h, KNN_CUDA_RUN_SYMBOL));
  ASSERT_NE(set_concurrent, nullptr);
  ASSERT_NE(run, nullptr);
  constexpr int kJobs = 4, kRounds = 3, kDim = 48, kK = 10;
  struct Job {
    std::vector<float> rows;
    KnnProblem p;
    std::vector<int64_t> ids;
    std::vector<double> dist;
  };
  std::vector<Job> jobs(kJobs);
  for (int j = 0; j < kJobs; j++) {
    jobs[j].rows = random_rows(6000 + 3000 * j, kDim);
    jobs[j].p = float_problem(jobs[j].rows, kDim, kK, KNN_DEVICE_GPU);
    jobs[j].p.method = j % 2 == 0 ? KNN_METHOD_BRUTE : KNN_METHOD_TI;
    jobs[j].p.gpu_memory_limit = int64_t{256} << 20;
    const size_t slots = static_cast<size_t>(jobs[j].p.n_queries) * kK;
    jobs[j].ids.resize(slots);
    jobs[j].dist.resize(slots);
  }
  const int32_t no_cancel = 0;
  set_concurrent(1);
  for (Job &job : jobs) {
    char error[512] = "";
    KnnStats stats{};
    ASSERT_EQ(run(&job.p, job.ids.data(), job.dist.data(), &stats, &no_cancel, error,
                  sizeof error),
              KNN_OK)
        << error;
  }
  set_concurrent(kJobs);
  std::vector<std::string> failures(kJobs);
  std::vector<std::thread> threads;
  for (int j = 0; j < kJobs; j++)
    threads.emplace_back([&, j] {
      const Job &job = jobs[j];
      std::vector<int64_t> ids(job.ids.size());
      std::vector<double> dist(job.dist.size());
      for (int round = 0; round < kRounds && failures[j].empty(); round++) {
        char error[512] = "";
        KnnStats stats{};
        const KnnStatus st =
            run(&job.p, ids.data(), dist.data(), &stats, &no_cancel, error, sizeof error);
        if (st != KNN_OK)
          failures[j] = std::string("status ") + std::to_string(st) + ": " + error;
        else if (ids != job.ids ||
                 std::memcmp(dist.data(), job.dist.data(), dist.size() * sizeof(double)) != 0)
          failures[j] = "round " + std::to_string(round) + " differs from the join alone";
      }
    });
  for (std::thread &t : threads) t.join();
  set_concurrent(1);
  for (int j = 0; j < kJobs; j++) EXPECT_TRUE(failures[j].empty()) << "job " << j << ": " << failures[j];
  dlclose(h);
}
