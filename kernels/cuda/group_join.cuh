// group_join.cuh -- per-group joins in one call of the GPU module
// (internal to kernels/cuda/; the entry is knn_cuda_run_groups in
// ../knn_cuda_module.h).
//
// Small groups -- the usual case: many groups of a few thousand rows --
// are packed into batches: a batch's rows go to the device once, sorted by
// group, and a segmented exact kernel (group_select.cu) takes work items
// (a tile of up to 32 queries of one group, a range of that group's
// targets) of every group of the batch in the same launches, so that the
// launches do not grow with the number of groups. The candidate lists are
// then turned into results by the brute-force path's rerank (exact
// distances, (distance, row) order). Large groups, k above the segmented
// kernel's lists, and bit rows run alone through the ordinary methods
// (TI, certified GEMM, the bit join), in the same call and device turn.
#pragma once

#include <cstdint>
#include <functional>

#include "../knn_cuda_module.h"
#include "brute_kernels.cuh"
#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

// Runs one plain (group-free) problem through the module's methods.
using PlainJoin =
    std::function<KnnStatus(const KnnProblem &sub, int64_t *neighbors, double *distances,
                            KnnStats *stats)>;

// The whole grouped problem (checked by the caller, the layout here) on
// the device of ctx, whose runtime the caller holds. stats: device-side
// fields (method, variant, counts, seconds); the caller adds the device.
KnnStatus group_join(const KnnProblem &p, const KnnGroupLayout &groups, const PlainJoin &plain,
                     int64_t *neighbors, double *distances, KnnStats *stats,
                     DeviceContext &ctx);

// ---- the segmented exact selection (group_select.cu) ----

// Rows of a work item are the batch's rows (sorted by group).
struct GroupTile {
  int32_t query_first;   // batch row of the tile's first query
  int32_t query_count;   // 1 .. kGroupTileQueries
  int32_t target_first;  // batch row of the target range's first row
  int32_t target_count;  // >= 1
  int32_t segment;       // which list of each query the range fills
};

constexpr int kGroupTileQueries = 32;
// The segmented kernel's largest list; larger k runs the group alone.
constexpr int kGroupMaxCap = 128;

struct GroupSelectArgs {
  KnnMetric metric = KNN_METRIC_L2;  // float metrics
  int dim = 0;
  const GroupTile *tiles = nullptr;  // one block per tile
  int64_t n_tiles = 0;
  const float *queries = nullptr;    // batch rows
  const float *targets = nullptr;
  const float *query_norm = nullptr;   // knn_dot(x, x): cosine only
  const float *target_norm = nullptr;
  const int64_t *query_keys = nullptr;  // null: no exclusion
  const int64_t *target_keys = nullptr;
  CandidateLists lists;  // (batch query, segment); kp = k; rows are batch target rows
};

// Fills, for every tile, list `segment` of each of its queries with the
// kp best (exact value, row) of its target range; lists no tile fills
// must have been cleared. cap: 32, 64 or 128.
KnnStatus launch_group_select(DeviceContext &ctx, const GroupSelectArgs &args);

}  // namespace cuda
}  // namespace knn
