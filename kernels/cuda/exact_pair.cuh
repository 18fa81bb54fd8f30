// exact_pair.cuh -- the exact distance of one pair on the device, through
// knn_distance.h only (so it is bit for bit the CPU's and the operators').
#pragma once

#include "../knn_distance.h"
#include "../knn_engine.h"

namespace knn {
namespace cuda {

// *value: the selection-domain value (see tile_value.cuh: squared L2, L1
// sum, -dot, cosine distance); *dist: the operator's float8 result.
// q_norm and t_norm (knn_dot(x, x)) are read for cosine only.
__device__ __forceinline__ void exact_pair(KnnMetric metric, const float *q, const float *t,
                                           int dim, float q_norm, float t_norm, double *value,
                                           double *dist) {
  switch (metric) {
    case KNN_METRIC_L2: {
      const float s = knn_l2_squared(q, t, dim);
      *value = s;
      *dist = knn_l2_from_squared(s);
      return;
    }
    case KNN_METRIC_L1: {
      const float s = knn_l1_sum(q, t, dim);
      *value = s;
      *dist = knn_l1_from_sum(s);
      return;
    }
    case KNN_METRIC_IP:
      *dist = knn_ip_from_dot(knn_dot(q, t, dim));
      *value = *dist;
      return;
    case KNN_METRIC_COSINE:
      *dist = knn_cosine_from_dot(knn_dot(q, t, dim), q_norm, t_norm);
      *value = *dist;
      return;
  }
}

}  // namespace cuda
}  // namespace knn
