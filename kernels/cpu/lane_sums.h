// lane_sums.h -- one query row against many target rows, with the exact
// arithmetic of knn_distance.h but fast.
//
// knn_l2_squared() and friends keep one 8-lane accumulator, so a single
// pair is a chain of dependent adds. Here one query row is summed against
// 8 target rows at once: each target keeps its own 8 lanes,
// every lane adds the same terms in the same order (dimension i goes to
// lane i % 8, in index order) and the lanes are folded by knn_fold_lanes().
// The sums are therefore bit-identical to knn_distance.h; the independent
// accumulators only let the CPU overlap the adds. The unit tests compare
// against knn_distance.h directly.
#pragma once

#include <cstdint>

#include "../knn_engine.h"

namespace knn {
namespace cpu {

// sums[r] = the lane sum of (query, targets + r * dim) for r < count: the
// value knn_l2_squared (L2), knn_dot (cosine, IP) or knn_l1_sum (L1)
// returns, bit for bit. Dispatched on what the CPU supports (AVX2 runs the
// same per-lane float operations on wider registers; there is no FMA
// because contraction is off and FMA is never enabled).
void lane_sums(KnnMetric metric, const float *query, const float *targets,
               int64_t count, int dim, float *sums);

// The same for target rows `stride` floats apart (stride >= dim).
void lane_sums_strided(KnnMetric metric, const float *query, const float *targets,
                       int64_t count, int dim, int64_t stride, float *sums);

// The same for rows that are not stored together: rows[r] for r < count.
void lane_sums_scattered(KnnMetric metric, const float *query,
                         const float *const *rows, int64_t count, int dim,
                         float *sums);

// "avx2" or "generic": what lane_sums() uses on this CPU.
const char *lane_sums_isa();

}  // namespace cpu
}  // namespace knn
