// ti_expand.cuh -- one query row's k results from its distinct point's k'
// list, on the device (ti_output.cu) or on the host (the out-of-core join's
// output, ti_out_of_core.cu): the same code, so the same answer.
#pragma once

#include <cstdint>
#include <cstring>

#include "ti_common.cuh"
#include "ti_distance.cuh"

namespace knn {
namespace cuda {
namespace ti {

// The list's entries in order, less those whose target key equals own_key
// (target_keys: nullptr for no exclusion), as rows and float8 distances;
// slots past the eligible entries get row -1 and distance NaN, as
// knn_engine.h says.
template <int METRIC>
__host__ __device__ inline void expand_list(const float *value, const int32_t *row, int k,
                                            int kprime, const int64_t *target_keys,
                                            int64_t own_key, int64_t *out_rows,
                                            double *out_distances) {
  int j = 0;
  for (int s = 0; s < kprime && j < k; s++) {
    const int32_t r = row[s];
    if (r == kNoRow) break;
    if (target_keys != nullptr && target_keys[r] == own_key) continue;
    out_rows[j] = r;
    out_distances[j] = MetricOps<METRIC>::result(value[s]);
    j++;
  }
#ifdef __CUDA_ARCH__
  const double nan = __longlong_as_double(0x7ff8000000000000ll);
#else
  double nan;
  const uint64_t bits = 0x7ff8000000000000ull;
  std::memcpy(&nan, &bits, sizeof nan);
#endif
  for (; j < k; j++) {
    out_rows[j] = -1;
    out_distances[j] = nan;
  }
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
