// gpu_service.cpp -- the GPU service's engine (gpu_service.h): the server
// of gpu_service_server.h with a run function that runs each job as an
// engine job of this process.

#include "gpu_service.h"

#include <unistd.h>

#include <memory>

#include "entry_guard.h"
#include "gpu_service_server.h"

struct KnnGpuServiceHandle {
  std::unique_ptr<knn::service::Server> server;
};

namespace {

constexpr int kPollMs = 5;

// One job on this process's engine: the GPU, or the CPU engine for a test
// job where the service was started as a CPU stand-in. The backend's
// cancel word is forwarded to the engine's cancel.
KnnStatus run_here(bool gpu_usable, bool serve_cpu_stand_in, const char *gpu_description,
                   const KnnProblem &problem, bool cpu_stand_in, int64_t *neighbors,
                   double *distances, KnnStats *stats, const int32_t *cancel, char *errbuf,
                   size_t errlen) {
  KnnProblem p = problem;
  if (cpu_stand_in && serve_cpu_stand_in) {
    p.device = KNN_DEVICE_CPU;
  } else if (gpu_usable) {
    p.device = KNN_DEVICE_GPU;
  } else {
    std::snprintf(errbuf, errlen, "the GPU service has no usable GPU (%s)", gpu_description);
    return KNN_NO_DEVICE;
  }
  p.admission = KNN_ADMISSION_NONE;  // the backend holds the slot
  p.fault = KNN_FAULT_NONE;
  p.range = KNN_RANGE_NONE;
  p.query_groups = nullptr;
  p.target_groups = nullptr;
  KnnJob *job = knn_job_start(&p, neighbors, distances, errbuf, errlen);
  if (job == nullptr) return KNN_INTERNAL_ERROR;
  bool cancelled = false;
  while (!knn_job_wait(job, kPollMs)) {
    if (!cancelled && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) {
      knn_job_cancel(job);
      cancelled = true;
    }
  }
  return knn_job_finish(job, stats, errbuf, errlen);
}

}  // namespace

extern "C" {

KnnGpuServiceHandle *knn_gpu_service_open(const char *socket_path, int serve_cpu_stand_in,
                                          char *description, size_t description_len,
                                          char *errbuf, size_t errlen) {
  KnnGpuServiceHandle *opened = nullptr;
  knn::guarded("knn_gpu_service_open", errbuf, errlen, [&] {
    // A dead service's socket goes first (the caller holds the lock), so
    // that backends do not take it for this one while the GPU warms up.
    if (socket_path != nullptr && socket_path[0] != '\0') (void)unlink(socket_path);
    char gpu[384];
    const bool usable = knn_engine_prepare_gpu(gpu, sizeof gpu) != 0;
    knn::copy_message(description, description_len, gpu);
    if (!usable && serve_cpu_stand_in == 0) {
      std::snprintf(errbuf, errlen, "no usable GPU: %s", gpu);
      return KNN_NO_DEVICE;
    }
    const bool stand_in = serve_cpu_stand_in != 0;
    const std::string gpu_text = gpu;
    std::unique_ptr<KnnGpuServiceHandle> h(new KnnGpuServiceHandle());
    h->server = knn::service::Server::listen(
        socket_path,
        [usable, stand_in, gpu_text](const KnnProblem &p, bool cpu_stand_in, int64_t *n,
                                     double *d, KnnStats *s, const int32_t *cancel, char *e,
                                     size_t el) {
          return run_here(usable, stand_in, gpu_text.c_str(), p, cpu_stand_in, n, d, s, cancel,
                          e, el);
        },
        errbuf, errlen);
    if (h->server == nullptr) return KNN_DEVICE_ERROR;
    opened = h.release();
    return KNN_OK;
  });
  return opened;
}

void knn_gpu_service_close(KnnGpuServiceHandle *service) {
  if (service == nullptr) return;
  knn::guarded("knn_gpu_service_close", nullptr, 0, [&] {
    service->server->stop();
    delete service;
    return KNN_OK;
  });
}

int64_t knn_gpu_service_jobs_answered(const KnnGpuServiceHandle *service) {
  return service != nullptr && service->server != nullptr ? service->server->jobs_answered() : 0;
}

}  // extern "C"
