// knn_job.cpp -- a join running on an engine-owned thread.
//
// The backend thread starts a job, polls it (so that it can notice cancel and
// statement_timeout), and finishes it. The job thread picks the engine: the
// GPU module when one is usable (loaded once with dlopen, so knn_gpu.so never
// links CUDA and loads on hosts without a driver), else the CPU engine.

#include <dlfcn.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "cpu/cpu_engine.h"
#include "knn_cuda_module.h"
#include "knn_engine.h"

namespace {

// ---- the GPU module, loaded once per process ----

struct GpuModule {
  std::once_flag loaded;
  bool usable = false;          // module loaded and a GPU answered
  std::string description;      // device line, or why there is none
  knn_cuda_run_fn run = nullptr;
};

GpuModule gpu_module;
std::mutex module_dir_mutex;
std::string module_dir;

void load_gpu_module() {
  std::string dir;
  if (const char *env = std::getenv("KNN_GPU_MODULE_DIR")) dir = env;
  if (dir.empty()) {
    std::lock_guard<std::mutex> lock(module_dir_mutex);
    dir = module_dir;
  }
  std::string path = (dir.empty() ? std::string(".") : dir) + "/knn_gpu_cuda.so";
  void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *why = dlerror();
    gpu_module.description = std::string("GPU module not loaded: ") + (why ? why : path);
    return;
  }
  auto probe = reinterpret_cast<knn_cuda_probe_fn>(dlsym(handle, KNN_CUDA_PROBE_SYMBOL));
  auto run = reinterpret_cast<knn_cuda_run_fn>(dlsym(handle, KNN_CUDA_RUN_SYMBOL));
  if (probe == nullptr || run == nullptr) {
    gpu_module.description = "GPU module " + path + " lacks its entry points";
    return;  // keep the handle: unloading CUDA libraries is not worth the risk
  }
  char line[256] = "";
  gpu_module.usable = probe(line, sizeof line) != 0;
  gpu_module.description = line;
  gpu_module.run = run;
}

GpuModule &gpu() {
  std::call_once(gpu_module.loaded, load_gpu_module);
  return gpu_module;
}

void copy_message(char *dst, size_t len, const std::string &msg) {
  if (dst == nullptr || len == 0) return;
  std::snprintf(dst, len, "%s", msg.c_str());
}

}  // namespace

struct KnnJob {
  KnnProblem problem;
  int64_t *neighbors;
  double *distances;
  int32_t cancel = 0;  // written with __atomic_store_n, read by the engines

  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  KnnStatus status = KNN_INTERNAL_ERROR;
  KnnStats stats{};
  std::string error;
  std::thread thread;

  void run();
  void run_cpu(const char *note);
};

void KnnJob::run_cpu(const char *note) {
  KnnStatus st = knn::cpu_run(problem, neighbors, distances, &stats, &cancel, &error);
  status = st;
  if (note != nullptr && note[0] != '\0')
    std::snprintf(stats.device + std::strlen(stats.device),
                  sizeof stats.device - std::strlen(stats.device), " [%s]", note);
}

void KnnJob::run() {
  try {
    if (problem.device == KNN_DEVICE_CPU) {
      run_cpu(nullptr);
    } else {
      GpuModule &m = gpu();
      if (!m.usable) {
        // The CPU engine answers; when a GPU was asked for, the caller is
        // told why (the message of an OK status is a notice).
        run_cpu("no GPU");
        if (problem.device == KNN_DEVICE_GPU && status == KNN_OK)
          error = "no usable GPU (" + m.description + "); the CPU engine ran";
      } else {
        char msg[512] = "";
        status = m.run(&problem, neighbors, distances, &stats, &cancel, msg, sizeof msg);
        error = msg;
        // Under AUTO a GPU that cannot take this join hands it to the CPU.
        bool retry_on_cpu = problem.device == KNN_DEVICE_AUTO &&
                            (status == KNN_OUT_OF_MEMORY || status == KNN_DEVICE_ERROR);
        if (retry_on_cpu) {
          std::string gpu_error = error;
          stats = KnnStats{};
          error.clear();
          run_cpu("GPU failed, CPU engine ran");
          if (status == KNN_OK)
            error = "the GPU engine failed (" + gpu_error + "); the CPU engine ran";
        }
      }
    }
  } catch (const std::bad_alloc &) {
    status = KNN_OUT_OF_MEMORY;
    error = "out of memory in the engine";
  } catch (...) {
    status = KNN_INTERNAL_ERROR;
    error = "unexpected exception in the engine";
  }
  std::lock_guard<std::mutex> lock(mutex);
  finished = true;
  finished_cv.notify_all();
}

extern "C" {

KnnJob *knn_job_start(const KnnProblem *problem, int64_t *neighbors, double *distances,
                      char *errbuf, size_t errlen) {
  KnnJob *job = new (std::nothrow) KnnJob();
  if (job == nullptr) {
    copy_message(errbuf, errlen, "out of memory starting a join");
    return nullptr;
  }
  job->problem = *problem;
  job->neighbors = neighbors;
  job->distances = distances;
  try {
    job->thread = std::thread([job] { job->run(); });
  } catch (...) {
    delete job;
    copy_message(errbuf, errlen, "could not start an engine thread");
    return nullptr;
  }
  return job;
}

int knn_job_wait(KnnJob *job, int timeout_ms) {
  std::unique_lock<std::mutex> lock(job->mutex);
  return job->finished_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                   [job] { return job->finished; })
             ? 1
             : 0;
}

void knn_job_cancel(KnnJob *job) { __atomic_store_n(&job->cancel, 1, __ATOMIC_RELAXED); }

KnnStatus knn_job_finish(KnnJob *job, KnnStats *stats, char *errbuf, size_t errlen) {
  if (job->thread.joinable()) job->thread.join();
  KnnStatus status = job->status;
  if (stats != nullptr) *stats = job->stats;
  copy_message(errbuf, errlen, job->error);
  delete job;
  return status;
}

void knn_engine_set_module_dir(const char *dir) {
  std::lock_guard<std::mutex> lock(module_dir_mutex);
  module_dir = dir != nullptr ? dir : "";
}

int knn_engine_describe(char *buf, size_t len) {
  GpuModule &m = gpu();
  unsigned cores = std::thread::hardware_concurrency();
  if (m.usable)
    std::snprintf(buf, len, "gpu: %s", m.description.c_str());
  else
    std::snprintf(buf, len, "cpu: %u threads (%s)", cores, m.description.c_str());
  return m.usable ? 1 : 0;
}

const char *knn_status_name(KnnStatus status) {
  switch (status) {
    case KNN_OK: return "ok";
    case KNN_CANCELLED: return "cancelled";
    case KNN_OUT_OF_MEMORY: return "out of memory";
    case KNN_INVALID_ARGUMENT: return "invalid argument";
    case KNN_DEVICE_ERROR: return "device error";
    case KNN_NO_DEVICE: return "no device";
    case KNN_INTERNAL_ERROR: return "internal error";
  }
  return "unknown";
}

}  // extern "C"
