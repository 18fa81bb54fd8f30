// knn_job.cpp -- a join running on an engine-owned thread.
//
// The backend thread starts a job, polls it (so that it can notice cancel and
// statement_timeout), and finishes it. The job thread picks the engine: the
// GPU module when one is usable (loaded once with dlopen, so knn_gpu.so never
// links CUDA and loads on hosts without a driver), else the CPU engine.
//
// Every extern "C" entry runs its body through knn::guarded (entry_guard.h),
// and the job thread starts with all signals blocked (signal_free_thread.h), so
// neither a C++ exception nor a PostgreSQL signal handler crosses the wall.

#include <dlfcn.h>
#include <limits.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/bit_join.h"
#include "cpu/cpu_engine.h"
#include "half_float.h"
#include "problem_check.h"
#include "signal_free_thread.h"
#include "entry_guard.h"
#include "knn_cuda_module.h"
#include "knn_engine.h"

namespace {

constexpr size_t kMessageBytes = 512;

// ---- the GPU module, loaded once per process ----

// Fixed buffers only: nothing here allocates, so loading cannot throw.
struct GpuModule {
  std::mutex mutex;              // guards everything below
  char dir[PATH_MAX] = "";       // knn_engine_set_module_dir; "" = the cwd
  bool loaded = false;
  bool usable = false;           // module loaded and a GPU answered
  char description[384] = "";    // device line, or why there is none
  knn_cuda_run_fn run = nullptr;
};

GpuModule gpu_module;

// Called once, under gpu_module.mutex. Signals stay blocked meanwhile so
// that the threads the CUDA driver starts inherit a blocked mask even when
// a backend thread loads the module (knn_engine_describe).
void load_gpu_module(GpuModule &m) noexcept {
  const knn::SignalsBlocked blocked;
  char path[PATH_MAX + 32];
  std::snprintf(path, sizeof path, "%s/knn_gpu_cuda.so", m.dir[0] != '\0' ? m.dir : ".");
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *why = dlerror();
    std::snprintf(m.description, sizeof m.description, "GPU module not loaded: %.350s",
                  why != nullptr ? why : path);
    return;
  }
  auto probe = reinterpret_cast<knn_cuda_probe_fn>(dlsym(handle, KNN_CUDA_PROBE_SYMBOL));
  auto run = reinterpret_cast<knn_cuda_run_fn>(dlsym(handle, KNN_CUDA_RUN_SYMBOL));
  if (probe == nullptr || run == nullptr) {
    std::snprintf(m.description, sizeof m.description, "GPU module %.300s lacks its entry points",
                  path);
    return;  // keep the handle: unloading CUDA libraries is not worth the risk
  }
  m.usable = probe(m.description, sizeof m.description) != 0;
  m.run = run;
}

// float16 rows widened to float32 for the float engines: exact (every
// binary16 is a float), so a halfvec join is the vector join of the same
// values, as pgvector's halfvec operators compute it. Returns false when
// cancelled on the way.
bool widen_rows(const void *rows, int64_t n, int32_t dim, const int32_t *cancel,
                std::vector<float> *out) {
  const auto *h = static_cast<const uint16_t *>(rows);
  const int64_t count = n * dim;
  out->resize(static_cast<size_t>(count));
  constexpr int64_t kSlice = int64_t{1} << 20;  // elements between looks at cancel
  for (int64_t first = 0; first < count; first += kSlice) {
    if (__atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) return false;
    const int64_t end = std::min(count, first + kSlice);
    for (int64_t i = first; i < end; i++) (*out)[i] = knn_half_to_float(h[i]);
  }
  return true;
}

// After loading, usable, description and run never change again, so the
// callers read them without the lock.
const GpuModule &gpu() {
  std::lock_guard<std::mutex> lock(gpu_module.mutex);
  if (!gpu_module.loaded) {
    load_gpu_module(gpu_module);
    gpu_module.loaded = true;
  }
  return gpu_module;
}

}  // namespace

struct KnnJob {
  KnnProblem problem;
  int64_t *neighbors = nullptr;
  double *distances = nullptr;
  int32_t cancel = 0;  // written with __atomic_store_n, read by the engines

