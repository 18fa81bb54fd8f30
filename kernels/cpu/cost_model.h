// cost_model.h -- how fast this machine runs the two brute forces, measured
// once per process (a small SGEMM and a small lane-sum run), so that AUTO
// can pick between them and decide whether TI is worth sampling. Internal
// to kernels/cpu/.
#pragma once

#include <cstdint>

#include "join_input.h"

namespace knn {
namespace cpu {

struct BruteForceCosts {
  double avx2_seconds = 0;  // predicted, on input.n_threads threads
  double blas_seconds = 0;  // +inf without a usable BLAS or for L1
};

// Predictions for this join (the first call measures; thread-safe).
BruteForceCosts predict_brute_force(const JoinInput &input, bool symmetric);

}  // namespace cpu
}  // namespace knn
