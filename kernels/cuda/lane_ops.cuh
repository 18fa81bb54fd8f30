// lane_ops.cuh -- one step of a canonical lane sum (knn_distance.h) on the
// device: acc + (a-b)^2, acc + |a-b| or acc + a*b, each operation rounded
// on its own (no fused multiply-add), exactly as knn_distance.h does.
#pragma once

#include <cuda_runtime.h>

#include "../knn_distance.h"

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

// Sets the MQ x MT lane accumulators of a tile kernel to +0.
template <int MQ, int MT>
__device__ __forceinline__ void clear_lanes(float (&acc)[MQ][MT][KNN_LANES]) {
#pragma unroll
  for (int m = 0; m < MQ; m++)
#pragma unroll
    for (int n = 0; n < MT; n++)
#pragma unroll
      for (int j = 0; j < KNN_LANES; j++) acc[m][n][j] = 0.0f;
}

// The lane sums of a tile kernel over one chunk of dimensions staged in
// shared memory (rows of STRIDE floats): thread (tx, ty) owns query rows
// ty * MQ + m and target rows tx + n * TX of the stages sq and st, and adds
// dimensions 0 .. dims - 1 of the chunk (rounded up to 4; staged zeros past
// the end add +0, which changes nothing). Dimension g goes to lane g % 8, a
// constant once the loop is unrolled, so every accumulator stays in a
// register.
template <int OP, int MQ, int MT, int TX, int CHUNK, int STRIDE>
__device__ __forceinline__ void add_staged_chunk(float (&acc)[MQ][MT][KNN_LANES], const float *sq,
                                                 const float *st, int tx, int ty, int dims) {
#pragma unroll
  for (int g = 0; g < CHUNK; g += 4) {
    if (g >= dims) break;
    const int lane0 = g % KNN_LANES;
    float4 x[MQ], y[MT];
#pragma unroll
    for (int m = 0; m < MQ; m++)
      x[m] = *reinterpret_cast<const float4 *>(&sq[(ty * MQ + m) * STRIDE + g]);
#pragma unroll
    for (int n = 0; n < MT; n++)
      y[n] = *reinterpret_cast<const float4 *>(&st[(tx + n * TX) * STRIDE + g]);
#pragma unroll
    for (int m = 0; m < MQ; m++)
#pragma unroll
      for (int n = 0; n < MT; n++) {
        acc[m][n][lane0 + 0] = lane_add<OP>(acc[m][n][lane0 + 0], x[m].x, y[n].x);
        acc[m][n][lane0 + 1] = lane_add<OP>(acc[m][n][lane0 + 1], x[m].y, y[n].y);
        acc[m][n][lane0 + 2] = lane_add<OP>(acc[m][n][lane0 + 2], x[m].z, y[n].z);
        acc[m][n][lane0 + 3] = lane_add<OP>(acc[m][n][lane0 + 3], x[m].w, y[n].w);
      }
  }
}

}  // namespace cuda
}  // namespace knn
