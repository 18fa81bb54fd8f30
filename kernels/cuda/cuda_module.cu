// cuda_module.cu -- the entry points of knn_gpu_cuda.so (see
// ../knn_cuda_module.h): knn_cuda_probe, knn_cuda_run (and which float16
// problems it takes as they are: knn_cuda_takes_float16), knn_cuda_range,
// the runtime's warm-up, release, idle timer and release notify, plus the tests'
// knn_cuda_run_tuned (knn_cuda_testing.h).
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
// A join runs on the GPUs its problem lists (knn_gpu.devices), split by
// query rows where there are several (multi_device.cuh), else on device 0;
// CUDA_VISIBLE_DEVICES picks which GPUs those are.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <mutex>
#include <string>
#include <thread>

#include "../signal_free_thread.h"
#include "../entry_guard.h"
#include "../knn_cuda_module.h"
#include "../knn_vocabulary.h"
#include "../output_prefault.h"
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
#include "multi_device.cuh"
#include "peer_rows.cuh"
#include "range_join.cuh"
#include "small_join.cuh"

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

// Lends the runtime to the join (its mutex held) and sets the join's
// memory budget: what is free, shared evenly by the join's engines on this
// GPU (`sharing`), and at most the problem's limit (each GPU's).
KnnStatus setup_context(const KnnProblem &p, int sharing, DeviceRuntime &rt,
                        DeviceContext &ctx) {
  KNN_TRY(open_runtime(rt, ctx));
  ctx.prop = rt.prop;
  ctx.stream = rt.stream;
  ctx.cublas = rt.cublas;
  ctx.staging = rt.staging.get();
  CUBLAS_CHECK(ctx, cublasSetStream(ctx.cublas, ctx.stream));
  // Pedantic math: the prescribed precision only (no TF32, no reduced
  // precision emulation), which the GEMM filter's error bounds assume.
  CUBLAS_CHECK(ctx, cublasSetMathMode(ctx.cublas, CUBLAS_PEDANTIC_MATH));
  KNN_TRY(set_pool_hold(rt, p.gpu_memory_limit <= 0, ctx));

  // What is free on the device, plus what the pools hold unused from
  // earlier joins: the default pool's (cudaMallocAsync takes that first)
  // and the shared rows' (a split's; an allocation that does not fit
  // beside it gives it back, device_buffer.cuh).
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(ctx, cudaMemGetInfo(&free_bytes, &total_bytes));
  for (cudaMemPool_t pool : {rt.pool, shared_rows_pool(rt.device, false)}) {
    if (pool == nullptr) continue;
    uint64_t reserved = 0, used = 0;
    CUDA_CHECK(ctx, cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    CUDA_CHECK(ctx, cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    free_bytes += static_cast<size_t>(reserved - std::min(used, reserved));
  }
  size_t budget =
      static_cast<size_t>(static_cast<double>(free_bytes) * 0.9 / std::max(1, sharing));
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

KnnStatus run_method(const KnnProblem &p, const JoinTuning &tuning, int64_t *neighbors,
                     double *distances, KnnStats *stats, DeviceContext &ctx);

// Whether a split join's shares run on the clusters of the whole set
// (ti_join_share): TI self-joins of float rows.
bool shares_clusters(const KnnProblem &p) {
  return p.element == KNN_ELEMENT_FLOAT32 && method_for(p) == KNN_METHOD_TI &&
         p.queries == p.targets && p.n_queries == p.n_targets && p.n_queries > 0;
}

// A share of a TI self-join (ctx.query_first, ctx.query_count) on the
// whole set's clusters; where ti_join_share declines, the share's rows as
// a problem of their own, through the usual methods.
KnnStatus run_shared_ti(const KnnProblem &p, const JoinTuning &tuning, int64_t *neighbors,
                        double *distances, KnnStats *stats, DeviceContext &ctx) {
  bool declined = false;
  const KnnStatus st = ti_join_share(p, tuning, neighbors, distances, stats, &declined, ctx);
  if (!declined) return st;
  const int64_t first = ctx.query_first, count = ctx.query_count;
  ctx.query_first = 0;
  ctx.query_count = -1;
  *stats = KnnStats{};
  return run_method(query_share(p, first, count, ctx.device), tuning, neighbors + first * p.k,
                    distances + first * p.k, stats, ctx);
}

// Runs the join's method on the prepared context; stats are the method's.
KnnStatus run_method(const KnnProblem &p, const JoinTuning &tuning, int64_t *neighbors,
                     double *distances, KnnStats *stats, DeviceContext &ctx) {
  // Only brute force offers its targets to a split's shared upload
  // (peer_rows.cuh); every other path says at once that it will not.
  const bool brute = p.element != KNN_ELEMENT_BIT && ctx.query_count < 0 &&
                     p.n_queries > 0 && p.n_targets > 0 &&
                     (p.element == KNN_ELEMENT_FLOAT16 || method_for(p) != KNN_METHOD_TI) &&
                     !small_join_applies(p, tuning, ctx);
  if (!brute) decline_peer_rows(ctx);
  // Only a TI share offers its cluster assignment and its points
  // (ti_join_share).
  if (ctx.query_count < 0) {
    decline_peer_assign(ctx);
    decline_peer_points(ctx);
  }
  if (ctx.query_count >= 0) return run_shared_ti(p, tuning, neighbors, distances, stats, ctx);
  if (p.element == KNN_ELEMENT_BIT) return bit_join(p, neighbors, distances, stats, ctx);
  if (p.n_queries == 0 || p.n_targets == 0) {
    fill_padding(p.n_queries, p.k, neighbors, distances);
    stats->method = KNN_METHOD_BRUTE;
    std::snprintf(stats->variant, sizeof stats->variant, "empty");
    return KNN_OK;
  }
  // Float16 rows: brute force, which widens them on the device (TI reads
  // float32 host rows; the job gives it those: knn_cuda_takes_float16).
  if (p.element == KNN_ELEMENT_FLOAT16 || method_for(p) != KNN_METHOD_TI) {
    // Tiny joins: one upload, one selection, one download (small_join.cu).
    if (!brute) return small_join(p, neighbors, distances, stats, ctx);
    return brute_force_join(p, tuning, neighbors, distances, stats, ctx);
  }
  // TI never hands a join to brute force for lack of memory: it runs out
  // of core, in parts down to the smallest (ti_out_of_core.cu); a budget
  // below those ends in KNN_OUT_OF_MEMORY with the join's message.
  return ti_join(p, tuning, neighbors, distances, stats, ctx);
}

// The split's test hook (knn_cuda_testing.h): the chosen engine, with its
// runtime borrowed and some memory of its own, waits (stopping on a
// cancel) and then fails, if asked to.
struct SplitTestHook {
  int engine = 0;  // 1-based; 0: none
  int wait_ms = 0;
  bool fail = false;
};

KnnStatus run_split_test_hook(const SplitTestHook &hook, const Engine &engine,
                              DeviceContext &ctx) {
  if (hook.engine != engine.index + 1) return KNN_OK;
  DeviceBuffer<unsigned char> held;
  KNN_TRY(held.allocate(ctx, size_t{64} << 20, "the split test hook"));
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(hook.wait_ms);
  while (std::chrono::steady_clock::now() < until) {
    KNN_TRY(ctx.cancel_point());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!hook.fail) return KNN_OK;
  ctx.error = "forced failure (split test hook)";
  return KNN_DEVICE_ERROR;
}

// Joins of this process that may run on one GPU at once, each on its own
// runtime replica (stream, cuBLAS handle, staging) of the GPU's one
// context (knn_cuda_set_concurrent_joins; the GPU service's setting). A
// backend runs one join at a time: 1.
std::atomic<int> concurrent_joins{1};

// Runs work() with the runtime of `device` lent to ctx: the first free of
// replicas [replica, replica + replicas), or, while all are busy, the first
// as it comes free (the turn's wait answers a cancel); the join's budget
// set, the stream drained before the next join's turn, the runtime marked
// used at the end.
template <typename Work>
KnnStatus with_device_turn(const KnnProblem &p, int device, int replica, int sharing,
                           const int32_t *cancel, DeviceContext &ctx, Work &&work,
                           int replicas = 1) {
  ctx.cancel = cancel;
  KNN_TRY(select_device(ctx, device));
  replicas = std::max(1, std::min(replicas, kMaxReplicas - replica));
  DeviceRuntime *rt = nullptr;
  std::unique_lock<std::timed_mutex> turn;
  while (rt == nullptr) {
    for (int r = replica; r < replica + replicas && rt == nullptr; r++) {
      DeviceRuntime &candidate = device_runtime(device, r);
      std::unique_lock<std::timed_mutex> attempt(candidate.mutex, std::try_to_lock);
      if (!attempt.owns_lock()) continue;
      rt = &candidate;
      turn = std::move(attempt);
    }
    if (rt != nullptr) break;
    DeviceRuntime &first = device_runtime(device, replica);
    std::unique_lock<std::timed_mutex> attempt(first.mutex, std::defer_lock);
    if (attempt.try_lock_for(std::chrono::milliseconds(5))) {
      rt = &first;
      turn = std::move(attempt);
    } else {
      KNN_TRY(ctx.cancel_point());
    }
  }
  StreamDrain drain(ctx);  // declared after the lock: drains before the next join's turn
  KNN_TRY(setup_context(p, sharing, *rt, ctx));
  struct MarkUsed {  // on every path: the idle keeper counts from the join's end
    DeviceRuntime &rt;
    ~MarkUsed() { mark_runtime_used(rt); }
  } mark_used{*rt};
  return work();
}

// The GPU of the entries that use one (range and grouped joins): the first
// of knn_gpu.devices' list.
int first_listed_device(const KnnProblem &p) {
  return p.n_devices > 0 ? p.devices[0] : kFirstDevice;
}

// One engine's rows on the calling thread: waits for the engine's runtime
// (still answering a cancel), borrows it and runs the method.
KnnStatus run_engine(const KnnProblem &p, const Engine &engine, const JoinTuning &tuning,
                     const SplitTestHook &hook, int64_t *neighbors, double *distances,
                     KnnStats *stats, const int32_t *cancel, DeviceContext &ctx,
                     int replicas = 1) {
  const auto start = std::chrono::steady_clock::now();
  return with_device_turn(p, engine.device, engine.replica, engine.sharing, cancel, ctx,
                          [&]() -> KnnStatus {
    KNN_TRY(run_split_test_hook(hook, engine, ctx));
    // The rows it answers: a share of the problem's (ctx.query_count), or all.
    const int64_t answered = ctx.query_count >= 0 ? ctx.query_count : p.n_queries;
    KnnStats local{};
    KnnStatus st = run_method(p, tuning, neighbors, distances, &local, ctx);
    if (st == KNN_OK) st = ctx.cancel_point();
    local.device = KNN_DEVICE_GPU;
    std::snprintf(local.device_name, sizeof local.device_name, "%.127s", ctx.prop.name);
    local.pairs = answered * p.n_targets;
    local.seconds_total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    local.n_devices = 1;
    local.device_work[0].device = engine.device;
    local.device_work[0].queries = answered;
    local.device_work[0].seconds = local.seconds_total;
    if (stats != nullptr) *stats = local;
    return st;
  }, replicas);
}

// What splitting could save: every pair's distance, in dimensions.
double split_work(const KnnProblem &p) {
  return static_cast<double>(p.n_queries) * static_cast<double>(p.n_targets) * p.dim;
}

KnnStatus run_join(const KnnProblem &p, const JoinTuning &tuning, const SplitTestHook &hook,
                   int64_t *neighbors, double *distances, KnnStats *stats,
                   const int32_t *cancel, DeviceContext &ctx) {
  // Float32 rows, float16 rows (brute force: run_method), or bit rows
  // (bit_join.cu).
  if (const char *why = problem_invalid_reason(p, neighbors, distances)) {
    ctx.error = why;
    return KNN_INVALID_ARGUMENT;
  }
  ctx.cancel = cancel;
  SplitPlan plan;
  KNN_TRY(plan_engines(p, split_work(p), &plan, ctx));
  int with_rows = 0, only = 0;
  for (int i = 0; i < plan.n_engines; i++)
    if (plan.engines[i].n_queries > 0) {
      with_rows++;
      only = i;
    }
  if (with_rows <= 1) {  // one engine, on this thread, with the whole GPU
    Engine alone = plan.engines[only];
    alone.sharing = 1;
    // Concurrent joins of one process each take a replica of their own,
    // only with a budget of their own (the admission's share): without one
    // each would plan for all the free memory.
    const int replicas = p.gpu_memory_limit > 0 ? concurrent_joins.load() : 1;
    return run_engine(p, alone, tuning, hook, neighbors, distances, stats, cancel, ctx,
                      replicas);
  }
  // Whether the engines share the whole set's clusters is decided for the
  // whole join (under AUTO a share alone may look small enough for brute
  // force); a share that runs as a problem of its own chooses for itself.
  const KnnProblem &whole = p;
  const bool shared = shares_clusters(whole);
  // The engines together write the result faster than its fresh pages
  // fault in one at a time: they are made present meanwhile.
  const size_t slots = static_cast<size_t>(p.n_queries) * p.k;
  const knn::OutputPrefault prefault(
      neighbors, slots * sizeof *neighbors, distances, slots * sizeof *distances,
      static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 4, 1u, 8u)));
  return run_split(
      whole, plan,
      [&](const Engine &engine, KnnStats *share_stats, const int32_t *stop,
          DeviceContext &engine_ctx) {
        if (shared) {  // the whole problem, the share marked on the context
          engine_ctx.query_first = engine.first_query;
          engine_ctx.query_count = engine.n_queries;
          return run_engine(whole, engine, tuning, hook, neighbors, distances, share_stats, stop,
                            engine_ctx);
        }
        const KnnProblem share =
            query_share(whole, engine.first_query, engine.n_queries, engine.device);
        return run_engine(share, engine, tuning, hook, neighbors + engine.first_query * p.k,
                          distances + engine.first_query * p.k, share_stats, stop, engine_ctx);
      },
      stats, cancel, ctx);
}

// A range job (range_join.cu): float32 rows (the job layer widens
// float16) or bit rows, its pairs to sink.
KnnStatus run_range(const KnnProblem &p, knn_cuda_pair_sink_fn sink, void *sink_context,
                    KnnStats *stats, const int32_t *cancel, DeviceContext &ctx) {
  if (const char *why = range_problem_invalid_reason(p)) {
    ctx.error = why;
    return KNN_INVALID_ARGUMENT;
  }
  if (sink == nullptr) {
    ctx.error = "a range join needs a sink for its pairs";
    return KNN_INVALID_ARGUMENT;
  }
  const auto start = std::chrono::steady_clock::now();
  return with_device_turn(p, first_listed_device(p), 0, 1, cancel, ctx, [&]() -> KnnStatus {
    KnnStats local{};
    KnnStatus st = range_join(p, sink, sink_context, &local, ctx);
    if (st == KNN_OK) st = ctx.cancel_point();
    local.device = KNN_DEVICE_GPU;
    std::snprintf(local.device_name, sizeof local.device_name, "%.127s", ctx.prop.name);
    local.pairs = p.n_queries * p.n_targets;
    local.seconds_total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (stats != nullptr) *stats = local;
    return st;
  });
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
  return with_device_turn(p, first_listed_device(p), 0, 1, cancel, ctx, [&]() -> KnnStatus {
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
  });
}

// knn_cuda_takes_float16: the problems whose float16 rows run_method
// sends to brute force anyway (TI, asked for or AUTO's choice, wants
// float32 rows from the caller).
bool takes_float16(const KnnProblem &p) {
  return p.element == KNN_ELEMENT_FLOAT16 && p.range == KNN_RANGE_NONE &&
         in_range(enum_value(p.method), KNN_METHOD_AUTO, KNN_METHOD_BRUTE) &&
         in_range(enum_value(p.metric), KNN_METRIC_L2, KNN_METRIC_L1) &&
         method_for(p) == KNN_METHOD_BRUTE;
}

JoinTuning tuning_from(const KnnCudaTestOptions *o) {
  JoinTuning t;
  if (o == nullptr) return t;
  t.sgemm_filter = o->sgemm_filter != 0;
  if (o->brute_filter == 1) t.brute_filter = BruteFilter::kSgemm;
  if (o->brute_filter == 2) t.brute_filter = BruteFilter::kDgemm;
  if (o->brute_filter == 3) t.brute_filter = BruteFilter::kHalf;
  t.pipeline_tiles = o->brute_pipeline != 0;
  t.large_k = o->brute_no_large_k == 0;
  t.small_join = o->no_small_join == 0;
  if (o->ti_filter == 1) t.ti.filter = ti::FilterKind::Full;
  if (o->ti_filter == 2) t.ti.filter = ti::FilterKind::Partial;
  if (o->ti_list == 1) t.ti.list = ti::ListKind::Registers;
  if (o->ti_list == 2) t.ti.list = ti::ListKind::Shared;
  if (o->ti_list == 3) t.ti.list = ti::ListKind::Global;
  t.ti.threads_per_query = o->ti_threads_per_query;
  t.ti.dedup = o->ti_keep_duplicates == 0;
  if (o->ti_gemm_assign_min_stride > 0) t.ti.gemm_assign_min_stride = o->ti_gemm_assign_min_stride;
  if (o->ti_landmark_factor > 0) t.ti.landmark_factor = o->ti_landmark_factor;
  t.ti.order_probe = o->ti_order_probe;
  t.ti.pinning_hook = o->ti_pinning_hook;
  t.ti.shared_probe = o->ti_shared_probe;
  t.ti.upload_slice_fail = o->ti_upload_slice_fail;
  t.ti.level1_probe = o->ti_level1_probe;
  t.ti.level1_fail = o->ti_level1_fail;
  t.ti.shared_pool_late = o->ti_shared_pool_late;
  return t;
}

SplitTestHook hook_from(const KnnCudaTestOptions *o) {
  SplitTestHook h;
  if (o == nullptr) return h;
  h.engine = std::max(0, o->split_test_engine);
  h.wait_ms = std::max(0, o->split_test_wait_ms);
  h.fail = o->split_test_fail != 0;
  return h;
}

// Describes device 0 in buf (and how many GPUs there are, when more than
// one); KNN_NO_DEVICE (and why, in buf) when there is none.
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
  } else if ((err = cudaGetDeviceProperties(&prop, kFirstDevice)) != cudaSuccess) {
    std::snprintf(line, sizeof line, "cudaGetDeviceProperties: %s", cudaGetErrorString(err));
  } else {
    const int used = std::snprintf(line, sizeof line, "%.200s (sm_%d%d, %.1f GiB)", prop.name,
                                   prop.major, prop.minor, prop.totalGlobalMem / 1073741824.0);
    if (count > 1 && used > 0 && static_cast<size_t>(used) < sizeof line)
      std::snprintf(line + used, sizeof line - used, " + %d more GPU%s", count - 1,
                    count > 2 ? "s" : "");
    st = KNN_OK;
  }
  (void)cudaGetLastError();
  copy_message(buf, len, line);
  return st;
}

