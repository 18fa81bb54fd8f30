// cuda_engine.cuh -- what the CUDA engine's files share (internal to
// kernels/cuda/). The module's exported entry points are in
// ../knn_cuda_module.h; this header holds the per-join device context and
// the two join methods.
//
// The stream, the cuBLAS handle and the pinned staging memory of a context
// are not made per join: cuda_module.cu creates them once per GPU engine
// slot and process (device_runtime.cuh) and lends them to one join at a
// time.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../knn_engine.h"
#include "join_tuning.cuh"

namespace knn {
namespace cuda {

class PinnedStaging;  // host_transfer.cuh
class ShareVote;     // share_vote.cuh
class PeerRows;      // peer_rows.cuh

// Everything a method needs to run on the device for one join.
struct DeviceContext {
  int device = 0;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;   // bound to `stream`, FP32 pedantic math
  PinnedStaging *staging = nullptr;  // pinned memory for host transfers (may be null)
  size_t memory_budget = 0;        // bytes this join may allocate
  bool hold_pool = false;          // the pools keep what it frees (set_pool_hold)
  const int32_t *cancel = nullptr; // non-zero: stop at the next check
  std::string error;               // set with a non-OK status
  // A share of a TI self-join split across GPUs (multi_device.cuh): the
  // join answers only query rows [query_first, query_first + query_count),
  // into those rows of the result arrays, on the whole set's clusters.
  // query_count < 0: every row. Only ti_join reads it.
  int64_t query_first = 0;
  int64_t query_count = -1;
  // The split's vote on dividing a TI self-join by query clusters instead
  // (share_vote.cuh), and this engine's place in it; null: no split.
  ShareVote *share_vote = nullptr;
  int share_voter = 0;
  // The split's shared upload of the target rows (peer_rows.cuh), where
  // this engine (share_voter) takes part; null: no split. Brute force
  // offers its resident targets; every other path declines.
  PeerRows *peer_rows = nullptr;
  // The split's shared cluster assignment of a TI self-join (ti_clustering.cu:
  // each engine picks the centres of its slice of the distinct points and
  // copies the others' picks), where this engine takes part; null: no
  // split. TI shares offer theirs; every other path declines.
  PeerRows *peer_assign = nullptr;
  // The split's shared upload of a TI self-join's points (ti_join.cu:
  // each engine uploads its slice of the rows and copies the others'),
  // where this engine takes part; null: no split. TI shares offer; every
  // other path declines.
  PeerRows *peer_points = nullptr;

  bool cancelled() const {
    return cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0;
  }

  // KNN_CANCELLED (with its message) once a cancel has been asked for, else
  // KNN_OK: KNN_TRY(ctx.cancel_point()) between launches and chunks.
  KnnStatus cancel_point() {
    if (!cancelled()) return KNN_OK;
    if (error.empty()) error = "canceled";
    return KNN_CANCELLED;
  }
};

// Exact brute force: cuBLAS GEMM tiles as a filter with a proven error
// margin, k-selection, exact re-rank with knn_distance.h; chunked when the
// sets do not fit the budget. Handles every metric.
KnnStatus brute_force_join(const KnnProblem &problem, const JoinTuning &tuning,
                           int64_t *neighbors, double *distances, KnnStats *stats,
                           DeviceContext &ctx);

// Sweet KNN: clustered triangle-inequality join (L2 and L1; the caller
// routes other metrics elsewhere). Inputs whose distances could overflow go
// to brute_force_join.
KnnStatus ti_join(const KnnProblem &problem, const JoinTuning &tuning, int64_t *neighbors,
                  double *distances, KnnStats *stats, DeviceContext &ctx);

// One GPU's share (ctx.query_first, ctx.query_count) of a TI self-join on
// the clusters of the whole set, in memory. *declined, with nothing
// written, where it cannot run so (not a self-join, more than the budget,
// values that need brute force, or AUTO's TI giving up after level 1): the
// caller then joins the share's rows as a problem of their own.
KnnStatus ti_join_share(const KnnProblem &problem, const JoinTuning &tuning, int64_t *neighbors,
                        double *distances, KnnStats *stats, bool *declined,
                        DeviceContext &ctx);

}  // namespace cuda
}  // namespace knn
