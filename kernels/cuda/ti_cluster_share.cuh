// ti_cluster_share.cuh -- one engine's share of a TI self-join split across
// GPUs, divided by whole query clusters (ti_query_share.cu; the vote that
// decides it: share_vote.cuh). Internal to the TI join (ti_join.cu).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ti_common.cuh"

namespace knn {
namespace cuda {
namespace ti {

// This engine's clusters [first_cluster, end_cluster), cut at the same
// fraction of the positions as its query rows [first_row, first_row +
// count) are of the rows, and whether every engine agreed (the same
// clusters everywhere). Without agreement the engine answers its rows
// (share_query_clusters).
struct ClusterShare {
  bool agreed = false;
  int32_t first_cluster = 0, end_cluster = 0;
  std::vector<int32_t> begin;  // the clusters' first positions (m + 1), on the host
};

// This engine's clusters [first_cluster, end_cluster) (out->begin from
// `all`, out->agreed false): known before the vote, so that level 1 runs
// over them first (ti_join.cu: an engine short of memory there still hands
// its rows to another method).
KnnStatus plan_cluster_share(const ClusterSet &all, int64_t n_rows, int64_t first_row,
                              int64_t count, ClusterShare *out, DeviceContext &ctx);

// Whether an engine declines to divide by clusters: the share's arrays,
// lists and output could need more than `room` bytes (after agreeing, a
// share cannot hand its rows to another method), or KNN_TI_SPLIT_ROWS=1
// (for comparing the two ways).
bool cluster_share_declines(const ClusterSet &all, int64_t n_rows, int k, int kprime,
                            size_t room);

// Votes (ctx.share_vote) with a fingerprint of `all` and share->begin
// (plan_cluster_share's), or declines (cluster_share_declines); sets
// share->agreed.
KnnStatus agree_on_cluster_share(const ClusterSet &all, int64_t n_rows, int k, int kprime,
                                 size_t room, ClusterShare *share, MemoryBudget &mem,
                                 DeviceContext &ctx);

// Whether the environment variable `name` is set to 1 (the measuring
// switches below).
bool env_flag(const char *name);

// A join on one GPU whose output is this many result slots (rows x k) or
// more runs level 2 and the output as batches of clusters side by side,
// each batch's rows written while the GPU filters the later ones: there
// the writes take nearly as long as level 2. Below it the batches' extra
// launches and slices cost more than the overlap saves.
constexpr double kBatchedWritesMinSlots = 50e6;

// Whether a one-GPU join of n_rows query rows and k neighbours should run
// as batches (above); KNN_TI_BATCHED_WRITES=1 or 0 in the environment
// forces it either way (for measuring and tests).
bool batched_writes_pay(int64_t n_rows, int k);

// Every cluster as one share, where batched_writes_pay says so and the
// share's arrays, lists and output fit `room` (else out->agreed stays
// false: one launch and the plain output). KNN_TI_BATCH_STREAMS=1 also
// queues the batches on one stream, the older way.
KnnStatus whole_cluster_share(const ClusterSet &all, int64_t n_rows, int k, int kprime,
                              size_t room, ClusterShare *out, DeviceContext &ctx);

// The query clusters restricted to [first_cluster, end_cluster): every
// cluster kept (indices as in `all`, as level 1's results are), those
// outside empty. `begin` is all.begin on the host.
KnnStatus slice_query_clusters(const ClusterSet &all, const std::vector<int32_t> &begin,
                               int32_t first_cluster, int32_t end_cluster, ClusterSet &out,
                               MemoryBudget &mem, DeviceContext &ctx);

// What level 2 and the output of the share read.
struct ClusterShareJoin {
  const ClusterSet *queries = nullptr;  // every query cluster
  const DistinctSet *query_set = nullptr;
  const ClusterSet *targets = nullptr;
  const DistinctSet *target_set = nullptr;
  const Level1Result *level1 = nullptr;
  KnnMetric metric = KNN_METRIC_L2;
  Margin margin;
  int k = 0, kprime = 0;
  float *result_value = nullptr;  // n_distinct x kprime
  int32_t *result_row = nullptr;
  unsigned long long *counter = nullptr;
  const int64_t *query_keys = nullptr, *target_keys = nullptr;  // exclusion, or null
  size_t budget = 0;
  // Level 2's configuration for a batch of n distinct queries.
  std::function<Level2Config(int64_t n)> config;
};

// Level 2 on the share's clusters, in batches of clusters queued side by
// side (a stream and a priority each), each batch's rows written
// (scattered, into the caller's arrays) while the GPU filters the later
// ones. *used is the share's configuration; the seconds of
// the row expansion and of the copies are added to *select_seconds and
// *download_seconds.
KnnStatus filter_and_write_cluster_share(const ClusterShareJoin &join, const ClusterShare &share,
                                         int64_t *neighbors, double *distances,
                                         Level2Config *used, double *select_seconds,
                                         double *download_seconds, MemoryBudget &mem,
                                         DeviceContext &ctx);

}  // namespace ti
}  // namespace cuda
}  // namespace knn
