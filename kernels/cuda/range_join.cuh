// range_join.cuh -- the GPU range join (internal to kernels/cuda/;
// cuda_module.cu's knn_cuda_range runs range problems here).
//
// Every (query, target) pair within the radius (KnnProblem::range),
// capped per query at k nearest (0 = no cap), ties by target row: the
// pairs, order and distances of the CPU range engine
// (kernels/cpu/range_join.h), bit for bit. L2 and L1 with a finite radius
// on finite rows are pruned by the triangle inequality over clustered
// targets (ti_clustering.cu); other metrics, radii and rows, and small
// joins, compare every pair. Pairs are found and ordered in chunks of query
// rows on the device and handed to the sink while the next chunk is found.
#pragma once

#include "../knn_cuda_module.h"
#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

// Runs a range problem (float32 or bit rows) on the prepared context; the
// pairs of each query row go to sink in ascending query order. stats are
// the join's (device name and totals are the caller's).
KnnStatus range_join(const KnnProblem &problem, knn_cuda_pair_sink_fn sink, void *sink_context,
                     KnnStats *stats, DeviceContext &ctx);

}  // namespace cuda
}  // namespace knn
