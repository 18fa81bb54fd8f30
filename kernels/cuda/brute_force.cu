// brute_force.cu -- knn::cuda::brute_force_join: the exact all-pairs join.
// brute_plan.cu decides how (scoring, list sizes, chunks, tiles); this file
// runs the plan.
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
//       Where FP64 is fast the DGEMM filter is also the faster one: its
//       tighter bound certifies far more queries, so fewer are redone.
//  2. rerank.cu computes the candidates' exact distances with
//     knn_distance.h, sorts them and, for GEMM candidates, certifies each
//     query; queries that fail certification are redone exactly.
// k beyond the selection's capacity takes the fp16 filter's large-k path
// (large_k_select.cu) where that filter is picked, else (and for the
// queries large k cannot certify) the full-sort path (full_sort.cu).
// Small query batches (< kFusedMinQueries) use small exact tiles and split
// each query's targets over many warps (segments), which the reranking
// merges. When the data do not fit the memory budget, queries and targets
// are processed in chunks; the exact k best of successive target chunks are
// merged (rows are global, so ties still go to the smaller row), and the
// next target chunk is uploaded (pinned double buffer, own stream, helper
// thread) while the current one is processed. Float16 rows
// (KNN_ELEMENT_FLOAT16) travel as float16 and are widened on the device
// into the float rows (upload_half_rows); everything after that is the
// float32 join of the same values. The engines of a join split across GPUs
// upload resident targets once between them and copy the slices GPU to GPU
// (peer_rows.cuh); a query share that is a run of the target rows (a
// self-join's) reads its rows from the resident targets instead of
// uploading them again.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "../problem_check.h"
#include "bitonic.cuh"
#include "brute_kernels.cuh"
#include "brute_plan.cuh"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"
#include "device_buffer.cuh"
#include "device_thread.cuh"
#include "host_transfer.cuh"
#include "large_k_select.cuh"
#include "peer_rows.cuh"
#include "phase_timer.cuh"
#include "../stopwatch.h"

namespace knn {
namespace cuda {
namespace {

// The device arrays of one side's rows (Rows is their view).
struct RowBuffers {
  DeviceBuffer<float> x, norm;
  DeviceBuffer<uint8_t> zero;
  DeviceBuffer<int64_t> keys;
  DeviceBuffer<double> xd, norm_d;
  DeviceBuffer<uint16_t> xh;
  DeviceBuffer<HalfRowStats> half;
  DeviceBuffer<float> half_scale;

  KnnStatus allocate(DeviceContext &ctx, int64_t rows, int dim, bool with_keys,
                     bool with_double, bool with_half, const char *what) {
    KNN_TRY(x.allocate(ctx, static_cast<size_t>(rows) * dim, what));
    KNN_TRY(norm.allocate(ctx, rows, what));
    KNN_TRY(zero.allocate(ctx, rows, what));
    if (with_keys) KNN_TRY(keys.allocate(ctx, rows, what));
    if (with_double) {
      KNN_TRY(xd.allocate(ctx, static_cast<size_t>(rows) * dim, what));
      KNN_TRY(norm_d.allocate(ctx, rows, what));
    }
    if (with_half) {
      KNN_TRY(xh.allocate(ctx, static_cast<size_t>(rows) * half_row_stride(dim), what));
      KNN_TRY(half.allocate(ctx, rows, what));
      KNN_TRY(half_scale.allocate(ctx, rows, what));
    }
    return KNN_OK;
  }

  Rows view(int64_t n, int64_t offset) const {
    Rows r;
    r.x = x.get();
    r.xd = xd.get();
    r.norm_d = norm_d.get();
    r.xh = xh.get();
    r.half = half.get();
    r.half_scale = half_scale.get();
    r.norm = norm.get();
    r.zero = zero.get();
    r.keys = keys.get();
    r.n = n;
    r.offset = offset;
    return r;
  }
};

// The running k best of a query chunk, and the k best of the current
// target chunk (merged into the running ones when targets are chunked).
struct ResultBuffers {
  DeviceBuffer<uint64_t> key;
  DeviceBuffer<int64_t> row;
  DeviceBuffer<double> dist;

  KnnStatus allocate(DeviceContext &ctx, size_t slots) {
    KNN_TRY(key.allocate(ctx, slots, "results"));
    KNN_TRY(row.allocate(ctx, slots, "results"));
    KNN_TRY(dist.allocate(ctx, slots, "results"));
    return KNN_OK;
  }

  ResultArrays view() const { return ResultArrays{key.get(), row.get(), dist.get()}; }
};

class BruteForce {
 public:
  BruteForce(const KnnProblem &p, DeviceContext &ctx, const Plan &plan)
      : p_(p), ctx_(ctx), plan_(plan) {}

  KnnStatus run(int64_t *neighbors, double *distances);

  int64_t exact_pairs = 0;      // exact distances evaluated
  int64_t fallback_queries = 0; // (query, target chunk) redone with exact tiles
  bool shared_targets = false;  // uploaded once with the split's other engines
  double seconds_transfer = 0, seconds_filter = 0, seconds_select = 0;
  PhaseTimer phases;  // KNN_BRUTE_PHASES=1: device time per stage

