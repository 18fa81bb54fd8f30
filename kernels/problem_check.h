// problem_check.h -- the one check of a KnnProblem that every engine makes
// before it touches the data (C++, internal to kernels/).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "knn_engine.h"

namespace knn {

// The integer a C caller stored in an enum field. Reading an out-of-range
// value through the C++ enum type is undefined, so the bytes are read.
template <class Enum>
int enum_value(const Enum &field) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized");
  int value;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

inline bool in_range(int value, int first, int last) { return value >= first && value <= last; }

// Returns nullptr when the problem is well formed, else why not.
inline const char *problem_invalid_reason(const KnnProblem &p, const int64_t *neighbors,
                                          const double *distances) {
  if (p.k < 1) return "k must be at least 1";
  if (p.dim < 1) return "dim must be at least 1";
  if (p.n_queries < 0 || p.n_targets < 0) return "negative row count";
  if (!in_range(enum_value(p.metric), KNN_METRIC_L2, KNN_METRIC_JACCARD)) return "unknown metric";
  if (!in_range(enum_value(p.element), KNN_ELEMENT_FLOAT32, KNN_ELEMENT_BIT))
    return "unknown element type";
  if ((p.element == KNN_ELEMENT_BIT) !=
      (p.metric == KNN_METRIC_HAMMING || p.metric == KNN_METRIC_JACCARD))
    return "hamming and jaccard are the metrics of bit rows, and only of them";
  if (!in_range(enum_value(p.method), KNN_METHOD_AUTO, KNN_METHOD_BRUTE)) return "unknown method";
  if (!in_range(enum_value(p.device), KNN_DEVICE_AUTO, KNN_DEVICE_GPU)) return "unknown device";
  if (p.n_threads < 0) return "n_threads must not be negative";
  if (p.n_threads > KNN_MAX_THREADS) return "n_threads exceeds KNN_MAX_THREADS";
  if (p.n_devices < 0 || p.n_devices > KNN_MAX_DEVICES)
    return "n_devices must be between 0 and KNN_MAX_DEVICES";
  for (int32_t i = 0; i < p.n_devices; i++)
    if (p.devices[i] < 0) return "a device ordinal is negative";
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

// The check of the float32 engines (the CPU engine's joins and the GPU
// module), which take float32 rows only.
inline const char *float_problem_invalid_reason(const KnnProblem &p, const int64_t *neighbors,
                                                const double *distances) {
  if (const char *why = problem_invalid_reason(p, neighbors, distances)) return why;
  if (p.element != KNN_ELEMENT_FLOAT32) return "this engine takes float32 rows only";
  return nullptr;
}

// The check of a range problem (KnnProblem::range), made by the CPU and
// the GPU range joins: float32 rows (the job widens float16) or bit rows;
// k is a cap and may be 0; no result arrays.
inline const char *range_problem_invalid_reason(const KnnProblem &p) {
  if (p.range != KNN_RANGE_BELOW && p.range != KNN_RANGE_AT_MOST) return "unknown range mode";
  if (p.k < 0) return "the cap k of a range join must not be negative";
  if (p.dim < 1) return "dim must be at least 1";
  if (p.n_queries < 0 || p.n_targets < 0) return "negative row count";
  if (!in_range(enum_value(p.metric), KNN_METRIC_L2, KNN_METRIC_JACCARD)) return "unknown metric";
  if (p.element != KNN_ELEMENT_FLOAT32 && p.element != KNN_ELEMENT_BIT)
    return "the range join takes float32 or bit rows";
  if ((p.element == KNN_ELEMENT_BIT) !=
      (p.metric == KNN_METRIC_HAMMING || p.metric == KNN_METRIC_JACCARD))
    return "hamming and jaccard are the metrics of bit rows, and only of them";
  if (!in_range(enum_value(p.method), KNN_METHOD_AUTO, KNN_METHOD_BRUTE)) return "unknown method";
  if (!in_range(enum_value(p.device), KNN_DEVICE_AUTO, KNN_DEVICE_GPU)) return "unknown device";
  if (p.n_threads < 0 || p.n_threads > KNN_MAX_THREADS) return "n_threads out of range";
  if ((p.query_keys == nullptr) != (p.target_keys == nullptr))
    return "query_keys and target_keys must be given together";
  if ((p.query_groups == nullptr) != (p.target_groups == nullptr))
    return "query_groups and target_groups must be given together";
  if (p.n_queries > 0 && p.queries == nullptr) return "queries is NULL";
  if (p.n_targets > 0 && p.targets == nullptr) return "targets is NULL";
  const int64_t limit = std::numeric_limits<int64_t>::max() / 16;
  if (p.n_queries > limit / p.dim || p.n_targets > limit / p.dim) return "problem too large";
  return nullptr;
}

// The rows of a float32 problem (the element type every engine computes on;
// knn_job.cpp hands the engines float32 rows unless they take others).
inline const float *float_rows(const void *rows) { return static_cast<const float *>(rows); }

}  // namespace knn
