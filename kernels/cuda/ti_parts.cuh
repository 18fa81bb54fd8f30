// ti_parts.cuh -- the pieces of the out-of-core TI join (ti_out_of_core.cu):
// how the rows are cut into parts (PartPlan, ti_part_plan.cu), the
// spatially coherent order the parts are cut from (SpatialOrder,
// ti_spatial_order.cu) and the target parts on the device (TargetParts,
// ti_target_parts.cu).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <vector>

#include "ti_common.cuh"

namespace knn {
namespace cuda {
namespace ti {

class SpatialOrder;

// Query parts and target parts, each a run of consecutive positions of its
// side's order, sized so that one query part and one target part, with
// their clusters, lists and scratch, fit the budget. Ordered sides
// (SpatialOrder, after cut_distinct) are cut by DISTINCT points: a part
// holds whole duplicate groups, and its bytes are counted from what it
// really holds (its distinct points and its rows); sides without an order
// are cut into equal row ranges. The sizes are estimates; halve() shrinks
// them when a part did not fit after all.
class PartPlan {
 public:
  PartPlan(const KnnProblem &p, const TiOptions &options, size_t budget);
  // Cuts both sides again by distinct points of their orders (kept; both
  // ordered; a self-join may pass the same order twice).
  void cut_distinct(const SpatialOrder &queries, const SpatialOrder &targets);

  size_t budget = 0;
  int kprime = 0;          // list length: k + the most rows one key excludes
  int64_t query_rows = 0;  // rows per query part (the largest part)
  int64_t target_rows = 0;
  // Several query parts: every target part is clustered first, kept in
  // pinned host memory, and copied back for each query part.
  bool cache_targets = false;
  // A self-join cut the same way on both sides, whose target parts also
  // serve as the query parts (same clusters): query part i is target part
  // i, copied back instead of built again.
  bool shared_parts = false;
  bool by_distinct() const { return by_distinct_; }
  // The query parts' k' lists in pinned host memory mapped into the
  // device's address space (not in the budget: a part is sized by its
  // points and clusters, and by the k'-th entry of each list, which stays
  // on the device); false: on the device, in the budget.
  // Ordered sides only (cut_distinct); KNN_TI_LISTS=device keeps them on
  // the device (A/B benchmarks).
  bool mapped_lists = false;
  // The lists on the device from here on (their pinned host memory could
  // not be had): cut again as KNN_TI_LISTS=device cuts.
  void keep_lists_on_device() {
    mapped_lists = false;
    if (by_distinct_) plan_distinct();
  }

  int query_parts() const { return (int)query_at_.size() - 1; }
  int target_parts() const { return (int)target_at_.size() - 1; }
  // Positions of each part (rows for row ranges) ...
  int64_t query_first(int index) const { return query_at_[index]; }
  int64_t query_count(int index) const { return query_at_[index + 1] - query_at_[index]; }
  int64_t target_first(int index) const { return target_at_[index]; }
  int64_t target_count(int index) const { return target_at_[index + 1] - target_at_[index]; }
  // ... and its distinct points of the order (by_distinct only).
  int64_t query_distinct_first(int index) const { return query_units_[index]; }
  int64_t query_distinct_count(int index) const;
  int64_t target_distinct_first(int index) const { return target_units_[index]; }
  int64_t target_distinct_count(int index) const;
  // The i-th target part that query part q visits (row ranges): for a
  // self-join the part with q's own rows first (theta tightens early),
  // then the others.
  int target_order(int q, int i) const;
  // Clusters for a part with n distinct points (capped so that the level-1
  // pair matrices of a query and a target part stay small).
  int32_t clusters_for(int64_t n_distinct) const;
  // The same for a query part, fewer where level 2's lists are in global
  // memory (one per thread slot of the warp groups).
  int32_t query_clusters_for(int64_t n_distinct) const;
  // Smaller parts; false once they cannot get smaller.
  bool halve();

 private:
  void plan_rows();
  void plan_distinct();
  void cap_clusters(int64_t query_units, int64_t target_units);
  double query_resident_bytes(int64_t n_distinct, int64_t rows) const;