 private:
  // ---- stages of run() ----
  KnnStatus allocate();
  KnnStatus load_resident_targets();
  KnnStatus load_queries(int64_t first, int64_t n, Rows *q);
  KnnStatus join_target_chunks(const Rows &q, ResultArrays running);
  KnnStatus join_target_chunk(const Rows &q, int64_t chunk, ResultArrays block);
  KnnStatus download(int64_t first, int64_t n, ResultArrays running, int64_t *neighbors,
                     double *distances);

  // ---- one (query chunk, target chunk) block ----
  KnnStatus solve_block(const Rows &q, const Rows &t, ResultArrays out);
  KnnStatus full_sort(const Rows &q, const Rows &t, ResultArrays out,
                      const int32_t *out_index = nullptr);
  KnnStatus large_k(const Rows &q, const Rows &t, ResultArrays out);
  KnnStatus select_pass(Scoring scoring, const Rows &q, const Rows &t, int kp, int cap);
  int segments_for(bool fused, const Rows &q, const Rows &t, int cap) const;
  TileValue tile_value(Scoring scoring, const Rows &q, const Rows &t) const;
  KnnStatus select_fused(const Rows &q, const Rows &t, const CandidateLists &lists);
  KnnStatus select_tiled(Scoring scoring, const Rows &q, const Rows &t,
                         const CandidateLists &lists);
  KnnStatus score_tile(Scoring scoring, const Rows &q, const Rows &t, int64_t q0, int nq,
                       int64_t t0, int nt);
  KnnStatus half_gemm(const Rows &q, const Rows &t, int64_t q0, int nq, int64_t t0, int nt,
                      void *out, cudaStream_t stream, int64_t t_step = 1, int ldc = 0);
  KnnStatus select_tiled_pipelined(const Rows &q, const Rows &t, SelectTileArgs a);
  KnnStatus rerank(Scoring scoring, const Rows &q, const Rows &t, int kp, int cap,
                   const int32_t *out_index, ResultArrays out, uint8_t *certified);
  KnnStatus fallback(const Rows &q, const Rows &t, ResultArrays out);

  KnnStatus upload_rows(RowBuffers &dst, const void *host, const int64_t *host_keys,
                        int64_t first, int64_t n, DeviceContext &ctx);
  KnnStatus upload_half_rows(float *x, const void *host, int64_t first, int64_t n,
                             DeviceContext &ctx);
  KnnStatus upload_target_slice(int64_t first, int64_t n);
  KnnStatus load_shared_targets();
  KnnStatus row_stats(const RowBuffers &b, int64_t n);
  int64_t target_chunk_rows(int64_t chunk) const {
    return std::min(plan_.t_chunk, p_.n_targets - chunk * plan_.t_chunk);
  }

  int segments_ = 1;  // lists per query of the last select_pass

