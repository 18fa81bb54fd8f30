// brute_kernels.cuh -- the kernels of the brute-force path and their
// launchers (internal to kernels/cuda/). brute_force.cu strings them
// together; each .cu file holds one step:
//   row_stats.cu    norms, zero flags, gathers, result merging
//   exact_tiles.cu  exact canonical distance tiles (knn_distance.h order)
//   select_tiles.cu streaming top-k' per query over distance tiles
//   exact_select.cu exact tiles and selection fused (no tile in memory)
//   half_rows.cu    fp16 rows and their numbers for the tensor-core filter
//   rerank.cu       exact re-rank of the candidates and certification
//   full_sort.cu    large k: every exact distance of a query, sorted
//   large_k_select.cu  large k on the fp16 filter (large_k_select.cuh)
#pragma once

#include <cstdint>

#include "cuda_engine.cuh"
#include "select_keys.cuh"
#include "tile_value.cuh"

namespace knn {
namespace cuda {

// The k results of each query on the device: (key, row, distance), sorted;
// unused slots hold kEmptyKey, -1, NaN. Rows are global target rows.
struct ResultArrays {
  uint64_t *key = nullptr;
  int64_t *row = nullptr;
  double *dist = nullptr;
};

// Rows of one side on the device (a chunk of it, or a slice of a chunk):
// n vectors of dim floats, their knn_dot norms and zero flags, keys (null
// without self-match exclusion), for the DGEMM filter only the vectors and
// sums of squares in double, and for the fp16 filter only the scaled fp16
// rows (stride half_row_stride(dim)), their numbers and float scales.
struct Rows {
  const float *x = nullptr;
  const uint16_t *xh = nullptr;
  const HalfRowStats *half = nullptr;
  const float *half_scale = nullptr;
  const double *xd = nullptr;
  const double *norm_d = nullptr;
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
    if (r.xh != nullptr) r.xh += first * half_row_stride(dim);
    if (r.half != nullptr) r.half += first;
    if (r.half_scale != nullptr) r.half_scale += first;
    if (r.norm_d != nullptr) r.norm_d += first;
    if (r.norm != nullptr) r.norm += first;
    if (r.zero != nullptr) r.zero += first;
    if (r.keys != nullptr) r.keys += first;
    r.n = count;
    r.offset += first;
    return r;
  }
};

// The candidate lists of a chunk of queries: (chunk query q, segment s)
// owns cap entries at ((q * segments) + s) * cap, sorted, kEmptyKey past
// its count; each keeps its kp best.
struct CandidateLists {
  uint64_t *key = nullptr;
  uint32_t *row = nullptr;
  int segments = 1;
  int cap = 32;  // 32, 64, 128 or 256
  int kp = 1;    // <= cap
};

// norm[i] = knn_dot(x_i, x_i); zero[i] = every component of x_i is 0.
KnnStatus launch_row_stats(DeviceContext &ctx, const float *x, int64_t n, int dim,
                           float *norm, uint8_t *zero);

// xd = x as doubles (exact), norm_d[i] = sum of x_i^2 in double (for the
// DGEMM filter of L2).
KnnStatus launch_to_double(DeviceContext &ctx, const float *x, int64_t n, int dim, double *xd,
                           double *norm_d);

// n float16 values held in bytes [2n, 4n) of x (a float16 problem's rows,
// uploaded as they are) widened in place into x[0 .. n) (binary16 ->
// binary32, exact; NaN as knn_half_to_float), on `stream` (half_rows.cu).
KnnStatus launch_widen_half_in_place(DeviceContext &ctx, cudaStream_t stream, float *x,
                                     int64_t n);

// The rows of the fp16 filter (half_rows.cu, half_bound.cuh): xh (n rows
// of half_row_stride(dim) fp16 values, as uint16_t), stats, float scales.
KnnStatus launch_to_half(DeviceContext &ctx, const float *x, int64_t n, int dim, uint16_t *xh,
                         HalfRowStats *stats, float *scale);

// dst row i = src row index[i] (rows of dim floats), plus norm, zero flag
// and key (each dst array may be null).
KnnStatus launch_gather_rows(DeviceContext &ctx, const int32_t *index, int64_t n, int dim,
                             const Rows &src, float *dst, float *dst_norm, uint8_t *dst_zero,
                             int64_t *dst_key);

// Sets n entries to (kEmptyKey, kEmptyRow).
KnnStatus launch_clear_entries(DeviceContext &ctx, uint64_t *key, uint32_t *row, int64_t n);

// Sets n * k result slots to empty.
KnnStatus launch_clear_results(DeviceContext &ctx, ResultArrays res, int64_t n, int k);

// into := the k best of (into, add), per query; both sorted.
KnnStatus launch_merge_results(DeviceContext &ctx, ResultArrays into, ResultArrays add,
                               int64_t n, int k);

// out[i * ld + j] = the canonical lane sum (knn_distance.h) of query i and
// target j: squared L2 (L2), L1 sum (L1) or dot product (IP, cosine).
KnnStatus launch_exact_tile(DeviceContext &ctx, KnnMetric metric, const float *queries,
                            int nq, const float *targets, int nt, int dim, float *out,
                            int64_t ld);

// One streaming step of the selection: folds the tile (nq rows x nt
// columns, row stride ld) into the per-query candidate lists; segment s of
// every tile goes to list s.
struct SelectTileArgs {
  const float *tile = nullptr;   // a float tile (exact values, SGEMM dots), or
  const double *tile_d = nullptr;  // a double tile (DGEMM dots), or
  const uint16_t *tile_h = nullptr;  // an fp16 tile (the fp16 filter's scaled dots)
  int64_t ld = 0;
  int nq = 0;                  // tile rows
  int nt = 0;                  // tile columns
  int64_t query_base = 0;      // chunk row of tile row 0
  int64_t target_base = 0;     // chunk row of tile column 0
  TileValue value;
  const int64_t *query_keys = nullptr;   // chunk rows; null: no exclusion
  const int64_t *target_keys = nullptr;
  CandidateLists lists;
};
KnnStatus launch_select_tile(DeviceContext &ctx, const SelectTileArgs &args);

constexpr int kMaxSelectCap = 256;

// Exact tiles and the selection in one kernel, into the same lists as
// launch_select_tile; for L2, L1 and IP with cap <= kMaxFusedCap. One
// launch covers all nt targets: each (query, segment) list is filled by one
// block walking its segment in row order (see exact_select.cu). The lists
// must be empty (launch_clear_entries) before the launch.
struct FusedSelectArgs {
  KnnMetric metric = KNN_METRIC_L2;
  int dim = 0;
  const float *queries = nullptr;     // chunk rows; this launch takes rows
  int64_t query_base = 0;             // [query_base, query_base + nq)
  int nq = 0;
  const float *targets = nullptr;     // the target chunk
  int nt = 0;
  const int64_t *query_keys = nullptr;  // chunk rows; null: no exclusion
  const int64_t *target_keys = nullptr;
  CandidateLists lists;
};
constexpr int kMaxFusedCap = 128;
bool fused_select_supports(KnnMetric metric, int cap);
int fused_select_rows_per_block();
KnnStatus launch_fused_select(DeviceContext &ctx, const FusedSelectArgs &args);
constexpr int kMaxListEntries = 2048;  // segments * cap per query (rerank's shared memory)

// Merges each query's lists, computes the exact distances of its kp best
// candidates with knn_distance.h, sorts them and writes the k best.
// Certifies (certified[i] = 1) when the candidate set provably holds the
// exact k best; always 1 when the lists came from exact tiles.
struct RerankArgs {
  CandidateLists lists;
  int k = 1;
  bool exact_lists = true;
  KnnMetric metric = KNN_METRIC_L2;
  int dim = 0;
  Rows q;                                // list i <-> query row i (norms: cosine only)
  Rows t;                                // the target chunk
  const int32_t *out_index = nullptr;    // results of list i go to slot out_index[i] (null: i)
  ResultArrays out;
  uint8_t *certified = nullptr;          // per list i (may be null when exact)
};
KnnStatus launch_rerank(DeviceContext &ctx, const RerankArgs &args);

// Large k: every exact distance of the queries q against the target chunk
// t, sorted per query; writes the k best of query i to out slots i*k...
// Works in batches of queries that fit `budget` bytes.
struct FullSortArgs {
  KnnMetric metric = KNN_METRIC_L2;
  int dim = 0;
  int k = 1;
  Rows q;
  Rows t;
  ResultArrays out;
  size_t budget = 0;  // device bytes this step may allocate
  const int32_t *out_index = nullptr;  // query row r's slots: out_index[r] * k (null: r * k)
};
KnnStatus run_full_sort(DeviceContext &ctx, const FullSortArgs &args, int64_t *exact_pairs);

// Bytes run_full_sort needs for a batch of `rows` queries (so that the
// planner can reserve it).
size_t full_sort_bytes(int64_t rows, int64_t nt);

}  // namespace cuda
}  // namespace knn
