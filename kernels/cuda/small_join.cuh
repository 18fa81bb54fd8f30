// small_join.cuh -- the brute force of tiny joins in one round trip
// (internal to kernels/cuda/; small_join.cu says how and why).
#pragma once

#include "../knn_engine.h"
#include "cuda_engine.cuh"
#include "join_tuning.cuh"

namespace knn {
namespace cuda {

// Whether small_join takes this brute-force join of float32 rows (both
// sides non-empty, one engine's whole rows, not a share of a TI
// self-join): few enough pairs and bytes that fixed costs dominate the
// general path, k within its lists, the default tuning (a forced filter
// is an A/B request for the general path), and its device memory within
// ctx.memory_budget.
bool small_join_applies(const KnnProblem &p, const JoinTuning &tuning, const DeviceContext &ctx);

// The exact k best of every query, as brute_force_join returns them
// (same neighbours, order and distances), with one upload, two or three
// launches and one download on ctx.stream.
KnnStatus small_join(const KnnProblem &p, int64_t *neighbors, double *distances, KnnStats *stats,
                     DeviceContext &ctx);

}  // namespace cuda
}  // namespace knn
