// problem_check.h -- the one check of a KnnProblem that every engine makes
// before it touches the data (C++, internal to kernels/).
#pragma once

#include <cstdint>
#include <limits>

#include "knn_engine.h"

namespace knn {

// Returns nullptr when the problem is well formed, else why not.
inline const char *problem_invalid_reason(const KnnProblem &p, const int64_t *neighbors,
                                          const double *distances) {
  if (p.k < 1) return "k must be at least 1";
  if (p.dim < 1) return "dim must be at least 1";
  if (p.n_queries < 0 || p.n_targets < 0) return "negative row count";
  if (p.metric < KNN_METRIC_L2 || p.metric > KNN_METRIC_L1) return "unknown metric";
  if (p.method < KNN_METHOD_AUTO || p.method > KNN_METHOD_BRUTE) return "unknown method";
  if (p.n_threads < 0) return "n_threads must not be negative";
  if ((p.query_keys == nullptr) != (p.target_keys == nullptr))
    return "query_keys and target_keys must be given together";
  if (p.n_queries > 0 && p.queries == nullptr) return "queries is NULL";
  if (p.n_targets > 0 && p.targets == nullptr) return "targets is NULL";
  if (p.n_queries > 0 && (neighbors == nullptr || distances == nullptr))
    return "result arrays are NULL";
  // Keep every index product (rows x dim, rows x k) far from overflow.
  const int64_t limit = std::numeric_limits<int64_t>::max() / 8;
  if (p.n_queries > limit / p.k || p.n_queries > limit / p.dim || p.n_targets > limit / p.dim)
    return "problem too large";
  return nullptr;
}

}  // namespace knn
