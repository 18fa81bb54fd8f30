// device_runtime.cu -- the module's per-process device runtime and its idle
// keeper (see device_runtime.cuh).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <new>
#include <string>
#include <system_error>
#include <thread>

#include "../entry_guard.h"
#include "../signal_free_thread.h"
#include "cuda_check.cuh"
#include "device_runtime.cuh"

namespace knn {
namespace cuda {
namespace {

// The device's default memory pool (cudaMallocAsync, used by every method)
// gets a release threshold: up to kPoolKeepBytes of the memory a join frees
// stays reserved for the next join (at most an eighth of the device), so
// that small joins allocate in microseconds instead of fresh page mappings;
// the rest goes back to the driver when the join's stream is synchronized.
// Small enough that many backends, each with its own pool, do not hold the
// GPU's memory between their joins; the idle keeper gives back the rest.
constexpr uint64_t kPoolKeepBytes = uint64_t(64) << 20;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

DeviceRuntime &device_runtime() {
  static DeviceRuntime *rt = new DeviceRuntime();  // never destroyed, see the header
  return *rt;
}

KnnStatus select_device(DeviceContext &ctx) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    ctx.error = std::string("no usable GPU: ") +
                (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    return KNN_NO_DEVICE;
  }
  ctx.device = kDevice;
  CUDA_CHECK(ctx, cudaSetDevice(ctx.device));
  return KNN_OK;
}

// What a failed attempt left out is created by the next one.
KnnStatus open_runtime(DeviceRuntime &rt, DeviceContext &ctx) {
  if (rt.ready.load()) return KNN_OK;
  CUDA_CHECK(ctx, cudaGetDeviceProperties(&rt.prop, ctx.device));
  if (rt.stream == nullptr)
    CUDA_CHECK(ctx, cudaStreamCreateWithFlags(&rt.stream, cudaStreamNonBlocking));
  if (rt.cublas == nullptr) CUBLAS_CHECK(ctx, cublasCreate(&rt.cublas));
  if (rt.staging == nullptr) {
    rt.staging.reset(new (std::nothrow) PinnedStaging());
    if (rt.staging == nullptr) {
      ctx.error = "out of host memory for the staging buffers";
      return KNN_OUT_OF_MEMORY;
    }
  }
  CUDA_CHECK(ctx, cudaDeviceGetDefaultMemPool(&rt.pool, ctx.device));
  uint64_t keep = std::min<uint64_t>(rt.prop.totalGlobalMem / 8, kPoolKeepBytes);
  CUDA_CHECK(ctx, cudaMemPoolSetAttribute(rt.pool, cudaMemPoolAttrReleaseThreshold, &keep));
  rt.ready.store(true);
  mark_runtime_used(rt);
  return KNN_OK;
}

// Frees in dependency order; every step runs even when an earlier one
// failed (the first failure is reported). The context goes last: it is
// most of what the process holds (measured with nvidia-smi: the pool,
// pinned memory and cuBLAS handle are tens of MiB, the context hundreds).
KnnStatus release_runtime(DeviceRuntime &rt, DeviceContext &ctx) {
  rt.ready.store(false);
  KnnStatus first = KNN_OK;
  auto keep_first = [&first](KnnStatus st) {
    if (first == KNN_OK) first = st;
  };
  auto step = [&](cudaError_t err, const char *what) {
    if (err != cudaSuccess) keep_first(record_failure(ctx, err, what, __FILE__, __LINE__));
  };
  if (rt.stream != nullptr) step(cudaStreamSynchronize(rt.stream), "cudaStreamSynchronize");
  rt.staging.reset();  // pinned slices, their events and upload stream
  if (rt.cublas != nullptr) {
    const cublasStatus_t st = cublasDestroy(rt.cublas);
    if (st != CUBLAS_STATUS_SUCCESS)
      keep_first(record_failure(ctx, st, "cublasDestroy", __FILE__, __LINE__));
    rt.cublas = nullptr;
  }
  if (rt.stream != nullptr) step(cudaStreamDestroy(rt.stream), "cudaStreamDestroy");
  rt.stream = nullptr;
  if (rt.pool != nullptr) step(cudaMemPoolTrimTo(rt.pool, 0), "cudaMemPoolTrimTo");
  rt.pool = nullptr;
  // Releases this process's primary context; the next join creates it anew.
  step(cudaDeviceReset(), "cudaDeviceReset");
  return first;
}

void mark_runtime_used(DeviceRuntime &rt) { rt.last_used_ns.store(now_ns()); }

// ---- the idle keeper ----

namespace {

struct IdleKeeper {
  std::mutex mutex;
  std::condition_variable wake;
  std::thread thread;
  int64_t idle_ms = 0;  // 0 = never release
  bool stopping = false;
};

IdleKeeper &keeper() {
  static IdleKeeper *k = new IdleKeeper();  // never destroyed, like the runtime
  return *k;
}

// Releases the runtime when it is idle enough and no join holds it (a
// running join is never waited for: it marks the runtime used when it
// ends, which restarts the count).
void release_if_idle(int64_t idle_ms) {
  DeviceRuntime &rt = device_runtime();
  if (!rt.ready.load() || now_ns() - rt.last_used_ns.load() < idle_ms * 1000000) return;
  std::unique_lock<std::timed_mutex> turn(rt.mutex, std::try_to_lock);
  if (!turn.owns_lock() || !rt.ready.load()) return;
  if (now_ns() - rt.last_used_ns.load() < idle_ms * 1000000) return;
  DeviceContext ctx;
  if (select_device(ctx) == KNN_OK) (void)release_runtime(rt, ctx);
  // A failed release leaves ready false: the next join recreates what is
  // missing, and a broken device is reported by that join.
}

void keeper_loop() {
  IdleKeeper &k = keeper();
  std::unique_lock<std::mutex> lock(k.mutex);
  while (!k.stopping) {
    // Looks a few times per idle period (at least every second), so a
    // release comes at most a quarter period late.
    const int64_t period = k.idle_ms > 0 ? std::clamp<int64_t>(k.idle_ms / 4, 10, 1000) : 1000;
    k.wake.wait_for(lock, std::chrono::milliseconds(period));
    if (k.stopping || k.idle_ms <= 0) continue;
    const int64_t idle_ms = k.idle_ms;
    lock.unlock();
    release_if_idle(idle_ms);
    lock.lock();
  }
}

}  // namespace

void set_idle_release(int64_t idle_ms) {
  IdleKeeper &k = keeper();
  std::lock_guard<std::mutex> lock(k.mutex);
  k.idle_ms = std::max<int64_t>(0, idle_ms);
  if (k.idle_ms > 0 && !k.thread.joinable() && !k.stopping) {
    try {
      k.thread = start_signal_free_thread(keeper_loop);
    } catch (const std::system_error &) {
      // No thread: the runtime is simply kept, as with 0.
    }
  }
  k.wake.notify_all();
}

void stop_idle_keeper() {
  IdleKeeper &k = keeper();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(k.mutex);
    k.stopping = true;
    t = std::move(k.thread);
  }
  k.wake.notify_all();
  if (t.joinable()) t.join();
}

}  // namespace cuda
}  // namespace knn