  std::mutex mutex;
  std::condition_variable finished_cv;
  std::atomic<bool> finished{false};
  KnnStatus status = KNN_INTERNAL_ERROR;
  KnnStats stats{};
  char error[kMessageBytes] = "";  // failure, or notice of an OK status
  std::thread thread;
  std::vector<float> wide_queries;  // float16 rows widened (FLOAT16 problems)
  std::vector<float> wide_targets;

  void run() noexcept;

 private:
  KnnStatus run_engines();
  KnnStatus run_float_engines();
  KnnStatus run_bit();
  KnnStatus widen();
  KnnStatus run_cpu(const char *note);
  KnnStatus run_gpu(const GpuModule &m);
  void announce_finished() noexcept;
};

KnnStatus KnnJob::run_cpu(const char *note) {
  const KnnStatus st =
      knn::cpu_run(problem, neighbors, distances, &stats, &cancel, error, sizeof error);
  if (note != nullptr) {
    const size_t used = std::strlen(stats.device_name);
    std::snprintf(stats.device_name + used, sizeof stats.device_name - used, " [%s]", note);
  }
  return st;
}

KnnStatus KnnJob::run_gpu(const GpuModule &m) {
  const KnnStatus st = m.run(&problem, neighbors, distances, &stats, &cancel, error, sizeof error);
  // Under AUTO a GPU that cannot take this join hands it to the CPU.
  if (problem.device != KNN_DEVICE_AUTO || (st != KNN_OUT_OF_MEMORY && st != KNN_DEVICE_ERROR))
    return st;
  char gpu_error[kMessageBytes];
  knn::copy_message(gpu_error, sizeof gpu_error, error);
  stats = KnnStats{};
  error[0] = '\0';
  const KnnStatus cpu_st = run_cpu("GPU failed, CPU engine ran");
  if (cpu_st == KNN_OK)
    std::snprintf(error, sizeof error, "the GPU engine failed (%.400s); the CPU engine ran",
                  gpu_error);
  return cpu_st;
}

// Bit rows: the CPU bit engine, whatever the device (no GPU bit kernel).
KnnStatus KnnJob::run_bit() {
  const KnnStatus st =
      knn::cpu::bit_run(problem, neighbors, distances, &stats, &cancel, error, sizeof error);
  if (problem.device == KNN_DEVICE_GPU && st == KNN_OK)
    std::snprintf(error, sizeof error,
                  "the GPU engine has no kernel for bit rows; the CPU engine ran");
  if (problem.device != KNN_DEVICE_CPU) {
    const size_t used = std::strlen(stats.device_name);
    std::snprintf(stats.device_name + used, sizeof stats.device_name - used,
                  " [bit rows: CPU engine]");
  }
  return st;
}

// Turns a FLOAT16 problem into the FLOAT32 problem of the same values.
KnnStatus KnnJob::widen() {
  if (const char *why = knn::problem_invalid_reason(problem, neighbors, distances)) {
    knn::copy_message(error, sizeof error, why);
    return KNN_INVALID_ARGUMENT;
  }
  const bool shared = problem.queries == problem.targets && problem.n_queries == problem.n_targets;
  if (!widen_rows(problem.queries, problem.n_queries, problem.dim, &cancel, &wide_queries) ||
      (!shared &&
       !widen_rows(problem.targets, problem.n_targets, problem.dim, &cancel, &wide_targets))) {
    knn::copy_message(error, sizeof error, "cancelled");
    return KNN_CANCELLED;
  }
  problem.element = KNN_ELEMENT_FLOAT32;
  problem.queries = wide_queries.data();
  problem.targets = shared ? wide_queries.data() : wide_targets.data();
  return KNN_OK;
}

KnnStatus KnnJob::run_engines() {
  if (problem.fault == KNN_FAULT_RUN) throw std::runtime_error("fault injection");
  if (problem.fault == KNN_FAULT_BAD_ALLOC) throw std::bad_alloc();
  if (problem.element == KNN_ELEMENT_BIT) return run_bit();
  if (problem.element == KNN_ELEMENT_FLOAT16) {
    const KnnStatus st = widen();
    if (st != KNN_OK) return st;
  }
  return run_float_engines();
}

KnnStatus KnnJob::run_float_engines() {
  if (problem.device == KNN_DEVICE_CPU) return run_cpu(nullptr);
  const GpuModule &m = gpu();
  if (m.usable) return run_gpu(m);
  // The CPU engine answers; when a GPU was asked for, the caller is told
  // why (the message of an OK status is a notice).
  const KnnStatus st = run_cpu("no GPU");
  if (problem.device == KNN_DEVICE_GPU && st == KNN_OK)
    std::snprintf(error, sizeof error, "no usable GPU (%s); the CPU engine ran", m.description);
  return st;
}

