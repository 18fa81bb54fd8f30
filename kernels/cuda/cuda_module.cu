// cuda_module.cu -- the entry points of knn_gpu_cuda.so (see
// ../knn_cuda_module.h): knn_cuda_probe and knn_cuda_run.
//
// knn_cuda_run sets up the device context of one join (device, stream,
// cuBLAS handle in FP32 pedantic math: no TF32, no emulation, which the
// brute-force error bounds rely on), derives the memory budget, picks the
// method and runs it. No C++ exception leaves this file, and every device
// allocation of the join is owned by an RAII object of the method, so it is
// released on every path.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "../knn_cuda_module.h"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"
#include "device_buffer.cuh"

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
// L1) and pays off when the data's intrinsic dimension is low, which high
// dimension relative to the data size makes unlikely (each cluster's
// radius then stays close to the distances it should prune), and when
// there are enough pairs for clustering to pay for itself. The thresholds
// are first guesses, to be tuned from bench/ numbers.
KnnMethod choose_auto_method(const KnnProblem &p) {
  if (p.metric == KNN_METRIC_IP || p.metric == KNN_METRIC_COSINE) return KNN_METHOD_BRUTE;
  const double pairs = static_cast<double>(p.n_queries) * static_cast<double>(p.n_targets);
  if (pairs < 1e8) return KNN_METHOD_BRUTE;
  const double log2_targets = std::log2(std::max<double>(2.0, static_cast<double>(p.n_targets)));
  if (p.dim > 4.0 * log2_targets) return KNN_METHOD_BRUTE;
  return KNN_METHOD_TI;
}

// cuBLAS handles are costly to create (milliseconds); joins borrow one
// per device from this pool and give it back.
class CublasPool {
 public:
  cublasHandle_t take(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < free_.size(); i++)
      if (free_[i].first == device) {
        cublasHandle_t h = free_[i].second;
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return h;
      }
    return nullptr;
  }
  void give_back(int device, cublasHandle_t h) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.emplace_back(device, h);
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<int, cublasHandle_t>> free_;
};

CublasPool &cublas_pool() {
  static CublasPool *pool = new CublasPool();  // never destroyed: handles live until exit
  return *pool;
}

// Owns the stream and the borrowed cuBLAS handle of one join.
class ContextGuard {
 public:
  explicit ContextGuard(DeviceContext &ctx) : ctx_(ctx) {}
  ~ContextGuard() {
    if (ctx_.cublas != nullptr) {
      cublasSetStream(ctx_.cublas, nullptr);
      cublas_pool().give_back(ctx_.device, ctx_.cublas);
    }
    if (ctx_.stream != nullptr) {
      cudaStreamSynchronize(ctx_.stream);
      cudaStreamDestroy(ctx_.stream);
    }
  }

 private:
  DeviceContext &ctx_;
};

KnnStatus setup_context(const KnnProblem &p, DeviceContext &ctx) {
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
  CUDA_CHECK(ctx, cudaGetDeviceProperties(&ctx.prop, ctx.device));
  CUDA_CHECK(ctx, cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  ctx.cublas = cublas_pool().take(ctx.device);
  if (ctx.cublas == nullptr) CUBLAS_CHECK(ctx, cublasCreate(&ctx.cublas));
  CUBLAS_CHECK(ctx, cublasSetStream(ctx.cublas, ctx.stream));
  // Pedantic math: the prescribed precision only (no TF32, no reduced
  // precision emulation), which the GEMM filter's error bounds assume.
  // KNN_CUBLAS_MATH=default is for benchmarking the difference only.
  const char *math = std::getenv("KNN_CUBLAS_MATH");
  const bool default_math = math != nullptr && std::strcmp(math, "default") == 0;
  CUBLAS_CHECK(ctx, cublasSetMathMode(ctx.cublas,
                                      default_math ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));

  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(ctx, cudaMemGetInfo(&free_bytes, &total_bytes));
  size_t budget = static_cast<size_t>(static_cast<double>(free_bytes) * 0.9);
  if (p.gpu_memory_limit > 0)
    budget = std::min(budget, static_cast<size_t>(p.gpu_memory_limit));
  ctx.memory_budget = budget;
  return KNN_OK;
}

const char *invalid_reason(const KnnProblem &p, const int64_t *neighbors,
                           const double *distances) {
  if (p.k < 1) return "k must be at least 1";
  if (p.dim < 1) return "dim must be at least 1";
  if (p.n_queries < 0 || p.n_targets < 0) return "negative row count";
  if (p.metric < KNN_METRIC_L2 || p.metric > KNN_METRIC_L1) return "unknown metric";
  if (p.method < KNN_METHOD_AUTO || p.method > KNN_METHOD_BRUTE) return "unknown method";
  if ((p.query_keys == nullptr) != (p.target_keys == nullptr))
    return "query_keys and target_keys must be given together";
  if (p.n_queries > 0 && p.queries == nullptr) return "queries is NULL";
  if (p.n_targets > 0 && p.targets == nullptr) return "targets is NULL";
  if (p.n_queries > 0 && (neighbors == nullptr || distances == nullptr))
    return "result arrays are NULL";
  const int64_t limit = std::numeric_limits<int64_t>::max() / 8;
  if (p.n_queries > limit / p.k || p.n_queries > limit / p.dim || p.n_targets > limit / p.dim)
    return "problem too large";
  return nullptr;
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
  if (const char *why = invalid_reason(p, neighbors, distances)) {
    *error = why;
    return KNN_INVALID_ARGUMENT;
  }
  DeviceContext ctx;
  ctx.cancel = cancel;
  ContextGuard guard(ctx);
  KnnStatus st = setup_context(p, ctx);
  if (st != KNN_OK) {
    *error = ctx.error;
    return st;
  }

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
  local.seconds_total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
