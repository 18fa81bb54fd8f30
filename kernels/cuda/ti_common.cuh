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
//    for it up to the rounding margin of ../cpu/rounding_margin.h.
//  * distinct point: one of the bitwise-distinct rows of a set (ti_dedup.cu).
//    The join runs on distinct points and expands them back to rows.
//  * position: the index of a distinct point in cluster order (clusters one
//    after the other, members by descending distance to their centre).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "device_buffer.cuh"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"

namespace knn {
namespace cuda {
namespace ti {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Row of an unused slot of a top-k list; every real row is smaller.
constexpr int32_t kNoRow = INT32_MAX;

enum class FilterKind { Adaptive, Full, Partial };
enum class ListKind { Adaptive, Registers, Shared, Global };

// Knobs of the join. The defaults are the adaptive scheme of section IV-D;
// the development driver forces variants through them to measure.
struct TiOptions {
  FilterKind filter = FilterKind::Adaptive;
  ListKind list = ListKind::Adaptive;
  int threads_per_query = 0;           // 0: adaptive (IV-D3)
  double landmark_factor = 3.0;        // clusters per set = factor * sqrt(n)
  int landmark_candidate_sets = 10;    // best spread of this many random sets
  // r of IV-D3. The paper's 0.25 gives one thread per query on every
  // benchmark set here (the register-resident kernel already limits the
  // concurrency it is applied to); measured on an H200, 2-4 warps per query
  // were 10-15% faster on kegg_std and keggD_std and one was best on skin
  // and ipums, which r = 1 reproduces.
  double cache_conflict_factor = 1.0;
  // Partial filter when k / dim exceeds this (the paper: 8). Measured on an
  // H200 the full filter was faster in every case tried (skin k=64: 0.036 s
  // vs 0.056 s, k=256: 0.33 s vs 0.44 s; kegg_std and keggD_std likewise),
  // so the adaptive scheme never picks it; FilterKind::Partial still can.
  double partial_filter_ratio = __builtin_huge_val();
  bool dedup = true;                   // merge bitwise-identical rows
  int gemm_assign_min_stride = 48;     // cuBLAS assignment from this stride (L2)
};

KnnStatus ti_join_with_options(const KnnProblem &problem, int64_t *neighbors,
                               double *distances, KnnStats *stats,
                               DeviceContext &ctx, const TiOptions &options);

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
  KnnStatus allocate(DeviceContext &ctx, DeviceBuffer<T> &buffer, size_t count, const char *what) {
    size_t bytes = count * sizeof(T);
    if (budget_ != 0 && used_ + bytes > budget_) {
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "TI join needs %zu bytes more for %s than the join budget of %zu bytes",
                    used_ + bytes - budget_, what, budget_);
      if (ctx.error.empty()) ctx.error = msg;
      return KNN_OUT_OF_MEMORY;
    }
    KNN_TRY(buffer.allocate(ctx, count, what));
    used_ += bytes;
    if (used_ > peak_) peak_ = used_;
    return KNN_OK;
  }

  // For buffers dropped before the join ends.
  template <class T>
  void release(DeviceBuffer<T> &buffer) {
    used_ -= buffer.bytes();
    buffer.release();
  }

  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t budget() const { return budget_; }

 private:
  size_t budget_;
  size_t used_ = 0;
  size_t peak_ = 0;
};

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
};

// Level-1 output for every query cluster (ti_filter_level1.cu).
struct Level1Result {
  int64_t cand_stride = 0;           // = target clusters
  DeviceBuffer<float> upper_bound;   // mq: no query of the cluster has its
                                     // k'-th neighbour farther (ti distance)
  DeviceBuffer<uint64_t> candidates; // mq x cand_stride sorted keys:
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
};

// ---- stage entry points (each returns KNN_OK or sets ctx.error) ----

// ti_dedup.cu: groups bitwise-identical rows of `points`.
KnnStatus build_distinct_set(const DevicePoints &points, bool dedup, DistinctSet &out,
                             MemoryBudget &mem, DeviceContext &ctx);

// ti_clustering.cu: landmarks, assignment and cluster arrays.
// Rows at least gemm_min_stride floats wide are assigned through cuBLAS
// (L2 only).
KnnStatus build_clusters(const DistinctSet &set, KnnMetric metric, int32_t clusters,
                         int candidate_sets, int gemm_min_stride, ClusterSet &out,
                         MemoryBudget &mem, DeviceContext &ctx);

// ti_filter_level1.cu: centre distances, upper bounds, group filter.
KnnStatus level1_filter(const ClusterSet &queries, const ClusterSet &targets,
                        KnnMetric metric, int kprime, Margin margin, Level1Result &out,
                        MemoryBudget &mem, DeviceContext &ctx);

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

// ---- small shared helpers ----

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline unsigned grid_for(int64_t threads, int block) {
  int64_t g = ceil_div(threads, block);
  return static_cast<unsigned>(g < 1 ? 1 : (g > 2147483647 ? 2147483647 : g));
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