void KnnJob::announce_finished() noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex);
    finished.store(true);
  } catch (...) {
    finished.store(true);  // without the lock a waiter wakes at its timeout
  }
  finished_cv.notify_all();
}

void KnnJob::run() noexcept {
  status = knn::guarded("engine", error, sizeof error, [this] { return run_engines(); });
  announce_finished();
}

extern "C" {

KnnJob *knn_job_start(const KnnProblem *problem, int64_t *neighbors, double *distances,
                      char *errbuf, size_t errlen) {
  KnnJob *started = nullptr;
  knn::guarded("knn_job_start", errbuf, errlen, [&] {
    if (problem == nullptr) throw std::invalid_argument("no problem");
    std::unique_ptr<KnnJob> job(new KnnJob());
    job->problem = *problem;
    job->neighbors = neighbors;
    job->distances = distances;
    if (problem->fault == KNN_FAULT_START) throw std::runtime_error("fault injection");
    KnnJob *raw = job.get();
    job->thread = knn::start_signal_free_thread([raw] { raw->run(); });
    started = job.release();
    return KNN_OK;
  });
  return started;
}

int knn_job_wait(KnnJob *job, int timeout_ms) {
  if (job == nullptr) return 1;
  // A wait that fails only returns early: the caller polls again.
  knn::guarded("knn_job_wait", nullptr, 0, [&] {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->finished_cv.wait_for(lock, std::chrono::milliseconds(std::max(0, timeout_ms)),
                              [job] { return job->finished.load(); });
    return KNN_OK;
  });
  return job->finished.load() ? 1 : 0;
}

void knn_job_cancel(KnnJob *job) {
  if (job != nullptr) __atomic_store_n(&job->cancel, 1, __ATOMIC_RELAXED);
}

KnnStatus knn_job_finish(KnnJob *job, KnnStats *stats, char *errbuf, size_t errlen) {
  if (job == nullptr) {
    knn::copy_message(errbuf, errlen, "knn_job_finish: no job");
    return KNN_INVALID_ARGUMENT;
  }
  bool joined = false;
  const KnnStatus status = knn::guarded("knn_job_finish", errbuf, errlen, [&] {
    if (job->thread.joinable()) job->thread.join();
    joined = true;
    if (job->problem.fault == KNN_FAULT_FINISH) throw std::runtime_error("fault injection");
    if (stats != nullptr) *stats = job->stats;
    knn::copy_message(errbuf, errlen, job->error);
    return job->status;
  });
  // A thread that could not be joined may still use the job: leak it
  // rather than free memory under it.
  if (joined) delete job;
  return status;
}

void knn_engine_set_module_dir(const char *dir) {
  knn::guarded("knn_engine_set_module_dir", nullptr, 0, [&] {
    std::lock_guard<std::mutex> lock(gpu_module.mutex);
    knn::copy_message(gpu_module.dir, sizeof gpu_module.dir, dir);
    return KNN_OK;
  });
}

int knn_engine_describe(char *buf, size_t len) {
  if (buf == nullptr) len = 0;
  int usable = 0;
  knn::guarded("knn_engine_describe", buf, len, [&] {
    const GpuModule &m = gpu();
    usable = m.usable ? 1 : 0;
    if (len == 0) return KNN_OK;
    if (m.usable) {
      std::snprintf(buf, len, "gpu: %s", m.description);
    } else {
      knn_engine_describe_cpu(buf, len);
      const size_t used = std::strlen(buf);
      std::snprintf(buf + used, len - used, " (%s)", m.description);
    }
    return KNN_OK;
  });
  return usable;
}

void knn_engine_describe_cpu(char *buf, size_t len) {
  if (buf == nullptr || len == 0) return;
  knn::guarded("knn_engine_describe_cpu", buf, len, [&] {
    const unsigned threads =
        std::min(std::thread::hardware_concurrency(), unsigned{KNN_MAX_THREADS});
    std::snprintf(buf, len, "cpu: %u threads, BLAS: %s", std::max(threads, 1u),
                  knn::cpu_blas_description());
    return KNN_OK;
  });
}

}  // extern "C"
