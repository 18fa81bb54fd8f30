// gpu_first_use_test.cpp -- a process's GPU runtime: its first join under
// AUTO (no slower than the CPU engine: the CPU answers while the runtime is
// created in the background), the runtime's release (explicit, and by the
// idle timer) giving GPU memory back, and bit rows on the GPU.
//
// Its own binary, because the first test must see a process that has not
// touched the GPU yet (gtest runs the tests of a file in order). Run with
// `make gputest` from the repository root (where knn_gpu_cuda.so is built).
// Without a usable GPU the GPU parts are skipped with the reason.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "job_run.h"
#include "knn_cuda_module.h"
#include "knn_engine.h"
#include "knn_vocabulary.h"
#include "loaded_module.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- running a join through the job API (job_run.h) ----

using Result = job_run::JobResult;
using job_run::expect_identical;

Result run(const KnnProblem &p) { return job_run::run_job(p); }

KnnProblem float_problem(const std::vector<float> &rows, int dim, int k, KnnDevice device) {
  KnnProblem p{};
  p.element = KNN_ELEMENT_FLOAT32;
  p.queries = rows.data();
  p.targets = rows.data();
  p.n_queries = p.n_targets = static_cast<int64_t>(rows.size()) / dim;
  p.dim = dim;
  p.k = k;
  p.metric = KNN_METRIC_L2;
  p.method = KNN_METHOD_AUTO;
  p.device = device;
  return p;
}

// An image-like set: 10000 x 784 values in [0, 1) (the case).
const std::vector<float> &image_rows() {
  static const std::vector<float> rows = [] {
    std::vector<float> v(size_t{10000} * 784);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (float &x : v) x = u(rng);
    return v;
  }();
  return rows;
}

// ---- the module, as the job layer loaded it ----

using gpu_test::Module;
using gpu_test::loaded_module;

bool gpu_available(std::string *why) {
  char buf[512] = "";
  const int usable = knn_engine_describe(buf, sizeof buf);
  *why = buf;
  return usable == 1;
}

#define REQUIRE_GPU()                                         \
  do {                                                        \
    std::string why_;                                         \
    if (!gpu_available(&why_))                                \
      GTEST_SKIP() << "no GPU is available (" << why_ << ")"; \
  } while (0)

// Waits until the runtime's readiness is `want`; the seconds it took, or
// -1 on timeout.
double wait_ready(const Module &m, bool want, double timeout) {
  const Clock::time_point start = Clock::now();
  while (seconds_since(start) < timeout) {
    if ((m.ready() != 0) == want) return seconds_since(start);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return -1;
}

// ---- GPU memory as nvidia-smi sees it (NVML, from the driver) ----
//
// A process that has released its context cannot ask cudaMemGetInfo (that
// would create a context again), so the device's used memory comes from
// NVML, declared here (the toolkit may lack nvml.h).

struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlProcess {  // nvmlProcessInfo_t of NVML's _v3 entry
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
};

class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
    count_ = reinterpret_cast<int (*)(unsigned *)>(dlsym(lib_, "nvmlDeviceGetCount_v2"));
    handle_ = reinterpret_cast<int (*)(unsigned, void **)>(
        dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
    memory_ = reinterpret_cast<int (*)(void *, NvmlMemory *)>(
        dlsym(lib_, "nvmlDeviceGetMemoryInfo"));
    processes_ = reinterpret_cast<int (*)(void *, unsigned *, NvmlProcess *)>(
        dlsym(lib_, "nvmlDeviceGetComputeRunningProcesses_v3"));
    ok_ = init != nullptr && count_ != nullptr && handle_ != nullptr && memory_ != nullptr &&
          init() == 0;
  }
  bool ok() const { return ok_; }

  // Used memory summed over the devices (a test host runs nothing else).
  long long device_used_bytes() const {
    unsigned n = 0;
    if (!ok_ || count_(&n) != 0) return -1;
    long long used = 0;
    for (unsigned i = 0; i < n; i++) {
      void *dev = nullptr;
      NvmlMemory mem{};
      if (handle_(i, &dev) != 0 || memory_(dev, &mem) != 0) return -1;
      used += static_cast<long long>(mem.used);
    }
    return used;
  }

  // This process's memory as nvidia-smi lists it; -1 where NVML does not
  // list it (e.g. another pid namespace), 0 when it holds none.
  long long process_used_bytes() const {
    unsigned n = 0;
    if (!ok_ || processes_ == nullptr || count_(&n) != 0) return -1;
    long long used = 0;
    bool seen_any = false;
    for (unsigned i = 0; i < n; i++) {
      void *dev = nullptr;
      if (handle_(i, &dev) != 0) return -1;
      NvmlProcess list[64];
      unsigned count = 64;
      if (processes_(dev, &count, list) != 0) return -1;
      for (unsigned j = 0; j < count; j++) {
        seen_any = true;
        if (list[j].pid == static_cast<unsigned>(getpid()))
          used += static_cast<long long>(list[j].used_gpu_memory);
      }
    }
    return used > 0 || !seen_any ? used : -1;
  }

 private:
  void *lib_ = nullptr;
  bool ok_ = false;
  int (*count_)(unsigned *) = nullptr;
  int (*handle_)(unsigned, void **) = nullptr;
  int (*memory_)(void *, NvmlMemory *) = nullptr;
  int (*processes_)(void *, unsigned *, NvmlProcess *) = nullptr;
};

