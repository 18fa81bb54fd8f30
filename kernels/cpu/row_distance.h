// row_distance.h -- the operator's distance between two rows, computed
// only through kernels/knn_distance.h, so that every CPU path returns the
// value the SQL operators return.
#pragma once

#include <cstdint>

#include "../knn_distance.h"
#include "../knn_engine.h"

namespace knn {
namespace cpu {

// Turns a lane sum (as knn_distance.h computes it for the metric) into the
// operator's float8 value. norm_a/norm_b (knn_dot(x, x)) are only read for
// cosine.
inline double distance_from_sum(KnnMetric metric, float sum, float norm_a,
                                float norm_b) {
  switch (metric) {
    case KNN_METRIC_L2:
      return knn_l2_from_squared(sum);
    case KNN_METRIC_COSINE:
      return knn_cosine_from_dot(sum, norm_a, norm_b);
    case KNN_METRIC_IP:
      return knn_ip_from_dot(sum);
    case KNN_METRIC_L1:
      return knn_l1_from_sum(sum);
    default:  // the bit metrics never reach the float engines (problem_check.h)
      break;
  }
  return knn_l2_from_squared(sum);
}

// The lane sum of one pair: squared differences (L2), products (cosine,
// IP) or absolute differences (L1).
inline float pair_sum(KnnMetric metric, const float *a, const float *b,
                      int dim) {
  switch (metric) {
    case KNN_METRIC_L2:
      return knn_l2_squared(a, b, dim);
    case KNN_METRIC_COSINE:
    case KNN_METRIC_IP:
      return knn_dot(a, b, dim);
    case KNN_METRIC_L1:
      return knn_l1_sum(a, b, dim);
    default:  // the bit metrics never reach the float engines (problem_check.h)
      break;
  }
  return knn_l2_squared(a, b, dim);
}

// A key that orders pairs exactly as their distance does, but is cheaper:
// for L2 the squared sum itself. sqrt((double) s) is strictly increasing
// over float sums (adjacent floats differ by 2^-24 relative or more, far
// above double rounding), so comparisons and ties are the same; the sqrt
// is taken only for the k results (distance_from_key) and for bounds.
inline double ordering_key(KnnMetric metric, float sum, float norm_a,
                           float norm_b) {
  if (metric == KNN_METRIC_L2) return static_cast<double>(sum);
  return distance_from_sum(metric, sum, norm_a, norm_b);
}

inline double distance_from_key(KnnMetric metric, double key) {
  // The key of L2 is a float widened to double, so narrowing is exact.
  if (metric == KNN_METRIC_L2) return knn_l2_from_squared(static_cast<float>(key));
  return key;
}

// Distance of one pair for the metrics that need no norms (L2, L1, IP).
inline double pair_distance(KnnMetric metric, const float *a, const float *b,
                            int dim) {
  return distance_from_sum(metric, pair_sum(metric, a, b, dim), 0.0f, 0.0f);
}

}  // namespace cpu
}  // namespace knn
