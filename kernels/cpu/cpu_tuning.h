// cpu_tuning.h -- the CPU engine with a choice forced that it otherwise
// makes itself, for the tests and the benchmark (nothing reaches it from
// SQL; like knn_cuda_run_tuned of the GPU module).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../knn_engine.h"

namespace knn {

struct CpuTuning {
  enum class Variant {
    kAuto,   // the engine's own choice (problem.method still applies)
    kTi,     // the triangle-inequality join, never declining
    kBlas,   // the certified SGEMM brute force (AVX2 where it cannot run)
    kAvx2,   // the blocked lane-sum brute force
  };
  Variant variant = Variant::kAuto;
  bool symmetric = true;    // kBlas: a self-join computes half the Gram matrix
  int64_t block_rows = 0;   // kBlas: tile side; 0 = the default
};

// cpu_run (cpu_engine.h) with `tuning`; never throws.
KnnStatus cpu_run_tuned(const KnnProblem &problem, const CpuTuning &tuning,
                        int64_t *neighbors, double *distances, KnnStats *stats,
                        const int32_t *cancel, char *errbuf, size_t errlen) noexcept;

}  // namespace knn
