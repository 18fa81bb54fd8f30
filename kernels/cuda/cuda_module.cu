// cuda_module.cu -- the entry points of knn_gpu_cuda.so (see
// ../knn_cuda_module.h): knn_cuda_probe and knn_cuda_run, the runtime's
// warm-up, release and idle timer, plus the tests' knn_cuda_run_tuned
// (knn_cuda_testing.h).
//
// knn_cuda_run borrows the device's runtime (context, stream, cuBLAS
// handle, pinned staging memory: created on the first join or by
// knn_cuda_warm_up, kept until the idle keeper or knn_cuda_release gives
// them back, see device_runtime.cuh), derives the memory budget, picks the
// method (bit rows: bit_join.cu) and runs it. No C++ exception leaves this file (entry_guard.h), and every
// device allocation of the join is owned by an RAII object of the method,
// so it is released on every path (into the device's memory pool, which
// keeps a bounded amount reserved for the next join).
//
// The module uses CUDA device 0; CUDA_VISIBLE_DEVICES picks which GPU that
// is.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <mutex>
#include <string>

#include "../signal_free_thread.h"
#include "../entry_guard.h"
#include "../knn_cuda_module.h"
#include "../knn_vocabulary.h"
#include "../problem_check.h"
#include "../result_padding.h"
#include "bit_join.cuh"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"
#include "device_buffer.cuh"
#include "device_runtime.cuh"
#include "group_join.cuh"
#include "host_transfer.cuh"
#include "knn_cuda_testing.h"

