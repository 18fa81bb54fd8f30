// join_input.h -- one join as the CPU methods see it: the validated
// problem, the resolved thread count and the cancel flag. Internal to
// kernels/cpu/.
#pragma once

#include <cstdint>

#include "../knn_engine.h"

namespace knn {
namespace cpu {

struct JoinInput {
  const float *queries = nullptr;  // n_queries x dim, row-major
  int64_t n_queries = 0;
  const float *targets = nullptr;  // n_targets x dim, row-major
  int64_t n_targets = 0;
  int dim = 0;
  int k = 0;
  KnnMetric metric = KNN_METRIC_L2;
  // Both set or both null: a pair with equal keys is never returned.
  const int64_t *query_keys = nullptr;
  const int64_t *target_keys = nullptr;
  int n_threads = 1;                 // >= 1, already resolved
  const int32_t *cancel = nullptr;   // may be null

  const float *query_row(int64_t i) const { return queries + i * dim; }
  const float *target_row(int64_t i) const { return targets + i * dim; }

  bool cancelled() const {
    return cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0;
  }

  // True when the pair (query q, target t) must not be returned.
  bool excluded(int64_t q, int64_t t) const {
    return query_keys != nullptr && query_keys[q] == target_keys[t];
  }

  // A self-join over one matrix: both sides may share one clustering.
  bool same_rows() const {
    return queries == targets && n_queries == n_targets;
  }
};

// Where the results go (layout of knn_engine.h: n_queries * k entries).
struct JoinOutput {
  int64_t *neighbors = nullptr;
  double *distances = nullptr;
};

// What a method reports back for KnnStats.
struct JoinReport {
  int64_t query_clusters = 0;
  int64_t target_clusters = 0;
  int64_t distance_computations = 0;  // exact query-target distances
  int64_t landmark_distances = 0;     // point-landmark and landmark-landmark
  double seconds_cluster = 0;
  double seconds_filter = 0;
  double seconds_select = 0;
  double ti_sample_share = -1;  // pairs TI computed in its sample, if any
  // Threads the method ran on, where fewer than JoinInput::n_threads (the
  // SGEMM's threads are what BlasBufferLease grants); 0: all of them.
  int threads_used = 0;
  const char *variant = "";
};

}  // namespace cpu
}  // namespace knn
