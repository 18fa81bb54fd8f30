// large_k_select.cuh -- k beyond the streaming selection's lists on the
// fp16 tensor-core filter (large_k_select.cu says how and why it is exact).
// brute_plan.cu sizes it, brute_force.cu runs it for one (query chunk,
// target chunk) block and redoes the queries it could not certify with the
// full sort.
#pragma once

#include <cstdint>
#include <functional>

#include "brute_kernels.cuh"
#include "device_buffer.cuh"

namespace knn {
namespace cuda {

// The largest k served this way; beyond it the full sort (full_sort.cu).
constexpr int kLargeKMax = 16384;

// How a block is guessed and collected (large_k_shape):
struct LargeKShape {
  int64_t step = 1;       // the sample: targets 0, step, 2 step, ...
  int sample = 0;         // ... this many of them
  int rank = 1;           // the guess is the rank-th smallest sample bound
  bool take_all = false;  // the sample cannot bound k: collect every target
  int capacity = 0;       // candidates a query may collect
};

// For k and nt targets, with a GEMM tile of tile_elements (the sample's
// GEMM must hold one query row).
LargeKShape large_k_shape(int k, int64_t nt, int64_t tile_elements);

// Device bytes of LargeKSelect's buffers for q_rows queries of `capacity`.
size_t large_k_bytes(int64_t q_rows, int capacity);

// One block: queries q against targets t (both with fp16 rows).
struct LargeKArgs {
  KnnMetric metric = KNN_METRIC_L2;
  int dim = 0;
  int k = 1;
  Rows q, t;
  TileValue value;          // the fp16 filter's bound (one of the half kinds)
  bool half_tiles = false;  // the GEMM writes fp16 tiles
  void *tile = nullptr;     // tile_rows x tile_cols elements
  int tile_rows = 0, tile_cols = 0;
  ResultArrays out;         // query row i: slots i*k ...
  uint8_t *certified = nullptr;  // per query row: 1 when its k best are proven
  // The fp16 GEMM on the join's stream: dots of queries [q0, q0 + nq) with
  // targets t0, t0 + step, ... (nt of them) into dst, column-major with
  // leading dimension ldc (dst[i * ldc + j]: query q0 + i, target j).
  std::function<KnnStatus(int64_t q0, int nq, int64_t t0, int64_t step, int nt, void *dst,
                          int ldc)>
      gemm;
};

// The work buffers, allocated once per join for the largest block.
class LargeKSelect {
 public:
  KnnStatus allocate(DeviceContext &ctx, int64_t q_rows, int capacity);
  // Writes every query's k best (exact, sorted) and whether they are
  // certified; ends with the stream synchronized.
  KnnStatus run(DeviceContext &ctx, const LargeKArgs &a, int64_t *exact_pairs);

 private:
  int capacity_ = 0;
  int64_t q_rows_ = 0;
  DeviceBuffer<uint32_t> rows_[2], pos_;
  DeviceBuffer<uint64_t> keys_[2];
  DeviceBuffer<double> dist_;
  DeviceBuffer<uint64_t> guess_;
  DeviceBuffer<uint32_t> count_;
  DeviceBuffer<int64_t> begin_, end_;
  DeviceBuffer<unsigned char> temp_;
};

}  // namespace cuda
}  // namespace knn
