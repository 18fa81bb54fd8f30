// value_range.h -- whether every distance of a join stays finite, which the
// triangle-inequality bounds need (both engines send other inputs to brute
// force, which is exact for any value).
#pragma once

#include <cmath>

#include "knn_engine.h"

namespace knn {

// max_abs: the largest |value| of both sides (NaN or infinity: not finite).
// The largest possible sum, with room to spare below FLT_MAX (2^128).
inline bool distances_stay_finite(KnnMetric metric, int dim, float max_abs) {
  if (!(max_abs <= 3.402823466e38f)) return false;  // NaN or infinity
  const double reach = 2.0 * static_cast<double>(max_abs);
  const double worst = metric == KNN_METRIC_L2 ? reach * reach * (dim + 16.0)
                                               : reach * (dim + 16.0);
  return worst < std::ldexp(1.0, 120);
}

}  // namespace knn