namespace knn {
namespace cuda {
namespace {

// ---- AUTO: which method a join gets ----
// Brute force is exact for every metric, and its GEMM/tile throughput does
// not care about the data's structure; TI (clustered triangle-inequality
// pruning) only works for metrics that obey the triangle inequality (L2,
// L1), needs enough pairs for its clustering to pay for itself, and pays
// off when the data's intrinsic dimension is low. That is unlikely when
// the dimension is high relative to log2 of the data size (a cluster's
// radius then stays close to the distances it should prune). The two
// thresholds were calibrated on the benchmark sets (bench/NOTES.md): TI
// wins by far at up to a few dimensions per log2 of the rows, brute force
// from about 18 on and below 1e8 pairs; the threshold sits in between, in
// log scale.
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

// Lends the device's runtime to the join (its mutex held) and sets the
// join's memory budget.
KnnStatus setup_context(const KnnProblem &p, DeviceRuntime &rt, DeviceContext &ctx) {
  KNN_TRY(open_runtime(rt, ctx));
  ctx.prop = rt.prop;
  ctx.stream = rt.stream;
  ctx.cublas = rt.cublas;
  ctx.staging = rt.staging.get();
  CUBLAS_CHECK(ctx, cublasSetStream(ctx.cublas, ctx.stream));
  // Pedantic math: the prescribed precision only (no TF32, no reduced
  // precision emulation), which the GEMM filter's error bounds assume.
  CUBLAS_CHECK(ctx, cublasSetMathMode(ctx.cublas, CUBLAS_PEDANTIC_MATH));

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

// TI covers the metrics that obey the triangle inequality; others go to
// brute force.
KnnMethod method_for(const KnnProblem &p) {
  const KnnMethod method = p.method == KNN_METHOD_AUTO ? choose_auto_method(p) : p.method;
  if (method == KNN_METHOD_TI && p.metric != KNN_METRIC_L2 && p.metric != KNN_METRIC_L1)
    return KNN_METHOD_BRUTE;
  return method;
}

// Runs the join's method on the prepared context; stats are the method's.
KnnStatus run_method(const KnnProblem &p, const JoinTuning &tuning, int64_t *neighbors,
                     double *distances, KnnStats *stats, DeviceContext &ctx) {
  if (p.element == KNN_ELEMENT_BIT) return bit_join(p, neighbors, distances, stats, ctx);
  if (p.n_queries == 0 || p.n_targets == 0) {
    fill_padding(p.n_queries, p.k, neighbors, distances);
    stats->method = KNN_METHOD_BRUTE;
    std::snprintf(stats->variant, sizeof stats->variant, "empty");
    return KNN_OK;
  }
  if (method_for(p) != KNN_METHOD_TI)
    return brute_force_join(p, tuning, neighbors, distances, stats, ctx);
  const KnnStatus st = ti_join(p, tuning, neighbors, distances, stats, ctx);
  if (st != KNN_OUT_OF_MEMORY || ctx.cancelled()) return st;
  // TI keeps whole clusterings on the device; when they do not fit the
  // budget, brute force (which works in chunks) still can.
  const std::string ti_error = ctx.error;
  ctx.error.clear();
  *stats = KnnStats{};
  const KnnStatus brute = brute_force_join(p, tuning, neighbors, distances, stats, ctx);
  if (brute == KNN_OK) {
    const size_t used = std::strlen(stats->variant);
    std::snprintf(stats->variant + used, sizeof stats->variant - used, " (TI out of memory)");
  } else if (ctx.error.empty()) {
    ctx.error = ti_error;
  }
  return brute;
}

KnnStatus run_join(const KnnProblem &p, const JoinTuning &tuning, int64_t *neighbors,
                   double *distances, KnnStats *stats, const int32_t *cancel,
                   DeviceContext &ctx) {
  const auto start = std::chrono::steady_clock::now();
  // Float32 rows (the job layer widens float16), or bit rows (bit_join.cu).
  if (const char *why = p.element == KNN_ELEMENT_BIT
                            ? problem_invalid_reason(p, neighbors, distances)
                            : float_problem_invalid_reason(p, neighbors, distances)) {
    ctx.error = why;
    return KNN_INVALID_ARGUMENT;
  }
  ctx.cancel = cancel;
  KNN_TRY(select_device(ctx));
  DeviceRuntime &rt = device_runtime();
  // Wait for the device's current join, still answering a cancel.
  std::unique_lock<std::timed_mutex> turn(rt.mutex, std::defer_lock);
  while (!turn.try_lock_for(std::chrono::milliseconds(5))) KNN_TRY(ctx.cancel_point());
  StreamDrain drain(ctx);  // declared after the lock: drains before the next join's turn
  KNN_TRY(setup_context(p, rt, ctx));

  struct MarkUsed {  // on every path: the idle keeper counts from the join's end
    DeviceRuntime &rt;
    ~MarkUsed() { mark_runtime_used(rt); }
  } mark_used{rt};

  KnnStats local{};
  KnnStatus st = run_method(p, tuning, neighbors, distances, &local, ctx);
  if (st == KNN_OK) st = ctx.cancel_point();
  local.device = KNN_DEVICE_GPU;
  std::snprintf(local.device_name, sizeof local.device_name, "%.127s", ctx.prop.name);
  local.pairs = p.n_queries * p.n_targets;
  local.seconds_total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (stats != nullptr) *stats = local;
  return st;
}

// A per-group join (group_join.cuh) in one turn on the device; a group
// that runs alone goes through run_method like a plain join.
KnnStatus run_group_join(const KnnProblem &p, const KnnGroupLayout *groups, int64_t *neighbors,
                         double *distances, KnnStats *stats, const int32_t *cancel,
                         DeviceContext &ctx) {
  const auto start = std::chrono::steady_clock::now();
  if (const char *why = p.element == KNN_ELEMENT_BIT
                            ? problem_invalid_reason(p, neighbors, distances)
                            : float_problem_invalid_reason(p, neighbors, distances)) {
    ctx.error = why;
    return KNN_INVALID_ARGUMENT;
  }
  if (groups == nullptr || (p.element == KNN_ELEMENT_BIT && p.k > KNN_CUDA_BIT_MAX_K)) {
    ctx.error = groups == nullptr ? "no group layout" : "k above the GPU bit join's";
    return KNN_INVALID_ARGUMENT;
  }
  ctx.cancel = cancel;
  KNN_TRY(select_device(ctx));
  DeviceRuntime &rt = device_runtime();
  std::unique_lock<std::timed_mutex> turn(rt.mutex, std::defer_lock);
  while (!turn.try_lock_for(std::chrono::milliseconds(5))) KNN_TRY(ctx.cancel_point());
  StreamDrain drain(ctx);
  KNN_TRY(setup_context(p, rt, ctx));
  struct MarkUsed {
    DeviceRuntime &rt;
    ~MarkUsed() { mark_runtime_used(rt); }
  } mark_used{rt};

  const JoinTuning tuning;
  const PlainJoin plain = [&](const KnnProblem &sub, int64_t *nb, double *d, KnnStats *s) {
    return run_method(sub, tuning, nb, d, s, ctx);
  };
  KnnStats local{};
  KnnStatus st = group_join(p, *groups, plain, neighbors, distances, &local, ctx);
  if (st == KNN_OK) st = ctx.cancel_point();
  local.device = KNN_DEVICE_GPU;
  std::snprintf(local.device_name, sizeof local.device_name, "%.127s", ctx.prop.name);
  local.seconds_total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (stats != nullptr) *stats = local;
  return st;
}

JoinTuning tuning_from(const KnnCudaTestOptions *o) {
  JoinTuning t;
  if (o == nullptr) return t;
  t.sgemm_filter = o->sgemm_filter != 0;
  if (o->brute_filter == 1) t.brute_filter = BruteFilter::kSgemm;
  if (o->brute_filter == 2) t.brute_filter = BruteFilter::kDgemm;
  if (o->brute_filter == 3) t.brute_filter = BruteFilter::kHalf;
  t.pipeline_tiles = o->brute_pipeline != 0;
  if (o->ti_filter == 1) t.ti.filter = ti::FilterKind::Full;
  if (o->ti_filter == 2) t.ti.filter = ti::FilterKind::Partial;
  if (o->ti_list == 1) t.ti.list = ti::ListKind::Registers;
  if (o->ti_list == 2) t.ti.list = ti::ListKind::Shared;
  if (o->ti_list == 3) t.ti.list = ti::ListKind::Global;
  t.ti.threads_per_query = o->ti_threads_per_query;
  t.ti.dedup = o->ti_keep_duplicates == 0;
  if (o->ti_gemm_assign_min_stride > 0) t.ti.gemm_assign_min_stride = o->ti_gemm_assign_min_stride;
  if (o->ti_landmark_factor > 0) t.ti.landmark_factor = o->ti_landmark_factor;
  return t;
}

// Describes device 0 in buf; KNN_NO_DEVICE (and why, in buf) when there is none.
KnnStatus probe(char *buf, size_t len) {
  char line[256];
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  KnnStatus st = KNN_NO_DEVICE;
  cudaDeviceProp prop{};
  if (err != cudaSuccess) {
    std::snprintf(line, sizeof line, "cudaGetDeviceCount: %s", cudaGetErrorString(err));
  } else if (count == 0) {
    std::snprintf(line, sizeof line, "no CUDA device");
  } else if ((err = cudaGetDeviceProperties(&prop, kDevice)) != cudaSuccess) {
    std::snprintf(line, sizeof line, "cudaGetDeviceProperties: %s", cudaGetErrorString(err));
  } else {
    std::snprintf(line, sizeof line, "%.200s (sm_%d%d, %.1f GiB)", prop.name, prop.major,
                  prop.minor, prop.totalGlobalMem / 1073741824.0);
    st = KNN_OK;
  }
  (void)cudaGetLastError();
  copy_message(buf, len, line);
  return st;
}

KnnStatus run_entry(const KnnProblem *problem, const KnnCudaTestOptions *options,
                    int64_t *neighbors, double *distances, KnnStats *stats,
                    const int32_t *cancel, char *errbuf, size_t errlen) noexcept {
  // The CUDA runtime and driver start threads of their own during the first
  // calls; they inherit this mask, so no signal handler runs on them.
  const SignalsBlocked blocked;
  knn::copy_message(errbuf, errlen, "");
  return guarded("GPU engine", errbuf, errlen, [&]() -> KnnStatus {
    if (problem == nullptr) {
      copy_message(errbuf, errlen, "problem is NULL");
      return KNN_INVALID_ARGUMENT;
    }
    // problem->fault is the job layer's (knn_job.cpp); the module ignores it.
    DeviceContext ctx;
    const KnnStatus st =
        run_join(*problem, tuning_from(options), neighbors, distances, stats, cancel, ctx);
    if (st != KNN_OK)
      copy_message(errbuf, errlen, ctx.error.empty() ? knn_status_name(st) : ctx.error.c_str());
    return st;
  });
}

KnnStatus run_groups_entry(const KnnProblem *problem, const KnnGroupLayout *groups,
                           int64_t *neighbors, double *distances, KnnStats *stats,
                           const int32_t *cancel, char *errbuf, size_t errlen) noexcept {
  const SignalsBlocked blocked;  // see run_entry
  knn::copy_message(errbuf, errlen, "");
  return guarded("GPU engine", errbuf, errlen, [&]() -> KnnStatus {
    if (problem == nullptr) {
      copy_message(errbuf, errlen, "problem is NULL");
      return KNN_INVALID_ARGUMENT;
    }
    DeviceContext ctx;
    const KnnStatus st =
        run_group_join(*problem, groups, neighbors, distances, stats, cancel, ctx);
    if (st != KNN_OK)
      copy_message(errbuf, errlen, ctx.error.empty() ? knn_status_name(st) : ctx.error.c_str());
    return st;
  });
}

// Creates the runtime ahead of the first join (blocking; the job layer
// runs it on a thread of its own).
KnnStatus warm_up(char *errbuf, size_t errlen) {
  DeviceContext ctx;
  KnnStatus st = select_device(ctx);
  if (st == KNN_OK) {
    DeviceRuntime &rt = device_runtime();
    std::lock_guard<std::timed_mutex> turn(rt.mutex);
    st = open_runtime(rt, ctx);
  }
  if (st != KNN_OK) copy_message(errbuf, errlen, ctx.error.c_str());
  return st;
}

// Gives the runtime back now, after the running join if there is one.
KnnStatus release(char *errbuf, size_t errlen) {
  DeviceRuntime &rt = device_runtime();
  std::lock_guard<std::timed_mutex> turn(rt.mutex);
  if (!rt.ready.load() && rt.stream == nullptr && rt.cublas == nullptr) return KNN_OK;
  DeviceContext ctx;
  KnnStatus st = select_device(ctx);
  if (st == KNN_OK) st = release_runtime(rt, ctx);
  if (st != KNN_OK) copy_message(errbuf, errlen, ctx.error.c_str());
  return st;
}

}  // namespace
}  // namespace cuda
}  // namespace knn

extern "C" {

__attribute__((visibility("default"))) int knn_cuda_runtime_ready(void) {
  return knn::cuda::device_runtime().ready.load() ? 1 : 0;
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_warm_up(char *errbuf, size_t errlen) {
  const knn::SignalsBlocked blocked;  // see run_entry
  knn::copy_message(errbuf, errlen, "");
  return knn::guarded("GPU warm-up", errbuf, errlen,
                      [&] { return knn::cuda::warm_up(errbuf, errlen); });
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_release(char *errbuf, size_t errlen) {
  const knn::SignalsBlocked blocked;
  knn::copy_message(errbuf, errlen, "");
  return knn::guarded("GPU release", errbuf, errlen,
                      [&] { return knn::cuda::release(errbuf, errlen); });
}

__attribute__((visibility("default"))) void knn_cuda_set_idle_release(int64_t idle_ms) {
  const knn::SignalsBlocked blocked;  // the keeper thread inherits this mask
  knn::guarded("GPU idle release", nullptr, 0, [&] {
    knn::cuda::set_idle_release(idle_ms);
    return KNN_OK;
  });
}

__attribute__((visibility("default"))) void knn_cuda_shutdown(void) {
  knn::guarded("GPU shutdown", nullptr, 0, [&] {
    knn::cuda::stop_idle_keeper();
    return KNN_OK;
  });
}

__attribute__((visibility("default"))) int knn_cuda_probe(char *buf, size_t len) {
  const knn::SignalsBlocked blocked;  // see run_entry
  return knn::guarded("GPU probe", buf, len, [&] { return knn::cuda::probe(buf, len); }) ==
                 KNN_OK
             ? 1
             : 0;
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_run(
    const KnnProblem *problem, int64_t *neighbors, double *distances, KnnStats *stats,
    const int32_t *cancel, char *errbuf, size_t errlen) {
  return knn::cuda::run_entry(problem, nullptr, neighbors, distances, stats, cancel, errbuf,
                              errlen);
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_run_groups(
    const KnnProblem *problem, const KnnGroupLayout *groups, int64_t *neighbors,
    double *distances, KnnStats *stats, const int32_t *cancel, char *errbuf, size_t errlen) {
  return knn::cuda::run_groups_entry(problem, groups, neighbors, distances, stats, cancel,
                                     errbuf, errlen);
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_run_tuned(
    const KnnProblem *problem, const KnnCudaTestOptions *options, int64_t *neighbors,
    double *distances, KnnStats *stats, const int32_t *cancel, char *errbuf, size_t errlen) {
  return knn::cuda::run_entry(problem, options, neighbors, distances, stats, cancel, errbuf,
                              errlen);
}

// The entries are found with dlsym: their types must be the headers'.
static_assert(std::is_same<decltype(&knn_cuda_probe), knn_cuda_probe_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_run), knn_cuda_run_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_run_tuned), knn_cuda_run_tuned_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_run_groups), knn_cuda_run_groups_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_runtime_ready), knn_cuda_runtime_ready_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_warm_up), knn_cuda_warm_up_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_release), knn_cuda_release_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_set_idle_release), knn_cuda_set_idle_release_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_shutdown), knn_cuda_shutdown_fn>::value, "");

}  // extern "C"
