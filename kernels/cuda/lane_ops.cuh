// lane_ops.cuh -- one step of a canonical lane sum (knn_distance.h) on the
// device: acc + (a-b)^2, acc + |a-b| or acc + a*b, each operation rounded
// on its own (no fused multiply-add), exactly as knn_distance.h does.
#pragma once

#include "../knn_engine.h"

namespace knn {
namespace cuda {

enum PairOp { kSquaredDiff = 0, kAbsDiff = 1, kProduct = 2 };

template <int OP>
__device__ __forceinline__ float lane_add(float acc, float a, float b) {
  if (OP == kSquaredDiff) {
    const float d = __fsub_rn(a, b);
    return __fadd_rn(acc, __fmul_rn(d, d));
  } else if (OP == kAbsDiff) {
    return __fadd_rn(acc, fabsf(__fsub_rn(a, b)));
  } else {
    return __fadd_rn(acc, __fmul_rn(a, b));
  }
}

// The lane sum a metric's exact tiles hold.
inline int pair_op(KnnMetric metric) {
  return metric == KNN_METRIC_L2 ? kSquaredDiff : metric == KNN_METRIC_L1 ? kAbsDiff : kProduct;
}

}  // namespace cuda
}  // namespace knn