  int64_t n_queries_ = 0, n_targets_ = 0;
  bool self_ = false;
  bool exclude_ = false;
  int stride_ = 0;
  bool gemm_build_ = false;  // clusters assigned through cuBLAS
  double avail_ = 0;   // the budget less what stays for the whole join
  double scale_ = 1;   // halve(): the share of avail_ the parts are cut for
  bool by_distinct_ = false;
  const SpatialOrder *query_order_ = nullptr, *target_order_ = nullptr;
  std::vector<int64_t> query_at_, target_at_;        // part bounds, positions
  std::vector<int64_t> query_units_, target_units_;  // part bounds, distinct points
  bool global_lists_ = false;  // k' > 32: level 2's lists in global memory
  double landmark_factor_ = 1.0;
  double cluster_scale_ = 1.0;
};

// The rows of one side in a spatially coherent order: landmarks sampled
// from the whole side, every row assigned to its nearest landmark on the
// device (streamed in chunks within the budget), rows then grouped by
// landmark (stable: rows of one group keep their order, so bitwise-equal
// rows, which always share a landmark, stay ascending) and the groups laid
// out along a greedy nearest-neighbour tour of the landmarks. A part cut
// from consecutive positions is then a few neighbouring groups, and
// bound() tells how near any of its rows can come to another part's.
class SpatialOrder {
 public:
  // Orders `n` rows of `dim` floats (row-major, host) into `groups` groups
  // (at most n). Metrics other than L2 and L1 are not ordered (identity).
  // With dedup, bitwise-equal rows are made adjacent (ascending by row)
  // and each run of them is one distinct point (distinct_begin); without,
  // every row is one.
  KnnStatus build(const float *rows, int64_t n, int dim, KnnMetric metric, int32_t groups,
                  bool dedup, size_t budget, DeviceContext &ctx);

  bool ordered() const { return !perm.empty(); }
  // Original row at position i.
  int64_t row(int64_t i) const { return ordered() ? perm[i] : i; }
  // Rows of positions [first, first + count) into out (count x dim).
  void gather(const float *rows, int64_t first, int64_t count, float *out) const;
  // The groups (tour indices) the positions [first, first + count) touch.
  void groups_of(int64_t first, int64_t count, int32_t *lo, int32_t *hi) const;

  int dim = 0;
  int n_threads = 1;
  std::vector<int32_t> perm;          // position -> original row
  std::vector<int64_t> group_begin;   // groups + 1 positions (tour order)
  std::vector<float> landmark;        // groups x dim (tour order)
  std::vector<double> radius;         // groups: no member farther (margin in)
  std::vector<int64_t> distinct_begin;  // distinct points + 1 positions
  double assign_seconds = 0, dedup_seconds = 0;  // build's phases (trace)
  double split_seconds = 0;  // of assign_seconds: the widest groups split
  // Of dedup_seconds (trace): pieces, merges, starts allocated, layout, rows moved.
  double dedup_phase_seconds[5] = {0, 0, 0, 0, 0};
  int64_t n_distinct() const { return (int64_t)distinct_begin.size() - 1; }

