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

// Queries per work item of the AVX2 brute force (brute_force.cpp, which
// defines it), for the model's view of how the items spread over threads.
int64_t brute_force_query_block(int k, int64_t n_targets);

}  // namespace cpu
}  // namespace knn
