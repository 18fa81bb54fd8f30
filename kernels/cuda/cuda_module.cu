// cuda_module.cu -- the entry points of knn_gpu_cuda.so (see
// ../knn_cuda_module.h): knn_cuda_probe and knn_cuda_run.
//
// knn_cuda_run borrows the device's runtime (stream, cuBLAS handle, pinned
// staging memory: created on the device's first join and kept for the
// process, see DeviceRuntime below), derives the memory budget, picks the
// method and runs it. No C++ exception leaves this file, and every device
// allocation of the join is owned by an RAII object of the method, so it is
// released on every path (into the device's memory pool, which keeps a
// bounded amount reserved for the next join).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "../knn_cuda_module.h"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"
#include "device_buffer.cuh"
#include "host_transfer.cuh"
#include "../problem_check.h"

namespace knn {
namespace cuda {
namespace {

// The device a join runs on: KNN_GPU_DEVICE (an index) or device 0.
int chosen_device() {
  const char *env = std::getenv("KNN_GPU_DEVICE");
  if (env != nullptr && env[0] != '\0') return std::atoi(env);
  return 0;
}

// ---- AUTO: which method a join gets ----
// Brute force is exact for every metric, and its GEMM/tile throughput does
// not care about the data's structure; TI (clustered triangle-inequality
// pruning) only works for metrics that obey the triangle inequality (L2,
// L1), needs enough pairs for its clustering to pay for itself, and pays
// off when the data's intrinsic dimension is low. That is unlikely when
// the dimension is high relative to log2 of the data size (a cluster's
// radius then stays close to the distances it should prune). Calibrated
// on bench/ (H200, k = 20, dims per log2 of the rows in brackets): TI is
// far ahead at skin (0.2), kegg (1.5 - 1.8), kdd (2.0) and ipums (3.4:
// 0.033 s against 1.30 s); brute force is ahead at blog (17.7: 0.072 s
// against TI's 0.079 s), fashion-mnist (55: 0.021 s against 0.53 s), and
// below 1e8 pairs (3DNet, 5000 rows: 0.0016 s against 0.0022 s; arcene,
// 100 rows). The threshold sits between ipums and blog, in log scale.
constexpr double kTiMinPairs = 1e8;
constexpr double kTiMaxDimPerLog2Rows = 8.0;

KnnMethod choose_auto_method(const KnnProblem &p) {
  if (p.metric != KNN_METRIC_L2 && p.metric != KNN_METRIC_L1) return KNN_METHOD_BRUTE;
  const double pairs = static_cast<double>(p.n_queries) * static_cast<double>(p.n_targets);
  if (pairs < kTiMinPairs) return KNN_METHOD_BRUTE;
  const double log2_targets = std::log2(std::max<double>(2.0, static_cast<double>(p.n_targets)));
  if (p.dim > kTiMaxDimPerLog2Rows * log2_targets) return KNN_METHOD_BRUTE;
  return KNN_METHOD_TI;
}

// ---- the device runtime, kept for the life of the process ----
// Querying the device's properties, creating a stream and a cuBLAS handle
// (milliseconds) and page-locking staging memory each cost more than a
// small join, so every device gets them once, on its first join, and keeps
// them until the process exits. They belong to the process, not leaked:
// the driver releases them at exit (nothing is destroyed from static
// destructors, which could run after the CUDA runtime has shut down).
// Joins on one device take turns (the mutex is held for a whole join), so
// the shared stream, handle and staging memory never serve two joins.
//
// The device's default memory pool (cudaMallocAsync, used by both methods)
// gets a release threshold: up to pool_keep_bytes() of the device memory
// that a join frees stays reserved for the next join, so that allocating
// costs microseconds instead of fresh page mappings; the rest goes back to
// the driver when the join's stream is synchronized. (TI trims the pool to
// zero after its joins, ti_join.cu.)
struct DeviceRuntime {
  std::timed_mutex mutex;  // held by the join using the device
  bool ready = false;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaMemPool_t pool = nullptr;
  PinnedStaging staging;
};

DeviceRuntime &runtime_of(int device) {
  static std::mutex *registry_mutex = new std::mutex();  // never destroyed, see above
  static std::map<int, DeviceRuntime *> *registry = new std::map<int, DeviceRuntime *>();
  std::lock_guard<std::mutex> lock(*registry_mutex);
  DeviceRuntime *&rt = (*registry)[device];
  if (rt == nullptr) rt = new DeviceRuntime();
  return *rt;
}

// Device memory a process keeps reserved between joins:
// KNN_GPU_POOL_KEEP_MIB, else 64 MiB -- enough for small joins to allocate
// in microseconds, small enough that many backends, each with its own pool,
// do not hold the GPU's memory between their joins.
uint64_t pool_keep_bytes(const cudaDeviceProp &prop) {
  const char *env = std::getenv("KNN_GPU_POOL_KEEP_MIB");
  if (env != nullptr && env[0] != '\0') return static_cast<uint64_t>(std::atoll(env)) << 20;
  return std::min<uint64_t>(prop.totalGlobalMem / 8, uint64_t(64) << 20);
}

// Creates what the runtime still lacks (what a failed attempt left out is
// created by the next join). The device must be current and the runtime's
// mutex held.
KnnStatus open_runtime(DeviceRuntime &rt, DeviceContext &ctx) {
  if (rt.ready) return KNN_OK;
  CUDA_CHECK(ctx, cudaGetDeviceProperties(&rt.prop, ctx.device));
  if (rt.stream == nullptr)
    CUDA_CHECK(ctx, cudaStreamCreateWithFlags(&rt.stream, cudaStreamNonBlocking));
  if (rt.cublas == nullptr) CUBLAS_CHECK(ctx, cublasCreate(&rt.cublas));
  CUDA_CHECK(ctx, cudaDeviceGetDefaultMemPool(&rt.pool, ctx.device));
  uint64_t keep = pool_keep_bytes(rt.prop);
  CUDA_CHECK(ctx, cudaMemPoolSetAttribute(rt.pool, cudaMemPoolAttrReleaseThreshold, &keep));
  rt.ready = true;
  return KNN_OK;
}

// At the end of a join, on every path: the shared stream must be idle,
// with the join's frees done, before the next join borrows it.
class StreamDrain {
 public:
  explicit StreamDrain(DeviceContext &ctx) : ctx_(ctx) {}
  ~StreamDrain() {
    if (ctx_.stream != nullptr) (void)cudaStreamSynchronize(ctx_.stream);
    (void)cudaGetLastError();
  }

