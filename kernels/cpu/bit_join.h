// bit_join.h -- the CPU engine of bit rows (KNN_ELEMENT_BIT): exact Hamming
// and Jaccard joins by popcount, pgvector's <~> and <%>. Internal to
// kernels/ (C++); the job layer (knn_job.cpp) sends every bit problem here,
// whatever the device: there is no GPU bit kernel yet.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../knn_engine.h"

namespace knn {
namespace cpu {

// pgvector's distances from popcounts, float8 exactly as its operators
// return them: Hamming is the count of differing bits; Jaccard is
// 1 - |a&b| / (|a| + |b| - |a&b|), and 1 when a&b is empty (two all-zero
// rows included).
inline double hamming_from_count(uint64_t differing) { return static_cast<double>(differing); }

inline double jaccard_from_counts(uint64_t ab, uint64_t aa, uint64_t bb) {
  if (ab == 0) return 1;
  return 1 - (static_cast<double>(ab) / static_cast<double>(aa + bb - ab));
}

// Runs a bit problem (layout and result order of knn_engine.h; ties by
// target row; self-exclusion keys honoured) on parallel_for threads,
// polling `cancel`. Never throws; the signature of cpu_run.
KnnStatus bit_run(const KnnProblem &problem, int64_t *neighbors, double *distances,
                  KnnStats *stats, const int32_t *cancel, char *errbuf, size_t errlen) noexcept;

}  // namespace cpu
}  // namespace knn
