// ti_common.cuh -- what the files of the GPU triangle-inequality join
// (Sweet KNN, ti_*.cu) share: options, the device-side data of each stage,
// memory accounting and the stage entry points. Internal to kernels/cuda/.
//
// Vocabulary used throughout:
//  * value: what knn_distance.h computes in float for a pair (the squared
//    sum for L2, the sum for L1). Distinct floats give distinct float8
//    results (sqrt in double keeps them apart), so ordering by (value, row)
//    is exactly knn_result_before on the operator's float8 result.
//  * ti distance: the value turned into a metric distance in float
//    (sqrtf for L2, the value itself for L1); the triangle inequality holds
//    for it up to the rounding margin of ../rounding_margin.h.
//  * distinct point: one of the bitwise-distinct rows of a set (ti_dedup.cu).
//    The join runs on distinct points and expands them back to rows.
//  * position: the index of a distinct point in cluster order (clusters one
//    after the other, members by descending distance to their centre).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "cuda_check.cuh"
#include "cuda_engine.cuh"
#include "device_buffer.cuh"
#include "grid.cuh"
#include "join_tuning.cuh"

namespace knn {
namespace cuda {
namespace ti {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Row of an unused slot of a top-k list; every real row is smaller.
constexpr int32_t kNoRow = INT32_MAX;

// ---- device memory of the join ----

// The join's device arrays are DeviceBuffers (device_buffer.cuh): stream-
// ordered, so temporaries can be dropped between launches without stalling
// the pipeline. ti_join.cu synchronizes and trims the pool before it
// returns, so no device memory outlives the join on any path.

// Accounts every allocation of the join against ctx.memory_budget.
class MemoryBudget {
 public:
  explicit MemoryBudget(size_t budget) : budget_(budget) {}

  template <class T>
  KnnStatus allocate(DeviceContext &ctx, DeviceBuffer<T> &buffer, size_t count, const char *what,
                     cudaMemPool_t pool = nullptr) {
    const size_t bytes = count * sizeof(T);
    if (budget_ != 0 && used_ + bytes > budget_) {
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "TI join needs %zu bytes more for %s than the join budget of %zu bytes",
                    used_ + bytes - budget_, what, budget_);
      if (ctx.error.empty()) ctx.error = msg;
      return KNN_OUT_OF_MEMORY;
    }
    KNN_TRY(buffer.allocate(ctx, count, what, pool));
    used_ += bytes;
    return KNN_OK;
  }

  // For buffers dropped before the join ends.
  template <class T>
  void release(DeviceBuffer<T> &buffer) {
    used_ -= buffer.bytes();
    buffer.release();
  }

  size_t used() const { return used_; }
  size_t budget() const { return budget_; }