double mib(long long bytes) { return static_cast<double>(bytes) / 1048576.0; }

// ---- 1. the first join of a process ----

// Must stay the first test of this file: the process has not loaded the GPU
// module yet, as a new PostgreSQL backend.
TEST(FirstUse, FirstAutoJoinIsNoSlowerThanCpu) {
  knn_engine_set_module_dir(".");
  ASSERT_EQ(loaded_module().ready, nullptr) << "the module must not be loaded before this test";
  const std::vector<float> &rows = image_rows();
  // The CPU engine alone (this also runs its one-time calibration, which
  // a new backend's first join pays either way).
  const Result cpu = run(float_problem(rows, 784, 10, KNN_DEVICE_CPU));
  ASSERT_EQ(cpu.status, KNN_OK) << cpu.message;
  const Result cpu2 = run(float_problem(rows, 784, 10, KNN_DEVICE_CPU));
  const double cpu_seconds = std::min(cpu.seconds, cpu2.seconds);

  const Result first = run(float_problem(rows, 784, 10, KNN_DEVICE_AUTO));
  ASSERT_EQ(first.status, KNN_OK) << first.message;
  expect_identical(first, cpu, "first AUTO join vs CPU engine");
  std::printf("[ timing   ] 10000 x 784 k=10: CPU engine %.3f s; first AUTO join %.3f s on %s (%s)\n",
              cpu_seconds, first.seconds, knn_device_name(first.stats.device),
              first.stats.device_name);
  EXPECT_TRUE(first.message.empty()) << "AUTO must not send a notice: " << first.message;

  REQUIRE_GPU();
  // The target (on a GPU host): no slower than the CPU engine (10 % and
  // 20 ms for noise).
  EXPECT_LE(first.seconds, cpu_seconds * 1.1 + 0.02);
  const Module m = loaded_module();
  ASSERT_NE(m.ready, nullptr);
  if (first.stats.device == KNN_DEVICE_CPU) {
    // The CPU answered while the runtime was created in the background;
    // the statistics say so.
    EXPECT_NE(std::strstr(first.stats.device_name, "[GPU not ready, CPU answers sooner]"),
              nullptr)
        << first.stats.device_name;
    const double waited = wait_ready(m, true, 30);
    ASSERT_GE(waited, 0) << "the runtime was not created in the background";
    std::printf("[ timing   ] the background warm-up ended %.3f s after the first join\n", waited);
  }
  ASSERT_NE(m.ready(), 0);

  // A later join finds the runtime ready and runs on the GPU.
  const Result warm = run(float_problem(rows, 784, 10, KNN_DEVICE_AUTO));
  ASSERT_EQ(warm.status, KNN_OK) << warm.message;
  EXPECT_EQ(warm.stats.device, KNN_DEVICE_GPU) << warm.stats.device_name;
  expect_identical(warm, cpu, "warm AUTO join vs CPU engine");
  std::printf("[ timing   ] second AUTO join %.3f s on %s\n", warm.seconds, warm.stats.device_name);
}

// ---- 2. giving the runtime back ----

