// range_join.h -- the CPU engine's range join: every (query, target) pair
// whose distance is within a radius (KnnProblem::range), exact, optionally
// capped per query. Internal to kernels/ (C++); the job layer
// (knn_job.cpp) runs range problems here unless the GPU range join
// (cuda/range_join.cuh, the same pairs bit for bit) takes them.
//
// L2 and L1 targets are clustered (clustering.h) and pruned by the
// triangle inequality, widened by rounding_margin.h so that no pair within
// the radius is lost: a target cluster is skipped when
// D(q,c) - R_c > r, a single target when |D(q,c) - D(t,c)| > r. Every pair
// kept is then decided on its canonical distance (knn_distance.h), the
// value the SQL operator returns. Cosine, IP, bit rows, a radius that is
// not finite and small joins use brute force.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "../knn_engine.h"

namespace knn {
namespace cpu {

// Receives the pairs of one query row (ordered by distance, then target
// row), query rows ascending; returns false to stop the join (cancelled).
using PairSink =
    std::function<bool(int64_t query_row, const int64_t *target_rows, const double *distances,
                       int64_t n)>;

// Runs a range problem (FLOAT32 or BIT rows; the job widens FLOAT16) and
// hands its pairs to sink. Never throws; the status and a one-line
// message as cpu_run. stats may be null.
KnnStatus range_run(const KnnProblem &problem, const PairSink &sink, KnnStats *stats,
                    const int32_t *cancel, char *errbuf, size_t errlen) noexcept;

}  // namespace cpu
}  // namespace knn
