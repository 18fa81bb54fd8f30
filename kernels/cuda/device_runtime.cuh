// device_runtime.cuh -- what the GPU module keeps for the process between
// joins (internal to kernels/cuda/): the CUDA context of device 0, a
// stream, a cuBLAS handle, pinned staging memory and a reserve in the
// device's memory pool.
//
// Creating them costs a fraction of a second (the context above all), so
// they are made once -- by the first join, or ahead of it by
// knn_cuda_warm_up -- and kept. Keeping them holds GPU memory (the context
// alone some hundreds of MiB), so an idle process gives them back after
// knn_gpu.gpu_idle_release (the idle keeper below), and the next join
// creates them again.
//
// Joins, warm-up and release take turns on the runtime's mutex, so a
// release never runs under a join.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "cuda_engine.cuh"
#include "host_transfer.cuh"

namespace knn {
namespace cuda {

constexpr int kDevice = 0;  // CUDA_VISIBLE_DEVICES picks which GPU that is

struct DeviceRuntime {
  std::timed_mutex mutex;          // held by the join (or warm-up, release) using it
  std::atomic<bool> ready{false};  // everything below exists
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaMemPool_t pool = nullptr;
  std::unique_ptr<PinnedStaging> staging;
  std::atomic<int64_t> last_used_ns{0};  // steady clock, end of the last join
};

// The process's runtime (never destroyed: static destructors could run
// after the CUDA runtime has shut down; the driver frees it at exit).
DeviceRuntime &device_runtime();

// Makes device 0 current on the calling thread, or says why there is none.
KnnStatus select_device(DeviceContext &ctx);

// Creates what the runtime lacks. Device current, mutex held.
KnnStatus open_runtime(DeviceRuntime &rt, DeviceContext &ctx);

// Gives back everything the runtime holds, the CUDA context included, so
// that the process holds no GPU memory. Device current, mutex held.
KnnStatus release_runtime(DeviceRuntime &rt, DeviceContext &ctx);

// Notes that a join ended now (the idle keeper counts from here).
void mark_runtime_used(DeviceRuntime &rt);

// The idle keeper: a thread of the module (started on the first non-zero
// setting, signals blocked) that releases the runtime once no join has
// used it for idle_ms. 0 = never release. Thread-safe.
void set_idle_release(int64_t idle_ms);

// Stops and joins the idle keeper (process exit). Idempotent.
void stop_idle_keeper();

}  // namespace cuda
}  // namespace knn
