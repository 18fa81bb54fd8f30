// brute_plan.cuh -- how a brute-force join runs (brute_plan.cu decides it,
// brute_force.cu follows it): how pairs are scored, how long the candidate
// lists are, the chunks of queries and targets that fit the memory budget,
// and the tile shapes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../knn_engine.h"
#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

// The fused exact kernel (exact_select.cu): queries per launch, and the
// blocks a launch should have (targets are split into segments to get them).
constexpr int64_t kFusedRowsPerLaunch = 8192;
constexpr int kFusedBlocksWanted = 1024;
// Small query batches use tiles + warp selection instead: the fused
// kernel's blocks take 32 queries each.
constexpr int64_t kFusedMinQueries = 9;

// How the selection scores a pair: exactly, or by a lower bound from an
// SGEMM (float tiles), a DGEMM (double tiles, L2 only) or an fp16
// tensor-core GEMM of scaled rows (fp16 or float tiles, half_bound.cuh).
enum class Scoring { kExact, kGemmFloat, kGemmDouble, kGemmHalf };

inline bool is_gemm(Scoring s) { return s != Scoring::kExact; }

struct Plan {
  Scoring scoring = Scoring::kExact;
  bool full_sort = false;
  bool fused = false;       // exact tiles and selection in one kernel
  bool double_gemm = false; // L2 filtered by a DGEMM (double rows and tiles)
  bool half_gemm = false;   // filtered by an fp16 tensor-core GEMM (fp16 rows)
  bool pipelined = false;   // fp16: two tiles, the next GEMM beside the selection
  bool half_tiles = false;  // fp16: the GEMM writes fp16 tiles (half the traffic)
  bool large_k = false;     // fp16: k beyond the lists (large_k_select.cu)
  int large_k_capacity = 0; // ... candidates a query may collect
  int cap = 32;             // list capacity (power of two, 32..256)
  int segments = 1;         // lists per query
  int64_t q_chunk = 0;      // queries per chunk
  int64_t t_chunk = 0;      // targets per chunk
  bool t_chunked = false;   // several target chunks (double-buffered)
  bool alias_queries = false;  // self-join with resident targets: query rows are target rows
  int64_t alias_first = -1;    // then the target row of query row 0
  int tile_rows = 0, tile_cols = 0;
  int64_t gather_rows = 0;  // fallback batch
  // DGEMM: also a float tile, for the fallback's exact pass where its
  // lists are beyond the fused selection (k > kMaxFusedCap).
  bool fallback_tile = false;
  size_t full_sort_budget = 0;
  size_t bytes = 0;         // device bytes the plan allocates
};

// The plan for a problem under ctx.memory_budget; KNN_OUT_OF_MEMORY (and
// why, in ctx.error) when not even one query and one target fit.
KnnStatus make_plan(const KnnProblem &p, const JoinTuning &tuning, DeviceContext &ctx,
                    Plan *plan);

}  // namespace cuda
}  // namespace knn