 private:
  size_t budget_;
  size_t used_ = 0;
};

// CUB's two calls: the first sizes the workspace, which goes to temp
// (counted against mem), the second runs. call(void *temp, size_t &bytes)
// returns the CUB call's cudaError_t.
template <class Call>
KnnStatus run_cub(DeviceContext &ctx, MemoryBudget &mem, DeviceBuffer<unsigned char> &temp,
                  const char *what, Call call) {
  size_t bytes = 0;
  KNN_CHECK_RESULT(ctx, call(nullptr, bytes), what);
  KNN_TRY(mem.allocate(ctx, temp, std::max<size_t>(bytes, 1), what));
  KNN_CHECK_RESULT(ctx, call(temp.get(), bytes), what);
  return KNN_OK;
}

// ---- the data of each stage ----

// A point set on the device: n rows of `stride` floats, zero padded past
// dim (padding adds +0 to a lane, which changes no sum: ti_distance.cuh).
struct DevicePoints {
  const float *x = nullptr;
  int64_t n = 0;
  int dim = 0;
  int stride = 0;
};

// The bitwise-distinct rows of a set (ti_dedup.cu).
struct DistinctSet {
  int64_t n_rows = 0;
  int64_t n_distinct = 0;
  int stride = 0;
  DeviceBuffer<float> x;             // n_distinct x stride
  DeviceBuffer<int32_t> group_begin; // n_distinct + 1 offsets into rows
  DeviceBuffer<int32_t> rows;        // the rows of each group, ascending
  DeviceBuffer<int32_t> group_of_row;  // n_rows
};

// What the kernels read of a ClusterSet (its arrays; see there).
struct ClusterView {
  const float *centers;
  const int32_t *begin;
  const float *radius;
  const float *nearest;
  const int32_t *member;
  const float *dist;
  const float *x;
  const int32_t *first_row;
  const int32_t *mult;
  const int32_t *rows_begin;
};

// Clusters of a distinct set around landmarks (ti_clustering.cu).
struct ClusterSet {
  int32_t m = 0;        // clusters
  int64_t n = 0;        // distinct points
  int stride = 0;
  DeviceBuffer<float> centers;      // m x stride
  DeviceBuffer<int32_t> begin;      // m + 1 offsets into positions
  DeviceBuffer<float> radius;       // m: largest member distance (0 if empty)
  DeviceBuffer<float> nearest;      // m: smallest member distance (+inf if empty)
  DeviceBuffer<int32_t> member;     // n: distinct point at each position
  DeviceBuffer<float> dist;         // n: ti distance to the own centre
  DeviceBuffer<float> x;            // n x stride: vectors in position order
  // Row expansion of each position (the duplicate group of its point).
  DeviceBuffer<int32_t> first_row;  // n: smallest row of the group
  DeviceBuffer<int32_t> mult;       // n: rows in the group
  DeviceBuffer<int32_t> rows_begin; // n: offset of the group in DistinctSet::rows