 private:
  // hash_at: the hash of each position's row (ti_spatial_order.cu), then
  // scratch; id_scratch: n, point_scratch: 2n values of scratch.
  void mark_distinct(const float *rows, uint64_t *hash_at, int32_t *id_scratch,
                     int32_t *point_scratch, bool dedup, const int32_t *cancel);
};

// Where the host copies of an ordered part are assembled (reused from part
// to part).
struct PartStaging {
  std::vector<float> x;          // distinct points x stride
  std::vector<int32_t> begin;    // distinct points + 1
  std::vector<int32_t> rows;     // the part's original rows, by position
  float max_abs = 0;             // their largest |value|
  int64_t first = -1, count = 0;  // the distinct points gathered
  int64_t n_rows = 0;             // their rows
  // Where set (before the gather), the three arrays go there instead of
  // the vectors: pinned memory that stays untouched until the copies queued
  // from it are done (TargetParts: the part's own cache block), so that
  // they are asynchronous.
  float *pinned_x = nullptr;
  int32_t *pinned_begin = nullptr, *pinned_rows = nullptr;
  const float *x_data() const { return pinned_x != nullptr ? pinned_x : x.data(); }
  const int32_t *begin_data() const {
    return pinned_begin != nullptr ? pinned_begin : begin.data();
  }
  const int32_t *rows_data() const { return pinned_rows != nullptr ? pinned_rows : rows.data(); }
};

// The distinct points [first, first + count) of an ordered side on the
// device as a DistinctSet (ti_part_upload.cu), in two halves. The host's
// gather into staging (no CUDA call: a host thread gathers the next part
// while the device works): one padded row per distinct point, their
// largest |value|, the rows' offsets and the ORIGINAL rows of each
// (ascending), so that clusters and lists carry original rows. Then the
// copies of what staging holds to the device (*max_abs: its largest
// |value|; the staging may be refilled once the call returns). No
// group_of_row: the out-of-core join expands its lists on the host.
// A set *cancel stops the gather between slices (a host thread gathering
// ahead must not hold a cancelled join up); staging.first then stays -1.
void gather_ordered_part(const SpatialOrder &order, const float *rows, int64_t first,
                         int64_t count, int stride, PartStaging &staging,
                         const int32_t *cancel);
KnnStatus send_ordered_part(const PartStaging &staging, int stride, DistinctSet &out,
                            float *max_abs, MemoryBudget &mem, DeviceContext &ctx);

// Lower bound, in ti distance (margins taken off), of the distance between
// any row of positions [qf, qf + qc) of `q` and any of [tf, tf + tc) of
// `t` (both ordered, same metric); `centre` is the landmarks' distance
// matrix (q groups x t groups).
double part_distance_bound(const SpatialOrder &q, int64_t qf, int64_t qc, const SpatialOrder &t,
                           int64_t tf, int64_t tc, const std::vector<double> &centre,
                           KnnMetric metric);

// The landmarks' distances of two orders (q groups x t groups), in double
// (incomplete once *cancel is set: the caller stops).
std::vector<double> landmark_distances(const SpatialOrder &q, const SpatialOrder &t,
                                       KnnMetric metric, const int32_t *cancel);

// Host memory of `bytes` (posix_memalign'd: free with unregister_pages,
// then std::free), its pages touched by a few threads, 2 MB pages where
// `huge` and the kernel gives them, then page-locked by cudaHostRegister
// with `flags`, in registrations of `chunk` bytes (0: one); nullptr where
// it cannot be had (*error, if given: the failed call's error) or where
// *cancel or *stop (either may be null) was set first (*error:
// cudaSuccess): the user's cancel, or the owner's word that it no longer
// wants the memory (a join that failed otherwise), is seen between pieces
// of 2 MB and between chunks (ti_target_parts.cu).
void *register_pages(size_t bytes, bool huge, unsigned flags, const int32_t *cancel,
                     const int32_t *stop, size_t chunk, cudaError_t *error);
// Unlocks what register_pages locked (the same bytes and chunk).
void unregister_pages(void *p, size_t bytes, size_t chunk);

// One target part on the device: its distinct points and clusters, with
// global target rows in set.rows and clusters.first_row.
struct TargetPart {
  int64_t first = 0;    // first target row of the part
  float max_abs = 0;    // largest |value| of its rows
  DistinctSet set;
  ClusterSet clusters;
};

// The target parts, each clustered once (upload, duplicates, clusters);
// where the plan caches them, the clustered arrays go to pinned host
// memory on the first get() and later ones copy them back.
class TargetParts {
 public:
  // order: the target side's order (parts are cut from its positions and
  // rows written as original rows), or nullptr for row ranges.
  TargetParts(const KnnProblem &p, const TiOptions &options, const PartPlan &plan,
              const SpatialOrder *order, DeviceContext &ctx);
  ~TargetParts();
  TargetParts(const TargetParts &) = delete;
  TargetParts &operator=(const TargetParts &) = delete;

