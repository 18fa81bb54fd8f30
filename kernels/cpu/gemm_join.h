// gemm_join.h -- exact brute force whose candidates come from an optimised
// SGEMM (blas_library.h), filtered with a proven rounding bound
// (gemm_bound.h) and re-ranked with the canonical distance. Internal to
// kernels/cpu/.
#pragma once

#include <cstdint>

#include "join_input.h"

namespace knn {
namespace cpu {

struct GemmOptions {
  // A self-join computes each block pair of the Gram matrix once and uses
  // it for both blocks (half the multiplications).
  bool symmetric = true;
  int64_t block_rows = 0;  // rows per tile side; 0 = the default
};

enum class GemmOutcome {
  kDone,         // output complete: exactly the brute-force results
  kCancelled,    // output incomplete
  kUnsupported,  // no BLAS (or no room for its buffers), L1, or values outside the
                 // bound's range; nothing written
};

// Rows per tile side by default (a function of the dimension only).
int64_t gemm_block_rows(int dim);

// Throws std::bad_alloc. Queries whose candidate list overflows are redone
// by the exact brute force. Runs on fewer threads than input.n_threads
// where OpenBLAS has room for fewer buffers (blas_buffers.h).
GemmOutcome gemm_join(const JoinInput &input, const JoinOutput &output,
                      const GemmOptions &options, JoinReport *report);

}  // namespace cpu
}  // namespace knn
