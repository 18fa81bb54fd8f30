// bit_join.cuh -- exact Hamming and Jaccard joins of bit rows on the GPU
// (internal to kernels/cuda/; cuda_module.cu routes KNN_ELEMENT_BIT
// problems here).
#pragma once

#include "../knn_cuda_module.h"
#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

// Runs a bit problem (layout and order of knn_engine.h, ties by target row,
// self-exclusion keys honoured) with k <= KNN_CUDA_BIT_MAX_K; the distances
// are bit for bit those of the CPU bit engine (kernels/cpu/bit_join.h).
KnnStatus bit_join(const KnnProblem &problem, int64_t *neighbors, double *distances,
                   KnnStats *stats, DeviceContext &ctx);

}  // namespace cuda
}  // namespace knn
