// device_runtime.cuh -- what the GPU module keeps for the process between
// joins (internal to kernels/cuda/): per engine slot of a GPU, a stream, a
// cuBLAS handle and pinned staging memory; per GPU, the CUDA context and a
// reserve in the device's memory pool.
//
// Creating them costs a fraction of a second (the context above all), so
// they are made once -- by the first join, or ahead of it by
// knn_cuda_warm_up -- and kept. Keeping them holds GPU memory (the context
// alone some hundreds of MiB), so an idle process gives them back after
// knn_gpu.gpu_idle_release (the idle keeper below), and the next join
// creates them again.
//
// A join runs one engine per listed GPU (multi_device.cuh); the engine of
// the i-th listing of a GPU uses that GPU's runtime `replica` i, so that a
// list naming one GPU twice (the test mode of knn_gpu.devices) gives two
// engines two streams and handle sets. A join on one GPU uses replica 0.
//
// Joins, warm-up and release take turns on each runtime's mutex; a release
// holds every runtime of the GPU (the context is the GPU's), so it never
// runs under a join.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "../knn_vocabulary.h"
#include "cuda_engine.cuh"
#include "host_transfer.cuh"

namespace knn {
namespace cuda {

// The GPU a join uses when the problem lists none and is not split, and
// whose runtime the warm-up creates (CUDA_VISIBLE_DEVICES picks which GPU
// that is).
constexpr int kFirstDevice = 0;

// Runtimes per GPU: as many as one list can name it.
constexpr int kMaxReplicas = KNN_MAX_DEVICES;

struct DeviceRuntime {
  int device = 0;                  // CUDA ordinal (fixed at creation)
  std::timed_mutex mutex;          // held by the join (or warm-up, release) using it
  std::atomic<bool> ready{false};  // everything below exists
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaMemPool_t pool = nullptr;
  std::unique_ptr<PinnedStaging> staging;
  std::atomic<int64_t> last_used_ns{0};  // steady clock, end of the last join
};

// Runtime `replica` of GPU `device` (0 <= device <= KNN_MAX_DEVICE_ORDINAL,
// 0 <= replica < kMaxReplicas), made (empty) on first use. Never destroyed:
// static destructors could run after the CUDA runtime has shut down; the
// driver frees it at exit. Thread-safe.
DeviceRuntime &device_runtime(int device, int replica = 0);

// Whether runtime `replica` of `device` exists and is ready (never makes one).
bool runtime_ready(int device, int replica = 0);

// How many GPUs the process sees (0 when none, or the driver fails: then
// *why says so).
int visible_devices(std::string *why);

// Makes `device` current on the calling thread, or says why it cannot be.
KnnStatus select_device(DeviceContext &ctx, int device = kFirstDevice);

// Creates what the runtime lacks. Its device current, its mutex held.
KnnStatus open_runtime(DeviceRuntime &rt, DeviceContext &ctx);

// How much of what this join frees the GPU's pools (the default one and
// the shared rows') keep for the next join of the process: all of it
// (`hold`, for a join without a memory limit) or a small reserve. The idle
// keeper gives back all but the reserve once the GPU has had no join for
// 2 s, and everything at knn_gpu.gpu_idle_release. Sets ctx.hold_pool.
// Its device current.
KnnStatus set_pool_hold(DeviceRuntime &rt, bool hold, DeviceContext &ctx);

// The pool of a split's buffers that other GPUs read (peer_rows.cuh: the
// TI self-join's shared upload and assignment), apart from the device's
// default pool. Access granted to a pool maps every later allocation of
// it on the reader too, so the default pool, which has all of a join's
// other arrays, would otherwise map them on every GPU of the split (and
// unmap them at the trim). Made on first use with `create` (its release
// threshold set_pool_hold's), and destroyed before the GPU's context is released. Null where it could
// not be made, without `create` where it was not, or under
// KNN_PEER_POOL=0 (the default pool then, the older way, for measuring).
// Thread-safe.
cudaMemPool_t shared_rows_pool(int device, bool create);

// Gives back every runtime of every GPU, each GPU's context included, so
// that the process holds no GPU memory; waits for running joins.
KnnStatus release_all_runtimes(DeviceContext &ctx);

// Notes that a join ended now (the idle keeper counts from here).
void mark_runtime_used(DeviceRuntime &rt);

// The idle keeper: a thread of the module (started on the first non-zero
// setting, signals blocked) that releases a GPU's runtimes once none of
// them has been used for idle_ms. 0 = never release. Thread-safe.
void set_idle_release(int64_t idle_ms);

// Stops and joins the idle keeper (process exit). Idempotent.
void stop_idle_keeper();

// What the module calls once it has released the last runtime it held, on
// every GPU (knn_cuda_set_release_notify; nullptr = nothing). Thread-safe.
void set_release_notify(void (*notify)());

}  // namespace cuda
}  // namespace knn
