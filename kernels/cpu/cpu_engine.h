// cpu_engine.h -- the CPU engine: exact KNN join on plain threads.
// Internal to kernels/ (C++); the extension reaches it through knn_job_*.
#pragma once

#include <string>

#include "../knn_engine.h"

namespace knn {

// Runs the join described by `problem` into neighbors/distances (layout as
// in knn_engine.h). Polls `cancel` often enough to stop within a few
// milliseconds. Never throws; on failure returns a status and sets *error.
KnnStatus cpu_run(const KnnProblem &problem, int64_t *neighbors,
                  double *distances, KnnStats *stats,
                  const int32_t *cancel, std::string *error);

}  // namespace knn