 private:
  DeviceContext &ctx_;
};

KnnStatus select_device(DeviceContext &ctx) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    ctx.error = std::string("no usable GPU: ") +
                (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    return KNN_NO_DEVICE;
  }
  ctx.device = chosen_device();
  if (ctx.device < 0 || ctx.device >= count) {
    ctx.error = "KNN_GPU_DEVICE names no device";
    return KNN_NO_DEVICE;
  }
  CUDA_CHECK(ctx, cudaSetDevice(ctx.device));
  return KNN_OK;
}

// Lends the device's runtime to the join (its mutex held) and sets the
// join's memory budget.
KnnStatus setup_context(const KnnProblem &p, DeviceRuntime &rt, DeviceContext &ctx) {
  KNN_TRY(open_runtime(rt, ctx));
  ctx.prop = rt.prop;
  ctx.stream = rt.stream;
  ctx.cublas = rt.cublas;
  ctx.staging = &rt.staging;
  CUBLAS_CHECK(ctx, cublasSetStream(ctx.cublas, ctx.stream));
  // Pedantic math: the prescribed precision only (no TF32, no reduced
  // precision emulation), which the GEMM filter's error bounds assume.
  // KNN_CUBLAS_MATH=default is for benchmarking the difference only.
  const char *math = std::getenv("KNN_CUBLAS_MATH");
  const bool default_math = math != nullptr && std::strcmp(math, "default") == 0;
  CUBLAS_CHECK(ctx, cublasSetMathMode(ctx.cublas,
                                      default_math ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));

  // What is free on the device, plus what the pool holds unused from
  // earlier joins (cudaMallocAsync takes that first).
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(ctx, cudaMemGetInfo(&free_bytes, &total_bytes));
  uint64_t reserved = 0, used = 0;
  CUDA_CHECK(ctx, cudaMemPoolGetAttribute(rt.pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  CUDA_CHECK(ctx, cudaMemPoolGetAttribute(rt.pool, cudaMemPoolAttrUsedMemCurrent, &used));
  free_bytes += static_cast<size_t>(reserved - std::min(used, reserved));
  size_t budget = static_cast<size_t>(static_cast<double>(free_bytes) * 0.9);
  if (p.gpu_memory_limit > 0)
    budget = std::min(budget, static_cast<size_t>(p.gpu_memory_limit));
  ctx.memory_budget = budget;
  return KNN_OK;
}

void fill_empty(const KnnProblem &p, int64_t *neighbors, double *distances) {
  const int64_t n = p.n_queries * p.k;
  for (int64_t i = 0; i < n; i++) {
    neighbors[i] = -1;
    distances[i] = std::numeric_limits<double>::quiet_NaN();
  }
}

// (knn_status_name lives in knn_gpu.so, which this module must not need.)
const char *status_text(KnnStatus st) {
  switch (st) {
    case KNN_OK: return "ok";
    case KNN_CANCELLED: return "canceled";
    case KNN_OUT_OF_MEMORY: return "out of GPU memory";
    case KNN_INVALID_ARGUMENT: return "invalid argument";
    case KNN_DEVICE_ERROR: return "GPU device error";
    case KNN_NO_DEVICE: return "no usable GPU";
    case KNN_INTERNAL_ERROR: return "internal error in the GPU engine";
  }
  return "unknown status";
}

void copy_message(char *dst, size_t len, const std::string &msg) {
  if (dst == nullptr || len == 0) return;
  std::snprintf(dst, len, "%s", msg.c_str());
}

KnnStatus run_join(const KnnProblem &p, int64_t *neighbors, double *distances, KnnStats *stats,
                   const int32_t *cancel, std::string *error) {
  const auto start = std::chrono::steady_clock::now();
  if (const char *why = problem_invalid_reason(p, neighbors, distances)) {
    *error = why;
    return KNN_INVALID_ARGUMENT;
  }
  DeviceContext ctx;
  ctx.cancel = cancel;
  KnnStatus st = select_device(ctx);
  if (st != KNN_OK) {
    *error = ctx.error;
    return st;
  }
  DeviceRuntime &rt = runtime_of(ctx.device);
  // Wait for the device's current join, still answering a cancel.
  std::unique_lock<std::timed_mutex> turn(rt.mutex, std::defer_lock);
  while (!turn.try_lock_for(std::chrono::milliseconds(5))) {
    if (ctx.cancelled()) {
      *error = "canceled";
      return KNN_CANCELLED;
    }
  }
  const bool first_use = !rt.ready;
  StreamDrain drain(ctx);  // declared after the lock: drains before the next join's turn
  st = setup_context(p, rt, ctx);
  if (st != KNN_OK) {
    *error = ctx.error;
    return st;
  }
  const auto set_up = std::chrono::steady_clock::now();

  KnnMethod method = p.method == KNN_METHOD_AUTO ? choose_auto_method(p) : p.method;
  // TI covers the metrics that obey the triangle inequality; others (and
  // empty sides) go to brute force.
  if (method == KNN_METHOD_TI && p.metric != KNN_METRIC_L2 && p.metric != KNN_METRIC_L1)
    method = KNN_METHOD_BRUTE;

  KnnStats local{};
  if (p.n_queries == 0 || p.n_targets == 0) {
    fill_empty(p, neighbors, distances);
    std::snprintf(local.variant, sizeof local.variant, "empty");
    std::snprintf(local.method, sizeof local.method, "brute");
    st = KNN_OK;
  } else if (method == KNN_METHOD_TI) {
    st = ti_join(p, neighbors, distances, &local, ctx);
    // TI keeps whole clusterings on the device; when they do not fit the
    // budget, brute force (which works in chunks) still can.
    if (st == KNN_OUT_OF_MEMORY && !ctx.cancelled()) {
      const std::string ti_error = ctx.error;
      ctx.error.clear();
      local = KnnStats{};
      st = brute_force_join(p, neighbors, distances, &local, ctx);
      if (st == KNN_OK) {
        const size_t used = std::strlen(local.variant);
        std::snprintf(local.variant + used, sizeof local.variant - used, " (TI out of memory)");
      } else if (ctx.error.empty()) {
        ctx.error = ti_error;
      }
    }
  } else {
    st = brute_force_join(p, neighbors, distances, &local, ctx);
  }
  if (st == KNN_OK && ctx.cancelled()) {
    st = KNN_CANCELLED;
    ctx.error = "canceled";
  }
  std::snprintf(local.device, sizeof local.device, "%s", ctx.prop.name);
  local.pairs = p.n_queries * p.n_targets;
  const auto done = std::chrono::steady_clock::now();
  local.seconds_total = std::chrono::duration<double>(done - start).count();
  const char *timing = std::getenv("KNN_CUDA_TIMING");
  if (timing != nullptr && timing[0] == '1')
    std::fprintf(stderr, "knn cuda join: setup %.5f s%s, %s %.5f s, total %.5f s\n",
                 std::chrono::duration<double>(set_up - start).count(),
                 first_use ? " (first join on the device)" : "", local.method,
                 std::chrono::duration<double>(done - set_up).count(), local.seconds_total);
  if (stats != nullptr) *stats = local;
  if (st != KNN_OK) *error = ctx.error.empty() ? status_text(st) : ctx.error;
  return st;
}

}  // namespace
}  // namespace cuda
}  // namespace knn

using knn::cuda::copy_message;

extern "C" {

__attribute__((visibility("default"))) int knn_cuda_probe(char *buf, size_t len) {
  try {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      copy_message(buf, len, std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err));
      return 0;
    }
    if (count == 0) {
      copy_message(buf, len, "no CUDA device");
      return 0;
    }
    const int device = knn::cuda::chosen_device();
    if (device < 0 || device >= count) {
      copy_message(buf, len, "KNN_GPU_DEVICE names no device");
      return 0;
    }
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      copy_message(buf, len, std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(err));
      return 0;
    }
    char line[256];
    std::snprintf(line, sizeof line, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                  prop.totalGlobalMem / 1073741824.0);
    copy_message(buf, len, line);
    return 1;
  } catch (...) {
    copy_message(buf, len, "GPU probe failed with an exception");
    return 0;
  }
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_run(
    const KnnProblem *problem, int64_t *neighbors, double *distances, KnnStats *stats,
    const int32_t *cancel, char *errbuf, size_t errlen) {
  std::string error;
  KnnStatus st;
  try {
    if (problem == nullptr) {
      copy_message(errbuf, errlen, "problem is NULL");
      return KNN_INVALID_ARGUMENT;
    }
    st = knn::cuda::run_join(*problem, neighbors, distances, stats, cancel, &error);
  } catch (const std::bad_alloc &) {
    st = KNN_OUT_OF_MEMORY;
    error = "out of host memory in the GPU engine";
  } catch (const std::exception &e) {
    st = KNN_INTERNAL_ERROR;
    error = std::string("GPU engine: ") + e.what();
  } catch (...) {
    st = KNN_INTERNAL_ERROR;
    error = "GPU engine: unknown exception";
  }
  copy_message(errbuf, errlen, st == KNN_OK ? std::string() : error);
  return st;
}

}  // extern "C"
