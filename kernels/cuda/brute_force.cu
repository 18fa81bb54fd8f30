// brute_force.cu -- knn::cuda::brute_force_join: the exact all-pairs join.
//
// For a query chunk and a target chunk resident on the device:
//  1. Candidates are selected per query from (queries x targets) values
//     computed either
//     - exactly, with the canonical lane sums of knn_distance.h: L1 always,
//       and every metric in low dimension (<= kGemmMinDim), where they cost
//       about what a GEMM does and need no certification. For L2, L1 and
//       IP the tiles and the selection are one kernel (exact_select.cu);
//       otherwise exact_tiles.cu writes tiles that select_tiles.cu reads;
//     - or by cuBLAS GEMM dot products turned into proven lower bounds of
//       the exact values (tile_value.cuh): a DGEMM for L2 on GPUs with fast
//       FP64 (its bound is relative to the distance), else an SGEMM (bound
//       relative to the norms); select_tiles.cu keeps k' >= k + 16 of them.
//       On an H200 the DGEMM filter is also the faster one (k = 20 self-
//       joins: fashion-mnist 0.021 s against 0.023 s with the SGEMM filter;
//       blog 0.071 s against 0.170 s, where 40 % of the SGEMM queries fail
//       certification and are redone exactly).
//  2. rerank.cu computes the candidates' exact distances with
//     knn_distance.h, sorts them and, for GEMM candidates, certifies each
//     query; queries that fail certification are redone exactly.
// k beyond the selection's capacity takes the full-sort path (full_sort.cu).
// Small query batches (< kFusedMinQueries) use small exact tiles and split
// each query's targets over many warps (segments), which the reranking
// merges. When the data do not fit the memory budget, queries and targets
// are processed in chunks; the exact k best of successive target chunks are
// merged (rows are global, so ties still go to the smaller row), and the
// next target chunk is uploaded (pinned double buffer, own stream, helper
// thread) while the current one is processed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "brute_kernels.cuh"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"
#include "device_buffer.cuh"
#include "host_transfer.cuh"