// What every entry does around its work: signals blocked (the CUDA runtime
// and driver start threads of their own during the first calls; they
// inherit this mask, so no signal handler runs on them), no exception out
// (guarded), a NULL problem refused, and a failure's message in errbuf.
template <typename Work>
KnnStatus entry(const char *what, const KnnProblem *problem, char *errbuf, size_t errlen,
                Work &&work) noexcept {
  const SignalsBlocked blocked;
  knn::copy_message(errbuf, errlen, "");
  return guarded(what, errbuf, errlen, [&]() -> KnnStatus {
    if (problem == nullptr) {
      copy_message(errbuf, errlen, "problem is NULL");
      return KNN_INVALID_ARGUMENT;
    }
    DeviceContext ctx;
    const KnnStatus st = work(*problem, ctx);
    if (st != KNN_OK)
      copy_message(errbuf, errlen, ctx.error.empty() ? knn_status_name(st) : ctx.error.c_str());
    return st;
  });
}

KnnStatus run_entry(const KnnProblem *problem, const KnnCudaTestOptions *options,
                    int64_t *neighbors, double *distances, KnnStats *stats,
                    const int32_t *cancel, char *errbuf, size_t errlen) noexcept {
  // problem->fault is the job layer's (knn_job.cpp); the module ignores it.
  return entry("GPU engine", problem, errbuf, errlen, [&](const KnnProblem &p, DeviceContext &ctx) {
    return run_join(p, tuning_from(options), hook_from(options), neighbors, distances, stats,
                    cancel, ctx);
  });
}