  // Part `index` on the device in `out`, allocated from mem. *finite is
  // false when a distance between it and a query part whose largest |value|
  // is query_max_abs could overflow.
  KnnStatus get(int index, float query_max_abs, TargetPart &out, bool *finite,
                MemoryBudget &mem);

  // The cluster centres (m x stride), radii (m) and offsets (m + 1) of a
  // cached part, in its pinned host block (for copies queued on the join's
  // stream, which orders them after the block is filled); false where the
  // part is not cached.
  struct ClusterSummary {
    int32_t m = 0;
    const float *centers = nullptr;
    const float *radius = nullptr;
    const int32_t *begin = nullptr;
  };
  bool summary(int index, ClusterSummary *out) const;

  // A cached part's arrays where the device reads them in place (its
  // pinned block, mapped into the device's address space), and the host's
  // own view of its cluster offsets and multiplicities (ti_gathered_targets.cu
  // copies clusters of many parts into one); false where the part is not
  // cached or its block is not mapped.
  struct CachedArrays {
    int32_t m = 0;
    int64_t n_distinct = 0, n_rows = 0;
    float max_abs = 0;
    const float *x = nullptr, *dist = nullptr, *centers = nullptr, *radius = nullptr,
                *nearest = nullptr;
    const int32_t *begin = nullptr, *first_row = nullptr, *mult = nullptr,
                  *rows_begin = nullptr, *rows = nullptr;
    const float *host_centers = nullptr, *host_radius = nullptr;
    const int32_t *host_begin = nullptr, *host_mult = nullptr, *host_rows_begin = nullptr,
                  *host_rows = nullptr;
  };
  bool cached_arrays(int index, CachedArrays *out) const;

  // The join ends (on any path): the blocks not pinned yet are not wanted.
  // The thread pinning them ahead stops within a piece; the parts already
  // cached keep theirs. (The destructor does it too.)
  void stop_pinning();

  bool cached() const { return cache_; }
  int64_t clusters() const { return clusters_; }
  double cluster_seconds() const { return cluster_seconds_; }
  double store_seconds() const { return store_seconds_; }
  double upload_seconds() const { return upload_seconds_; }  // of cluster_seconds (trace)

 private:
  struct HostPart;  // ti_target_parts.cu
  class Pinner;     // ti_target_parts.cu: the pinned blocks, allocated ahead

  KnnStatus build(int index, float query_max_abs, TargetPart &out, bool *finite,
                  MemoryBudget &mem);
  // Points staging at part `index`'s pinned cache block (taken from the
  // Pinner, the part's HostPart made), or at its vectors where there is
  // none. pin: whether to try (decided on the join's thread).
  void pin_staging(int index, bool pin, PartStaging &staging);
  KnnStatus store(int index, const TargetPart &part);
  KnnStatus load(int index, TargetPart &out, MemoryBudget &mem);

  const KnnProblem &p_;
  const TiOptions &options_;
  const PartPlan &plan_;
  const SpatialOrder *order_;
  DeviceContext &ctx_;
  bool cache_;
  PartStaging part_staging_[2];  // the part being built and the next (ordered)
  std::vector<HostPart *> host_;
  std::unique_ptr<Pinner> pinner_;  // ordered parts that are cached
  // The next part's gather on a host thread (build), declared after the
  // stagings: destroyed, so waited for, first.
  std::future<void> gather_;
  int64_t clusters_ = 0;
  double cluster_seconds_ = 0, store_seconds_ = 0, upload_seconds_ = 0;
  double gather_wait_seconds_ = 0;  // of upload_seconds_ (trace)
  double send_seconds_ = 0, upload_wait_seconds_ = 0, pin_seconds_ = 0;  // (trace)
  // KNN_TI_PINNED_PARTS=0: cached parts gathered into pageable stagings (A/B).
  const bool pinned_parts_ = std::getenv("KNN_TI_PINNED_PARTS") == nullptr ||
                             std::getenv("KNN_TI_PINNED_PARTS")[0] != '0';
  const bool trace_ = std::getenv("KNN_TI_TRACE") != nullptr &&
                      std::getenv("KNN_TI_TRACE")[0] == '1';
};

}  // namespace ti
}  // namespace cuda
}  // namespace knn