  const KnnProblem &p_;
  DeviceContext &ctx_;
  const Plan &plan_;
  RowBuffers t_buf_[2], q_buf_, g_buf_;
  DeviceBuffer<float> tile_;     // exact or SGEMM tiles
  DeviceBuffer<double> tile_d_;  // DGEMM tiles
  // The fp16 filter's second tile, its GEMM stream and their events.
  DeviceBuffer<float> tile2_;
  Stream gemm_stream_;
  Event gemm_done_[2], tile_free_[2];
  DeviceBuffer<uint64_t> list_key_;
  DeviceBuffer<uint32_t> list_row_;
  DeviceBuffer<uint8_t> certified_;
  DeviceBuffer<int32_t> gather_index_;
  LargeKSelect large_k_;
  ResultBuffers results_[2];  // [0] running, [1] the current target chunk's
  // Last, so first to go: the other engines' reads of t_buf_[0] end before
  // it is freed.
  PeerRowsTurn peer_turn_;
};

// Rows [first, first + n) of the problem's host rows (and keys) into dst.
KnnStatus BruteForce::upload_rows(RowBuffers &dst, const void *host, const int64_t *host_keys,
                                  int64_t first, int64_t n, DeviceContext &ctx) {
  if (p_.element == KNN_ELEMENT_FLOAT16)
    KNN_TRY(upload_half_rows(dst.x.get(), host, first, n, ctx));
  else
    KNN_TRY(upload_to_device(ctx, dst.x.get(), float_rows(host) + first * p_.dim,
                             static_cast<size_t>(n) * p_.dim * sizeof(float)));
  if (host_keys != nullptr)
    KNN_TRY(upload_to_device(ctx, dst.keys.get(), host_keys + first, n * sizeof(int64_t)));
  return KNN_OK;
}

// Float16 rows [first, first + n) into the float rows x: uploaded as they
// are (pinned staging, half the bytes of float32 rows) into the upper half
// of x's bytes, then widened in place on the stream that carried them, so
// no device memory beyond the float rows is needed.
KnnStatus BruteForce::upload_half_rows(float *x, const void *host, int64_t first, int64_t n,
                                       DeviceContext &ctx) {
  const int64_t values = n * p_.dim;
  KNN_TRY(upload_to_device(ctx, reinterpret_cast<uint16_t *>(x) + values,
                           static_cast<const uint16_t *>(host) + first * p_.dim,
                           static_cast<size_t>(values) * sizeof(uint16_t)));
  const cudaStream_t stream = ctx.staging != nullptr ? ctx.staging->upload_stream() : ctx.stream;
  KNN_TRY(launch_widen_half_in_place(ctx, stream, x, values));
  CUDA_CHECK(ctx, cudaStreamSynchronize(stream));
  return KNN_OK;
}

KnnStatus BruteForce::row_stats(const RowBuffers &b, int64_t n) {
  phases.mark(ctx_.stream, PhaseTimer::kOther);
  KNN_TRY(launch_row_stats(ctx_, b.x.get(), n, p_.dim, b.norm.get(), b.zero.get()));
  if (plan_.double_gemm)
    KNN_TRY(launch_to_double(ctx_, b.x.get(), n, p_.dim, b.xd.get(), b.norm_d.get()));
  if (plan_.half_gemm)
    KNN_TRY(launch_to_half(ctx_, b.x.get(), n, p_.dim, b.xh.get(), b.half.get(),
                           b.half_scale.get()));
  phases.mark(ctx_.stream, PhaseTimer::kRows);
  return KNN_OK;
}

// Lists per query: the plan's, or for the fused kernel enough blocks for
// the GPU (the targets split further when there are few queries, as in the
// exact fallback's batches), as far as the lists fit.
int BruteForce::segments_for(bool fused, const Rows &q, const Rows &t, int cap) const {
  if (!fused) return std::min(plan_.segments, kMaxListEntries / cap);
  const int64_t rows = std::min(q.n, kFusedRowsPerLaunch);
  const int64_t blocks = (rows + fused_select_rows_per_block() - 1) / fused_select_rows_per_block();
  const int64_t fit = static_cast<int64_t>(list_key_.size()) / (q.n * static_cast<int64_t>(cap));
  int64_t want = (kFusedBlocksWanted + blocks - 1) / blocks;
  want = std::min({want, std::max<int64_t>(1, t.n / 256), fit,
                   static_cast<int64_t>(kMaxListEntries / cap)});
  return static_cast<int>(std::max<int64_t>(1, want));
}

// What the selection compares for a pair under `scoring` (tile_value.cuh).
TileValue BruteForce::tile_value(Scoring scoring, const Rows &q, const Rows &t) const {
  TileValue value;
  if (scoring == Scoring::kExact) {
    value.kind = exact_kind(p_.metric);
  } else if (scoring == Scoring::kGemmDouble) {
    set_double_bound_constants(&value, p_.dim);
    value.query_norm_d = q.norm_d;
    value.target_norm_d = t.norm_d;
  } else if (scoring == Scoring::kGemmHalf) {
    set_half_bound_constants(&value, p_.metric, p_.dim, plan_.half_tiles);
    value.query_half = q.half;
    value.target_half = t.half;
    value.query_scale = q.half_scale;
    value.target_scale = t.half_scale;
  } else {
    set_bound_constants(&value, p_.metric, p_.dim);
  }
  value.query_norm = q.norm;
  value.target_norm = t.norm;
  value.query_zero = q.zero;
  value.target_zero = t.zero;
  return value;
}

// Fills the candidate lists of q (kp each, capacity cap) from the targets t.
KnnStatus BruteForce::select_pass(Scoring scoring, const Rows &q, const Rows &t, int kp,
                                  int cap) {
  // Fused whenever possible; a fused plan has no tile buffer, so its
  // small last chunk of queries stays fused too.
  const bool fused = scoring == Scoring::kExact && fused_select_supports(p_.metric, cap) &&
                     (q.n >= kFusedMinQueries || tile_.get() == nullptr);
  CandidateLists lists{list_key_.get(), list_row_.get(), segments_for(fused, q, t, cap), cap, kp};
  segments_ = lists.segments;  // rerank reads the lists with the same layout
  KNN_TRY(launch_clear_entries(ctx_, lists.key, lists.row,
                               q.n * lists.segments * static_cast<int64_t>(cap)));
  return fused ? select_fused(q, t, lists) : select_tiled(scoring, q, t, lists);
}

KnnStatus BruteForce::select_fused(const Rows &q, const Rows &t, const CandidateLists &lists) {
  for (int64_t q0 = 0; q0 < q.n; q0 += kFusedRowsPerLaunch) {
    FusedSelectArgs f;
    f.metric = p_.metric;
    f.dim = p_.dim;
    f.queries = q.x;
    f.query_base = q0;
    f.nq = static_cast<int>(std::min<int64_t>(kFusedRowsPerLaunch, q.n - q0));
    f.targets = t.x;
    f.nt = static_cast<int>(t.n);
    f.query_keys = q.keys;
    f.target_keys = t.keys;
    f.lists = lists;
    KNN_TRY(launch_fused_select(ctx_, f));
    exact_pairs += static_cast<int64_t>(f.nq) * t.n;
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
    KNN_TRY(ctx_.cancel_point());
  }
  return KNN_OK;
}

// Tile [q0, q0 + nq) x [t0, t0 + nt) of the plan's kind into tile_ / tile_d_.
KnnStatus BruteForce::score_tile(Scoring scoring, const Rows &q, const Rows &t, int64_t q0,
                                 int nq, int64_t t0, int nt) {
  const int dim = p_.dim;
  if (scoring == Scoring::kExact) {
    exact_pairs += static_cast<int64_t>(nq) * nt;
    return launch_exact_tile(ctx_, p_.metric, q.x + q0 * dim, nq, t.x + t0 * dim, nt, dim,
                             tile_.get(), plan_.tile_cols);
  }
  // tile[i][j] = dot(query q0+i, target t0+j): column-major C = T^T Q.
  if (scoring == Scoring::kGemmHalf) return half_gemm(q, t, q0, nq, t0, nt, tile_.get(), ctx_.stream);
  if (scoring == Scoring::kGemmDouble) {
    const double one = 1.0, zero = 0.0;
    CUBLAS_CHECK(ctx_, cublasDgemm(ctx_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, nt, nq, dim, &one,
                                   t.xd + t0 * dim, dim, q.xd + q0 * dim, dim, &zero,
                                   tile_d_.get(), plan_.tile_cols));
  } else {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(ctx_, cublasSgemm(ctx_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, nt, nq, dim, &one,
                                   t.x + t0 * dim, dim, q.x + q0 * dim, dim, &zero,
                                   tile_.get(), plan_.tile_cols));
  }
  return KNN_OK;
}

// The fp16 tensor-core tile into `out` on `stream`: scaled dots with fp32
// accumulation, written as fp16 or fp32 (plan_.half_tiles; half_bound.cuh
// states what the bound assumes of both). The
// handle's pedantic mode is lifted for this call only (tensor cores);
// reductions stay in fp32 (the output type). Both settings are restored
// before any failure is reported. Targets t0, t0 + t_step, ... (a sample
// for large k); ldc 0: the plan's tile.
KnnStatus BruteForce::half_gemm(const Rows &q, const Rows &t, int64_t q0, int nq, int64_t t0,
                                int nt, void *out, cudaStream_t stream, int64_t t_step,
                                int ldc) {
  const int ld = half_row_stride(p_.dim);
  if (q.xh == nullptr || t.xh == nullptr || ld * t_step > 2147483647) {
    ctx_.error = "brute force: no fp16 rows planned";
    return KNN_INTERNAL_ERROR;
  }
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_CHECK(ctx_, cublasSetStream(ctx_.cublas, stream));
  cublasStatus_t st = cublasSetMathMode(
      ctx_.cublas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                             CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasGemmEx(ctx_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, nt, nq, ld, &one, t.xh + t0 * ld,
                      CUDA_R_16F, static_cast<int>(ld * t_step), q.xh + q0 * ld, CUDA_R_16F, ld,
                      &zero, out, plan_.half_tiles ? CUDA_R_16F : CUDA_R_32F,
                      ldc > 0 ? ldc : plan_.tile_cols, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  const cublasStatus_t mode = cublasSetMathMode(ctx_.cublas, CUBLAS_PEDANTIC_MATH);
  const cublasStatus_t back = cublasSetStream(ctx_.cublas, ctx_.stream);
  CUBLAS_CHECK(ctx_, st);
  CUBLAS_CHECK(ctx_, mode);
  CUBLAS_CHECK(ctx_, back);
  return KNN_OK;
}

// The fp16 filter's tiles, pipelined: the GEMM of the next tile (on
// gemm_stream_, into the other of two tile buffers) runs while the
// selection reads the current one. Events order each GEMM after the
// selection that last read its buffer, and each selection after its GEMM.
KnnStatus BruteForce::select_tiled_pipelined(const Rows &q, const Rows &t, SelectTileArgs a) {
  const cudaStream_t main = ctx_.stream, side = gemm_stream_.get();
  // On every return (errors included) the side stream is idle, so that no
  // GEMM still writes a tile when the buffers are freed on the main stream.
  struct Drain {
    cudaStream_t s;
    ~Drain() { (void)cudaStreamSynchronize(s); }
  } drain{side};
  float *tiles[2] = {tile_.get(), tile2_.get()};
  // The side stream starts after everything queued so far (rows, lists).
  for (int b = 0; b < 2; b++) CUDA_CHECK(ctx_, cudaEventRecord(tile_free_[b].get(), main));
  int64_t i = 0;
  for (int64_t q0 = 0; q0 < q.n; q0 += plan_.tile_rows) {
    a.nq = static_cast<int>(std::min<int64_t>(plan_.tile_rows, q.n - q0));
    a.query_base = q0;
    for (int64_t t0 = 0; t0 < t.n; t0 += plan_.tile_cols, i++) {
      const int b = static_cast<int>(i % 2);
      a.nt = static_cast<int>(std::min<int64_t>(plan_.tile_cols, t.n - t0));
      a.target_base = t0;
      if (plan_.half_tiles)
        a.tile_h = reinterpret_cast<const uint16_t *>(tiles[b]);
      else
        a.tile = tiles[b];
      CUDA_CHECK(ctx_, cudaStreamWaitEvent(side, tile_free_[b].get(), 0));
      KNN_TRY(half_gemm(q, t, q0, a.nq, t0, a.nt, tiles[b], side));
      CUDA_CHECK(ctx_, cudaEventRecord(gemm_done_[b].get(), side));
      CUDA_CHECK(ctx_, cudaStreamWaitEvent(main, gemm_done_[b].get(), 0));
      KNN_TRY(launch_select_tile(ctx_, a));
      CUDA_CHECK(ctx_, cudaEventRecord(tile_free_[b].get(), main));
    }
    // Every GEMM so far precedes a selection on the main stream.
    CUDA_CHECK(ctx_, cudaStreamSynchronize(main));
    KNN_TRY(ctx_.cancel_point());
  }
  return KNN_OK;
}

KnnStatus BruteForce::select_tiled(Scoring scoring, const Rows &q, const Rows &t,
                                   const CandidateLists &lists) {
  const bool dgemm = scoring == Scoring::kGemmDouble;
  if (dgemm ? tile_d_.get() == nullptr : tile_.get() == nullptr) {
    ctx_.error = "brute force: no distance tile planned";
    return KNN_INTERNAL_ERROR;
  }
  if (dgemm && (q.xd == nullptr || t.xd == nullptr)) {
    ctx_.error = "brute force: no double rows planned";
    return KNN_INTERNAL_ERROR;
  }
  SelectTileArgs a;
  const bool half_tiles = scoring == Scoring::kGemmHalf && plan_.half_tiles;
  a.tile = dgemm || half_tiles ? nullptr : tile_.get();
  a.tile_h = half_tiles ? reinterpret_cast<const uint16_t *>(tile_.get()) : nullptr;
  a.tile_d = dgemm ? tile_d_.get() : nullptr;
  a.ld = plan_.tile_cols;
  a.value = tile_value(scoring, q, t);
  a.query_keys = q.keys;
  a.target_keys = t.keys;
  a.lists = lists;
  if (scoring == Scoring::kGemmHalf && plan_.pipelined) return select_tiled_pipelined(q, t, a);
  phases.mark(ctx_.stream, PhaseTimer::kOther);
  for (int64_t q0 = 0; q0 < q.n; q0 += plan_.tile_rows) {
    a.nq = static_cast<int>(std::min<int64_t>(plan_.tile_rows, q.n - q0));
    a.query_base = q0;
    for (int64_t t0 = 0; t0 < t.n; t0 += plan_.tile_cols) {
      a.nt = static_cast<int>(std::min<int64_t>(plan_.tile_cols, t.n - t0));
      a.target_base = t0;
      KNN_TRY(score_tile(scoring, q, t, q0, a.nq, t0, a.nt));
      phases.mark(ctx_.stream, PhaseTimer::kGemm);
      KNN_TRY(launch_select_tile(ctx_, a));
      phases.mark(ctx_.stream, PhaseTimer::kSelect);
      phases.add_tile_bytes(double(a.nq) * a.nt * (dgemm ? 8 : a.tile_h != nullptr ? 2 : 4));
    }
    // One row of tiles at a time: keeps the queue short, so that a cancel
    // is noticed within one row of tiles.
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
    phases.flush();
    KNN_TRY(ctx_.cancel_point());
  }
  return KNN_OK;
}

KnnStatus BruteForce::rerank(Scoring scoring, const Rows &q, const Rows &t, int kp, int cap,
                             const int32_t *out_index, ResultArrays out, uint8_t *certified) {
  RerankArgs r;
  r.lists = CandidateLists{list_key_.get(), list_row_.get(), segments_, cap, kp};
  r.k = p_.k;
  r.exact_lists = scoring == Scoring::kExact;
  r.metric = p_.metric;
  r.dim = p_.dim;
  r.q = q;
  r.t = t;
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
    KNN_TRY(launch_gather_rows(ctx_, gather_index_.get(), n, p_.dim, q, g_buf_.x.get(),
                               g_buf_.norm.get(), g_buf_.zero.get(),
                               q.keys != nullptr ? g_buf_.keys.get() : nullptr));
    Rows g = g_buf_.view(n, 0);
    if (q.keys == nullptr) g.keys = nullptr;
    if (plan_.large_k) {  // k beyond the exact lists too
      KNN_TRY(full_sort(g, t, out, gather_index_.get()));
    } else {
      KNN_TRY(select_pass(Scoring::kExact, g, t, kp, cap));
      KNN_TRY(rerank(Scoring::kExact, g, t, kp, cap, gather_index_.get(), out, nullptr));
    }
    // The index buffer is reused by the next batch.
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  }
  return KNN_OK;
}

KnnStatus BruteForce::full_sort(const Rows &q, const Rows &t, ResultArrays out,
                                const int32_t *out_index) {
  const Clock::time_point t0 = Clock::now();
  FullSortArgs a;
  a.metric = p_.metric;
  a.dim = p_.dim;
  a.k = p_.k;
  a.q = q;
  a.t = t;
  a.out = out;
  a.budget = plan_.full_sort_budget;
  a.out_index = out_index;
  KNN_TRY(run_full_sort(ctx_, a, &exact_pairs));
  seconds_filter += seconds_since(t0);
  return KNN_OK;
}

// k beyond the lists on the fp16 filter (large_k_select.cu), then the full
// sort for the queries it could not certify.
KnnStatus BruteForce::large_k(const Rows &q, const Rows &t, ResultArrays out) {
  Clock::time_point t0 = Clock::now();
  LargeKArgs a;
  a.metric = p_.metric;
  a.dim = p_.dim;
  a.k = p_.k;
  a.q = q;
  a.t = t;
  a.value = tile_value(Scoring::kGemmHalf, q, t);
  a.half_tiles = plan_.half_tiles;
  a.tile = tile_.get();
  a.tile_rows = plan_.tile_rows;
  a.tile_cols = plan_.tile_cols;
  a.out = out;
  a.certified = certified_.get();
  a.gemm = [&](int64_t q0, int nq, int64_t first, int64_t step, int nt, void *dst, int ldc) {
    return half_gemm(q, t, q0, nq, first, nt, dst, ctx_.stream, step, ldc);
  };
  KNN_TRY(large_k_.run(ctx_, a, &exact_pairs));
  seconds_filter += seconds_since(t0);
  t0 = Clock::now();
  KNN_TRY(fallback(q, t, out));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  seconds_select += seconds_since(t0);
  return KNN_OK;
}

// The k best of t for every query of q, into out; ends with the stream
// synchronized.
KnnStatus BruteForce::solve_block(const Rows &q, const Rows &t, ResultArrays out) {
  if (plan_.full_sort) return full_sort(q, t, out);
  if (plan_.large_k) return large_k(q, t, out);
  const Scoring scoring = plan_.scoring;
  const bool gemm = is_gemm(scoring);
  const int kp = static_cast<int>(
      std::min<int64_t>(gemm ? plan_.cap : static_cast<int64_t>(p_.k), t.n));
  Clock::time_point t0 = Clock::now();
  KNN_TRY(select_pass(scoring, q, t, kp, plan_.cap));
  seconds_filter += seconds_since(t0);
  t0 = Clock::now();
  KNN_TRY(rerank(scoring, q, t, kp, plan_.cap, nullptr, out, gemm ? certified_.get() : nullptr));
  phases.mark(ctx_.stream, PhaseTimer::kRerank);
  if (gemm) KNN_TRY(fallback(q, t, out));
  phases.mark(ctx_.stream, PhaseTimer::kOther);
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  phases.flush();
  seconds_select += seconds_since(t0);
  return KNN_OK;
}

// Every device array of the plan (all released by the owners' destructors).
KnnStatus BruteForce::allocate() {
  const int dim = p_.dim;
  const bool keys = p_.query_keys != nullptr;
  const bool dbl = plan_.double_gemm;
  const bool half = plan_.half_gemm;
  const int buffers = plan_.t_chunked ? 2 : 1;
  for (int b = 0; b < buffers; b++)
    KNN_TRY(t_buf_[b].allocate(ctx_, plan_.t_chunk, dim, keys, dbl, half, "target rows"));
  if (!plan_.alias_queries)
    KNN_TRY(q_buf_.allocate(ctx_, plan_.q_chunk, dim, keys, dbl, half, "query rows"));
  if (plan_.large_k)
    KNN_TRY(large_k_.allocate(ctx_, plan_.q_chunk, plan_.large_k_capacity));
  if (!plan_.full_sort) {
    const size_t lists = static_cast<size_t>(plan_.q_chunk) * plan_.segments * plan_.cap;
    const size_t tile_elements = static_cast<size_t>(plan_.tile_rows) * plan_.tile_cols;
    if (dbl)
      KNN_TRY(tile_d_.allocate(ctx_, tile_elements, "distance tile"));
    if ((!dbl && !plan_.fused) || plan_.fallback_tile)
      KNN_TRY(tile_.allocate(ctx_, tile_elements, "distance tile"));
    if (plan_.pipelined) {
      KNN_TRY(tile2_.allocate(ctx_, tile_elements, "distance tile"));
      KNN_TRY(gemm_stream_.create(ctx_));
      for (int b = 0; b < 2; b++) {
        KNN_TRY(gemm_done_[b].create(ctx_));
        KNN_TRY(tile_free_[b].create(ctx_));
      }
    }
    if (!plan_.large_k) {
      KNN_TRY(list_key_.allocate(ctx_, lists, "candidate lists"));
      KNN_TRY(list_row_.allocate(ctx_, lists, "candidate lists"));
    }
  }
  if (is_gemm(plan_.scoring) && !plan_.full_sort) {
    KNN_TRY(certified_.allocate(ctx_, plan_.q_chunk, "certification flags"));
    KNN_TRY(gather_index_.allocate(ctx_, plan_.gather_rows, "fallback rows"));
    KNN_TRY(g_buf_.allocate(ctx_, plan_.gather_rows, dim, keys, false, false, "fallback rows"));
  }
  const size_t slots = static_cast<size_t>(plan_.q_chunk) * p_.k;
  for (int b = 0; b < buffers; b++) KNN_TRY(results_[b].allocate(ctx_, slots));
  // The allocations are ordered on ctx.stream; the uploads use the staging
  // stream, which may touch them only once they are complete.
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  return KNN_OK;
}

// Targets that fit in one chunk stay on the device for every query chunk.
// The engines of a split join upload them once between them, where all of
// them keep them so (peer_rows.cuh).
KnnStatus BruteForce::load_resident_targets() {
  const Clock::time_point t0 = Clock::now();
  bool shared = false;
  if (ctx_.peer_rows != nullptr)
    KNN_TRY(ctx_.peer_rows->offer(ctx_, ctx_.share_voter, t_buf_[0].x.get(), p_.n_targets,
                                  p_.dim, p_.targets, static_cast<int>(p_.element),
                                  p_.target_keys, &shared));
  if (shared)
    KNN_TRY(load_shared_targets());
  else
    KNN_TRY(upload_rows(t_buf_[0], p_.targets, p_.target_keys, 0, p_.n_targets, ctx_));
  seconds_transfer += seconds_since(t0);
  return row_stats(t_buf_[0], p_.n_targets);
}

// Target rows [first, first + n) from the host into their place of the
// resident buffer.
KnnStatus BruteForce::upload_target_slice(int64_t first, int64_t n) {
  float *x = t_buf_[0].x.get() + first * p_.dim;
  if (p_.element == KNN_ELEMENT_FLOAT16) return upload_half_rows(x, p_.targets, first, n, ctx_);
  return upload_to_device(ctx_, x, float_rows(p_.targets) + first * p_.dim,
                          static_cast<size_t>(n) * p_.dim * sizeof(float));
}

// A split join's shared upload: this engine's slice from the host, every
// other slice from its engine's GPU, the keys from the host. The buffer is
// first filled with NaN bits, so that a slice not copied shows in the
// results (tests) instead of a stale copy of the same rows.
KnnStatus BruteForce::load_shared_targets() {
  PeerRows &peers = *ctx_.peer_rows;
  const int me = peers.member(ctx_.share_voter);
  peer_turn_.take(&peers, me, ctx_.stream);
  int64_t first, count;
  peers.slice(me, &first, &count);
  auto fill_and_upload = [&]() -> KnnStatus {
    CUDA_CHECK(ctx_, cudaMemsetAsync(t_buf_[0].x.get(), 0xFF,
                                     static_cast<size_t>(p_.n_targets) * p_.dim * sizeof(float),
                                     ctx_.stream));
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
    return upload_target_slice(first, count);
  };
  const KnnStatus own = fill_and_upload();
  peers.slice_done(me, own == KNN_OK);
  KNN_TRY(own);
  if (p_.target_keys != nullptr)
    KNN_TRY(upload_to_device(ctx_, t_buf_[0].keys.get(), p_.target_keys,
                             static_cast<size_t>(p_.n_targets) * sizeof(int64_t)));
  KNN_TRY(copy_other_slices(ctx_, peers, me, t_buf_[0].x.get(), p_.dim * sizeof(float)));
  peer_turn_.finished_reading();
  shared_targets = true;
  return KNN_OK;
}

// Query rows [first, first + n) on the device (or, in a self-join with
// resident targets, the same rows of the targets).
KnnStatus BruteForce::load_queries(int64_t first, int64_t n, Rows *q) {
  if (plan_.alias_queries) {
    *q = t_buf_[0].view(p_.n_targets, 0).slice(plan_.alias_first + first, n, p_.dim);
    return KNN_OK;
  }
  const Clock::time_point t0 = Clock::now();
  KNN_TRY(upload_rows(q_buf_, p_.queries, p_.query_keys, first, n, ctx_));
  seconds_transfer += seconds_since(t0);
  KNN_TRY(row_stats(q_buf_, n));
  *q = q_buf_.view(n, first);
  return KNN_OK;
}

// Target chunk `chunk` (already uploaded into its buffer) against q, into
// block; the next chunk is uploaded by a helper thread meanwhile.
KnnStatus BruteForce::join_target_chunk(const Rows &q, int64_t chunk, ResultArrays block) {
  const int64_t t_first = chunk * plan_.t_chunk;
  const int64_t nt = target_chunk_rows(chunk);
  RowBuffers &cur = t_buf_[chunk % 2];
  KNN_TRY(row_stats(cur, nt));
  // The other buffer's last reader (chunk - 1) is done: solve_block ends
  // with a stream synchronization. The helper only touches that buffer and
  // the problem's host arrays, and is joined before this returns or throws.
  DeviceThread prefetch;
  const int64_t next = chunk + 1;
  if (next * plan_.t_chunk < p_.n_targets) {
    RowBuffers *buffer = &t_buf_[next % 2];
    const int64_t next_first = next * plan_.t_chunk, next_n = target_chunk_rows(next);
    auto upload_next = [this, buffer, next_first, next_n](DeviceContext &ctx) {
      return upload_rows(*buffer, p_.targets, p_.target_keys, next_first, next_n, ctx);
    };
    if (!prefetch.start(ctx_, upload_next)) {
      // No thread: upload now, without the overlap.
      const Clock::time_point t0 = Clock::now();
      KNN_TRY(upload_next(ctx_));
      seconds_transfer += seconds_since(t0);
    }
  }
  const KnnStatus st = solve_block(q, cur.view(nt, t_first), block);
  if (prefetch.running()) {
    const Clock::time_point w = Clock::now();
    prefetch.wait();
    seconds_transfer += seconds_since(w);  // only the part not hidden
  }
  KNN_TRY(st);
  return prefetch.finish(ctx_);
}

// Every target chunk against q: the k best of each merged into running.
KnnStatus BruteForce::join_target_chunks(const Rows &q, ResultArrays running) {
  const ResultArrays block = results_[1].view();
  KNN_TRY(launch_clear_results(ctx_, running, q.n, p_.k));
  // Chunk 0 now; chunk c+1 is uploaded by a helper thread while chunk c is
  // processed.
  const Clock::time_point t0 = Clock::now();
  KNN_TRY(upload_rows(t_buf_[0], p_.targets, p_.target_keys, 0, target_chunk_rows(0), ctx_));
  seconds_transfer += seconds_since(t0);
  const int64_t chunks = (p_.n_targets + plan_.t_chunk - 1) / plan_.t_chunk;
  for (int64_t c = 0; c < chunks; c++) {
    KNN_TRY(join_target_chunk(q, c, block));
    KNN_TRY(launch_merge_results(ctx_, running, block, q.n, p_.k));
  }
  return KNN_OK;
}

KnnStatus BruteForce::download(int64_t first, int64_t n, ResultArrays running,
                               int64_t *neighbors, double *distances) {
  const int k = p_.k;
  const Clock::time_point t0 = Clock::now();
  KNN_TRY(download_to_host(ctx_, neighbors + first * k, running.row,
                           static_cast<size_t>(n) * k * sizeof(int64_t)));
  KNN_TRY(download_to_host(ctx_, distances + first * k, running.dist,
                           static_cast<size_t>(n) * k * sizeof(double)));
  seconds_transfer += seconds_since(t0);
  return KNN_OK;
}

KnnStatus BruteForce::run(int64_t *neighbors, double *distances) {
  if (plan_.t_chunked) decline_peer_rows(ctx_);
  KNN_TRY(allocate());
  if (!plan_.t_chunked) KNN_TRY(load_resident_targets());
  const ResultArrays running = results_[0].view();
  for (int64_t q_first = 0; q_first < p_.n_queries; q_first += plan_.q_chunk) {
    const int64_t nq = std::min(plan_.q_chunk, p_.n_queries - q_first);
    Rows q;
    KNN_TRY(load_queries(q_first, nq, &q));
    if (plan_.t_chunked)
      KNN_TRY(join_target_chunks(q, running));
    else
      KNN_TRY(solve_block(q, t_buf_[0].view(p_.n_targets, 0), running));
    KNN_TRY(download(q_first, nq, running, neighbors, distances));
    KNN_TRY(ctx_.cancel_point());
  }
  return KNN_OK;
}

// "dgemm-bound/warp-select k'=64 chunks 1000x5000 +fallback 3" or
// "hgemm-bound/warp-select k'=32 fp16-tiles fp16-rows" and the like.
void describe(const KnnProblem &problem, const Plan &plan, const BruteForce &bf,
              KnnStats *stats) {
  const bool gemm = is_gemm(plan.scoring) && !plan.full_sort;
  const char *scoring = plan.full_sort                            ? "exact-tiles/full-sort"
                        : gemm && plan.scoring == Scoring::kGemmDouble ? "dgemm-bound/warp-select"
                        : gemm && plan.large_k                     ? "hgemm-bound/large-k"
                        : gemm && plan.scoring == Scoring::kGemmHalf
                            ? (plan.pipelined ? "hgemm-bound/pipelined" : "hgemm-bound/warp-select")
                        : gemm                                     ? "sgemm-bound/warp-select"
                        : plan.fused                               ? "exact-fused-select"
                                                                   : "exact-tiles/warp-select";
  char chunks[48] = "", fallback[40] = "";
  if (plan.q_chunk < problem.n_queries || plan.t_chunked)
    std::snprintf(chunks, sizeof chunks, " chunks %lldx%lld",
                  static_cast<long long>(plan.q_chunk), static_cast<long long>(plan.t_chunk));
  if (bf.fallback_queries > 0)
    std::snprintf(fallback, sizeof fallback, " +fallback %lld",
                  static_cast<long long>(bf.fallback_queries));
  const char *tiles = gemm && plan.half_tiles ? " fp16-tiles" : "";
  // Float16 rows uploaded as such (widened on the device).
  const char *rows = problem.element == KNN_ELEMENT_FLOAT16 ? " fp16-rows" : "";
  // Targets uploaded once for the split's engines, copied between GPUs.
  const char *peer = bf.shared_targets ? " peer" : "";
  std::snprintf(stats->variant, sizeof stats->variant, "%s k'=%d%s%s%s%s%s", scoring,
                plan.full_sort ? problem.k : plan.large_k ? plan.large_k_capacity : plan.cap,
                tiles, rows, peer, chunks, fallback);
}

}  // namespace

KnnStatus brute_force_join(const KnnProblem &problem, const JoinTuning &tuning,
                           int64_t *neighbors, double *distances, KnnStats *stats,
                           DeviceContext &ctx) {
  const Clock::time_point start = Clock::now();
  Plan plan;
  KNN_TRY(make_plan(problem, tuning, ctx, &plan));
  BruteForce bf(problem, ctx, plan);
  const KnnStatus st = bf.run(neighbors, distances);
  if (stats != nullptr) {
    stats->method = KNN_METHOD_BRUTE;
    describe(problem, plan, bf, stats);
    stats->distance_computations = bf.exact_pairs;
    stats->pairs = problem.n_queries * problem.n_targets;
    stats->threads_per_query = plan.full_sort ? 1 : 32 * plan.segments;
    stats->seconds_transfer = bf.seconds_transfer;
    stats->seconds_filter = bf.seconds_filter;
    stats->seconds_select = bf.seconds_select;
    stats->seconds_total = seconds_since(start);
  }
  bf.phases.report(bf.seconds_transfer, seconds_since(start));
  return st;
}

}  // namespace cuda
}  // namespace knn