KnnStatus range_entry(const KnnProblem *problem, knn_cuda_pair_sink_fn sink, void *sink_context,
                      KnnStats *stats, const int32_t *cancel, char *errbuf,
                      size_t errlen) noexcept {
  return entry("GPU range join", problem, errbuf, errlen,
               [&](const KnnProblem &p, DeviceContext &ctx) {
                 return run_range(p, sink, sink_context, stats, cancel, ctx);
               });
}

KnnStatus run_groups_entry(const KnnProblem *problem, const KnnGroupLayout *groups,
                           int64_t *neighbors, double *distances, KnnStats *stats,
                           const int32_t *cancel, char *errbuf, size_t errlen) noexcept {
  return entry("GPU engine", problem, errbuf, errlen, [&](const KnnProblem &p, DeviceContext &ctx) {
    return run_group_join(p, groups, neighbors, distances, stats, cancel, ctx);
  });
}

// Creates the runtime ahead of the first join (blocking; the job layer
// runs it on a thread of its own).
KnnStatus warm_up(char *errbuf, size_t errlen) {
  DeviceContext ctx;
  KnnStatus st = select_device(ctx, kFirstDevice);
  if (st == KNN_OK) {
    DeviceRuntime &rt = device_runtime(kFirstDevice);
    std::lock_guard<std::timed_mutex> turn(rt.mutex);
    st = open_runtime(rt, ctx);
  }
  if (st != KNN_OK) copy_message(errbuf, errlen, ctx.error.c_str());
  return st;
}

