// ti_join.cu -- Sweet KNN on the GPU: the clustered triangle-inequality
// join, from host arrays to host results (knn::cuda::ti_join).
//
// Stages (each in its own file):
//   upload + padding        here
//   duplicate groups        ti_dedup.cu
//   clusters                ti_clustering.cu     (section III-A)
//   level-1 filter          ti_filter_level1.cu  (III-B)
//   level-2 filter          ti_filter_level2.cu  (III-C, IV)
//   rows, exclusion, float8 ti_output.cu
//
// A join whose points, clusters and lists do not fit the memory budget
// runs in parts instead (ti_out_of_core.cu), never as brute force.
//
// One GPU's share of a self-join split across GPUs (ctx.query_first and
// query_count, ti_join_share) clusters the whole set as here and filters
// the share's queries only: whole clusters where every engine agrees, else
// its rows (ti_query_share.cu).
//
// KNN_TI_PHASES=1 in the environment prints each stage's wall time to
// stderr (a synchronisation after each; for measuring only).
// A one-GPU join with a large output runs its level 2 and output as a
// share divided by clusters does, writing rows beside level 2
// (ti_cluster_share.cuh: batched_writes_pay; KNN_TI_BATCHED_WRITES=0/1
// forces it off or on).
//
// The adaptive scheme of IV-D is decided here: the partial filter when
// k / dim exceeds a ratio (TiOptions says why it is off by default), the
// place of the top-k lists from the device's shared memory and register
// limits, and the threads per query from the number of distinct queries and
// the concurrency of the level-2 kernel.
//
// Exactness: every distance is computed by knn_distance.h (device build
// with --fmad=false), pruning keeps ties (ti_filter_level2.cu), and the
// results are ordered by (value, row) = knn_result_before. Inputs with
// non-finite values, or so large that a distance could overflow (the
// bounds need finite distances), go to brute_force_join instead.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../exclusion_runs.h"
#include "../problem_check.h"
#include "../rounding_margin.h"
#include "../value_range.h"
#include "ti_common.cuh"
#include "host_transfer.cuh"
#include "peer_rows.cuh"
#include "share_vote.cuh"
#include "ti_cluster_share.cuh"
#include "ti_distance.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Copies rows of `dim` floats into rows of `stride` floats (zero padding)
// and records the largest |value| (as float bits: non-negative floats order
// like their bits, NaN above +inf).
__global__ void pad_rows_kernel(const float *raw, int64_t n, int dim, int stride, float *out,
                                unsigned *max_abs_bits) {
  unsigned local = 0;
  const int64_t total = n * stride;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / stride;
    int c = (int)(i % stride);
    float v = c < dim ? raw[r * dim + c] : 0.0f;
    if (raw != out) out[i] = v;
    local = max(local, __float_as_uint(fabsf(v)));
  }
  for (int off = kWarp / 2; off > 0; off /= 2)
    local = max(local, __shfl_down_sync(kFullMask, local, off));
  if (threadIdx.x % kWarp == 0) atomicMax(max_abs_bits, local);
}

// keys[i] = i: the rows' own numbers, as keys.
__global__ void row_number_keys_kernel(int64_t n, int64_t *keys) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    keys[i] = i;
}

}  // namespace

namespace {

// Host rows [first, first + count) of `dim` floats into the same rows of
// `padded` (`stride` floats a row, zero padding), their largest |value|
// recorded at max_abs_bits. Through the pinned staging, on several host
// threads (host_transfer.cuh), once the allocation is usable from the
// staging's stream.
KnnStatus upload_padded_rows(const float *host, int64_t first, int64_t count, int dim,
                             int stride, float *padded, unsigned *max_abs_bits,
                             MemoryBudget &mem, DeviceContext &ctx) {
  if (count == 0) return KNN_OK;
  float *to = padded + first * stride;
  const float *from = host + first * dim;
  DeviceBuffer<float> raw;  // rows as they come, where they need padding
  if (dim != stride) KNN_TRY(mem.allocate(ctx, raw, (size_t)count * dim, "points"));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  float *in = dim == stride ? to : raw.get();
  KNN_TRY(upload_to_device(ctx, in, from, (size_t)count * dim * sizeof(float)));
  pad_rows_kernel<<<grid_for(count * stride, 256 * 8), 256, 0, ctx.stream>>>(
      in, count, dim, stride, to, max_abs_bits);
  CUDA_CHECK_LAUNCH(ctx, "pad_rows_kernel");
  mem.release(raw);
  return KNN_OK;
}

}  // namespace

KnnStatus upload_points(const float *host, int64_t n, int dim, int stride, UploadedSet &out,
                        unsigned *max_abs_bits, MemoryBudget &mem, DeviceContext &ctx) {
  KNN_TRY(mem.allocate(ctx, out.padded, (size_t)n * stride, "points"));
  KNN_TRY(upload_padded_rows(host, 0, n, dim, stride, out.padded.get(), max_abs_bits, mem, ctx));
  out.points.x = out.padded.get();
  out.points.n = n;
  out.points.dim = dim;
  out.points.stride = stride;
  return KNN_OK;
}

