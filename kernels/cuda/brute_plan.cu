// brute_plan.cu -- knn::cuda::make_plan: the shape of a brute-force join
// (brute_plan.cuh) from the problem, the device and the memory budget.
#include <algorithm>
#include <cstdio>

#include "bitonic.cuh"
#include "brute_kernels.cuh"
#include "brute_plan.cuh"
#include "large_k_select.cuh"

namespace knn {
namespace cuda {
namespace {

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
// Queries whose GEMM candidates fail certification are redone in batches
// of at most this many.
constexpr int64_t kFallbackBatch = 16384;

// The fp16 tensor-core filter from this many dimensions (embeddings: 384
// and up) on GPUs with fp16 tensor cores of the Ampere generation or later
// (sm_80+): there its GEMM costs a tenth of the DGEMM. Its bound is
// relative to the norms and a few times looser than the SGEMM one, so data
// whose near neighbours are close relative to their norms fail its
// certification and are redone exactly: below this dimension (blog, 281
// dimensions, is such a set) the DGEMM / SGEMM filters stay.
constexpr int kHalfMinDim = 384;

bool has_half_tensor_cores(const cudaDeviceProp &prop) { return prop.major >= 8; }

// GPUs whose FP64 rate equals their FP32 rate (A100, H100/H200, B200):
// there a DGEMM costs what an SGEMM does, and its error bound for L2 is
// relative to the distance rather than to the norms (tile_value.cuh).
bool fast_fp64(const cudaDeviceProp &prop) {
  return (prop.major == 8 && prop.minor == 0) || prop.major == 9 ||
         (prop.major == 10 && prop.minor == 0);
}

// The target row of query row 0 where the query rows (and keys) are a run
// of the target rows (a self-join, or one engine's share of it: the same
// host memory), else -1.
int64_t queries_within_targets(const KnnProblem &p) {
  const uintptr_t row = (p.element == KNN_ELEMENT_FLOAT16 ? 2u : 4u) * (uintptr_t)p.dim;
  const uintptr_t q = reinterpret_cast<uintptr_t>(p.queries);
  const uintptr_t t = reinterpret_cast<uintptr_t>(p.targets);
  if (row == 0 || q < t || (q - t) % row != 0) return -1;
  const uintptr_t first = (q - t) / row;
  if (first > (uintptr_t)p.n_targets || (uintptr_t)p.n_queries > (uintptr_t)p.n_targets - first)
    return -1;
  const bool keys = p.query_keys == nullptr
                        ? p.target_keys == nullptr
                        : p.target_keys != nullptr && p.query_keys == p.target_keys + first;
  return keys ? static_cast<int64_t>(first) : -1;
}

// Tiles and segments for the current chunk sizes.
void shape_tiles(const KnnProblem &p, size_t budget, Plan *pl) {
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
  // fp16 tiles: rows of whole 16-byte groups (select_tiles.cu loads 8
  // halves at a time).
  if (pl->half_gemm) pl->tile_cols = (pl->tile_cols + 7) & ~7;
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
}

// The device bytes of the current shape.
size_t plan_bytes(const KnnProblem &p, const Plan &pl) {
  const bool gemm = is_gemm(pl.scoring);
  const size_t dim = p.dim;
  const size_t row_extra = sizeof(float) + 1 + (p.query_keys != nullptr ? 8 : 0);
  const size_t half_bytes =
      pl.half_gemm ? static_cast<size_t>(half_row_stride(p.dim)) * 2 + sizeof(HalfRowStats) + 4 : 0;
  const size_t row_bytes = dim * sizeof(float) + row_extra +
                           (pl.double_gemm ? dim * sizeof(double) + 8 : 0) + half_bytes;
  const size_t t_bytes = pl.t_chunk * row_bytes * (pl.t_chunked ? 2 : 1);
  size_t per_query = static_cast<size_t>(p.k) * 24 * (pl.t_chunked ? 2 : 1);
  if (!pl.full_sort && !pl.large_k) per_query += static_cast<size_t>(pl.segments) * pl.cap * 12;
  if (gemm) per_query += 1;
  const size_t q_bytes = pl.q_chunk * ((pl.alias_queries ? 0 : row_bytes) + per_query);
  // A pipelined fp16 filter has two tiles (brute_force.cu).
  const size_t tile = (pl.full_sort || pl.fused)
                          ? 0
                          : static_cast<size_t>(pl.tile_rows) * pl.tile_cols *
                                (pl.double_gemm ? 8 : 4) * (pl.pipelined ? 2 : 1);
  const size_t gather = pl.gather_rows * (row_bytes + 4);
  const size_t fallback_tile =
      pl.fallback_tile ? static_cast<size_t>(pl.tile_rows) * pl.tile_cols * sizeof(float) : 0;
  // Large k reserves one query's full sort for the queries it redoes.
  const size_t sort = pl.full_sort || pl.large_k ? full_sort_bytes(1, pl.t_chunk) : 0;
  const size_t large_k = pl.large_k ? large_k_bytes(pl.q_chunk, pl.large_k_capacity) : 0;
  return t_bytes + q_bytes + tile + fallback_tile + gather + sort + large_k;
}

void shape(const KnnProblem &p, size_t budget, Plan *pl) {
  pl->t_chunked = pl->t_chunk < p.n_targets;
  pl->alias_first = pl->t_chunked ? -1 : queries_within_targets(p);
  pl->alias_queries = pl->alias_first >= 0;
  shape_tiles(p, budget, pl);
  if (pl->large_k)
    pl->large_k_capacity = large_k_shape(p.k, pl->t_chunk,
                                         static_cast<int64_t>(pl->tile_rows) * pl->tile_cols)
                               .capacity;
  pl->bytes = plan_bytes(p, *pl);
}

// Scoring and list capacity.
void choose_scoring(const KnnProblem &p, const JoinTuning &tuning, const cudaDeviceProp &prop,
                    Plan *pl) {
  const int k = p.k;
  const bool gemm_fits = k + kGemmMinExtra <= kMaxSelectCap;
  const BruteFilter forced = tuning.brute_filter;
  const bool forced_half = forced == BruteFilter::kHalf && p.metric != KNN_METRIC_L1 &&
                           p.dim <= kGemmMaxDim && gemm_fits;
  const bool gemm = forced_half || (p.metric != KNN_METRIC_L1 && p.dim > kGemmMinDim &&
                                    p.dim <= kGemmMaxDim && gemm_fits);
  pl->scoring = Scoring::kExact;
  // k beyond the lists: the fp16 filter collects candidates under a
  // sampled threshold (large_k_select.cu) where it would filter a small k.
  const int64_t wanted = std::min<int64_t>(k, p.n_targets);
  const bool half_wanted =
      forced == BruteFilter::kHalf ||
      (forced == BruteFilter::kAuto && !tuning.sgemm_filter && p.dim >= kHalfMinDim &&
       has_half_tensor_cores(prop));
  if (!gemm_fits && tuning.large_k && k <= kLargeKMax && wanted + kGemmMinExtra > kMaxSelectCap &&
      p.metric != KNN_METRIC_L1 && p.dim <= kGemmMaxDim && half_wanted) {
    pl->large_k = pl->half_gemm = true;
    pl->half_tiles = tuning.half_tiles && half_row_stride(p.dim) <= kHalfTileMaxStride;
    pl->scoring = Scoring::kGemmHalf;
    return;
  }
  if (gemm) {
    pl->cap = std::min(kMaxSelectCap, next_pow2(std::max({2 * k, k + kGemmMinExtra, 32})));
    const bool auto_half = forced == BruteFilter::kAuto && !tuning.sgemm_filter &&
                           p.dim >= kHalfMinDim && has_half_tensor_cores(prop);
    if (forced_half || auto_half) {
      pl->half_gemm = true;
      pl->pipelined = tuning.pipeline_tiles;
      pl->half_tiles = tuning.half_tiles && half_row_stride(p.dim) <= kHalfTileMaxStride;
      pl->scoring = Scoring::kGemmHalf;
      return;
    }
    const bool want_double = forced == BruteFilter::kDgemm ||
                             (forced == BruteFilter::kAuto && fast_fp64(prop) && !tuning.sgemm_filter);
    pl->double_gemm = p.metric == KNN_METRIC_L2 && want_double && forced != BruteFilter::kSgemm;
    pl->scoring = pl->double_gemm ? Scoring::kGemmDouble : Scoring::kGemmFloat;
    // The fallback's exact lists (BruteForce::fallback) hold at most
    // next_pow2(max(k, 32)); beyond the fused selection they need a float
    // tile, which the other filters have anyway.
    pl->fallback_tile =
        pl->double_gemm && !fused_select_supports(p.metric, next_pow2(std::max(k, 32)));
  } else {
    pl->full_sort = wanted > kMaxSelectCap;
    pl->cap = next_pow2(std::max<int64_t>(wanted, 32));
    if (pl->full_sort) pl->cap = 32;  // unused
  }
}

}  // namespace

KnnStatus make_plan(const KnnProblem &p, const JoinTuning &tuning, DeviceContext &ctx,
                    Plan *pl) {
  choose_scoring(p, tuning, ctx.prop, pl);
  const size_t budget = ctx.memory_budget;
  pl->q_chunk = std::min(p.n_queries, kMaxChunkRows);
  pl->t_chunk = std::min(p.n_targets, kMaxChunkRows);
  for (int iter = 0; iter < 256; iter++) {
    shape(p, budget, pl);
    if (pl->bytes <= budget) {
      pl->full_sort_budget =
          budget - pl->bytes +
          (pl->full_sort || pl->large_k ? full_sort_bytes(1, pl->t_chunk) : 0);
      return KNN_OK;
    }
    // Shrink whichever side holds more: targets first when equal, since a
    // smaller target chunk also shrinks the large-k sort.
    const size_t row_bytes =
        static_cast<size_t>(p.dim) * (pl->double_gemm ? 12 : pl->half_gemm ? 6 : 4) + 21 +
        (pl->half_gemm ? sizeof(HalfRowStats) + 4 : 0);
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

}  // namespace cuda
}  // namespace knn
