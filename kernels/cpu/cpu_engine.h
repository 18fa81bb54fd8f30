// cpu_engine.h -- the CPU engine: exact KNN join on plain threads.
// Internal to kernels/ (C++); the extension reaches it through knn_job_*.
#pragma once

#include <cstddef>

#include "../knn_engine.h"

namespace knn {

// Runs the join described by `problem` into neighbors/distances (layout as
// in knn_engine.h). Polls `cancel` often enough to stop within a few
// milliseconds. Never throws; on failure returns a status and a one-line
// message in errbuf (the signature of the GPU module's knn_cuda_run).
KnnStatus cpu_run(const KnnProblem &problem, int64_t *neighbors,
                  double *distances, KnnStats *stats,
                  const int32_t *cancel, char *errbuf, size_t errlen) noexcept;

// Which BLAS the engine uses: "OpenBLAS 0.3.21 (libopenblas.so.0)" or
// "none (why)". Loads it on first call (with every signal blocked).
const char *cpu_blas_description() noexcept;

}  // namespace knn