KnnStatus read_max_abs(const unsigned *max_abs_bits, float *out, DeviceContext &ctx) {
  unsigned bits = 0;
  CUDA_CHECK(ctx, cudaMemcpyAsync(&bits, max_abs_bits, sizeof bits, cudaMemcpyDeviceToHost,
                                  ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  std::memcpy(out, &bits, sizeof bits);
  return KNN_OK;
}

KnnStatus release_join_memory(KnnStatus status, DeviceContext &ctx) {
  const Clock::time_point t0 = Clock::now();
  const cudaError_t err = cudaStreamSynchronize(ctx.stream);
  const Clock::time_point t1 = Clock::now();
  // Under a memory limit the pools give back what the join freed now;
  // without one they keep it for the next join (set_pool_hold).
  cudaMemPool_t pool;
  if (!ctx.hold_pool && cudaDeviceGetMemPool(&pool, ctx.device) == cudaSuccess)
    (void)cudaMemPoolTrimTo(pool, 0);
  if (cudaMemPool_t shared = ctx.hold_pool ? nullptr : shared_rows_pool(ctx.device, false))
    (void)cudaMemPoolTrimTo(shared, 0);
  (void)cudaGetLastError();
  // KNN_TI_PHASES=1: what the end of the join takes (the frees' wait, the
  // trim), outside the phases line.
  static const bool phases = std::getenv("KNN_TI_PHASES") != nullptr &&
                             std::getenv("KNN_TI_PHASES")[0] == '1';
  if (phases)
    std::fprintf(stderr, "ti release (GPU %d): wait %.4f trim %.4f\n", ctx.device,
                 seconds_between(t0, t1), seconds_between(t1, Clock::now()));
  if (status == KNN_OK && err != cudaSuccess)
    return record_failure(ctx, err, "cudaStreamSynchronize", __FILE__, __LINE__);
  return status;
}

int32_t landmarks_for(double factor, int64_t n) {
  double m = std::floor(factor * std::sqrt((double)n) + 0.5);
  return (int32_t)std::max<double>(1.0, std::min<double>(m, (double)n));
}

ListPlace choose_list_place(const DeviceContext &ctx, int kprime, ListKind forced) {
  auto registers = [&]() {
    return kprime <= 16 ? ListPlace::Registers16 : ListPlace::Registers32;
  };
  switch (forced) {
    case ListKind::Registers:
      return kprime <= 32 ? registers() : ListPlace::Global;
    case ListKind::Shared: return ListPlace::Shared;
    case ListKind::Global: return ListPlace::Global;
    default: break;
  }
  // IV-D2: th1 = shared memory per SM / max threads per SM,
  //        th2 = registers a thread may hold (255) * 4 bytes.
  const size_t entry = sizeof(float) + sizeof(int32_t);
  const size_t bytes = (size_t)kprime * entry;
  const size_t th1 = ctx.prop.sharedMemPerMultiprocessor /
                     std::max(1, ctx.prop.maxThreadsPerMultiProcessor);
  const size_t th2 = 255 * 4;
  if (bytes <= th1) return ListPlace::Shared;
  // Register lists are instantiated up to 32 entries (compile-time size).
  if (bytes < th2 && kprime <= 32) return registers();
  return ListPlace::Global;
}

const char *place_name(ListPlace p) {
  switch (p) {
    case ListPlace::Registers16:
    case ListPlace::Registers32: return "registers";
    case ListPlace::Shared: return "shared";
    default: return "global";
  }
}

namespace {

// A split TI self-join's engines upload the points once between them
// (DeviceContext::peer_points, peer_rows.cuh): each uploads its slice of
// the rows from the host, padded, and copies the other slices from the
// other GPUs; the largest |value| is then taken over all of them, so
// every engine holds what upload_points would have made, bit for bit.
// A slice that will not come (its engine failed, maybe for want of memory,
// which that engine then answers another way) is uploaded from the host
// instead. *shared false: nothing was uploaded (the caller uploads all
// rows). KNN_TI_SHARED_UPLOAD=0 declines, for A/B benchmarks and tests;
// fail_own_slice and pool_made_after are the engine tests' hooks
// (TiOptions::upload_slice_fail, shared_pool_late).
KnnStatus upload_points_shared(const float *host, int64_t n, int dim, int stride,
                               PeerRows &peers, int engine, int element, const int64_t *keys,
                               bool fail_own_slice, bool pool_made_after, UploadedSet &out,
                               unsigned *max_abs_bits, bool *shared, MemoryBudget &mem,
                               DeviceContext &ctx) {
  *shared = false;
  const char *forced = std::getenv("KNN_TI_SHARED_UPLOAD");
  if (n < 2 || (forced != nullptr && forced[0] == '0')) {
    peers.decline(engine);
    return KNN_OK;
  }
  // Read by the other GPUs: from the pool of shared rows (device_runtime.cuh),
  // or the default pool where it could not be made (the offer names the
  // pool: another join may make it meanwhile, as the hook does).
  cudaMemPool_t pool = pool_made_after ? nullptr : shared_rows_pool(ctx.device, true);
  KNN_TRY(mem.allocate(ctx, out.padded, (size_t)n * stride, "points", pool));
  if (pool_made_after) (void)shared_rows_pool(ctx.device, true);
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));  // usable from the other GPUs
  KNN_TRY(peers.offer(ctx, engine, out.padded.get(), n, stride, host, element, keys, shared,
                      pool));
  if (!*shared) {
    mem.release(out.padded);
    return KNN_OK;
  }
  PeerRowsTurn turn;  // (declared after out.padded's owner: done with it first)
  const int me = peers.member(engine);
  turn.take(&peers, me, ctx.stream);
  // Rows [first, first + count) from the host, complete on the device.
  auto from_host = [&](int64_t first, int64_t count) -> KnnStatus {
    KNN_TRY(upload_padded_rows(host, first, count, dim, stride, out.padded.get(), max_abs_bits,
                               mem, ctx));
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    return KNN_OK;
  };
  int64_t first, count;
  peers.slice(me, &first, &count);
  KnnStatus own = KNN_OK;
  if (fail_own_slice) {
    ctx.error = "forced failure (shared upload test hook)";
    own = KNN_OUT_OF_MEMORY;
  } else {
    own = from_host(first, count);
  }
  peers.slice_done(me, own == KNN_OK);
  KNN_TRY(own);
  KNN_TRY(copy_other_slices(ctx, peers, me, out.padded.get(), (size_t)stride * sizeof(float),
                            from_host));
  turn.finished_reading();
  // The largest |value| of every row (padding is zero; in place).
  pad_rows_kernel<<<grid_for(n * stride, 256 * 8), 256, 0, ctx.stream>>>(
      out.padded.get(), n, stride, stride, out.padded.get(), max_abs_bits);
  CUDA_CHECK_LAUNCH(ctx, "pad_rows_kernel");
  turn.release();  // the others read this engine's rows no more
  out.points.x = out.padded.get();
  out.points.n = n;
  out.points.dim = dim;
  out.points.stride = stride;
  return KNN_OK;
}

// One join, stage by stage. Every device array is a member (or a local of
// a stage), so all of them are released when the join object goes.
class TiJoin {
 public:
  // excluded: max_rows_per_key of the target keys (0 without keys), which
  // the caller has counted already.
  TiJoin(const KnnProblem &p, const TiOptions &options, int64_t excluded, DeviceContext &ctx)
      : p_(p),
        options_(options),
        ctx_(ctx),
        self_(p.queries == p.targets && p.n_queries == p.n_targets),
        exclude_(p.query_keys != nullptr && p.target_keys != nullptr),
        excluded_(exclude_ ? excluded : 0),
        stride_(padded_stride(p.dim)),
        share_(ctx.query_count >= 0),
        share_first_(share_ ? ctx.query_first : 0),
        share_count_(share_ ? ctx.query_count : p.n_queries),
        budget_(ctx.memory_budget),
        mem_(ctx.memory_budget) {}

  // Stage 1: the points and keys on the device; *finite tells whether every
  // distance stays finite (else the join must go to brute force).
  KnnStatus upload(bool *finite);
  // The other stages, then the statistics.
  KnnStatus finish(int64_t *neighbors, double *distances, KnnStats *stats);
  // After finish: level 1 pruned too little for TI to pay (AUTO only);
  // nothing was written and brute force should answer.
  bool gave_up() const { return gave_up_; }
  double level1_kept() const { return level1_kept_; }

 private:
  KnnStatus upload_keys();
  KnnStatus cluster();
  KnnStatus divide_share();
  KnnStatus run_level1(int32_t first_cluster, int32_t end_cluster, Margin margin);
  KnnStatus filter();
  KnnStatus measure_level1();
  // For n distinct queries.
  Level2Config level2_config(int kprime, int64_t n) const;
  KnnStatus output(int64_t *neighbors, double *distances);
  // A share divided by clusters: level 2 and the output, batch by batch.
  KnnStatus filter_and_write_clusters(int64_t *neighbors, double *distances);
  KnnStatus output_rows(int64_t first, int64_t count, int64_t *neighbors, double *distances,
                        DeviceBuffer<int64_t> &rows, DeviceBuffer<double> &dist);
  void describe(KnnStats *stats) const;
  // KNN_TI_PHASES: the stage that just ended (waits for the stream).
  void phase(const char *name);

  const DistinctSet &target_set() const { return self_ ? query_set_ : target_set_own_; }
  // The query clusters level 2 runs on: a share's, or all.
  const ClusterSet &filtered_queries() const { return share_ ? share_clusters_ : query_clusters_; }
  const ClusterSet &target_clusters() const {
    return self_ ? query_clusters_ : target_clusters_own_;
  }

  const KnnProblem &p_;
  const TiOptions &options_;
  DeviceContext &ctx_;
  const bool self_, exclude_;
  const int64_t excluded_;  // the most targets one query can lose to exclusion
  const bool share_;  // answers query rows [share_first_, + share_count_) only
  const int64_t share_first_, share_count_;
  const int stride_;
  size_t budget_;
  MemoryBudget mem_;

  UploadedSet query_upload_, target_upload_;
  DeviceBuffer<int64_t> query_keys_, target_keys_;
  DistinctSet query_set_, target_set_own_;
  ClusterSet query_clusters_, target_clusters_own_, share_clusters_;
  ClusterShare by_clusters_;  // a share's clusters, where the engines agreed
  Level1Result level1_;
  int32_t level1_first_ = 0, level1_end_ = 0;  // the query clusters it ran over
  Level2Config used_;
  int kprime_ = 0;
  DeviceBuffer<float> result_value_;
  DeviceBuffer<int32_t> result_row_;
  DeviceBuffer<unsigned long long> counter_;

  Clock::time_point t_start_ = Clock::now(), t_uploaded_, t_clustered_, t_filtered_;
  double select_seconds_ = 0, download_seconds_ = 0;
  unsigned long long computed_ = 0;
  double level1_kept_ = 0;  // share of cluster pairs level 1 kept
  bool gave_up_ = false;
  const bool phases_ = std::getenv("KNN_TI_PHASES") != nullptr &&
                       std::getenv("KNN_TI_PHASES")[0] == '1';
  std::string phase_text_;
  Clock::time_point phase_at_ = Clock::now();
};

void TiJoin::phase(const char *name) {
  if (!phases_) return;
  (void)cudaStreamSynchronize(ctx_.stream);
  const Clock::time_point now = Clock::now();
  char item[64];
  std::snprintf(item, sizeof item, " %s %.4f", name, seconds_between(phase_at_, now));
  phase_text_ += item;
  phase_at_ = now;
}

// Through the pinned staging, as the points (a plain copy from pageable
// memory is several times slower), once the allocations are usable from
// the staging's stream.
KnnStatus TiJoin::upload_keys() {
  if (!exclude_) return KNN_OK;
  const int64_t nq = p_.n_queries, nt = p_.n_targets;
  KNN_TRY(mem_.allocate(ctx_, query_keys_, nq, "keys"));
  const bool one_set = self_ && p_.query_keys == p_.target_keys;
  if (one_set && excluded_ == 1) {
    // One set of distinct keys (a self-join's): two rows' keys are equal
    // exactly where the rows are, so the row numbers exclude the same
    // pairs, written on the device instead of copied from the host.
    row_number_keys_kernel<<<grid_for(nq, 256 * 8), 256, 0, ctx_.stream>>>(nq,
                                                                          query_keys_.get());
    CUDA_CHECK_LAUNCH(ctx_, "row_number_keys_kernel");
    return KNN_OK;
  }
  if (!one_set) KNN_TRY(mem_.allocate(ctx_, target_keys_, nt, "keys"));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  KNN_TRY(upload_to_device(ctx_, query_keys_.get(), p_.query_keys, nq * sizeof(int64_t)));
  if (!one_set)
    KNN_TRY(upload_to_device(ctx_, target_keys_.get(), p_.target_keys, nt * sizeof(int64_t)));
  return KNN_OK;
}

KnnStatus TiJoin::upload(bool *finite) {
  if (budget_ == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(ctx_, cudaMemGetInfo(&free_bytes, &total_bytes));
    budget_ = free_bytes;
    mem_ = MemoryBudget(budget_);
  }
  DeviceBuffer<unsigned> max_abs;
  KNN_TRY(mem_.allocate(ctx_, max_abs, 1, "value range"));
  CUDA_CHECK(ctx_, cudaMemsetAsync(max_abs.get(), 0, sizeof(unsigned), ctx_.stream));
  // A share of a split self-join: the engines upload the rows once between
  // them; elsewhere (or where they did not agree) each uploads them all.
  bool shared = false;
  if (share_ && self_ && ctx_.peer_points != nullptr)
    KNN_TRY(upload_points_shared(float_rows(p_.queries), p_.n_queries, p_.dim, stride_,
                                 *ctx_.peer_points, ctx_.share_voter,
                                 static_cast<int>(p_.element), p_.target_keys,
                                 options_.upload_slice_fail == ctx_.share_voter + 1,
                                 options_.shared_pool_late == ctx_.share_voter + 1, query_upload_, max_abs.get(), &shared, mem_, ctx_));
  if (shared && options_.shared_probe != nullptr)
    __atomic_fetch_or(options_.shared_probe, 1, __ATOMIC_RELAXED);
  if (!shared)
    KNN_TRY(upload_points(float_rows(p_.queries), p_.n_queries, p_.dim, stride_, query_upload_,
                          max_abs.get(), mem_, ctx_));
  if (!self_)
    KNN_TRY(upload_points(float_rows(p_.targets), p_.n_targets, p_.dim, stride_, target_upload_,
                          max_abs.get(), mem_, ctx_));
  KNN_TRY(upload_keys());
  float max_abs_value;
  KNN_TRY(read_max_abs(max_abs.get(), &max_abs_value, ctx_));
  t_uploaded_ = Clock::now();
  phase(shared ? "upload(shared)" : "upload");
  *finite = distances_stay_finite(p_.metric, p_.dim, max_abs_value);
  return ctx_.cancel_point();
}

// Stage 2: duplicate groups, then clusters of the distinct points.
KnnStatus TiJoin::cluster() {
  KNN_TRY(build_distinct_set(query_upload_.points, options_.dedup, query_set_, mem_, ctx_));
  if (!self_)
    KNN_TRY(build_distinct_set(target_upload_.points, options_.dedup, target_set_own_, mem_,
                               ctx_));
  KNN_TRY(ctx_.cancel_point());
  phase("dedup");

  int32_t mq = landmarks_for(options_.landmark_factor, query_set_.n_distinct);
  int32_t mt = landmarks_for(options_.landmark_factor, target_set().n_distinct);
  // Cap by the budget: the cluster-pair matrices take about 32 bytes a pair.
  const double pair_bytes = 32.0;
  if (pair_bytes * mq * mt > budget_ / 4.0) {
    double scale = std::sqrt(budget_ / 4.0 / (pair_bytes * mq * mt));
    mq = std::max<int32_t>(1, (int32_t)(mq * scale));
    mt = std::max<int32_t>(1, (int32_t)(mt * scale));
  }
  if (self_) mq = mt;
  // A share of a split self-join: the engines assign the points once
  // between them (ti_clustering.cu: assign_shared).
  AssignShare share;
  share.peers = share_ && self_ ? ctx_.peer_assign : nullptr;
  share.engine = ctx_.share_voter;
  share.host = p_.queries;
  share.element = static_cast<int>(p_.element);
  share.keys = p_.target_keys;
  share.probe = options_.shared_probe;
  KNN_TRY(build_clusters(query_set_, p_.metric, mq, options_.landmark_candidate_sets,
                         options_.gemm_assign_min_stride, query_clusters_, mem_, ctx_,
                         share.peers != nullptr ? &share : nullptr));
  if (!self_)
    KNN_TRY(build_clusters(target_set_own_, p_.metric, mt, options_.landmark_candidate_sets,
                           options_.gemm_assign_min_stride, target_clusters_own_, mem_, ctx_));
  // The rows and distinct points are no longer needed: the clusters hold
  // their own copies in position order.
  mem_.release(query_upload_.padded);
  mem_.release(target_upload_.padded);
  mem_.release(query_set_.x);
  mem_.release(target_set_own_.x);
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  t_clustered_ = Clock::now();
  phase("clusters");
  return ctx_.cancel_point();
}

// The adaptive scheme of IV-D (or what the options force).
Level2Config TiJoin::level2_config(int kprime, int64_t n) const {
  Level2Config config;
  config.kprime = kprime;
  config.partial = options_.filter == FilterKind::Partial ||
                   (options_.filter == FilterKind::Adaptive &&
                    (double)p_.k / p_.dim > options_.partial_filter_ratio);
  config.place = choose_list_place(ctx_, kprime, options_.list);
  config.parts = options_.threads_per_query > 0
                     ? options_.threads_per_query
                     : level2_threads_per_query(ctx_, p_.metric, stride_, config.place, kprime,
                                                n, options_.cache_conflict_factor);
  return config;
}

// A share of a split self-join: whether the engines divide it by clusters
// (by_clusters_, planned), else its query clusters restricted to its rows.
// The room left now must hold the rest (after agreeing, a share cannot
// hand its rows to another method).
KnnStatus TiJoin::divide_share() {
  const size_t room = budget_ > mem_.used() ? budget_ - mem_.used() : 0;
  KNN_TRY(agree_on_cluster_share(query_clusters_, p_.n_queries, p_.k, kprime_, room,
                                 &by_clusters_, mem_, ctx_));
  phase(by_clusters_.agreed ? "vote(clusters)" : "vote(rows)");
  return KNN_OK;
}

// Level 1 over query clusters [first_cluster, end_cluster) (end -1: all).
KnnStatus TiJoin::run_level1(int32_t first_cluster, int32_t end_cluster, Margin margin) {
  if (share_ && options_.level1_fail == ctx_.share_voter + 1) {
    if (ctx_.error.empty()) ctx_.error = "level 1 failed (test hook: as for want of memory)";
    return KNN_OUT_OF_MEMORY;
  }
  mem_.release(level1_.candidates);
  mem_.release(level1_.cand_count);
  mem_.release(level1_.upper_bound);
  KNN_TRY(level1_filter(query_clusters_, target_clusters(), p_.metric, kprime_, margin, level1_,
                        mem_, ctx_, nullptr, first_cluster, end_cluster));
  level1_first_ = first_cluster;
  level1_end_ = end_cluster < 0 ? query_clusters_.m : end_cluster;
  if (options_.level1_probe != nullptr)
    __atomic_fetch_add(options_.level1_probe, level1_end_ - level1_first_, __ATOMIC_RELAXED);
  return ctx_.cancel_point();
}

// Stage 3: the k' nearest (value, row) of every distinct query.
KnnStatus TiJoin::filter() {
  kprime_ = (int)std::min<int64_t>(INT32_MAX / 4, (int64_t)p_.k + excluded_);
  const RoundingMargin rounding(p_.metric, stride_);
  Margin margin;
  margin.rel = (float)rounding.relative();
  margin.abs = (float)(rounding(0.0));
  // A share runs level 1 over its own query clusters (their bounds and
  // candidates are the same bits as in the whole filter), then votes: an
  // engine short of memory in level 1, the largest allocation of its share,
  // has not agreed yet and hands its rows to another method. Where the
  // engines do not agree, level 1 runs again over all clusters (the rows'
  // clusters may be any). Not where AUTO may give up after level 1: that
  // decision must be the same on every engine, so it is taken over all
  // clusters first (KNN_TI_LEVEL1_ALL=1 also keeps that order, for
  // measuring).
  const bool own_first =
      share_ && options_.level1_give_up <= 0 && !env_flag("KNN_TI_LEVEL1_ALL");
  bool own_range = false;
  if (share_)
    KNN_TRY(plan_cluster_share(query_clusters_, p_.n_queries, share_first_, share_count_,
                               &by_clusters_, ctx_));
  if (own_first) {
    // A share that could not be divided even before level 1 declines now.
    const size_t room = budget_ > mem_.used() ? budget_ - mem_.used() : 0;
    own_range = !cluster_share_declines(query_clusters_, p_.n_queries, p_.k, kprime_, room);
    if (!own_range) KNN_TRY(divide_share());
  }
  if (own_range) {
    KNN_TRY(run_level1(by_clusters_.first_cluster, by_clusters_.end_cluster, margin));
    phase("level1(own)");
    KNN_TRY(divide_share());
    if (!by_clusters_.agreed) {
      KNN_TRY(run_level1(0, -1, margin));
      phase("level1");
    }
  } else {
    KNN_TRY(run_level1(0, -1, margin));
    phase("level1");
  }
  KNN_TRY(measure_level1());
  if (options_.level1_give_up > 0 && level1_kept_ > options_.level1_give_up) {
    gave_up_ = true;
    t_filtered_ = Clock::now();
    return KNN_OK;
  }
  if (share_ && !own_first) KNN_TRY(divide_share());
  if (share_) {
    if (!by_clusters_.agreed)
      KNN_TRY(share_query_clusters(query_clusters_, query_set_, share_first_, share_count_,
                                   share_clusters_, mem_, ctx_));
  } else {
    const size_t room = budget_ > mem_.used() ? budget_ - mem_.used() : 0;
    KNN_TRY(whole_cluster_share(query_clusters_, p_.n_queries, p_.k, kprime_, room,
                                &by_clusters_, ctx_));
  }

  const size_t slots = (size_t)query_set_.n_distinct * kprime_;
  KNN_TRY(mem_.allocate(ctx_, result_value_, slots, "results"));
  KNN_TRY(mem_.allocate(ctx_, result_row_, slots, "results"));
  KNN_TRY(mem_.allocate(ctx_, counter_, 1, "distance counter"));
  CUDA_CHECK(ctx_, cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), ctx_.stream));
  // Divided by clusters, level 2 runs batch by batch with the output.
  if (by_clusters_.agreed) return KNN_OK;
  const Level2Config config = level2_config(kprime_, filtered_queries().n);
  used_ = config;
  KNN_TRY(level2_filter(filtered_queries(), target_clusters(), target_set(), level1_, p_.metric,
                        config, margin, result_value_.get(), result_row_.get(), counter_.get(),
                        &used_, mem_, ctx_));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  t_filtered_ = Clock::now();
  phase("level2");
  KNN_TRY(ctx_.cancel_point());
  mem_.release(level1_.candidates);
  mem_.release(level1_.cand_count);
  mem_.release(level1_.upper_bound);
  return KNN_OK;
}