TEST(IdleRelease, ReleaseGivesBackGpuMemoryAndTheNextJoinRecreatesIt) {
  REQUIRE_GPU();
  const std::vector<float> &rows = image_rows();
  const Result cpu = run(float_problem(rows, 784, 10, KNN_DEVICE_CPU));
  ASSERT_EQ(cpu.status, KNN_OK) << cpu.message;
  const Result gpu = run(float_problem(rows, 784, 10, KNN_DEVICE_GPU));
  ASSERT_EQ(gpu.status, KNN_OK) << gpu.message;
  ASSERT_EQ(gpu.stats.device, KNN_DEVICE_GPU);
  const Module m = loaded_module();
  ASSERT_NE(m.release, nullptr);
  ASSERT_NE(m.ready(), 0);

  Nvml nvml;
  const long long device_before = nvml.device_used_bytes();
  const long long process_before = nvml.process_used_bytes();
  char err[512] = "";
  ASSERT_EQ(m.release(err, sizeof err), KNN_OK) << err;
  EXPECT_EQ(m.ready(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // NVML's view settles
  const long long device_after = nvml.device_used_bytes();
  const long long process_after = nvml.process_used_bytes();
  std::printf("[ memory   ] device used: %.0f MiB before release, %.0f MiB after; "
              "this process (nvidia-smi): %.0f MiB before, %.0f MiB after (-1: not listed)\n",
              mib(device_before), mib(device_after), mib(process_before), mib(process_after));
  if (!nvml.ok()) {
    std::printf("[ memory   ] NVML (libnvidia-ml.so.1) not usable: memory not checked\n");
  } else {
    // The context alone is some hundreds of MiB.
    EXPECT_GE(device_before - device_after, 100LL << 20) << "release gave back too little";
    if (process_after >= 0) {
      EXPECT_EQ(process_after, 0) << "the process still holds GPU memory";
    }
  }

  // Creating the runtime again (the module is loaded, the driver started):
  // the context's share of a new backend's first-join cost.
  const Clock::time_point t = Clock::now();
  ASSERT_EQ(m.warm_up(err, sizeof err), KNN_OK) << err;
  std::printf("[ timing   ] runtime re-created in %.3f s (knn_cuda_warm_up)\n", seconds_since(t));
  ASSERT_EQ(m.release(err, sizeof err), KNN_OK) << err;

  // A join after a release creates the runtime itself and is exact.
  const Result again = run(float_problem(rows, 784, 10, KNN_DEVICE_GPU));
  ASSERT_EQ(again.status, KNN_OK) << again.message;
  EXPECT_EQ(again.stats.device, KNN_DEVICE_GPU);
  expect_identical(again, cpu, "GPU join after a release vs CPU engine");
  std::printf("[ timing   ] GPU join after a release (context created inline): %.3f s\n",
              again.seconds);
}

TEST(IdleRelease, ReleaseWaitsForARunningJoin) {
  REQUIRE_GPU();
  const std::vector<float> &rows = image_rows();
  const Result cpu = run(float_problem(rows, 784, 10, KNN_DEVICE_CPU));
  const Module m = loaded_module();
  KnnProblem p = float_problem(rows, 784, 10, KNN_DEVICE_GPU);
  std::vector<int64_t> nb(static_cast<size_t>(p.n_queries * p.k));
  std::vector<double> ds(nb.size());
  char err[512] = "";
  for (int round = 0; round < 5; round++) {
    KnnJob *job = knn_job_start(&p, nb.data(), ds.data(), err, sizeof err);
    ASSERT_NE(job, nullptr) << err;
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 3));
    char rerr[512] = "";
    EXPECT_EQ(m.release(rerr, sizeof rerr), KNN_OK) << rerr;
    KnnStats stats{};
    ASSERT_EQ(knn_job_finish(job, &stats, err, sizeof err), KNN_OK) << err;
    EXPECT_EQ(stats.device, KNN_DEVICE_GPU);
    Result r;
    r.neighbors = nb;
    r.distances = ds;
    expect_identical(r, cpu, "GPU join with a concurrent release vs CPU engine");
  }
}

TEST(IdleRelease, IdleTimerReleasesAfterTheSetting) {
  REQUIRE_GPU();
  const std::vector<float> &rows = image_rows();
  const Module m = loaded_module();
  knn_engine_set_gpu_idle_release(300);
  const Result gpu = run(float_problem(rows, 784, 10, KNN_DEVICE_GPU));  // hands the setting over
  ASSERT_EQ(gpu.status, KNN_OK) << gpu.message;
  const Clock::time_point end = Clock::now();
  ASSERT_NE(m.ready(), 0);
  const double released = wait_ready(m, false, 5);
  const double idle = seconds_since(end) - 0.002;
  knn_engine_set_gpu_idle_release(0);
  const Result keep = run(float_problem(rows, 784, 10, KNN_DEVICE_GPU));  // back to "never"
  ASSERT_EQ(keep.status, KNN_OK) << keep.message;
  ASSERT_GE(released, 0) << "the idle timer did not release the runtime within 5 s";
  std::printf("[ timing   ] idle release 300 ms: released after %.3f s idle\n", idle);
  EXPECT_GE(idle, 0.29);
  EXPECT_LE(idle, 1.5);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_NE(m.ready(), 0) << "with 0 the runtime must be kept";
}

}  // namespace
