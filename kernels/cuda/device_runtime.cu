// device_runtime.cu -- the module's per-process device runtimes and their
// idle keeper (see device_runtime.cuh).
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../entry_guard.h"
#include "../signal_free_thread.h"
#include "cuda_check.cuh"
#include "device_runtime.cuh"

namespace knn {
namespace cuda {
namespace {

// The device's default memory pool (cudaMallocAsync, used by every method)
// gets a release threshold (set_pool_hold, per join). A join without a
// memory limit leaves all it frees in the pool: fresh device memory costs
// a page mapping when allocated and an unmapping when freed (about 17 ms of
// a 5000000 x 8 TI join's 0.36 s on an H200, level 1 and the result arrays
// above all), so the next join of the process reuses it instead; once no
// join has run for kPoolHoldMs, the idle keeper gives it back (all but
// kPoolKeepBytes): back-to-back joins reuse it, and an idle backend does
// not keep it from other sessions' joins. A join under a limit
// (knn_gpu.gpu_memory_limit, or its share of gpu_memory_budget, which
// bounds all backends' joins together) keeps only kPoolKeepBytes (at most
// an eighth of the device) from the start, so that many backends, each
// with its own pool, do not hold the GPU's memory between their joins.
constexpr uint64_t kPoolKeepBytes = uint64_t(64) << 20;
constexpr int64_t kPoolHoldMs = 2000;

constexpr int kOrdinals = KNN_MAX_DEVICE_ORDINAL + 1;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Every runtime made so far, by GPU and replica (null: never used).
struct Registry {
  std::mutex mutex;  // guards making runtimes; reading a made one needs no lock
  std::array<std::array<std::atomic<DeviceRuntime *>, kMaxReplicas>, kOrdinals> runtimes{};
};

Registry &registry() {
  static Registry *r = new Registry();  // never destroyed, like the runtimes
  return *r;
}

DeviceRuntime *find_runtime(int device, int replica) {
  if (device < 0 || device >= kOrdinals || replica < 0 || replica >= kMaxReplicas)
    return nullptr;
  return registry().runtimes[device][replica].load();
}

// The runtimes of one GPU that exist, in replica order.
std::vector<DeviceRuntime *> runtimes_of(int device) {
  std::vector<DeviceRuntime *> out;
  for (int r = 0; r < kMaxReplicas; r++)
    if (DeviceRuntime *rt = find_runtime(device, r)) out.push_back(rt);
  return out;
}

// Each GPU's pools' release threshold as the last join set it
// (set_pool_hold), which a pool of shared rows made later takes too
// (0 before any join: freed memory goes back at once).
std::array<std::atomic<uint64_t>, kOrdinals> &pool_thresholds() {
  static auto *thresholds = new std::array<std::atomic<uint64_t>, kOrdinals>();
  return *thresholds;
}

// Each GPU: whether a join without a memory limit has run on it since the
// idle keeper last trimmed its pools (set_pool_hold). The keeper looks at
// this rather than at the threshold: a limited join after the held one
// lowers the threshold, but what the pools kept stays reserved until
// trimmed (the shared rows' pool is not used by most joins, so no
// synchronisation of theirs gives it back).
std::array<std::atomic<bool>, kOrdinals> &pools_held() {
  static auto *held = new std::array<std::atomic<bool>, kOrdinals>();
  return *held;
}

// Everything, or the small reserve.
uint64_t pool_threshold(const cudaDeviceProp &prop, bool hold) {
  return hold ? UINT64_MAX : std::min<uint64_t>(prop.totalGlobalMem / 8, kPoolKeepBytes);
}

// Each GPU's pool of shared rows (shared_rows_pool), made under the
// registry's mutex.
std::array<std::atomic<cudaMemPool_t>, kOrdinals> &shared_pools() {
  static auto *pools = new std::array<std::atomic<cudaMemPool_t>, kOrdinals>();
  return *pools;
}

// Destroys `device`'s pool of shared rows (its runtimes held: no join
// allocates from it); the next split makes a new one.
void drop_shared_rows_pool(int device) {
  if (device < 0 || device >= kOrdinals) return;
  cudaMemPool_t pool = shared_pools()[device].exchange(nullptr);
  if (pool != nullptr) {
    (void)cudaMemPoolTrimTo(pool, 0);
    (void)cudaMemPoolDestroy(pool);
    (void)cudaGetLastError();
  }
}

// A runtime's stream, handle and staging (not the GPU's context or pool).
// Every step runs even when an earlier one failed (the first failure is
// reported). Its mutex held.
KnnStatus close_runtime(DeviceRuntime &rt, DeviceContext &ctx) {
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
  rt.pool = nullptr;
  return first;
}

std::atomic<void (*)()> release_notify{nullptr};  // set_release_notify

// After a release: tells the job layer when no runtime of any GPU is left
// (its context permit goes back, knn_job.cpp). Called with the released
// GPU's runtimes still held, so no join of that GPU makes one meanwhile.
void notify_if_none_held() {
  void (*notify)() = release_notify.load();
  if (notify == nullptr) return;
  for (int device = 0; device < kOrdinals; device++)
    for (DeviceRuntime *rt : runtimes_of(device))
      if (rt->ready.load()) return;
  notify();
}

// Gives back every runtime of one GPU and then its context; the caller
// holds all their mutexes. The context goes last: it is most of what the
// process holds (measured with nvidia-smi: the pool, pinned memory and
// cuBLAS handle are tens of MiB, the context hundreds).
KnnStatus release_device(int device, const std::vector<DeviceRuntime *> &rts,
                         DeviceContext &ctx) {
  KnnStatus first = select_device(ctx, device);
  if (first != KNN_OK) {
    for (DeviceRuntime *rt : rts) rt->ready.store(false);
    return first;
  }
  for (DeviceRuntime *rt : rts) {
    const KnnStatus st = close_runtime(*rt, ctx);
    if (first == KNN_OK) first = st;
  }
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) (void)cudaMemPoolTrimTo(pool, 0);
  (void)cudaGetLastError();
  drop_shared_rows_pool(device);
  // Releases this process's primary context; the next join creates it anew.
  const cudaError_t err = cudaDeviceReset();
  if (err != cudaSuccess) {
    const KnnStatus st = record_failure(ctx, err, "cudaDeviceReset", __FILE__, __LINE__);
    if (first == KNN_OK) first = st;
  }
  return first;
}

}  // namespace

cudaMemPool_t shared_rows_pool(int device, bool create) {
  if (device < 0 || device >= kOrdinals) return nullptr;
  static const bool off = [] {
    const char *v = std::getenv("KNN_PEER_POOL");
    return v != nullptr && v[0] == '0';
  }();
  if (off) return nullptr;
  cudaMemPool_t pool = shared_pools()[device].load();
  if (pool != nullptr || !create) return pool;
  std::lock_guard<std::mutex> lock(registry().mutex);
  pool = shared_pools()[device].load();
  if (pool != nullptr) return pool;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  uint64_t keep = pool_thresholds()[device].load();
  (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  (void)cudaGetLastError();
  shared_pools()[device].store(pool);
  return pool;
}

DeviceRuntime &device_runtime(int device, int replica) {
  Registry &reg = registry();
  std::atomic<DeviceRuntime *> &slot = reg.runtimes[device][replica];
  DeviceRuntime *rt = slot.load();
  if (rt != nullptr) return *rt;
  std::lock_guard<std::mutex> lock(reg.mutex);
  rt = slot.load();
  if (rt == nullptr) {
    rt = new DeviceRuntime();  // never destroyed, see the header
    rt->device = device;
    slot.store(rt);
  }
  return *rt;
}

bool runtime_ready(int device, int replica) {
  const DeviceRuntime *rt = find_runtime(device, replica);
  return rt != nullptr && rt->ready.load();
}

int visible_devices(std::string *why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    if (why != nullptr) *why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    return 0;
  }
  return count;
}

KnnStatus select_device(DeviceContext &ctx, int device) {
  std::string why;
  const int count = visible_devices(&why);
  if (count == 0) {
    ctx.error = "no usable GPU: " + why;
    return KNN_NO_DEVICE;
  }
  if (device < 0 || device >= count) {
    ctx.error = "GPU " + std::to_string(device) + " does not exist: this process sees " +
                std::to_string(count) + (count == 1 ? " GPU (0)" : " GPUs (0 to " +
                std::to_string(count - 1) + ")");
    return KNN_NO_DEVICE;
  }
  ctx.device = device;
  CUDA_CHECK(ctx, cudaSetDevice(ctx.device));
  return KNN_OK;
}

// What a failed attempt left out is created by the next one.
KnnStatus open_runtime(DeviceRuntime &rt, DeviceContext &ctx) {
  if (rt.ready.load()) return KNN_OK;
  CUDA_CHECK(ctx, cudaGetDeviceProperties(&rt.prop, rt.device));
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
  CUDA_CHECK(ctx, cudaDeviceGetDefaultMemPool(&rt.pool, rt.device));
  uint64_t keep = pool_threshold(rt.prop, false);
  CUDA_CHECK(ctx, cudaMemPoolSetAttribute(rt.pool, cudaMemPoolAttrReleaseThreshold, &keep));
  rt.ready.store(true);
  mark_runtime_used(rt);
  return KNN_OK;
}

KnnStatus set_pool_hold(DeviceRuntime &rt, bool hold, DeviceContext &ctx) {
  uint64_t keep = pool_threshold(rt.prop, hold);
  pool_thresholds()[rt.device].store(keep);
  CUDA_CHECK(ctx, cudaMemPoolSetAttribute(rt.pool, cudaMemPoolAttrReleaseThreshold, &keep));
  if (cudaMemPool_t shared = shared_rows_pool(rt.device, false))
    CUDA_CHECK(ctx, cudaMemPoolSetAttribute(shared, cudaMemPoolAttrReleaseThreshold, &keep));
  if (hold) pools_held()[rt.device].store(true);
  ctx.hold_pool = hold;
  return KNN_OK;
}

KnnStatus release_all_runtimes(DeviceContext &ctx) {
  KnnStatus first = KNN_OK;
  for (int device = 0; device < kOrdinals; device++) {
    const std::vector<DeviceRuntime *> rts = runtimes_of(device);
    if (rts.empty()) continue;
    // In replica order, as everywhere that holds more than one.
    std::vector<std::unique_lock<std::timed_mutex>> turns;
    for (DeviceRuntime *rt : rts) turns.emplace_back(rt->mutex);
    bool held = false;
    for (DeviceRuntime *rt : rts)
      held = held || rt->ready.load() || rt->stream != nullptr || rt->cublas != nullptr;
    if (!held) continue;
    const KnnStatus st = release_device(device, rts, ctx);
    if (first == KNN_OK) first = st;
    notify_if_none_held();  // the last GPU's release tells
  }
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
  static IdleKeeper *k = new IdleKeeper();  // never destroyed, like the runtimes
  return *k;
}

// Whether some runtime of the GPU is ready and none has been used for idle_ms.
bool device_idle(const std::vector<DeviceRuntime *> &rts, int64_t idle_ms) {
  bool any_ready = false;
  for (const DeviceRuntime *rt : rts) {
    if (!rt->ready.load()) continue;
    any_ready = true;
    if (now_ns() - rt->last_used_ns.load() < idle_ms * 1000000) return false;
  }
  return any_ready;
}

// Every runtime's turn of a GPU (rts), where all are free now and none
// has been used for idle_ms: a running join is never waited for (it marks
// its runtime used when it ends, which restarts the count). Empty where not.
std::vector<std::unique_lock<std::timed_mutex>> idle_turns(const std::vector<DeviceRuntime *> &rts,
                                                           int64_t idle_ms) {
  std::vector<std::unique_lock<std::timed_mutex>> turns;
  if (rts.empty() || !device_idle(rts, idle_ms)) return turns;
  for (DeviceRuntime *rt : rts) {
    turns.emplace_back(rt->mutex, std::try_to_lock);
    if (!turns.back().owns_lock()) return {};
  }
  if (!device_idle(rts, idle_ms)) return {};
  return turns;
}

// Releases each GPU's runtimes when all are idle enough and no join holds
// any.
void release_if_idle(int64_t idle_ms) {
  for (int device = 0; device < kOrdinals; device++) {
    const std::vector<DeviceRuntime *> rts = runtimes_of(device);
    const auto turns = idle_turns(rts, idle_ms);
    if (turns.empty()) continue;
    DeviceContext ctx;
    (void)release_device(device, rts, ctx);
    notify_if_none_held();
    // A failed release leaves ready false: the next join recreates what is
    // missing, and a broken device is reported by that join.
  }
}

// Gives back what each GPU's pools hold past the small reserve once none
// of its runtimes has been used for hold_ms (pools_held: only joins
// without a memory limit leave more). A GPU with a join running is left
// for the next look.
void trim_pools_if_idle(int64_t hold_ms) {
  for (int device = 0; device < kOrdinals; device++) {
    if (!pools_held()[device].load()) continue;
    const std::vector<DeviceRuntime *> rts = runtimes_of(device);
    const auto turns = idle_turns(rts, hold_ms);
    if (turns.empty()) continue;
    DeviceContext ctx;
    if (select_device(ctx, device) != KNN_OK) continue;
    uint64_t keep = pool_threshold(rts.front()->prop, false);
    pool_thresholds()[device].store(keep);
    pools_held()[device].store(false);
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      (void)cudaMemPoolTrimTo(pool, keep);
    }
    if (cudaMemPool_t shared = shared_rows_pool(device, false)) {
      (void)cudaMemPoolSetAttribute(shared, cudaMemPoolAttrReleaseThreshold, &keep);
      (void)cudaMemPoolTrimTo(shared, 0);
    }
    (void)cudaGetLastError();
  }
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
    trim_pools_if_idle(std::min(idle_ms, kPoolHoldMs));
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

void set_release_notify(void (*notify)()) { release_notify.store(notify); }

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