// Query rows [first, first + count): expanded on the device, then copied.
KnnStatus TiJoin::output_rows(int64_t first, int64_t count, int64_t *neighbors,
                              double *distances, DeviceBuffer<int64_t> &rows,
                              DeviceBuffer<double> &dist) {
  const int k = p_.k;
  const int64_t *target_keys = nullptr;
  if (exclude_) target_keys = target_keys_.get() != nullptr ? target_keys_.get() : query_keys_.get();
  const Clock::time_point t0 = Clock::now();
  KNN_TRY(expand_results(query_set_, p_.metric, first, count, k, kprime_, result_value_.get(),
                         result_row_.get(), exclude_ ? query_keys_.get() : nullptr, target_keys,
                         rows.get(), dist.get(), ctx_));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  const Clock::time_point t1 = Clock::now();
  CUDA_CHECK(ctx_, cudaMemcpyAsync(neighbors + first * k, rows.get(),
                                   (size_t)count * k * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                   ctx_.stream));
  CUDA_CHECK(ctx_, cudaMemcpyAsync(distances + first * k, dist.get(),
                                   (size_t)count * k * sizeof(double), cudaMemcpyDeviceToHost,
                                   ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  select_seconds_ += seconds_between(t0, t1);
  download_seconds_ += seconds_between(t1, Clock::now());
  return KNN_OK;
}

// The share of (query cluster, target cluster) pairs that level 1 kept as
// candidates: what level 2 may still have to look at. Where it is high,
// the data's intrinsic dimension defeats the clustering.
KnnStatus TiJoin::measure_level1() {
  // (Over the query clusters level 1 filtered: a share's own, or all.)
  const int32_t first = level1_first_, mq = level1_end_ - level1_first_,
                mt = target_clusters().m;
  if (mq <= 0) return KNN_OK;
  std::vector<int32_t> counts(mq);
  CUDA_CHECK(ctx_, cudaMemcpyAsync(counts.data(), level1_.cand_count.get() + first,
                                   mq * sizeof(int32_t), cudaMemcpyDeviceToHost, ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  double kept = 0;
  for (int32_t c : counts) kept += c;
  level1_kept_ = kept / ((double)mq * (double)mt);
  return KNN_OK;
}

// Stage 4: rows, exclusion, float8. The level-2 scratch is gone; the
// output (16 bytes a slot) is written and copied in chunks of rows that
// fit what is left of the budget.
KnnStatus TiJoin::output(int64_t *neighbors, double *distances) {
  const int64_t nq = share_count_;
  const int k = p_.k;
  CUDA_CHECK(ctx_, cudaMemcpyAsync(&computed_, counter_.get(), sizeof computed_,
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  const int64_t chunk = output_chunk_rows(budget_, mem_.used(), nq, k);
  DeviceBuffer<int64_t> rows;
  DeviceBuffer<double> dist;
  KNN_TRY(mem_.allocate(ctx_, rows, (size_t)chunk * k, "results"));
  KNN_TRY(mem_.allocate(ctx_, dist, (size_t)chunk * k, "results"));
  for (int64_t done = 0; done < nq; done += chunk) {
    KNN_TRY(ctx_.cancel_point());
    KNN_TRY(output_rows(share_first_ + done, std::min(chunk, nq - done), neighbors, distances,
                        rows, dist));
  }
  return KNN_OK;
}

KnnStatus TiJoin::filter_and_write_clusters(int64_t *neighbors, double *distances) {
  const RoundingMargin rounding(p_.metric, stride_);
  ClusterShareJoin join;
  join.queries = &query_clusters_;
  join.query_set = &query_set_;
  join.targets = &target_clusters();
  join.target_set = &target_set();
  join.level1 = &level1_;
  join.metric = p_.metric;
  join.margin.rel = (float)rounding.relative();
  join.margin.abs = (float)(rounding(0.0));
  join.k = p_.k;
  join.kprime = kprime_;
  join.result_value = result_value_.get();
  join.result_row = result_row_.get();
  join.counter = counter_.get();
  if (exclude_) {
    join.query_keys = query_keys_.get();
    join.target_keys = target_keys_.get() != nullptr ? target_keys_.get() : query_keys_.get();
  }
  join.budget = budget_;
  join.config = [this](int64_t n) { return level2_config(kprime_, n); };
  used_ = join.config(by_clusters_.begin[by_clusters_.end_cluster] -
                      by_clusters_.begin[by_clusters_.first_cluster]);
  KNN_TRY(filter_and_write_cluster_share(join, by_clusters_, neighbors, distances, &used_,
                                         &select_seconds_, &download_seconds_, mem_, ctx_));
  CUDA_CHECK(ctx_, cudaMemcpyAsync(&computed_, counter_.get(), sizeof computed_,
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  t_filtered_ = Clock::now();
  phase("level2+output");
  return KNN_OK;
}

void TiJoin::describe(KnnStats *stats) const {
  const Clock::time_point t_done = Clock::now();
  stats->method = KNN_METHOD_TI;
  stats->pairs = share_count_ * p_.n_targets;
  char parts[32] = "";
  if (used_.parts > 1) std::snprintf(parts, sizeof parts, "/inside-query x%d", used_.parts);
  // (A split divided by clusters says so first: the text is short.)
  std::snprintf(stats->variant, sizeof stats->variant, "%s%s/%s/remap%s%s/level-1 kept %.1f%%",
                !by_clusters_.agreed ? "" : share_ ? "cluster-split/" : "cluster-batches/", used_.partial ? "partial" : "full",
                used_.partial ? "global" : place_name(used_.place), parts,
                options_.dedup ? "/dedup" : "", 100.0 * level1_kept_);
  stats->query_clusters = by_clusters_.agreed
                              ? by_clusters_.end_cluster - by_clusters_.first_cluster
                              : filtered_queries().m;
  stats->target_clusters = target_clusters().m;
  stats->distance_computations = (int64_t)computed_;
  stats->threads_per_query = used_.parts;
  stats->seconds_transfer = seconds_between(t_start_, t_uploaded_) + download_seconds_;
  stats->seconds_cluster = seconds_between(t_uploaded_, t_clustered_);
  stats->seconds_filter = seconds_between(t_clustered_, t_filtered_);
  stats->seconds_select = select_seconds_;
  stats->seconds_total = seconds_between(t_start_, t_done);
  if (phases_)
    std::fprintf(stderr, "ti phases (GPU %d%s):%s select %.4f download %.4f\n", ctx_.device,
                 share_ ? (by_clusters_.agreed ? ", share by clusters" : ", share by rows") : "",
                 phase_text_.c_str(), select_seconds_, download_seconds_);
}

KnnStatus TiJoin::finish(int64_t *neighbors, double *distances, KnnStats *stats) {
  KNN_TRY(cluster());
  KNN_TRY(filter());
  if (gave_up_) return KNN_OK;
  if (by_clusters_.agreed)
    KNN_TRY(filter_and_write_clusters(neighbors, distances));
  else
    KNN_TRY(output(neighbors, distances));
  if (stats != nullptr) describe(stats);
  return KNN_OK;
}

// The whole join on the device at once. *finite as for out_of_core_join;
// *level1_kept >= 0 when TI gave up after level 1 (nothing written).
KnnStatus in_memory_join(const KnnProblem &problem, const TiOptions &options, int64_t excluded,
                         int64_t *neighbors, double *distances, KnnStats *stats, bool *finite,
                         double *level1_kept, DeviceContext &ctx) {
  *level1_kept = -1;
  TiJoin join(problem, options, excluded, ctx);
  KNN_TRY(join.upload(finite));
  if (!*finite) return KNN_OK;
  KNN_TRY(join.finish(neighbors, distances, stats));
  if (join.gave_up()) *level1_kept = join.level1_kept();
  return KNN_OK;
}

// AUTO's measured second opinion: TI clusters both sides and runs level 1
// (a few per cent of its time where it prunes well); when level 1 keeps
// more than this share of the cluster pairs, level 2 computes nearly every
// distance at TI's per-distance cost, far above the GEMM brute force's from
// a few dozen dimensions on (an H200, 1000 x 100000 uniform rows of 128
// dimensions: TI 0.247 s computing 100 % of the distances, brute force
// 0.006 s). Level 1 bounds whole query clusters, so it keeps far more than
// level 2 computes on clustered data of few dimensions (an H200, 5000000
// clustered rows of 8 dimensions: level 1 kept 88 %, level 2 computed 0.3 %
// of the distances); below kGiveUpMinDim, where brute force's GEMM is short
// and TI may still win by orders of magnitude, TI keeps the join whatever
// level 1 kept.
constexpr double kLevel1GiveUp = 0.5;
constexpr int kGiveUpMinDim = 64;

// The in-memory join's options: AUTO's give-up where it applies.
TiOptions in_memory_options(const KnnProblem &problem, const JoinTuning &tuning) {
  TiOptions options = tuning.ti;
  if (problem.method == KNN_METHOD_AUTO && problem.dim >= kGiveUpMinDim)
    options.level1_give_up = kLevel1GiveUp;
  return options;
}

// The budget the join may use: the module's, else what the device has free.
KnnStatus join_budget(DeviceContext &ctx, size_t *budget) {
  *budget = ctx.memory_budget;
  if (*budget != 0) return KNN_OK;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(ctx, cudaMemGetInfo(&free_bytes, &total_bytes));
  *budget = free_bytes;
  return KNN_OK;
}

KnnStatus run_join(const KnnProblem &problem, const JoinTuning &tuning, int64_t *neighbors,
                   double *distances, KnnStats *stats, DeviceContext &ctx) {
  // (cuda_module.cu sends empty sides and metrics other than L2 and L1
  // elsewhere.)
  const int64_t nq = problem.n_queries, nt = problem.n_targets;
  // Rows are int32 on the device (kNoRow = INT32_MAX marks an empty slot).
  if (nq >= INT32_MAX - 1 || nt >= INT32_MAX - 1)
    return brute_force_join(problem, tuning, neighbors, distances, stats, ctx);
  // Where the in-memory join cannot fit the budget, or runs out of memory
  // after all, the out-of-core join takes over: the TI join never hands a
  // join to brute force for lack of memory.
  size_t budget = 0;
  KNN_TRY(join_budget(ctx, &budget));
  const int64_t excluded = problem.query_keys != nullptr && problem.target_keys != nullptr
                               ? max_rows_per_key(problem.target_keys, nt)
                               : 0;
  const int kprime = (int)std::min<int64_t>(INT32_MAX / 4, (int64_t)problem.k + excluded);
  bool finite = false;
  KnnStatus status = KNN_OUT_OF_MEMORY;
  if (in_memory_join_bytes(problem, kprime) <= budget) {
    double level1_kept = -1;
    status = in_memory_join(problem, in_memory_options(problem, tuning), excluded, neighbors,
                            distances, stats, &finite, &level1_kept, ctx);
    if (status == KNN_OK && level1_kept >= 0) {
      // Level 1's device memory is queued for freeing: let it go first.
      CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
      KNN_TRY(brute_force_join(problem, tuning, neighbors, distances, stats, ctx));
      const size_t used = std::strlen(stats->variant);
      std::snprintf(stats->variant + used, sizeof stats->variant - used,
                    " (auto: TI's level 1 kept %.0f%% of the cluster pairs)", 100.0 * level1_kept);
      return KNN_OK;
    }
    if (status == KNN_OUT_OF_MEMORY && !ctx.cancelled()) {
      // The in-memory join's buffers are queued for freeing on the stream;
      // let them go before the out-of-core join allocates.
      CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
      ctx.error.clear();
    }
  }
  if (status == KNN_OUT_OF_MEMORY) {
    // A cancel, not the budget, may have ended the in-memory try: say so.
    if (ctx.cancelled()) ctx.error.clear();
    KNN_TRY(ctx.cancel_point());
    status = out_of_core_join(problem, tuning.ti, neighbors, distances, stats, &finite, ctx);
  }
  if (status != KNN_OK || finite) return status;
  // The bounds need finite distances; brute force handles everything (the
  // join's device memory was released above).
  return brute_force_join(problem, tuning, neighbors, distances, stats, ctx);
}

}  // namespace
}  // namespace ti

KnnStatus ti_join(const KnnProblem &problem, const JoinTuning &tuning, int64_t *neighbors,
                  double *distances, KnnStats *stats, DeviceContext &ctx) {
  return ti::release_join_memory(ti::run_join(problem, tuning, neighbors, distances, stats, ctx), ctx);
}

KnnStatus ti_join_share(const KnnProblem &problem, const JoinTuning &tuning, int64_t *neighbors,
                        double *distances, KnnStats *stats, bool *declined,
                        DeviceContext &ctx) {
  *declined = true;
  // However this ends, this engine's vote on dividing by clusters is cast
  // (a share that did not vote declines, so that no engine waits for it).
  // Likewise its offers of the shared upload and cluster assignment.
  struct DeclineUnlessVoted {
    DeviceContext &ctx;
    ~DeclineUnlessVoted() {
      if (ctx.share_vote != nullptr) ctx.share_vote->decline(ctx.share_voter);
      decline_peer_assign(ctx);
      decline_peer_points(ctx);
    }
  } vote_cast{ctx};
  const int64_t nq = problem.n_queries, nt = problem.n_targets;
  const bool self = problem.queries == problem.targets && nq == nt;
  if (!self || ctx.query_count < 0 || nq >= INT32_MAX - 1) return KNN_OK;
  size_t budget = 0;
  KNN_TRY(ti::join_budget(ctx, &budget));
  const int64_t excluded = problem.query_keys != nullptr && problem.target_keys != nullptr
                               ? max_rows_per_key(problem.target_keys, nt)
                               : 0;
  const int kprime = (int)std::min<int64_t>(INT32_MAX / 4, (int64_t)problem.k + excluded);
  if (ti::in_memory_join_bytes(problem, kprime) > budget) return KNN_OK;
  bool finite = false;
  double level1_kept = -1;
  KnnStatus status = ti::in_memory_join(problem, ti::in_memory_options(problem, tuning), excluded,
                                        neighbors, distances, stats, &finite, &level1_kept, ctx);
  // After agreeing to answer whole clusters, no other method can take over
  // this share (its rows are not a range): a failure ends the join.
  const bool by_clusters = ctx.share_vote != nullptr && ctx.share_vote->agreed();
  if (status == KNN_OUT_OF_MEMORY && !ctx.cancelled() && !by_clusters) {
    ctx.error.clear();  // the caller runs the share another way
    return ti::release_join_memory(KNN_OK, ctx);
  }
  // Values that need brute force, or AUTO's TI gave up after level 1.
  if (status == KNN_OK && (!finite || level1_kept >= 0)) return ti::release_join_memory(KNN_OK, ctx);
  *declined = false;
  return ti::release_join_memory(status, ctx);
}

}  // namespace cuda
}  // namespace knn
