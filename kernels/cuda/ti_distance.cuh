// ti_distance.cuh -- exact distances of the TI join, computed with the
// functions of knn_distance.h on rows padded to a multiple of 8 (or to 4).
//
// Why padding is exact: knn_l2_squared / knn_l1_sum put dimension i into
// lane i % 8 and sum each lane in index order. A padded dimension holds 0 in
// both rows, so it adds (0-0)^2 = +0 or |0-0| = +0 to its lane; a lane
// starts at +0 and only grows by non-negative terms, so x + 0 == x exactly.
// The padded sum is therefore bit-identical to the unpadded one.
//
// Queries live in registers as an array of compile-time length DPAD (the
// padded stride), so the loops of knn_distance.h unroll fully; targets are
// read from global memory with 16-byte alignment. DPAD == 0 is the generic
// path for wide rows: both rows are read from global memory.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "../knn_distance.h"
#include "../knn_engine.h"

namespace knn {
namespace cuda {
namespace ti {

// The padded strides that have register-resident kernels; wider rows use
// the generic path (stride rounded up to a multiple of 8).
constexpr int kStrideBuckets[] = {4, 8, 16, 24, 32, 40, 48, 64};

inline int padded_stride(int dim) {
  for (int s : kStrideBuckets)
    if (dim <= s) return s;
  return (dim + 7) / 8 * 8;
}

// Compile-time stride of the kernels for a padded stride (0 = generic).
inline int register_stride(int stride) {
  for (int s : kStrideBuckets)
    if (stride == s) return s;
  return 0;
}

// f(std::integral_constant<int, D>()) with D = register_stride(stride):
// picks the kernel instantiation for the rows' stride.
template <class F>
decltype(auto) with_register_stride(int stride, F &&f) {
  static_assert(sizeof kStrideBuckets / sizeof kStrideBuckets[0] == 8, "one case per bucket");
  switch (register_stride(stride)) {
    case 4: return f(std::integral_constant<int, 4>());
    case 8: return f(std::integral_constant<int, 8>());
    case 16: return f(std::integral_constant<int, 16>());
    case 24: return f(std::integral_constant<int, 24>());
    case 32: return f(std::integral_constant<int, 32>());
    case 40: return f(std::integral_constant<int, 40>());
    case 48: return f(std::integral_constant<int, 48>());
    case 64: return f(std::integral_constant<int, 64>());
    default: return f(std::integral_constant<int, 0>());
  }
}

template <int METRIC>
struct MetricOps;

template <>
struct MetricOps<KNN_METRIC_L2> {
  __device__ __forceinline__ static float value(const float *a, const float *b, int n) {
    return knn_l2_squared(a, b, n);
  }
  // The metric distance the triangle inequality is applied to.
  __device__ __forceinline__ static float ti(float value) { return sqrtf(value); }
  __host__ __device__ __forceinline__ static double result(float value) {
    return knn_l2_from_squared(value);
  }
};

template <>
struct MetricOps<KNN_METRIC_L1> {
  __device__ __forceinline__ static float value(const float *a, const float *b, int n) {
    return knn_l1_sum(a, b, n);
  }
  __device__ __forceinline__ static float ti(float value) { return value; }
  __host__ __device__ __forceinline__ static double result(float value) {
    return knn_l1_from_sum(value);
  }
};

// One query row held by a thread.
template <int DPAD>
struct QueryRow {
  float v[DPAD];

  __device__ __forceinline__ void load(const float *row, int /*stride*/) {
    const float4 *p = reinterpret_cast<const float4 *>(row);
#pragma unroll
    for (int i = 0; i < DPAD / 4; i++) {
      float4 f = p[i];
      v[4 * i] = f.x;
      v[4 * i + 1] = f.y;
      v[4 * i + 2] = f.z;
      v[4 * i + 3] = f.w;
    }
  }

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < DPAD; i++) v[i] = 0.0f;
  }

  // Value of the pair (this query, target row `t`), t 16-byte aligned.
  template <int METRIC>
  __device__ __forceinline__ float value_to(const float *t) const {
    const float *ta = static_cast<const float *>(__builtin_assume_aligned(t, 16));
    return MetricOps<METRIC>::value(v, ta, DPAD);
  }
};

// Generic path: the query stays in global memory.
template <>
struct QueryRow<0> {
  const float *row = nullptr;
  int stride = 0;

  __device__ __forceinline__ void load(const float *r, int s) {
    row = r;
    stride = s;
  }
  __device__ __forceinline__ void clear() {}

  template <int METRIC>
  __device__ __forceinline__ float value_to(const float *t) const {
    return MetricOps<METRIC>::value(row, t, stride);
  }
};

// Runtime-metric versions for the small kernels that are not templated.
__device__ __forceinline__ float row_value_rt(KnnMetric metric, const float *a, const float *b,
                                              int stride) {
  return metric == KNN_METRIC_L1 ? knn_l1_sum(a, b, stride) : knn_l2_squared(a, b, stride);
}

__device__ __forceinline__ float ti_distance_rt(KnnMetric metric, float value) {
  return metric == KNN_METRIC_L1 ? value : sqrtf(value);
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
