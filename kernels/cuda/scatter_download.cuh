// scatter_download.cuh -- result rows from the device into scattered rows of
// the caller's arrays (one engine's share of a TI self-join divided by
// query clusters: its rows are spread over the whole output).
#pragma once

#include <cstdint>

#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

// Copies `count` result rows -- k neighbours (device `rows`) and k distances
// (device `dist`), row c at c * k -- to rows places[c] (host array,
// ascending for locality) of `neighbors` and `distances` (row r at r * k),
// after the work queued on ctx.stream so far, and waits for the copies.
// Through ctx.staging's pinned slices, on up to its number of worker
// threads, each emptying one slice into the scattered rows while the DMA
// engine fills the other; without staging, through a pageable buffer.
KnnStatus download_scattered_rows(DeviceContext &ctx, const int64_t *rows, const double *dist,
                                  const int32_t *places, int64_t count, int k,
                                  int64_t *neighbors, double *distances);

}  // namespace cuda
}  // namespace knn