// Gives every runtime back now, after the running join if there is one.
KnnStatus release(char *errbuf, size_t errlen) {
  DeviceContext ctx;
  const KnnStatus st = release_all_runtimes(ctx);
  if (st != KNN_OK) copy_message(errbuf, errlen, ctx.error.c_str());
  return st;
}

}  // namespace
}  // namespace cuda
}  // namespace knn

extern "C" {

__attribute__((visibility("default"))) int knn_cuda_runtime_ready(void) {
  return knn::cuda::runtime_ready(knn::cuda::kFirstDevice) ? 1 : 0;
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_warm_up(char *errbuf, size_t errlen) {
  const knn::SignalsBlocked blocked;  // see entry()
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

__attribute__((visibility("default"))) void knn_cuda_set_concurrent_joins(int32_t n) {
  knn::cuda::concurrent_joins.store(std::max(1, std::min<int32_t>(n, knn::cuda::kMaxReplicas)));
}

__attribute__((visibility("default"))) void knn_cuda_shutdown(void) {
  knn::guarded("GPU shutdown", nullptr, 0, [&] {
    knn::cuda::stop_idle_keeper();
    return KNN_OK;
  });
}

__attribute__((visibility("default"))) void knn_cuda_set_release_notify(
    knn_cuda_release_notify_fn notify) {
  knn::cuda::set_release_notify(notify);
}

__attribute__((visibility("default"))) uint64_t knn_cuda_interface(void) {
  return knn_cuda_interface_id();
}

__attribute__((visibility("default"))) int knn_cuda_probe(char *buf, size_t len) {
  const knn::SignalsBlocked blocked;  // see entry()
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

__attribute__((visibility("default"))) int knn_cuda_takes_float16(const KnnProblem *problem) {
  return problem != nullptr && knn::cuda::takes_float16(*problem) ? 1 : 0;
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_range(
    const KnnProblem *problem, knn_cuda_pair_sink_fn sink, void *sink_context, KnnStats *stats,
    const int32_t *cancel, char *errbuf, size_t errlen) {
  return knn::cuda::range_entry(problem, sink, sink_context, stats, cancel, errbuf, errlen);
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

__attribute__((visibility("default"))) int knn_cuda_test_device_count(void) {
  const knn::SignalsBlocked blocked;  // see entry()
  int count = 0;
  knn::guarded("GPU count", nullptr, 0, [&] {
    count = knn::cuda::visible_devices(nullptr);
    return KNN_OK;
  });
  return count;
}

// An attribute's bytes summed over the GPU's default pool and its pool of
// shared rows (where there is one); -1 when the device does not exist.
static int64_t pool_bytes(int device, cudaMemPoolAttr attribute) {
  const knn::SignalsBlocked blocked;
  int64_t bytes = -1;
  knn::guarded("GPU pool", nullptr, 0, [&] {
    if (device < 0 || device >= knn::cuda::visible_devices(nullptr)) return KNN_NO_DEVICE;
    cudaMemPool_t pool;
    uint64_t value = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, attribute, &value) == cudaSuccess)
      bytes = static_cast<int64_t>(value);
    uint64_t shared_value = 0;
    if (cudaMemPool_t shared = knn::cuda::shared_rows_pool(device, false))
      if (bytes >= 0 && cudaMemPoolGetAttribute(shared, attribute, &shared_value) == cudaSuccess)
        bytes += static_cast<int64_t>(shared_value);
    (void)cudaGetLastError();
    return KNN_OK;
  });
  return bytes;
}

__attribute__((visibility("default"))) int64_t knn_cuda_test_pool_used(int device) {
  return pool_bytes(device, cudaMemPoolAttrUsedMemCurrent);
}

__attribute__((visibility("default"))) int64_t knn_cuda_test_pool_reserved(int device) {
  return pool_bytes(device, cudaMemPoolAttrReservedMemCurrent);
}

// The entries are found with dlsym: their types must be the headers'.
static_assert(std::is_same<decltype(&knn_cuda_probe), knn_cuda_probe_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_run), knn_cuda_run_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_run_tuned), knn_cuda_run_tuned_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_range), knn_cuda_range_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_takes_float16), knn_cuda_takes_float16_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_run_groups), knn_cuda_run_groups_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_runtime_ready), knn_cuda_runtime_ready_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_warm_up), knn_cuda_warm_up_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_interface), knn_cuda_interface_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_release), knn_cuda_release_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_set_idle_release), knn_cuda_set_idle_release_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_set_concurrent_joins), knn_cuda_set_concurrent_joins_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_shutdown), knn_cuda_shutdown_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_set_release_notify), knn_cuda_set_release_notify_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_test_device_count), knn_cuda_test_device_count_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_test_pool_used), knn_cuda_test_pool_used_fn>::value, "");
static_assert(std::is_same<decltype(&knn_cuda_test_pool_reserved), knn_cuda_test_pool_used_fn>::value, "");

}  // extern "C"
