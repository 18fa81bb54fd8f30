// ti_padded_sum.h -- the lane sum of one pair of rows that are stored
// padded with zeros to a multiple of 8 floats, as the TI join's clusters
// store them. Internal to kernels/cpu/.
//
// knn_distance.h adds dimension i to lane i % 8 and leaves the lanes past
// the last dimension alone. Here every lane takes one term per block of 8,
// the padding included; a padding term is (0 - 0)^2 or |0 - 0|, which is
// +0, and adding +0 to a lane that holds +0 or more changes no bit. So the
// sum is bit-identical to knn_l2_squared / knn_l1_sum on the unpadded rows,
// without a tail loop. (Used for L2 and L1, whose terms are never negative.)
#pragma once

#include <cstdint>

#include "lane_terms.h"
#include "../knn_distance.h"

namespace knn {
namespace cpu {

// Floats per stored row: dim rounded up to whole lane blocks.
inline int padded_stride(int dim) { return (dim + KNN_LANES - 1) / KNN_LANES * KNN_LANES; }

// The lane sum of rows a and b, each kBlocks * 8 floats.
template <class Term, int kBlocks>
__attribute__((always_inline)) inline float padded_sum(const float *a, const float *b) {
  Lanes lanes = Lanes{};
  for (int i = 0; i < kBlocks * KNN_LANES; i += KNN_LANES) {
    Lanes va, vb;
    load_lanes(va, a + i);
    load_lanes(vb, b + i);
    Term::add(lanes, va, vb);
  }
  float l[KNN_LANES];
  __builtin_memcpy(l, &lanes, sizeof(l));
  return knn_fold_lanes(l);
}

}  // namespace cpu
}  // namespace knn