namespace knn {
namespace cuda {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- tuning (see the benchmark notes in bench/) ----
// At or below this many dimensions exact tiles are used for every metric:
// 3 float operations per pair and dimension against the GEMM's 2, but no
// certification and no fallback, and the selection dominates anyway.
constexpr int kGemmMinDim = 64;
// The GEMM bound constants assume d * 2^-24 small (tile_value.cuh).
constexpr int kGemmMaxDim = 1 << 16;
// GEMM lists keep k' = max(2k, k + 16) candidates (rounded up to the list
// capacity): the margin between the k-th and the k'-th is what certifies.
constexpr int kGemmMinExtra = 16;
// An exact distance tile of 8 Mi floats (32 MiB) stays mostly in L2
// between the kernel that writes it and the selection that reads it.
constexpr int64_t kTileElements = int64_t(8) << 20;
constexpr int kMaxTileRows = 1024;
// GEMM tiles are larger (up to 4096 x 16384): cuBLAS runs large products
// far more efficiently, and fewer segments per query mean fewer candidate
// lists to warm up (the first tiles of a list pass many candidates).
constexpr int64_t kGemmTileElements = int64_t(64) << 20;
constexpr int kGemmMaxTileRows = 4096;
// The selection wants this many warps per launch; with few queries per
// tile the targets are split into more segments (one warp each).
constexpr int kSelectWarpsWanted = 16384;
constexpr int kGemmSelectWarpsWanted = 4096;
constexpr int kMinSegmentColumns = 2048;
// Chunk rows stay addressable with 32-bit row numbers in the lists.
constexpr int64_t kMaxChunkRows = int64_t(1) << 30;
// The fused exact kernel (exact_select.cu): queries per launch, and the
// blocks a launch should have (targets are split into segments to get them).
constexpr int64_t kFusedRowsPerLaunch = 8192;
constexpr int kFusedBlocksWanted = 1024;
// Small query batches use tiles + warp selection instead: the fused
// kernel's blocks take 32 queries each.
constexpr int64_t kFusedMinQueries = 9;
constexpr int64_t kFallbackBatch = 16384;

int next_pow2(int64_t x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// How the selection scores a pair: exactly, or by a lower bound from an
// SGEMM (float tiles) or a DGEMM (double tiles, L2 only).
enum class Scoring { kExact, kGemmFloat, kGemmDouble };

bool is_gemm(Scoring s) { return s != Scoring::kExact; }

// GPUs whose FP64 rate equals their FP32 rate (A100, H100/H200, B200):
// there a DGEMM costs what an SGEMM does, and its error bound for L2 is
// relative to the distance rather than to the norms (tile_value.cuh).
bool fast_fp64(const cudaDeviceProp &prop) {
  return (prop.major == 8 && prop.minor == 0) || prop.major == 9 ||
         (prop.major == 10 && prop.minor == 0);
}

struct Plan {
  Scoring scoring = Scoring::kExact;
  bool full_sort = false;
  bool fused = false;       // exact tiles and selection in one kernel
  bool double_gemm = false; // L2 filtered by a DGEMM (double rows and tiles)
  int cap = 32;             // list capacity (power of two, 32..256)
  int segments = 1;         // lists per query
  int64_t q_chunk = 0;      // queries per chunk
  int64_t t_chunk = 0;      // targets per chunk
  bool t_chunked = false;   // several target chunks (double-buffered)
  bool alias_queries = false;  // self-join with resident targets: query rows are target rows
  int tile_rows = 0, tile_cols = 0;
  int64_t gather_rows = 0;  // fallback batch
  size_t full_sort_budget = 0;
  size_t bytes = 0;         // device bytes the plan allocates
};

bool same_rows(const KnnProblem &p) {
  return p.queries == p.targets && p.n_queries <= p.n_targets &&
         p.query_keys == p.target_keys;
}

void shape(const KnnProblem &p, size_t budget, Plan *pl) {
  pl->t_chunked = pl->t_chunk < p.n_targets;
  pl->alias_queries = !pl->t_chunked && same_rows(p);
  // Small budgets (forced chunking) also get small tiles.
  const bool gemm = is_gemm(pl->scoring);
  const size_t element_bytes = pl->double_gemm ? 8 : 4;
  const int64_t elements = std::max<int64_t>(
      4096, std::min<int64_t>(gemm ? kGemmTileElements : kTileElements,
                              static_cast<int64_t>(budget / 16 / element_bytes)));
  pl->tile_rows =
      static_cast<int>(std::min<int64_t>(pl->q_chunk, gemm ? kGemmMaxTileRows : kMaxTileRows));
  pl->tile_rows = static_cast<int>(std::min<int64_t>(pl->tile_rows, std::max<int64_t>(1, elements / 256)));
  pl->tile_cols = static_cast<int>(
      std::min<int64_t>(pl->t_chunk, std::max<int64_t>(256, elements / pl->tile_rows)));
  int s = std::max(1, (gemm ? kGemmSelectWarpsWanted : kSelectWarpsWanted) / pl->tile_rows);
  s = std::min(s, kMaxListEntries / pl->cap);
  s = std::min(s, std::max(1, pl->tile_cols / kMinSegmentColumns));
  pl->fused = pl->scoring == Scoring::kExact && !pl->full_sort &&
              fused_select_supports(p.metric, pl->cap) && p.n_queries >= kFusedMinQueries;
  if (pl->fused) {
    const int64_t rows = std::min(pl->q_chunk, kFusedRowsPerLaunch);
    const int64_t blocks = (rows + fused_select_rows_per_block() - 1) / fused_select_rows_per_block();
    s = static_cast<int>(std::min<int64_t>((kFusedBlocksWanted + blocks - 1) / blocks,
                                           std::max<int64_t>(1, pl->t_chunk / 256)));
    s = std::max(1, std::min(s, kMaxListEntries / pl->cap));
  }
  pl->segments = std::max(1, s);
  pl->gather_rows = gemm ? std::min(pl->q_chunk, kFallbackBatch) : 0;

  const size_t dim = p.dim;
  const size_t row_extra = sizeof(float) + 1 + (p.query_keys != nullptr ? 8 : 0);
  const size_t row_bytes =
      dim * sizeof(float) + row_extra + (pl->double_gemm ? dim * sizeof(double) + 8 : 0);
  const size_t t_bytes = pl->t_chunk * row_bytes * (pl->t_chunked ? 2 : 1);
  size_t per_query = static_cast<size_t>(p.k) * 24 * (pl->t_chunked ? 2 : 1);
  if (!pl->full_sort) per_query += static_cast<size_t>(pl->segments) * pl->cap * 12;
  if (gemm) per_query += 1;
  const size_t q_bytes = pl->q_chunk * ((pl->alias_queries ? 0 : row_bytes) + per_query);
  const size_t tile = (pl->full_sort || pl->fused)
                          ? 0
                          : static_cast<size_t>(pl->tile_rows) * pl->tile_cols *
                                (pl->double_gemm ? 8 : 4);
  const size_t gather = pl->gather_rows * (row_bytes + 4);
  const size_t sort = pl->full_sort ? full_sort_bytes(1, pl->t_chunk) : 0;
  pl->bytes = t_bytes + q_bytes + tile + gather + sort;
}

KnnStatus make_plan(const KnnProblem &p, DeviceContext &ctx, Plan *pl) {
  const int k = p.k;
  const bool gemm_fits = k + kGemmMinExtra <= kMaxSelectCap;
  const bool gemm = p.metric != KNN_METRIC_L1 && p.dim > kGemmMinDim && p.dim <= kGemmMaxDim &&
                    gemm_fits;
  pl->scoring = Scoring::kExact;
  if (gemm) {
    pl->cap = std::min(kMaxSelectCap, next_pow2(std::max({2 * k, k + kGemmMinExtra, 32})));
    const char *dgemm = std::getenv("KNN_CUDA_DGEMM");  // "0": force the SGEMM filter
    pl->double_gemm = p.metric == KNN_METRIC_L2 && fast_fp64(ctx.prop) &&
                      !(dgemm != nullptr && dgemm[0] == '0');
    pl->scoring = pl->double_gemm ? Scoring::kGemmDouble : Scoring::kGemmFloat;
  } else {
    const int64_t wanted = std::min<int64_t>(k, p.n_targets);
    pl->full_sort = wanted > kMaxSelectCap;
    pl->cap = next_pow2(std::max<int64_t>(wanted, 32));
    if (pl->full_sort) pl->cap = 32;  // unused
  }

  const size_t budget = ctx.memory_budget;
  pl->q_chunk = std::min(p.n_queries, kMaxChunkRows);
  pl->t_chunk = std::min(p.n_targets, kMaxChunkRows);
  for (int iter = 0; iter < 256; iter++) {
    shape(p, budget, pl);
    if (pl->bytes <= budget) {
      pl->full_sort_budget = budget - pl->bytes + (pl->full_sort ? full_sort_bytes(1, pl->t_chunk) : 0);
      return KNN_OK;
    }
    // Shrink whichever side holds more: targets first when equal, since a
    // smaller target chunk also shrinks the large-k sort.
    const size_t row_bytes = static_cast<size_t>(p.dim) * (pl->double_gemm ? 12 : 4) + 21;
    const size_t t_part = pl->t_chunk * row_bytes * 2;
    const size_t q_part = pl->bytes - std::min(pl->bytes, t_part);
    if ((t_part >= q_part || pl->q_chunk == 1) && pl->t_chunk > 1)
      pl->t_chunk = (pl->t_chunk + 1) / 2;
    else if (pl->q_chunk > 1)
      pl->q_chunk = (pl->q_chunk + 1) / 2;
    else
      break;
  }
  char msg[256];
  std::snprintf(msg, sizeof msg,
                "the GPU memory budget (%.1f MiB) is too small for this join (dim %d, k %d)",
                budget / 1048576.0, p.dim, p.k);
  ctx.error = msg;
  return KNN_OUT_OF_MEMORY;
}

// Rows of one side on the device: vectors, knn_dot norms, zero flags, keys.
struct Rows {
  const float *x = nullptr;
  const double *xd = nullptr;      // x as doubles (DGEMM filter only)
  const double *norm_d = nullptr;  // sums of squares in double (DGEMM filter only)
  const float *norm = nullptr;
  const uint8_t *zero = nullptr;
  const int64_t *keys = nullptr;
  int64_t n = 0;
  int64_t offset = 0;  // global row of row 0

  // Rows [first, first + count) of these.
  Rows slice(int64_t first, int64_t count, int dim) const {
    Rows r = *this;
    if (r.x != nullptr) r.x += first * dim;
    if (r.xd != nullptr) r.xd += first * dim;
    if (r.norm_d != nullptr) r.norm_d += first;
    if (r.norm != nullptr) r.norm += first;
    if (r.zero != nullptr) r.zero += first;
    if (r.keys != nullptr) r.keys += first;
    r.n = count;
    r.offset += first;
    return r;
  }
};

struct RowBuffers {
  DeviceBuffer<float> x, norm;
  DeviceBuffer<uint8_t> zero;
  DeviceBuffer<int64_t> keys;
  DeviceBuffer<double> xd, norm_d;

  KnnStatus allocate(DeviceContext &ctx, int64_t rows, int dim, bool with_keys,
                     bool with_double, const char *what) {
    KNN_TRY(x.allocate(ctx, static_cast<size_t>(rows) * dim, what));
    KNN_TRY(norm.allocate(ctx, rows, what));
    KNN_TRY(zero.allocate(ctx, rows, what));
    if (with_keys) KNN_TRY(keys.allocate(ctx, rows, what));
    if (with_double) {
      KNN_TRY(xd.allocate(ctx, static_cast<size_t>(rows) * dim, what));
      KNN_TRY(norm_d.allocate(ctx, rows, what));
    }
    return KNN_OK;
  }

  Rows view(int64_t n, int64_t offset) const {
    Rows r;
    r.x = x.get();
    r.xd = xd.get();
    r.norm_d = norm_d.get();
    r.norm = norm.get();
    r.zero = zero.get();
    r.keys = keys.get();
    r.n = n;
    r.offset = offset;
    return r;
  }
};

// Joins a helper thread on every path out of a scope.
struct ThreadGuard {
  std::thread thread;
  ~ThreadGuard() {
    if (thread.joinable()) thread.join();
  }
};

class BruteForce {
 public:
  BruteForce(const KnnProblem &p, DeviceContext &ctx, const Plan &plan)
      : p_(p), ctx_(ctx), plan_(plan) {}

  KnnStatus run(int64_t *neighbors, double *distances);

  int64_t exact_pairs = 0;      // exact distances evaluated
  int64_t gemm_pairs = 0;       // pairs scored by the GEMM filter
  int64_t fallback_queries = 0; // (query, target chunk) redone with exact tiles
  double seconds_transfer = 0, seconds_filter = 0, seconds_select = 0;
  // KNN_CUDA_TIMING=1: synchronize after each step and add up its time per
  // kind (a diagnostic; it slows the join down a little).
  bool timing = false;
  double t_alloc = 0, t_upload = 0, t_stats = 0, t_score = 0, t_select_tiles = 0, t_fused = 0,
         t_rerank = 0, t_fallback = 0, t_download = 0;

 private:
  KnnStatus upload_rows(RowBuffers &dst, const float *host, const int64_t *host_keys,
                        int64_t first, int64_t n, DeviceContext &ctx);
  KnnStatus row_stats(const RowBuffers &b, int64_t n);
  KnnStatus solve_block(const Rows &q, const Rows &t, ResultArrays out);
  KnnStatus select_pass(Scoring scoring, const Rows &q, const Rows &t, int kp, int cap);
  KnnStatus rerank(Scoring scoring, const Rows &q, const Rows &t, int kp, int cap,
                   const int32_t *out_index, ResultArrays out, uint8_t *certified);
  KnnStatus fallback(const Rows &q, const Rows &t, ResultArrays out);
  // With `timing`: waits for the stream and adds the time since the last mark.
  KnnStatus mark(double *bucket) {
    if (!timing) return KNN_OK;
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
    const Clock::time_point now = Clock::now();
    *bucket += std::chrono::duration<double>(now - last_mark_).count();
    last_mark_ = now;
    return KNN_OK;
  }
  Clock::time_point last_mark_ = Clock::now();
  int segments_ = 1;  // lists per query of the last select_pass

  const KnnProblem &p_;
  DeviceContext &ctx_;
  const Plan &plan_;
  RowBuffers t_buf_[2], q_buf_, g_buf_;
  DeviceBuffer<float> tile_;     // exact or SGEMM tiles
  DeviceBuffer<double> tile_d_;  // DGEMM tiles
  DeviceBuffer<uint64_t> list_key_;
  DeviceBuffer<uint32_t> list_row_;
  DeviceBuffer<uint8_t> certified_;
  DeviceBuffer<int32_t> gather_index_;
  DeviceBuffer<uint64_t> res_key_[2];
  DeviceBuffer<int64_t> res_row_[2];
  DeviceBuffer<double> res_dist_[2];
};

KnnStatus BruteForce::upload_rows(RowBuffers &dst, const float *host, const int64_t *host_keys,
                                  int64_t first, int64_t n, DeviceContext &ctx) {
  KNN_TRY(upload_to_device(ctx, dst.x.get(), host + first * p_.dim,
                           static_cast<size_t>(n) * p_.dim * sizeof(float)));
  if (host_keys != nullptr)
    KNN_TRY(upload_to_device(ctx, dst.keys.get(), host_keys + first, n * sizeof(int64_t)));
  return KNN_OK;
}

KnnStatus BruteForce::row_stats(const RowBuffers &b, int64_t n) {
  KNN_TRY(launch_row_stats(ctx_, b.x.get(), n, p_.dim, b.norm.get(), b.zero.get()));
  if (plan_.double_gemm)
    KNN_TRY(launch_to_double(ctx_, b.x.get(), n, p_.dim, b.xd.get(), b.norm_d.get()));
  return KNN_OK;
}

KnnStatus BruteForce::select_pass(Scoring scoring, const Rows &q, const Rows &t, int kp,
                                  int cap) {
  const int dim = p_.dim;
  const bool fused = scoring == Scoring::kExact && fused_select_supports(p_.metric, cap) &&
                     (q.n >= kFusedMinQueries || tile_.get() == nullptr);
  int segments = std::min(plan_.segments, kMaxListEntries / cap);
  if (fused) {
    // Enough blocks for the GPU: split the targets further when there are
    // few queries (the exact fallback's batches), as far as the lists fit.
    const int64_t rows = std::min(q.n, kFusedRowsPerLaunch);
    const int64_t blocks = (rows + fused_select_rows_per_block() - 1) / fused_select_rows_per_block();
    const int64_t fit = static_cast<int64_t>(list_key_.size()) / (q.n * static_cast<int64_t>(cap));
    int64_t want = (kFusedBlocksWanted + blocks - 1) / blocks;
    want = std::min({want, std::max<int64_t>(1, t.n / 256), fit,
                     static_cast<int64_t>(kMaxListEntries / cap)});
    segments = static_cast<int>(std::max<int64_t>(1, want));
  }
  segments_ = segments;  // rerank reads the lists with the same layout
  KNN_TRY(launch_clear_entries(ctx_, list_key_.get(), list_row_.get(),
                               q.n * segments * static_cast<int64_t>(cap)));
  const bool dgemm = scoring == Scoring::kGemmDouble;
  TileValue value;
  if (scoring == Scoring::kExact) {
    value.kind = exact_kind(p_.metric);
  } else if (dgemm) {
    set_double_bound_constants(&value, dim);
    value.query_norm_d = q.norm_d;
    value.target_norm_d = t.norm_d;
  } else {
    set_bound_constants(&value, p_.metric, dim);
  }
  value.query_norm = q.norm;
  value.target_norm = t.norm;
  value.query_zero = q.zero;
  value.target_zero = t.zero;

  // Fused whenever possible; a fused plan has no tile buffer, so its
  // small last chunk of queries stays fused too.
  if (fused) {
    for (int64_t q0 = 0; q0 < q.n; q0 += kFusedRowsPerLaunch) {
      FusedSelectArgs f;
      f.metric = p_.metric;
      f.dim = dim;
      f.queries = q.x;
      f.query_base = q0;
      f.nq = static_cast<int>(std::min<int64_t>(kFusedRowsPerLaunch, q.n - q0));
      f.targets = t.x;
      f.nt = static_cast<int>(t.n);
      f.query_keys = q.keys;
      f.target_keys = t.keys;
      f.list_key = list_key_.get();
      f.list_row = list_row_.get();
      f.segments = segments;
      f.cap = cap;
      f.kp = kp;
      KNN_TRY(mark(&t_rerank));  // whatever ran before (list clearing) is small
      KNN_TRY(launch_fused_select(ctx_, f));
      KNN_TRY(mark(&t_fused));
      exact_pairs += static_cast<int64_t>(f.nq) * t.n;
      CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
      if (ctx_.cancelled()) {
        ctx_.error = "canceled";
        return KNN_CANCELLED;
      }
    }
    return KNN_OK;
  }
  if (dgemm ? tile_d_.get() == nullptr : tile_.get() == nullptr) {
    ctx_.error = "brute force: no distance tile planned";
    return KNN_INTERNAL_ERROR;
  }
  if (dgemm && (q.xd == nullptr || t.xd == nullptr)) {
    ctx_.error = "brute force: no double rows planned";
    return KNN_INTERNAL_ERROR;
  }

  const float one = 1.0f, zero = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  for (int64_t q0 = 0; q0 < q.n; q0 += plan_.tile_rows) {
    const int nq = static_cast<int>(std::min<int64_t>(plan_.tile_rows, q.n - q0));
    for (int64_t t0 = 0; t0 < t.n; t0 += plan_.tile_cols) {
      const int nt = static_cast<int>(std::min<int64_t>(plan_.tile_cols, t.n - t0));
      if (scoring == Scoring::kExact) {
        KNN_TRY(launch_exact_tile(ctx_, p_.metric, q.x + q0 * dim, nq, t.x + t0 * dim, nt, dim,
                                  tile_.get(), plan_.tile_cols));
        exact_pairs += static_cast<int64_t>(nq) * nt;
        KNN_TRY(mark(&t_score));
      } else if (dgemm) {
        CUBLAS_CHECK(ctx_, cublasDgemm(ctx_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, nt, nq, dim, &one_d,
                                       t.xd + t0 * dim, dim, q.xd + q0 * dim, dim, &zero_d,
                                       tile_d_.get(), plan_.tile_cols));
        gemm_pairs += static_cast<int64_t>(nq) * nt;
        KNN_TRY(mark(&t_score));
      } else {
        // tile[i][j] = dot(query q0+i, target t0+j): column-major C = T^T Q.
        CUBLAS_CHECK(ctx_, cublasSgemm(ctx_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, nt, nq, dim, &one,
                                       t.x + t0 * dim, dim, q.x + q0 * dim, dim, &zero,
                                       tile_.get(), plan_.tile_cols));
        gemm_pairs += static_cast<int64_t>(nq) * nt;
        KNN_TRY(mark(&t_score));
      }
      SelectTileArgs a;
      a.tile = dgemm ? nullptr : tile_.get();
      a.tile_d = dgemm ? tile_d_.get() : nullptr;
      a.ld = plan_.tile_cols;
      a.nq = nq;
      a.nt = nt;
      a.query_base = q0;
      a.target_base = t0;
      a.value = value;
      a.query_keys = q.keys;
      a.target_keys = t.keys;
      a.list_key = list_key_.get();
      a.list_row = list_row_.get();
      a.segments = segments;
      a.cap = cap;
      a.kp = kp;
      KNN_TRY(launch_select_tile(ctx_, a));
      KNN_TRY(mark(&t_select_tiles));
    }
    // One row of tiles at a time: keeps the queue short, so that a cancel
    // is noticed within one row of tiles.
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
    if (ctx_.cancelled()) {
      ctx_.error = "canceled";
      return KNN_CANCELLED;
    }
  }
  return KNN_OK;
}

KnnStatus BruteForce::rerank(Scoring scoring, const Rows &q, const Rows &t, int kp, int cap,
                             const int32_t *out_index, ResultArrays out, uint8_t *certified) {
  RerankArgs r;
  r.list_key = list_key_.get();
  r.list_row = list_row_.get();
  r.segments = segments_;
  r.cap = cap;
  r.kp = kp;
  r.k = p_.k;
  r.exact_lists = scoring == Scoring::kExact;
  r.metric = p_.metric;
  r.dim = p_.dim;
  r.nq = q.n;
  r.queries = q.x;
  r.query_norm = q.norm;
  r.targets = t.x;
  r.target_norm = t.norm;
  r.n_targets = t.n;
  r.target_offset = t.offset;
  r.out_index = out_index;
  r.out = out;
  r.certified = certified;
  exact_pairs += q.n * static_cast<int64_t>(kp);
  return launch_rerank(ctx_, r);
}

// Queries whose GEMM candidates could not be certified: exact tiles.
KnnStatus BruteForce::fallback(const Rows &q, const Rows &t, ResultArrays out) {
  std::vector<uint8_t> flags(q.n);
  CUDA_CHECK(ctx_, cudaMemcpyAsync(flags.data(), certified_.get(), q.n, cudaMemcpyDeviceToHost,
                                   ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  std::vector<int32_t> failed;
  for (int64_t i = 0; i < q.n; i++)
    if (!flags[i]) failed.push_back(static_cast<int32_t>(i));
  fallback_queries += static_cast<int64_t>(failed.size());

  const int kp = static_cast<int>(std::min<int64_t>(p_.k, t.n));
  const int cap = next_pow2(std::max(kp, 32));
  for (size_t b = 0; b < failed.size(); b += plan_.gather_rows) {
    const int64_t n = std::min<int64_t>(plan_.gather_rows, failed.size() - b);
    CUDA_CHECK(ctx_, cudaMemcpyAsync(gather_index_.get(), failed.data() + b, n * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, ctx_.stream));
    KNN_TRY(launch_gather_rows(ctx_, gather_index_.get(), n, p_.dim, q.x, q.norm, q.zero, q.keys,
                               g_buf_.x.get(), g_buf_.norm.get(), g_buf_.zero.get(),
                               q.keys != nullptr ? g_buf_.keys.get() : nullptr));
    Rows g = g_buf_.view(n, 0);
    if (q.keys == nullptr) g.keys = nullptr;
    KNN_TRY(select_pass(Scoring::kExact, g, t, kp, cap));
    KNN_TRY(rerank(Scoring::kExact, g, t, kp, cap, gather_index_.get(), out, nullptr));
    // The index buffer is reused by the next batch.
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  }
  return KNN_OK;
}

KnnStatus BruteForce::solve_block(const Rows &q, const Rows &t, ResultArrays out) {
  if (plan_.full_sort) {
    const Clock::time_point t0 = Clock::now();
    FullSortArgs a;
    a.metric = p_.metric;
    a.dim = p_.dim;
    a.k = p_.k;
    a.nq = q.n;
    a.queries = q.x;
    a.query_norm = q.norm;
    a.query_keys = q.keys;
    a.nt = t.n;
    a.targets = t.x;
    a.target_norm = t.norm;
    a.target_keys = t.keys;
    a.target_offset = t.offset;
    a.out = out;
    a.budget = plan_.full_sort_budget;
    KNN_TRY(run_full_sort(ctx_, a, &exact_pairs));
    seconds_filter += seconds_since(t0);
    return KNN_OK;
  }
  const Scoring scoring = plan_.scoring;
  const bool gemm = is_gemm(scoring);
  const int kp = static_cast<int>(
      std::min<int64_t>(gemm ? plan_.cap : static_cast<int64_t>(p_.k), t.n));
  Clock::time_point t0 = Clock::now();
  KNN_TRY(select_pass(scoring, q, t, kp, plan_.cap));
  seconds_filter += seconds_since(t0);
  t0 = Clock::now();
  KNN_TRY(mark(&t_select_tiles));
  KNN_TRY(rerank(scoring, q, t, kp, plan_.cap, nullptr, out, gemm ? certified_.get() : nullptr));
  KNN_TRY(mark(&t_rerank));
  if (gemm) KNN_TRY(fallback(q, t, out));
  KNN_TRY(mark(&t_fallback));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  seconds_select += seconds_since(t0);
  return KNN_OK;
}

KnnStatus BruteForce::run(int64_t *neighbors, double *distances) {
  const int dim = p_.dim;
  const int k = p_.k;
  const bool keys = p_.query_keys != nullptr;

  // ---- allocations (all released by the owners' destructors) ----
  const bool dbl = plan_.double_gemm;
  for (int b = 0; b < (plan_.t_chunked ? 2 : 1); b++)
    KNN_TRY(t_buf_[b].allocate(ctx_, plan_.t_chunk, dim, keys, dbl, "target rows"));
  if (!plan_.alias_queries)
    KNN_TRY(q_buf_.allocate(ctx_, plan_.q_chunk, dim, keys, dbl, "query rows"));
  if (!plan_.full_sort) {
    const size_t lists = static_cast<size_t>(plan_.q_chunk) * plan_.segments * plan_.cap;
    const size_t tile_elements = static_cast<size_t>(plan_.tile_rows) * plan_.tile_cols;
    if (dbl)
      KNN_TRY(tile_d_.allocate(ctx_, tile_elements, "distance tile"));
    else if (!plan_.fused)
      KNN_TRY(tile_.allocate(ctx_, tile_elements, "distance tile"));
    KNN_TRY(list_key_.allocate(ctx_, lists, "candidate lists"));
    KNN_TRY(list_row_.allocate(ctx_, lists, "candidate lists"));
  }
  if (is_gemm(plan_.scoring) && !plan_.full_sort) {
    KNN_TRY(certified_.allocate(ctx_, plan_.q_chunk, "certification flags"));
    KNN_TRY(gather_index_.allocate(ctx_, plan_.gather_rows, "fallback rows"));
    KNN_TRY(g_buf_.allocate(ctx_, plan_.gather_rows, dim, keys, false, "fallback rows"));
  }
  const size_t slots = static_cast<size_t>(plan_.q_chunk) * k;
  for (int b = 0; b < (plan_.t_chunked ? 2 : 1); b++) {
    KNN_TRY(res_key_[b].allocate(ctx_, slots, "results"));
    KNN_TRY(res_row_[b].allocate(ctx_, slots, "results"));
    KNN_TRY(res_dist_[b].allocate(ctx_, slots, "results"));
  }
  // The allocations are ordered on ctx.stream; the uploads use the staging
  // stream, which may touch them only once they are complete.
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  KNN_TRY(mark(&t_alloc));
  ResultArrays running{res_key_[0].get(), res_row_[0].get(), res_dist_[0].get()};
  ResultArrays block{res_key_[1].get(), res_row_[1].get(), res_dist_[1].get()};

  const int64_t n_t_chunks = (p_.n_targets + plan_.t_chunk - 1) / plan_.t_chunk;
  if (!plan_.t_chunked) {
    const Clock::time_point t0 = Clock::now();
    KNN_TRY(upload_rows(t_buf_[0], p_.targets, p_.target_keys, 0, p_.n_targets, ctx_));
    seconds_transfer += seconds_since(t0);
    KNN_TRY(mark(&t_upload));
    KNN_TRY(row_stats(t_buf_[0], p_.n_targets));
    KNN_TRY(mark(&t_stats));
  }

  for (int64_t q_first = 0; q_first < p_.n_queries; q_first += plan_.q_chunk) {
    const int64_t nq = std::min(plan_.q_chunk, p_.n_queries - q_first);
    Rows q;
    if (plan_.alias_queries) {
      q = t_buf_[0].view(p_.n_targets, 0).slice(q_first, nq, dim);
    } else {
      const Clock::time_point t0 = Clock::now();
      KNN_TRY(upload_rows(q_buf_, p_.queries, p_.query_keys, q_first, nq, ctx_));
      seconds_transfer += seconds_since(t0);
      KNN_TRY(mark(&t_upload));
      KNN_TRY(row_stats(q_buf_, nq));
      KNN_TRY(mark(&t_stats));
      q = q_buf_.view(nq, q_first);
    }

    if (!plan_.t_chunked) {
      KNN_TRY(solve_block(q, t_buf_[0].view(p_.n_targets, 0), running));
    } else {
      KNN_TRY(launch_clear_results(ctx_, running, nq, k));
      // Chunk 0 now; chunk c+1 is uploaded by a helper thread while chunk c
      // is processed.
      const Clock::time_point t0 = Clock::now();
      KNN_TRY(upload_rows(t_buf_[0], p_.targets, p_.target_keys, 0,
                          std::min(plan_.t_chunk, p_.n_targets), ctx_));
      seconds_transfer += seconds_since(t0);
      for (int64_t c = 0; c < n_t_chunks; c++) {
        const int64_t t_first = c * plan_.t_chunk;
        const int64_t nt = std::min(plan_.t_chunk, p_.n_targets - t_first);
        RowBuffers &cur = t_buf_[c % 2];
        KNN_TRY(row_stats(cur, nt));
        // The other buffer's last reader (chunk c-1) is done: solve_block
        // ends with a stream synchronization.
        ThreadGuard prefetch;
        KnnStatus prefetch_status = KNN_OK;
        std::string prefetch_error;
        if (c + 1 < n_t_chunks) {
          const int64_t next_first = t_first + plan_.t_chunk;
          const int64_t next_n = std::min(plan_.t_chunk, p_.n_targets - next_first);
          RowBuffers *next = &t_buf_[(c + 1) % 2];
          prefetch.thread = std::thread([this, next, next_first, next_n, &prefetch_status,
                                         &prefetch_error] {
            DeviceContext tctx;
            tctx.device = ctx_.device;
            tctx.memory_budget = ctx_.memory_budget;
            tctx.staging = ctx_.staging;
            try {
              if (cudaSetDevice(ctx_.device) != cudaSuccess) {
                prefetch_status = KNN_DEVICE_ERROR;
                prefetch_error = "cudaSetDevice failed in the upload thread";
                return;
              }
              prefetch_status = upload_rows(*next, p_.targets, p_.target_keys, next_first,
                                            next_n, tctx);
              prefetch_error = tctx.error;
            } catch (...) {
              prefetch_status = KNN_INTERNAL_ERROR;
              prefetch_error = "exception in the upload thread";
            }
          });
        }
        Rows t = cur.view(nt, t_first);
        const KnnStatus st = solve_block(q, t, block);
        if (prefetch.thread.joinable()) {
          const Clock::time_point w = Clock::now();
          prefetch.thread.join();
          seconds_transfer += seconds_since(w);  // only the part not hidden
        }
        if (st != KNN_OK) return st;
        if (prefetch_status != KNN_OK) {
          ctx_.error = prefetch_error;
          return prefetch_status;
        }
        KNN_TRY(launch_merge_results(ctx_, running, block, nq, k));
      }
    }

    KNN_TRY(mark(&t_fallback));
    const Clock::time_point t0 = Clock::now();
    KNN_TRY(download_to_host(ctx_, neighbors + q_first * k, running.row,
                             static_cast<size_t>(nq) * k * sizeof(int64_t)));
    KNN_TRY(download_to_host(ctx_, distances + q_first * k, running.dist,
                             static_cast<size_t>(nq) * k * sizeof(double)));
    seconds_transfer += seconds_since(t0);
    KNN_TRY(mark(&t_download));
    if (ctx_.cancelled()) {
      ctx_.error = "canceled";
      return KNN_CANCELLED;
    }
  }
  return KNN_OK;
}

}  // namespace

KnnStatus brute_force_join(const KnnProblem &problem, int64_t *neighbors, double *distances,
                           KnnStats *stats, DeviceContext &ctx) {
  const Clock::time_point start = Clock::now();
  Plan plan;
  KNN_TRY(make_plan(problem, ctx, &plan));
  BruteForce bf(problem, ctx, plan);
  const char *timing = std::getenv("KNN_CUDA_TIMING");
  bf.timing = timing != nullptr && timing[0] == '1';
  const KnnStatus st = bf.run(neighbors, distances);
  const bool gemm = is_gemm(plan.scoring) && !plan.full_sort;
  const bool dgemm = gemm && plan.scoring == Scoring::kGemmDouble;
  if (bf.timing)
    std::fprintf(stderr,
                 "knn brute timing: alloc %.5f upload %.5f stats %.5f score %.5f "
                 "select-tiles %.5f fused %.5f rerank %.5f fallback %.5f download %.5f s "
                 "(%s, fallback queries %lld, S=%d cap=%d tile %dx%d)\n",
                 bf.t_alloc, bf.t_upload, bf.t_stats, bf.t_score, bf.t_select_tiles, bf.t_fused,
                 bf.t_rerank, bf.t_fallback, bf.t_download,
                 !gemm ? "exact" : dgemm ? "dgemm" : "sgemm",
                 static_cast<long long>(bf.fallback_queries), plan.segments, plan.cap,
                 plan.tile_rows, plan.tile_cols);
  if (stats != nullptr) {
    std::snprintf(stats->method, sizeof stats->method, "brute");
    const char *scoring = plan.full_sort ? "exact-tiles/full-sort"
                          : dgemm        ? "dgemm-bound/warp-select"
                          : gemm         ? "sgemm-bound/warp-select"
                          : plan.fused   ? "exact-fused-select"
                                         : "exact-tiles/warp-select";
    char chunks[48] = "";
    if (plan.q_chunk < problem.n_queries || plan.t_chunked)
      std::snprintf(chunks, sizeof chunks, " chunks %lldx%lld",
                    static_cast<long long>(plan.q_chunk), static_cast<long long>(plan.t_chunk));
    std::snprintf(stats->variant, sizeof stats->variant, "%s k'=%d%s%s", scoring,
                  plan.full_sort ? problem.k : plan.cap, chunks,
                  bf.fallback_queries > 0 ? " +fallback" : "");
    stats->distance_computations = bf.exact_pairs;
    stats->pairs = problem.n_queries * problem.n_targets;
    stats->threads_per_query = plan.full_sort ? 1 : 32 * plan.segments;
    stats->seconds_transfer = bf.seconds_transfer;
    stats->seconds_filter = bf.seconds_filter;
    stats->seconds_select = bf.seconds_select;
    stats->seconds_total = seconds_since(start);
  }
  return st;
}

}  // namespace cuda
}  // namespace knn