  ClusterView view() const {
    return ClusterView{centers.get(), begin.get(), radius.get(),    nearest.get(),
                       member.get(),  dist.get(),  x.get(),         first_row.get(),
                       mult.get(),    rows_begin.get()};
  }
};

// Level-1 output for every query cluster (ti_filter_level1.cu), computed
// for the clusters [cand_first, cand_first + rows of candidates) only (a
// split's share divided by clusters: its own); the others have no
// candidates and bound 0.
struct Level1Result {
  int64_t cand_stride = 0;           // = target clusters
  int32_t cand_first = 0;            // the query cluster of candidates' row 0
  DeviceBuffer<float> upper_bound;   // mq: no query of the cluster has its
                                     // k'-th neighbour farther (ti distance)
  DeviceBuffer<uint64_t> candidates; // rows x cand_stride sorted keys:
                                     // (centre distance bits << 32) | cluster
  DeviceBuffer<int32_t> cand_count;  // mq
};

// The rounding margin of rounding_margin.h, in float for the kernels:
// a bound whose computed distances sum to S is widened by rel * S + abs.
struct Margin {
  float rel = 0;
  float abs = 0;
};

// Where the level-2 top-k lists live (section IV-C2).
enum class ListPlace { Registers16, Registers32, Shared, Global };

struct Level2Config {
  bool partial = false;
  ListPlace place = ListPlace::Registers32;
  int parts = 1;              // threads (warps) per query, IV-D3
  int kprime = 0;             // list length: k + excluded rows per query
  // Out-of-core join: the lists go on from result_value/result_row (the
  // nearest of the target parts done so far) instead of starting empty.
  // Full filter only.
  bool resume = false;
  // Several threads per query: their lists are merged in shared memory
  // (the P warps of a query are one block) instead of a global array of
  // max groups x 32 x P x k' entries, which an out-of-core budget cannot
  // spare. Taken where the block's lists fit its shared memory.
  bool shared_merge = false;
  // Out-of-core join: where set, each stored list's k'-th entry (value,
  // row) also goes here, by distinct query, in device memory: the per-pair
  // scans then read it there while the lists themselves may be in mapped
  // host memory (ti_out_of_core.cu).
  float *last_value = nullptr;
  int32_t *last_row = nullptr;
  // With resume and last_value: a carried list is read (and written back)
  // only by the warps whose visit offers an entry before its k'-th entry
  // (the others leave it unread); off: every list of a visited cluster is
  // read and written.
  bool lazy_lists = false;
  // The lists by query POSITION, in tiles of 32 positions, entry-major
  // within a tile (entry i of position p at (p / 32) * 32 k' + i * 32 +
  // p % 32), so that a warp's loads and stores of its lists are coalesced:
  // over the bus, scattered 4-byte accesses cost several times more.
  bool tiled_lists = false;
  // Out-of-core join: a word in device memory that turns non-zero once
  // the join is cancelled (cancel_watch.cuh); blocks that begin after that
  // return at once, so that a cancel does not wait for the queued
  // launches' work (their lists are not wanted). Null: none.
  const int32_t *stop = nullptr;
};

// ---- stage entry points (each returns KNN_OK or sets ctx.error) ----

// ti_join.cu: one point set on the device, rows padded to `stride` floats;
// the largest |value| goes to *max_abs_bits (atomicMax on float bits).
struct UploadedSet {
  DeviceBuffer<float> padded;
  DevicePoints points;
};
KnnStatus upload_points(const float *host, int64_t n, int dim, int stride, UploadedSet &out,
                        unsigned *max_abs_bits, MemoryBudget &mem, DeviceContext &ctx);

// ti_join.cu: the largest |value| upload_points recorded at the device's
// max_abs_bits, once the stream has caught up.
KnnStatus read_max_abs(const unsigned *max_abs_bits, float *out, DeviceContext &ctx);

// ti_join.cu: the end of a join whose buffers have all been handed to
// cudaFreeAsync: waits for the frees and gives the pool's memory back to
// the device. Returns `status`, or the failure of the wait.
KnnStatus release_join_memory(KnnStatus status, DeviceContext &ctx);

// ti_join.cu: clusters for n distinct points (factor * sqrt(n), at least 1).
int32_t landmarks_for(double factor, int64_t n);

// ti_join.cu: where the level-2 lists of k' entries live (IV-D2).
ListPlace choose_list_place(const DeviceContext &ctx, int kprime, ListKind forced);
const char *place_name(ListPlace p);

// ti_dedup.cu: groups bitwise-identical rows of `points`.
KnnStatus build_distinct_set(const DevicePoints &points, bool dedup, DistinctSet &out,
                             MemoryBudget &mem, DeviceContext &ctx);

// A split TI self-join's engines share the assignment of the points to
// their centres (ti_clustering.cu): `peers` (DeviceContext::peer_assign),
// this engine's index in it, and what the engines must have in common to
// share (the host rows, element type and keys of the problem).
struct AssignShare {
  PeerRows *peers = nullptr;
  int engine = 0;
  const void *host = nullptr;
  int element = 0;
  const int64_t *keys = nullptr;
  int32_t *probe = nullptr;  // TiOptions::shared_probe: 2 is ORed in once shared
};

// ti_clustering.cu: landmarks, assignment and cluster arrays.
// Rows at least gemm_min_stride floats wide are assigned through cuBLAS
// (L2 only). share (optional): the split's shared assignment, offered or
// declined here.
KnnStatus build_clusters(const DistinctSet &set, KnnMetric metric, int32_t clusters,
                         int candidate_sets, int gemm_min_stride, ClusterSet &out,
                         MemoryBudget &mem, DeviceContext &ctx,
                         const AssignShare *share = nullptr);

// ti_filter_level1.cu: centre distances, upper bounds, group filter.
// carried_bound (mq, optional; the out-of-core join's lists carried from
// earlier target parts): a bound no query of the cluster's k'-th neighbour
// exceeds (ti distance, margin in); each upper bound is at most it.
// [first_cluster, end_cluster): the query clusters filtered (end -1: to
// the last); level 2 may then run on queries of those clusters only.
KnnStatus level1_filter(const ClusterSet &queries, const ClusterSet &targets,
                        KnnMetric metric, int kprime, Margin margin, Level1Result &out,
                        MemoryBudget &mem, DeviceContext &ctx,
                        const float *carried_bound = nullptr, int32_t first_cluster = 0,
                        int32_t end_cluster = -1);

// ti_filter_level1.cu: a bound of level1_filter's device memory at its
// peak, for `rows` query clusters against mt target clusters.
size_t level1_filter_bytes(int64_t rows, int64_t mt, int kprime);

// ti_filter_level2.cu: the k' nearest (value, row) of every distinct query,
// written to result_value/result_row (n_distinct_queries x kprime). *used
// is the configuration that ran (the partial filter falls back to the full
// one when its candidates do not fit the budget; a list that does not fit
// its place goes to global memory).
KnnStatus level2_filter(const ClusterSet &queries, const ClusterSet &targets,
                        const DistinctSet &target_set, const Level1Result &level1,
                        KnnMetric metric, const Level2Config &requested, Margin margin,
                        float *result_value, int32_t *result_row,
                        unsigned long long *distance_counter, Level2Config *used,
                        MemoryBudget &mem, DeviceContext &ctx);

// Threads per query the level-2 kernel would give `distinct_queries`
// queries under IV-D3 (r * max concurrent threads / |Q|).
int level2_threads_per_query(const DeviceContext &ctx, KnnMetric metric, int stride,
                             ListPlace place, int kprime, int64_t distinct_queries,
                             double r);

// ti_output.cu: expands the per-distinct-query lists to the query rows
// first .. first + count - 1, drops pairs with equal keys, writes int64 rows
// and float8 distances (device arrays of count x k).
KnnStatus expand_results(const DistinctSet &queries, KnnMetric metric, int64_t first,
                         int64_t count, int k, int kprime, const float *result_value,
                         const int32_t *result_row, const int64_t *query_keys,
                         const int64_t *target_keys, int64_t *out_rows, double *out_distances,
                         DeviceContext &ctx);

// Rows of output (k int64 rows and k float8 distances each) expanded on
// the device at a time: half of what the budget has left, at most `rows`;
// where nothing is left, 1024 rows (their allocation then reports it).
inline int64_t output_chunk_rows(size_t budget, size_t used, int64_t rows, int k) {
  const size_t slot_bytes = sizeof(int64_t) + sizeof(double);
  const size_t room = budget > used ? budget - used : 0;
  const int64_t chunk = std::min<int64_t>(rows, (int64_t)(room / 2 / (slot_bytes * k)));
  return chunk >= 1 ? chunk : std::min<int64_t>(rows, 1024);
}

// ti_output.cu: the same for the listed query rows listed[0 .. count - 1]
// (a device array); output row c is listed[c]'s.
KnnStatus expand_listed_results(const DistinctSet &queries, KnnMetric metric,
                                const int32_t *listed, int64_t count, int k, int kprime,
                                const float *result_value, const int32_t *result_row,
                                const int64_t *query_keys, const int64_t *target_keys,
                                int64_t *out_rows, double *out_distances, DeviceContext &ctx);

// ti_out_of_core.cu: the join for sets whose clusters and lists do not fit
// the budget: query parts x target parts, each query's list carried from one
// target part to the next. *finite is false (and nothing is written) when a
// distance could overflow; the caller then runs brute force.
KnnStatus out_of_core_join(const KnnProblem &problem, const TiOptions &options,
                           int64_t *neighbors, double *distances, KnnStats *stats,
                           bool *finite, DeviceContext &ctx);

// ti_out_of_core.cu: a conservative estimate of the device memory of the
// in-memory join (ti_join.cu), to skip it where it cannot fit.
size_t in_memory_join_bytes(const KnnProblem &problem, int kprime);

// The query clusters of a self-join restricted to the positions whose
// distinct point has a row in [first, first + count) (ti_query_share.cu):
// same clusters, centres and extents (bounds of the whole cluster hold for
// any of its members), members compacted in position order. The level-2
// filter then answers those rows only.
KnnStatus share_query_clusters(const ClusterSet &all, const DistinctSet &set, int64_t first,
                               int64_t count, ClusterSet &out, MemoryBudget &mem,
                               DeviceContext &ctx);

}  // namespace ti
}  // namespace cuda
}  // namespace knn
