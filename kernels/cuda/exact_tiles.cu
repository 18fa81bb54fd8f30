// exact_tiles.cu -- exact distance tiles: for a block of queries and a
// block of targets, the canonical lane sum of knn_distance.h for every
// pair, bit for bit what knn_l2_squared / knn_l1_sum / knn_dot return.
//
// The canonical order puts dimension i in lane i % 8 and sums each lane in
// index order, then folds the 8 lanes in a fixed tree. A thread keeps the 8
// lane accumulators of each of its pairs, walks the dimensions in order
// (in chunks staged through shared memory) and folds with knn_fold_lanes,
// so the result is the canonical one. Dimensions past `dim` are staged as
// zeros: they add +0 to a lane, which changes nothing (a lane starts at +0
// and can never become -0).
//
// Layout, like a SIMT matrix product: a block of 256 threads computes a
// (2*TY) x (4*TX) tile (TX*TY = 256); each thread owns 2 queries x 4
// targets = 8 pairs = 64 accumulators, reading 4 dimensions of its rows per
// step as float4 from shared memory.
#include "brute_kernels.cuh"
#include "cuda_check.cuh"
#include "lane_ops.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kQueriesPerThread = 2;
constexpr int kTargetsPerThread = 4;
constexpr int kChunk = 32;            // dimensions staged per step (multiple of 8)
constexpr int kStride = kChunk + 4;   // padded row stride (floats), keeps 16-byte alignment

template <int OP, int TY>
__global__ void __launch_bounds__(kThreads, 2)
exact_tile_kernel(const float *__restrict__ queries, int nq, const float *__restrict__ targets,
                  int nt, int dim, float *__restrict__ out, int64_t ld) {
  constexpr int TX = kThreads / TY;
  constexpr int BQ = TY * kQueriesPerThread;
  constexpr int BT = TX * kTargetsPerThread;
  __shared__ __align__(16) float sq[BQ * kStride];
  __shared__ __align__(16) float st[BT * kStride];

  const int tx = threadIdx.x % TX;
  const int ty = threadIdx.x / TX;
  const int q0 = blockIdx.y * BQ;
  const int t0 = blockIdx.x * BT;

  float acc[kQueriesPerThread][kTargetsPerThread][KNN_LANES];
  clear_lanes(acc);

  for (int d0 = 0; d0 < dim; d0 += kChunk) {
    // Stage the chunk (its dimensions rounded up to 4), zero-padded past the
    // last row and dimension. Low-dimensional data only pays for its own
    // dimensions: groups of 4 past `dim` are skipped below.
    const int chunk_dims = min(kChunk, dim - d0);
    const int cols = (chunk_dims + 3) & ~3;
    for (int i = threadIdx.x; i < BQ * cols; i += kThreads) {
      const int r = i / cols, c = i % cols;
      const int q = q0 + r, d = d0 + c;
      sq[r * kStride + c] =
          (q < nq && d < dim) ? queries[static_cast<int64_t>(q) * dim + d] : 0.0f;
    }
    for (int i = threadIdx.x; i < BT * cols; i += kThreads) {
      const int r = i / cols, c = i % cols;
      const int t = t0 + r, d = d0 + c;
      st[r * kStride + c] =
          (t < nt && d < dim) ? targets[static_cast<int64_t>(t) * dim + d] : 0.0f;
    }
    __syncthreads();

    add_staged_chunk<OP, kQueriesPerThread, kTargetsPerThread, TX, kChunk, kStride>(
        acc, sq, st, tx, ty, chunk_dims);
    __syncthreads();
  }

#pragma unroll
  for (int m = 0; m < kQueriesPerThread; m++) {
    const int q = q0 + ty * kQueriesPerThread + m;
    if (q >= nq) continue;
#pragma unroll
    for (int n = 0; n < kTargetsPerThread; n++) {
      const int t = t0 + tx + n * TX;
      if (t < nt) out[static_cast<int64_t>(q) * ld + t] = knn_fold_lanes(acc[m][n]);
    }
  }
}

template <int OP>
KnnStatus launch_op(DeviceContext &ctx, const float *queries, int nq, const float *targets,
                    int nt, int dim, float *out, int64_t ld) {
  // Few queries (small batches): a tile of 8 queries x 256 targets wastes
  // less than the 32 x 64 tile.
  if (nq <= 8) {
    constexpr int TY = 4, BQ = TY * kQueriesPerThread, BT = (kThreads / TY) * kTargetsPerThread;
    dim3 grid((nt + BT - 1) / BT, (nq + BQ - 1) / BQ);
    exact_tile_kernel<OP, TY><<<grid, kThreads, 0, ctx.stream>>>(queries, nq, targets, nt, dim,
                                                                 out, ld);
  } else {
    constexpr int TY = 16, BQ = TY * kQueriesPerThread, BT = (kThreads / TY) * kTargetsPerThread;
    dim3 grid((nt + BT - 1) / BT, (nq + BQ - 1) / BQ);
    exact_tile_kernel<OP, TY><<<grid, kThreads, 0, ctx.stream>>>(queries, nq, targets, nt, dim,
                                                                 out, ld);
  }
  CUDA_CHECK_LAUNCH(ctx, "exact_tile_kernel");
  return KNN_OK;
}

}  // namespace

KnnStatus launch_exact_tile(DeviceContext &ctx, KnnMetric metric, const float *queries,
                            int nq, const float *targets, int nt, int dim, float *out,
                            int64_t ld) {
  if (nq <= 0 || nt <= 0) return KNN_OK;
  switch (metric) {
    case KNN_METRIC_L2:
      return launch_op<kSquaredDiff>(ctx, queries, nq, targets, nt, dim, out, ld);
    case KNN_METRIC_L1:
      return launch_op<kAbsDiff>(ctx, queries, nq, targets, nt, dim, out, ld);
    case KNN_METRIC_IP:
    case KNN_METRIC_COSINE:
      return launch_op<kProduct>(ctx, queries, nq, targets, nt, dim, out, ld);
  }
  ctx.error = "exact tile: unknown metric";
  return KNN_INTERNAL_ERROR;
}

}  // namespace cuda
}  // namespace knn
