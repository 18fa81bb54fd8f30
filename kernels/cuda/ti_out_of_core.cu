// ti_out_of_core.cu -- the TI join for sets whose clusters and kNN lists do
// not fit the join's memory budget (knn::cuda::ti::out_of_core_join).
//
// Each side's rows are first put in a spatially coherent order
// (ti_spatial_order.cu: landmark groups along a tour), in which the same
// pass finds the duplicate groups: bitwise-equal rows are adjacent,
// ascending, and each run of them is one distinct point. The query and
// target parts are runs of consecutive distinct points, sized from what
// they hold (ti_part_plan.cu), and only distinct rows go to the device,
// with their original rows (ti_part_upload.cu), gathered on the host by a
// thread while the device works on the part before. For each query part:
//   1. its distinct points go up and are clustered (as in ti_join.cu), or,
//      for a self-join cut alike on both sides (PartPlan::shared_parts),
//      the cached target part of the same points is copied back and its
//      clusters serve as the queries; its k' lists are allocated: in
//      pinned host memory mapped into the device's address space
//      (MappedLists; PartPlan::mapped_lists, the default for ordered
//      sides), by query position in tiles of 32 so that level 2's accesses
//      over the bus are coalesced (Level2Config::tiled_lists), so that a
//      query part is sized by its points alone; or on the device; the
//      k'-th entry of each list is kept on the device too (level 2 writes
//      it with the list), for the per-pair scans;
//   2. the target parts come nearest first, by a lower bound on the
//      distance between the two parts' landmark groups (ti_parts.cuh:
//      part_distance_bound); with one query part each is clustered beside
//      it; with several, all of them are clustered first, kept in pinned
//      host memory, and copied back for each query part. For each: level 1
//      against that part alone, its upper bounds capped by the lists
//      carried so far (carried_bound_kernel), then level 2 with every
//      query's list and theta carried over from the parts before
//      (Level2Config::resume). Before a part (but the first) the largest
//      k'-th list entry of the query part is read back; when the part's
//      bound is beyond it, that part and all farther ones are skipped: not
//      uploaded, not filtered. A cached part is then tested query by
//      query (part_needed_kernel: its cluster centres and radii, copied
//      from its pinned block, against each query's carried k'-th entry)
//      and skipped alone where no (query, target cluster) pair passes.
//      Where every target part is cached in a mapped block and all their
//      clusters' centres fit a 32nd of the budget (filter_gathered), only
//      the nearest part is visited so; then, in rounds, every cluster of the
//      other parts that some query cluster's carried bound still admits
//      (level 1's group test) is gathered, nearest parts first, into a part
//      of at most the largest part's size (ti_gathered_targets.cu), which
//      level 1 and level 2 filter as any part, until no cluster is left
//      that any query could need. Far parts no longer cost a pair each (a
//      copy of the part, launches and a read-back for a few clusters);
//      KNN_TI_GATHER=0 visits them one by one (A/B);
//   3. the lists come back to the host (mapped: the host reads them where
//      the device wrote them, no download, and copies them out of the
//      tiles into distinct point order, a pageable n_distinct x k' copy),
//      and each query row takes its distinct point's list less the
//      targets that share its key, with float8 distances
//      (output_ordered_part: what ti_output.cu does on the device). Sides without an order (row ranges) deduplicate each part
//      on the device and expand there, as in ti_join.cu.
//
// Exactness: the level-1 bound of one target part is an upper bound of the
// k'-th distance within that part, hence of the k'-th over all targets; the
// carried list's k'-th is one too, and so is the largest of a cluster's
// carried k'-th entries for each of its queries (widened by the rounding
// margin). Pruning with any of them keeps every target that can be among
// the final k' (ties included), and a list holds the k' smallest (value,
// row) of all it was offered, whatever the order. Target rows in the lists
// are the ORIGINAL rows (each part sends its points' original rows), so
// ties across parts are broken by target row as in memory; a distinct
// point stands for all its rows (ascending), which are whole in one part,
// exactly as ti_dedup.cu's groups are in memory (a hash collision can only
// split a group, never merge unequal rows). A skipped part: for every
// query q of the part and target t of
// the skipped part, d(q,t) >= d(Lq,Lt) - r(Lq) - r(Lt) >= B (the groups'
// landmarks and radii, in double, widened), and the device's computed
// distance D(q,t) >= d(q,t)(1 - e) - A (rounding_margin.h); B is compared
// with theta = the largest k'-th entry of the part's lists, widened by the
// rounding margin of B + theta, and only a bound strictly beyond it skips.
// Then D(q,t) > theta >= q's k'-th entry, which only decreases: t could
// never enter q's list, ties included. The farther parts have larger
// bounds (they are visited in bound order), so they go too. A part skipped
// by its clusters: for every query q and target cluster ct of the part,
// x - R_t > theta + margin(x + R_t + theta), with x = D(q, ct) and theta
// q's carried k'-th entry (ti distance): level 2's own cluster test, whose
// margin (rounding_margin.h) covers the rounding of x, R_t and D(q, t),
// so every member t has D(q, t) > theta >= q's k'-th entry, which only
// decreases: no t could enter q's list, ties included (level 2's theta is
// never larger than this one, so it would prune the same clusters).
//
// KNN_TI_TRACE=1 prints the phases (order, part builds, level 1, level 2,
// theta read-backs, output) to stderr, the stream waited for after each.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <future>
#include <system_error>
#include <thread>

#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "../cpu/parallel_for.h"
#include "../exclusion_runs.h"
#include "../problem_check.h"
#include "../rounding_margin.h"
#include "../value_range.h"
#include "cancel_watch.cuh"
#include "host_transfer.cuh"
#include "knn_cuda_testing.h"
#include "ti_common.cuh"
#include "ti_distance.cuh"
#include "ti_expand.cuh"
#include "ti_gathered_targets.cuh"
#include "ti_parts.cuh"
#include "../stopwatch.h"

namespace knn {
namespace cuda {
namespace ti {
namespace {

// The largest k'-th entry (value) of n lists of k' entries, as float bits
// (non-negative floats order as their bits; +inf where a list is not
// full), and the largest row of those entries: out[0], out[1].
__global__ void largest_last_kernel(const float *value, const int32_t *row, int64_t n,
                                    int kprime, unsigned *out) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  unsigned bits = i < n ? __float_as_uint(value[i * kprime + kprime - 1]) : 0u;
  unsigned last = i < n ? (unsigned)row[i * kprime + kprime - 1] : 0u;
  for (int off = 16; off > 0; off /= 2) {
    bits = max(bits, __shfl_down_sync(0xffffffffu, bits, off));
    last = max(last, __shfl_down_sync(0xffffffffu, last, off));
  }
  if ((threadIdx.x & 31) == 0) {
    if (bits != 0) atomicMax(out, bits);
    if (last != 0) atomicMax(out + 1, last);
  }
}

// The carried bound of each query cluster: the largest k'-th entry of its
// queries' lists, as a ti distance widened by the rounding margin (+inf
// while some list is not full). Every query's final k'-th is at most its
// current one, hence at most this. One warp per cluster.
template <int METRIC>
__global__ void carried_bound_kernel(const int32_t *begin, const int32_t *member, int32_t mq,
                                     const float *value, int kprime, Margin margin,
                                     float *out) {
  const int lane = threadIdx.x % kWarp;
  const int64_t cq = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / kWarp;
  if (cq >= mq) return;  // the whole warp
  float top = 0.0f;
  for (int32_t pos = begin[cq] + lane; pos < begin[cq + 1]; pos += kWarp)
    top = fmaxf(top, value[(int64_t)member[pos] * kprime + kprime - 1]);
  for (int off = kWarp / 2; off > 0; off /= 2)
    top = fmaxf(top, __shfl_xor_sync(kFullMask, top, off));
  if (lane != 0) return;
  const float ti = MetricOps<METRIC>::ti(top);
  out[cq] = ti == __int_as_float(0x7f800000) ? ti : ti + margin.rel * ti + margin.abs;
}

// Whether a target part can change any list of the query part: 1 goes to
// *needed where some query q and target cluster ct pass level 2's cluster
// test (ti_filter_level2.cu) with q's own k'-th entry as theta: not
// x - R_t > theta + margin(x + R_t + theta), x = D(q, ct). kNeededSlices
// threads per query position, each over every kNeededSlices-th target
// cluster; the first pass found ends every thread.
constexpr int kNeededSlices = 8;

template <int METRIC>
__global__ void part_needed_kernel(const float *qx, const int32_t *qmember, int64_t nq,
                                   const float *value, int kprime, const float *tc,
                                   const float *tr, const int32_t *tbegin, int32_t mt, int stride,
                                   Margin margin, unsigned *needed) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const int64_t pos = i / kNeededSlices;
  const int slice = (int)(i % kNeededSlices);
  if (pos >= nq || *(volatile unsigned *)needed != 0) return;
  const float last = value[(int64_t)qmember[pos] * kprime + kprime - 1];
  if (last == __int_as_float(0x7f800000)) {  // a list not yet full
    *needed = 1;
    return;
  }
  const float theta = MetricOps<METRIC>::ti(last);
  const float *q = qx + pos * stride;
  int tested = 0;
  for (int32_t ct = slice; ct < mt; ct += kNeededSlices) {
    if ((++tested & 31) == 0 && *(volatile unsigned *)needed != 0) return;
    if (tbegin[ct + 1] == tbegin[ct]) continue;
    const float x = MetricOps<METRIC>::ti(MetricOps<METRIC>::value(q, tc + (int64_t)ct * stride,
                                                                    stride));
    const float rt = tr[ct];
    if (!(x - rt > theta + margin.rel * (x + rt + theta) + margin.abs)) {
      *needed = 1;
      return;
    }
  }
}

// Groups for each side's order: several per part, so that a part's bound
// is made of groups smaller than it, within what the host's tour and the
// landmark distance matrix take (1024^2 pairs).
// KNN_TI_ORDER_GROUPS=N (64..1024) sets it, for A/B benchmarks.
int32_t order_groups(const PartPlan &plan) {
  const char *forced = std::getenv("KNN_TI_ORDER_GROUPS");
  if (forced != nullptr && std::atoi(forced) > 0) return std::max(64, std::min(1024, std::atoi(forced)));
  const int parts = std::max(plan.query_parts(), plan.target_parts());
  return std::max(64, std::min(1024, 8 * parts));
}

// Threads per query of level 2 asked for by KNN_TI_OOC_THREADS=P (1..8),
// for A/B benchmarks; 0: as TiOptions say.
int forced_threads_per_query() {
  const char *forced = std::getenv("KNN_TI_OOC_THREADS");
  return forced != nullptr ? std::max(0, std::min(8, std::atoi(forced))) : 0;
}

// Pairs of a query part from this place in its target order on (0: its
// nearest part) are far pairs (filter_part), with kFarThreadsPerQuery
// threads per query; KNN_TI_FAR_THREADS=P (1..8) sets P, for A/B benchmarks.
constexpr int kNearPairs = 3;
constexpr int kFarThreadsPerQuery = 8;

int forced_far_threads_per_query() {
  const char *forced = std::getenv("KNN_TI_FAR_THREADS");
  return forced != nullptr ? std::max(0, std::min(8, std::atoi(forced))) : 0;
}

// Level 2 reads a carried list only where a visit can change it
// (Level2Config::lazy_lists); KNN_TI_LAZY_LISTS=0 reads every list of a
// visited cluster, for A/B benchmarks and tests.
bool lazy_lists() {
  const char *forced = std::getenv("KNN_TI_LAZY_LISTS");
  return forced == nullptr || forced[0] != '0';
}

// Past its nearest target part, a query part takes the clusters it still
// needs from every other part gathered into few parts (GatheredTargets);
// KNN_TI_GATHER=0 visits the parts one by one, for A/B benchmarks and tests.
bool gather_far_clusters() {
  const char *forced = std::getenv("KNN_TI_GATHER");
  return forced == nullptr || forced[0] != '0';
}

// The nearest target parts a query part visits whole before the far
// clusters are gathered; KNN_TI_DIRECT_PARTS=N (1..8) for A/B benchmarks.
int direct_parts() {
  const char *forced = std::getenv("KNN_TI_DIRECT_PARTS");
  const int n = forced != nullptr ? std::atoi(forced) : 0;
  return n >= 1 && n <= 8 ? n : 1;
}

// Host arrays of a query part's lists, left uninitialized where they grow
// (a std::vector zeroes them first, on one thread: 1.7 s for two of 10M x
// 32 entries, which a cancel had to wait for); each is written whole before
// it is read, by threads that check the cancel. Kept for the next part.
template <class T>
class HostSlots {
 public:
  void resize(size_t n) {
    if (n <= capacity_) return;
    data_.reset(new T[n]);
    capacity_ = n;
  }
  T *data() { return data_.get(); }
  const T *data() const { return data_.get(); }

 private:
  std::unique_ptr<T[]> data_;
  size_t capacity_ = 0;
};

// Pinned host memory mapped into the device's address space: the query
// parts' k' lists (PartPlan::mapped_lists), which level 2 reads and writes
// through the bus and the host copies out of the tiles (expand_lists). Registered pages
// (register_pages: far faster to lock than cudaHostAlloc for hundreds of
// MB, as ti_target_parts.cu measured for its blocks). Freed with its
// owner, on every path.
class MappedLists {
 public:
  MappedLists() = default;
  ~MappedLists() { release(); }
  MappedLists(const MappedLists &) = delete;
  MappedLists &operator=(const MappedLists &) = delete;

  // Room for `entries` (value, row) pairs, on `device` (any host thread:
  // the join allocates ahead while target parts are built). No CUDA error
  // state is left behind; the caller records a failure. A cancel (*cancel)
  // or the join's stop (*stop: it failed otherwise) ends the pinning within
  // a piece of it: cudaSuccess, nothing held.
  cudaError_t allocate(int device, size_t entries, const int32_t *cancel, const int32_t *stop) {
    release();
    const size_t page = 4096;
    size_t bytes = std::max<size_t>(1, entries) * (sizeof(float) + sizeof(int32_t));
    bytes = (bytes + page - 1) / page * page;
    cudaError_t err = cudaSetDevice(device);
    int same_address = 0;
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&same_address, cudaDevAttrCanUseHostPointerForRegisteredMem,
                                   device);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return err;
    }
    // Registered in chunks only where the device reads registered pages at
    // their host addresses: the chunks are then one range there too; else
    // in one call (the device pointer of one registration covers only it).
    const size_t chunk = same_address != 0 ? kMappedChunk : 0;
    void *p = register_pages(bytes, true, cudaHostRegisterMapped, cancel, stop, chunk, &err);
    if (p == nullptr) return err;  // (cudaSuccess: cancelled or stopped)
    host_ = p;
    bytes_ = bytes;
    chunk_ = chunk;
    void *dev = nullptr;
    err = cudaHostGetDevicePointer(&dev, p, 0);
    if (err == cudaSuccess && chunk != 0 && dev != p) err = cudaErrorInvalidValue;
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      release();
      return err;
    }
    device_ = dev;
    entries_ = entries;
    return cudaSuccess;
  }

  void release() {
    if (host_ == nullptr) return;
    unregister_pages(host_, bytes_, chunk_);
    std::free(host_);
    host_ = device_ = nullptr;
    entries_ = bytes_ = chunk_ = 0;
  }

  size_t entries() const { return entries_; }
  // Values first, then rows (entries each), on the host and on the device.
  float *host_value() const { return static_cast<float *>(host_); }
  int32_t *host_row() const { return reinterpret_cast<int32_t *>(host_value() + entries_); }
  float *device_value() const { return static_cast<float *>(device_); }
  int32_t *device_row() const { return reinterpret_cast<int32_t *>(device_value() + entries_); }

 private:
  // Registrations of 256 MB: a cancel waits for one at most.
  static constexpr size_t kMappedChunk = size_t(256) << 20;
  void *host_ = nullptr;
  void *device_ = nullptr;
  size_t entries_ = 0, bytes_ = 0, chunk_ = 0;
};

// One query part against every target part.
class OutOfCoreJoin {
 public:
  OutOfCoreJoin(const KnnProblem &p, const TiOptions &options, const PartPlan &plan,
                const SpatialOrder &query_order, const SpatialOrder &target_order,
                const std::vector<double> &centre, DeviceContext &ctx)
      : p_(p),
        options_(options),
        plan_(plan),
        query_order_(query_order),
        target_order_(target_order),
        centre_(centre),
        ordered_(query_order.ordered() && target_order.ordered()),
        ctx_(ctx),
        exclude_(p.query_keys != nullptr && p.target_keys != nullptr),
        stride_(padded_stride(p.dim)),
        fixed_mem_(plan.budget),
        // Ordered target parts only where the plan is cut in distinct points
        // (both sides ordered): a one-row query side stays unordered, and
        // its plan counts target rows.
        targets_(p, options, plan, ordered_ ? &target_order : nullptr, ctx) {
    const RoundingMargin rounding(p.metric, stride_);
    rounding_ = rounding;
    margin_.rel = (float)rounding.relative();
    margin_.abs = (float)rounding(0.0);
  }

  // Mapped lists and the cancel watch's word go only once the device is
  // done with them (an error path may leave kernels queued); the host
  // threads are waited for by their futures, destroyed first. Whatever
  // ended the join (a failure, a cancel, a budget too small, values that
  // overflow), the pinning still under way is not wanted: both pinning
  // threads stop within a piece (a block stopped half-way is unlocked and
  // freed by its thread; the blocks done go with their owners, after the
  // stream), and the join's own status and message stand (a stopped
  // pinning reports nothing).
  ~OutOfCoreJoin() {
    __atomic_store_n(&stop_pinning_, 1, __ATOMIC_RELAXED);
    targets_.stop_pinning();
    if (mapping_.valid()) (void)mapping_.wait();
    // (Also before the cancel watch's word goes.)
    (void)cudaStreamSynchronize(ctx_.stream);
  }
  OutOfCoreJoin(const OutOfCoreJoin &) = delete;
  OutOfCoreJoin &operator=(const OutOfCoreJoin &) = delete;

  // *finite: false when some distance could overflow (nothing written).
  KnnStatus run(int64_t *neighbors, double *distances, KnnStats *stats, bool *finite);
  // The mapped lists could not be pinned (the status says why).
  bool pinning_failed() const { return pinning_failed_; }

 private:
  KnnStatus upload_target_keys();
  KnnStatus query_part(int index, bool *finite, int64_t *neighbors, double *distances);
  KnnStatus filter_part(const ClusterSet &queries, const TargetPart &part, const float *carried,
                        bool far, MemoryBudget &mem);
  KnnStatus carried_bounds(const ClusterSet &queries, float *carried);
  // After the query part's `direct` nearest target parts (order[0], ...,
  // visited whole, or skipped by their tests): the clusters of
  // all other parts that some query may still need, gathered into parts of
  // at most the largest part's size, nearest parts' clusters first, until
  // no cluster is needed (GatheredTargets).
  KnnStatus filter_gathered(const ClusterSet &queries,
                            const std::vector<std::pair<double, int>> &order, int direct,
                            float query_max_abs, float *carried, bool *finite,
                            MemoryBudget &mem);
  KnnStatus pair_tests(const ClusterSet &queries, const DistinctSet &query_set, int target,
                       double *theta, int64_t *last_row, bool *needed, MemoryBudget &mem);
  KnnStatus output_part(const DistinctSet &query_set, int64_t first, const int64_t *query_keys,
                        MemoryBudget &mem, int64_t *neighbors, double *distances);
  KnnStatus output_ordered_part(int index, const ClusterSet &queries, int64_t n_distinct,
                                int64_t *neighbors, double *distances);
  void expand_lists(int index, int64_t n_distinct, int slot, int64_t *neighbors,
                    double *distances);
  void wait_output();
  void start_mapping();
  KnnStatus wait_mapping();
  KnnStatus pinning_test_hook();
  KnnStatus allocate_lists(int index, int64_t n_distinct, MemoryBudget &mem);
  PartStaging &gather_query_part(int index);
  // KNN_TI_TRACE=1: the stream is waited for after each stage, so that the
  // phase times (printed to stderr at the end) are the stages' own.
  void lap(double *phase, Clock::time_point *t0);
  void trace() const;
  void describe(KnnStats *stats) const;

  const KnnProblem &p_;
  const TiOptions &options_;
  void order_target_parts(int query_index, int64_t first, int64_t count,
                          std::vector<std::pair<double, int>> *order) const;

  const PartPlan &plan_;
  const SpatialOrder &query_order_;
  const SpatialOrder &target_order_;
  const std::vector<double> &centre_;  // landmark distances (query x target groups)
  const bool ordered_;
  DeviceContext &ctx_;
  const bool exclude_;
  const int stride_;
  Margin margin_;
  RoundingMargin rounding_{KNN_METRIC_L2, 1};
  MemoryBudget fixed_mem_;  // what stays for the whole join (keys, counter)
  TargetParts targets_;

  DeviceBuffer<int64_t> target_keys_;  // all target keys (rows are global)
  DeviceBuffer<int64_t> query_keys_;   // the current query part's keys
  DeviceBuffer<unsigned long long> counter_;
  // 1 once the join is cancelled (cancel_watch_, declared after it so that
  // it stops first): level 2's queued blocks then end at once.
  DeviceBuffer<int32_t> stop_word_;
  CancelWatch cancel_watch_;
  DeviceBuffer<float> result_value_;  // the lists on the device (not mapped)
  DeviceBuffer<int32_t> result_row_;
  // Mapped lists: two blocks, one per query part in turn (the host expands
  // one while the device fills the other), each for the largest part.
  MappedLists mapped_[2];
  // The current query part's lists, as the device addresses them (mapped
  // or result_value_/result_row_), and each list's k'-th entry (device).
  float *lists_value_ = nullptr;
  int32_t *lists_row_ = nullptr;
  DeviceBuffer<float> last_value_;
  DeviceBuffer<int32_t> last_row_;
  DeviceBuffer<unsigned> theta_bits_;
  // Ordered query parts: two stagings, the next part gathered by a host
  // thread (query_gather_) while the device filters the current one.
  PartStaging query_staging_[2];
  // A query part's lists on the host, two: one being expanded by a host
  // thread (expanding_) while the device filters the next query part.
  HostSlots<float> list_value_[2];
  HostSlots<int32_t> list_row_[2];
  // Where expand_lists reads each slot's lists: the vectors above, or the
  // mapped blocks.
  const float *host_value_[2] = {nullptr, nullptr};
  const int32_t *host_row_[2] = {nullptr, nullptr};
  // Mapped lists are by position (Level2Config::tiled_lists): the distinct
  // point at each position, by slot.
  std::vector<int32_t> list_member_[2];
  int list_slot_ = 0;

  Level2Config used_;   // of the last near pair's level 2
  int far_parts_ = 0;   // threads per query of the far pairs' level 2 (0: none ran)
  int64_t pairs_skipped_ = 0;
  int64_t cluster_skipped_ = 0;  // of those, by part_needed (trace)
  std::vector<int64_t> part_min_row_;  // ordered: smallest original row of each target part
  int64_t query_clusters_ = 0;
  Clock::time_point t_start_ = Clock::now();
  double cluster_seconds_ = 0, filter_seconds_ = 0, output_seconds_ = 0;
  const bool trace_ = std::getenv("KNN_TI_TRACE") != nullptr &&
                      std::getenv("KNN_TI_TRACE")[0] == '1';
  // Phases (trace): target parts built or copied back, level 1, level 2,
  // theta read-backs; pairs filtered.
  double get_seconds_ = 0, level1_seconds_ = 0, level2_seconds_ = 0, theta_seconds_ = 0;
  double query_upload_seconds_ = 0;
  int64_t pairs_visited_ = 0;
  // Cached ordered parts: the far clusters gathered (filter_gathered).
  GatheredTargets gathered_;
  bool gathering_ = false;
  int64_t gathered_sets_ = 0, gathered_clusters_ = 0;
  // Declared last, so destroyed first: the expansion and the gather still
  // running (an error path) are waited for before anything they use goes.
  std::future<void> expanding_;
  std::future<void> query_gather_;
  // Set (only) by the destructor: the pinning thread stops (start_mapping).
  // Declared before the future, so alive as long as the thread.
  int32_t stop_pinning_ = 0;
  // The mapped blocks being allocated by a host thread (start_mapping).
  std::future<cudaError_t> mapping_;
  bool pinning_failed_ = false;
  double mapping_wait_seconds_ = 0;  // (trace)
  unsigned long long computed_ = 0;
};

void OutOfCoreJoin::lap(double *phase, Clock::time_point *t0) {
  if (!trace_) return;
  (void)cudaStreamSynchronize(ctx_.stream);
  const Clock::time_point now = Clock::now();
  *phase += std::chrono::duration<double>(now - *t0).count();
  *t0 = now;
}

void OutOfCoreJoin::trace() const {
  if (!trace_) return;
  std::fprintf(stderr,
               "[ti out-of-core] %dx%d parts (%lldx%lld rows), pairs %lld visited %lld skipped "
               "(%lld by clusters); "
               "query parts %.4f s (build %.4f: upload %.4f; filter %.4f: targets %.4f, "
               "level 1 %.4f, level 2 %.4f, theta %.4f; output %.4f), target builds %.4f s "
               "(uploads %.4f, pinned copies %.4f); lists %s (pinning waited %.4f s); "
               "%lld gathered parts of %lld clusters (rows of large duplicate groups: %lld by "
               "copies of their own, %lld by the block)\n",
               plan_.query_parts(), plan_.target_parts(), (long long)plan_.query_rows,
               (long long)plan_.target_rows, (long long)pairs_visited_,
               (long long)pairs_skipped_, (long long)cluster_skipped_,
               cluster_seconds_ + filter_seconds_ + output_seconds_, cluster_seconds_,
               query_upload_seconds_, filter_seconds_, get_seconds_, level1_seconds_,
               level2_seconds_, theta_seconds_, output_seconds_, targets_.cluster_seconds(),
               targets_.upload_seconds(), targets_.store_seconds(),
               plan_.mapped_lists ? "mapped" : "device", mapping_wait_seconds_,
               (long long)gathered_sets_, (long long)gathered_clusters_,
               (long long)gathered_.rows_copied(), (long long)gathered_.rows_by_block());
}

KnnStatus OutOfCoreJoin::upload_target_keys() {
  // Ordered: keys are applied on the host (output_ordered_part).
  if (!exclude_ || ordered_) return KNN_OK;
  KNN_TRY(fixed_mem_.allocate(ctx_, target_keys_, p_.n_targets, "keys"));
  CUDA_CHECK(ctx_, cudaMemcpyAsync(target_keys_.get(), p_.target_keys,
                                   p_.n_targets * sizeof(int64_t), cudaMemcpyHostToDevice,
                                   ctx_.stream));
  return KNN_OK;
}

// The carried bound of each query cluster (carried_bound_kernel).
KnnStatus OutOfCoreJoin::carried_bounds(const ClusterSet &queries, float *carried) {
  const unsigned grid = grid_for((int64_t)queries.m * kWarp, 128);
  if (p_.metric == KNN_METRIC_L1)
    carried_bound_kernel<KNN_METRIC_L1><<<grid, 128, 0, ctx_.stream>>>(
        queries.begin.get(), queries.member.get(), queries.m, last_value_.get(), 1, margin_,
        carried);
  else
    carried_bound_kernel<KNN_METRIC_L2><<<grid, 128, 0, ctx_.stream>>>(
        queries.begin.get(), queries.member.get(), queries.m, last_value_.get(), 1, margin_,
        carried);
  CUDA_CHECK_LAUNCH(ctx_, "carried_bound_kernel");
  return KNN_OK;
}

// The tests before a target part (but the first), read back together
// with one wait: where `ordered`, the largest k'-th entry of the query
// part's lists as a ti distance (+inf while some list is not full) and the
// largest row among them (largest_last_kernel); and *needed, whether
// cached target part `target` can change a list of the query part
// (part_needed_kernel; true where it is not cached). Its clusters'
// centres, radii and offsets come from the part's pinned block (a few KB),
// not the whole part.
KnnStatus OutOfCoreJoin::pair_tests(const ClusterSet &queries, const DistinctSet &query_set,
                                    int target, double *theta, int64_t *last_row, bool *needed,
                                    MemoryBudget &mem) {
  *theta = 0;
  *last_row = 0;
  *needed = true;
  CUDA_CHECK(ctx_, cudaMemsetAsync(theta_bits_.get(), 0, 3 * sizeof(unsigned), ctx_.stream));
  if (ordered_) {
    largest_last_kernel<<<grid_for(query_set.n_distinct, 256), 256, 0, ctx_.stream>>>(
        last_value_.get(), last_row_.get(), query_set.n_distinct, 1, theta_bits_.get());
    CUDA_CHECK_LAUNCH(ctx_, "largest_last_kernel");
  }
  TargetParts::ClusterSummary s;
  const bool test = targets_.summary(target, &s) && s.m > 0 && queries.m > 0;
  DeviceBuffer<float> centers, radius;
  DeviceBuffer<int32_t> begin;
  if (test) {
    KNN_TRY(mem.allocate(ctx_, centers, (size_t)s.m * stride_, "part test"));
    KNN_TRY(mem.allocate(ctx_, radius, (size_t)s.m, "part test"));
    KNN_TRY(mem.allocate(ctx_, begin, (size_t)s.m + 1, "part test"));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(centers.get(), s.centers, centers.bytes(),
                                     cudaMemcpyHostToDevice, ctx_.stream));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(radius.get(), s.radius, radius.bytes(),
                                     cudaMemcpyHostToDevice, ctx_.stream));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(begin.get(), s.begin, begin.bytes(), cudaMemcpyHostToDevice,
                                     ctx_.stream));
    const unsigned grid = grid_for(queries.n * kNeededSlices, 256);
    if (p_.metric == KNN_METRIC_L1)
      part_needed_kernel<KNN_METRIC_L1><<<grid, 256, 0, ctx_.stream>>>(
          queries.x.get(), queries.member.get(), queries.n, last_value_.get(), 1,
          centers.get(), radius.get(), begin.get(), s.m, stride_, margin_,
          theta_bits_.get() + 2);
    else
      part_needed_kernel<KNN_METRIC_L2><<<grid, 256, 0, ctx_.stream>>>(
          queries.x.get(), queries.member.get(), queries.n, last_value_.get(), 1,
          centers.get(), radius.get(), begin.get(), s.m, stride_, margin_,
          theta_bits_.get() + 2);
    CUDA_CHECK_LAUNCH(ctx_, "part_needed_kernel");
  }
  unsigned host[3];
  CUDA_CHECK(ctx_, cudaMemcpyAsync(host, theta_bits_.get(), sizeof host, cudaMemcpyDeviceToHost,
                                   ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  if (ordered_) {
    float value;
    std::memcpy(&value, &host[0], sizeof value);
    *theta = p_.metric == KNN_METRIC_L2 ? std::sqrt((double)value) : (double)value;
    *last_row = host[1];
  }
  if (test) *needed = host[2] != 0;
  mem.release(centers);
  mem.release(radius);
  mem.release(begin);
  return KNN_OK;
}

// Level 1 and level 2 of the query part against one target part; carried:
// the query clusters' carried bounds (carried_bounds), or nullptr before
// the first part (empty lists).
KnnStatus OutOfCoreJoin::filter_part(const ClusterSet &queries, const TargetPart &part,
                                     const float *carried, bool far, MemoryBudget &mem) {
  Clock::time_point t0 = Clock::now();
  const bool resume = carried != nullptr;
  // Resumed lists bound level 1's upper bounds (ti_filter_level1.cu): a far
  // part then leaves few candidate clusters, or none.
  Level1Result level1;
  KNN_TRY(level1_filter(queries, part.clusters, p_.metric, plan_.kprime, margin_, level1, mem,
                        ctx_, carried));
  KNN_TRY(ctx_.cancel_point());
  lap(&level1_seconds_, &t0);
  Level2Config config;
  config.kprime = plan_.kprime;
  config.partial = false;  // the partial filter cannot carry lists over
  config.resume = resume;
  config.shared_merge = true;
  config.last_value = last_value_.get();
  config.last_row = last_row_.get();
  config.lazy_lists = lazy_lists();
  // Mapped lists by position, coalesced over the bus.
  config.tiled_lists = plan_.mapped_lists;
  config.place = choose_list_place(ctx_, plan_.kprime, options_.list);
  // A cancel ends the blocks not yet begun: every result the host reads
  // from here on is behind a cancel check after the stream's wait.
  config.stop = stop_word_.get();
  // Threads per query as in memory (IV-D3): a part's queries are few next
  // to the device's threads. The level-2 kernel seeds a carried list into
  // thread 0 of a query only, so the merge of the P lists sees each entry
  // once; every thread prunes with a theta no smaller than the final k'-th
  // (its own list's k'-th, or the shared minimum of the P lists' k'-th,
  // each an upper bound of the merged list's). The P lists are merged in
  // shared memory: a global merge array would take max groups x 32 x P x k'
  // entries, more than a quarter-of-the-data budget holds. Lists in global
  // memory keep one thread (their slots are per thread).
  // At least two: a pair's launch is short and ends with its slowest warp
  // groups (the query clusters with most candidates), whose walks two
  // threads per query halve (bench/results-2026-11-27-s8/h100x2-assignment-threads.txt).
  // A far pair (past the query part's nearest target parts) changes few
  // lists: each of its warp groups meets a few candidate clusters, and the
  // launch lasts as long as the longest of those walks. The most threads
  // per query split each group's candidates the most. Lists in registers
  // only: lists in shared memory take P times the block's shared memory,
  // and past the device's limit level 2 would take them to global memory.
  const bool register_lists =
      config.place == ListPlace::Registers16 || config.place == ListPlace::Registers32;
  far = far && register_lists;
  const int forced = forced_threads_per_query();
  const int far_forced = far ? forced_far_threads_per_query() : 0;
  config.parts = forced > 0                        ? forced
                 : options_.threads_per_query > 0 ? options_.threads_per_query
                 : config.place == ListPlace::Global
                     ? 1
                 : far_forced > 0 ? far_forced
                 : far            ? kFarThreadsPerQuery
                     : std::max(2, level2_threads_per_query(ctx_, p_.metric, stride_,
                                                            config.place, plan_.kprime,
                                                            queries.n,
                                                            options_.cache_conflict_factor));
  Level2Config used;
  KNN_TRY(level2_filter(queries, part.clusters, part.set, level1, p_.metric, config, margin_,
                        lists_value_, lists_row_, counter_.get(), &used, mem, ctx_));
  if (far) far_parts_ = used.parts;
  else used_ = used;
  lap(&level2_seconds_, &t0);
  mem.release(level1.candidates);
  mem.release(level1.cand_count);
  mem.release(level1.upper_bound);
  return KNN_OK;
}

KnnStatus OutOfCoreJoin::filter_gathered(const ClusterSet &queries,
                                         const std::vector<std::pair<double, int>> &order,
                                         int direct, float query_max_abs, float *carried,
                                         bool *finite, MemoryBudget &mem) {
  std::vector<uint8_t> taken(gathered_.clusters(), 0), needed;
  for (int i = 0; i < direct; i++) {
    const int part = order[i].second;
    for (int32_t g = gathered_.first_cluster(part); g < gathered_.end_cluster(part); g++)
      taken[g] = 1;
  }
  for (int round = 0;; round++) {
    KNN_TRY(ctx_.cancel_point());
    // Every cluster not taken yet is tested with the bounds carried so far:
    // those needed go in, the nearest parts' first (a part's clusters lie
    // together: few query clusters meet each), up to the largest part's
    // size; the rest wait for the next round's (smaller) bounds. Once none
    // is needed, no target left can enter any list (GatheredTargets::select).
    const Clock::time_point t_select = Clock::now();
    KNN_TRY(carried_bounds(queries, carried));
    KNN_TRY(gathered_.select(queries, carried, p_.metric, margin_, &needed, ctx_));
    theta_seconds_ += seconds_since(t_select);
    std::vector<int32_t> chosen;
    size_t bytes = 0;
    float max_abs = query_max_abs;
    bool full = false;
    for (size_t i = direct; i < order.size() && !full; i++) {
      const int part = order[i].second;
      for (int32_t g = gathered_.first_cluster(part); g < gathered_.end_cluster(part); g++) {
        if (taken[g] != 0 || needed[g] == 0) continue;
        if ((int32_t)chosen.size() == gathered_.max_clusters() ||
            bytes + gathered_.bytes(g) > gathered_.max_bytes()) {
          full = true;
          break;
        }
        chosen.push_back(g);
        taken[g] = 1;
        bytes += gathered_.bytes(g);
        max_abs = std::max(max_abs, gathered_.max_abs(part));
      }
    }
    if (chosen.empty()) return KNN_OK;
    // The bounds need finite distances (as TargetParts::get checks).
    if (!distances_stay_finite(p_.metric, p_.dim, max_abs)) {
      *finite = false;
      return KNN_OK;
    }
    MemoryBudget part_mem(mem.budget() - std::min(mem.budget(), mem.used()));
    TargetPart part;
    Clock::time_point t_get = Clock::now();
    KNN_TRY(gathered_.gather(chosen, part, part_mem, ctx_));
    lap(&get_seconds_, &t_get);
    pairs_visited_++;
    gathered_sets_++;
    gathered_clusters_ += (int64_t)chosen.size();
    // The first gathered part holds the next nearest parts' clusters (many
    // lists change); the later ones few clusters each query meets.
    KNN_TRY(filter_part(queries, part, carried, round > 0, part_mem));
  }
}

// The target parts for query positions [first, first + count), nearest
// first: (bound, part). Without an order: the part with the query part's
// own rows first for a self-join, then the others by row (bound -inf).
void OutOfCoreJoin::order_target_parts(int query_index, int64_t first, int64_t count,
                                       std::vector<std::pair<double, int>> *order) const {
  order->clear();
  const double none = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < plan_.target_parts(); i++) {
    if (!ordered_) {
      order->emplace_back(none, plan_.target_order(query_index, i));
      continue;
    }
    const int64_t tf = plan_.target_first(i), tc = plan_.target_count(i);
    double bound = part_distance_bound(query_order_, first, count, target_order_, tf, tc,
                                       centre_, p_.metric);
    // A self-join's own part first, whatever the bounds of its neighbours.
    if (p_.queries == p_.targets && tf <= first && first < tf + tc) bound = none;
    order->emplace_back(bound, i);
  }
  if (ordered_) std::stable_sort(order->begin(), order->end());
}

// Rows, exclusion and float8 of a row-range query part (on the device),
// written at row `first`.
KnnStatus OutOfCoreJoin::output_part(const DistinctSet &query_set, int64_t first,
                                     const int64_t *query_keys, MemoryBudget &mem,
                                     int64_t *neighbors, double *distances) {
  const int64_t n = query_set.n_rows;
  const int k = p_.k;
  const int64_t chunk = output_chunk_rows(mem.budget(), mem.used(), n, k);
  DeviceBuffer<int64_t> rows;
  DeviceBuffer<double> dist;
  KNN_TRY(mem.allocate(ctx_, rows, (size_t)chunk * k, "results"));
  KNN_TRY(mem.allocate(ctx_, dist, (size_t)chunk * k, "results"));
  for (int64_t c = 0; c < n; c += chunk) {
    KNN_TRY(ctx_.cancel_point());
    const int64_t count = std::min(chunk, n - c);
    KNN_TRY(expand_results(query_set, p_.metric, c, count, k, plan_.kprime, lists_value_,
                           lists_row_, query_keys, exclude_ ? target_keys_.get() : nullptr,
                           rows.get(), dist.get(), ctx_));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(neighbors + (first + c) * k, rows.get(),
                                     (size_t)count * k * sizeof(int64_t),
                                     cudaMemcpyDeviceToHost, ctx_.stream));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(distances + (first + c) * k, dist.get(),
                                     (size_t)count * k * sizeof(double), cudaMemcpyDeviceToHost,
                                     ctx_.stream));
    // The buffers are reused by the next chunk's kernel, which the stream
    // orders after these copies; the host waits once, at the end.
  }
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  mem.release(rows);
  mem.release(dist);
  return KNN_OK;
}

// The lists of query part `index` (n_distinct distinct points) to the
// results of its rows, on the host: each row of a distinct point takes
// its list, less the entries whose target key equals its own key
// (ti_expand.cuh: the code ti_output.cu runs on the device).
KnnStatus OutOfCoreJoin::output_ordered_part(int index, const ClusterSet &queries,
                                             int64_t n_distinct, int64_t *neighbors,
                                             double *distances) {
  wait_output();  // the part before, whose buffers are the other slot
  const int slot = list_slot_ = index % 2;
  if (plan_.mapped_lists) {
    // The device wrote them here (the stream was waited for): no copy.
    const MappedLists &block = mapped_[plan_.query_parts() > 1 ? slot : 0];
    host_value_[slot] = block.host_value();
    host_row_[slot] = block.host_row();
    // They are by position (tiled): the distinct point at each position.
    std::vector<int32_t> &member = list_member_[slot];
    member.resize((size_t)queries.n);
    KNN_TRY(download_to_host(ctx_, member.data(), queries.member.get(),
                             member.size() * sizeof(int32_t)));
  } else {
    const size_t slots = (size_t)n_distinct * plan_.kprime;
    list_value_[slot].resize(slots);
    list_row_[slot].resize(slots);
    KNN_TRY(download_to_host(ctx_, list_value_[slot].data(), result_value_.get(),
                             slots * sizeof(float)));
    KNN_TRY(download_to_host(ctx_, list_row_[slot].data(), result_row_.get(),
                             slots * sizeof(int32_t)));
    host_value_[slot] = list_value_[slot].data();
    host_row_[slot] = list_row_[slot].data();
  }
  // The rows are written by a host thread while the device goes on with the
  // next query part (here, if no thread can be had).
  try {
    expanding_ = std::async(std::launch::async, [=] {
      expand_lists(index, n_distinct, slot, neighbors, distances);
    });
  } catch (const std::system_error &) {
    expand_lists(index, n_distinct, slot, neighbors, distances);
  }
  return KNN_OK;
}

void OutOfCoreJoin::wait_output() {
  if (expanding_.valid()) expanding_.get();
}

// The staging of ordered query part `index`, gathered: by the host thread
// started for the part before, or here. The next part's gather is then
// started into the other staging (this one's copies to the device are
// queued from pageable memory, so they have taken its bytes before that
// staging is refilled, two parts on).
PartStaging &OutOfCoreJoin::gather_query_part(int index) {
  if (query_gather_.valid()) query_gather_.get();
  PartStaging &staging = query_staging_[index % 2];
  const int64_t first = plan_.query_distinct_first(index);
  if (staging.first != first || staging.count != plan_.query_distinct_count(index))
    gather_ordered_part(query_order_, float_rows(p_.queries), first,
                        plan_.query_distinct_count(index), stride_, staging, ctx_.cancel);
  const int next = index + 1;
  if (next < plan_.query_parts()) {
    PartStaging &ahead = query_staging_[next % 2];
    ahead.first = -1;  // not gathered until the thread is done
    try {
      query_gather_ = std::async(std::launch::async, [this, next, &ahead] {
        gather_ordered_part(query_order_, float_rows(p_.queries),
                            plan_.query_distinct_first(next), plan_.query_distinct_count(next),
                            stride_, ahead, ctx_.cancel);
      });
    } catch (const std::system_error &) {
      // No thread: the next part gathers its own rows.
    }
  }
  return staging;
}

void OutOfCoreJoin::expand_lists(int index, int64_t n_distinct, int slot, int64_t *neighbors,
                                 double *distances) {
  const int k = p_.k, kp = plan_.kprime;
  if (plan_.mapped_lists) {
    // Mapped lists are by position in tiles of 32 (entry i of position p at
    // (p / 32) * 32 k' + i * 32 + p % 32): first into distinct point order,
    // tile by tile (each tile read where it lies, each list written whole).
    const float *tile_value = host_value_[slot];
    const int32_t *tile_row = host_row_[slot];
    const std::vector<int32_t> &member = list_member_[slot];
    const int64_t n = (int64_t)member.size();
    list_value_[slot].resize((size_t)n_distinct * kp);
    list_row_[slot].resize((size_t)n_distinct * kp);
    float *value = list_value_[slot].data();
    int32_t *row = list_row_[slot].data();
    cpu::parallel_for((n + kWarp - 1) / kWarp, query_order_.n_threads, ctx_.cancel,
                      [&](int64_t t, int) {
      const int64_t tile = t * kWarp * kp;
      for (int lane = 0; lane < kWarp && t * kWarp + lane < n; lane++) {
        const int64_t d = member[t * kWarp + lane];
        for (int i = 0; i < kp; i++) {
          value[d * kp + i] = tile_value[tile + (int64_t)i * kWarp + lane];
          row[d * kp + i] = tile_row[tile + (int64_t)i * kWarp + lane];
        }
      }
    });
  }
  const float *list_value = plan_.mapped_lists ? list_value_[slot].data() : host_value_[slot];
  const int32_t *list_row = plan_.mapped_lists ? list_row_[slot].data() : host_row_[slot];
  const int64_t d0 = plan_.query_distinct_first(index);
  const std::vector<int64_t> &begin = query_order_.distinct_begin;
  const bool l1 = p_.metric == KNN_METRIC_L1;
  const int64_t *target_keys = exclude_ ? p_.target_keys : nullptr;
  // Slices of about 1 MB of output, by position (one distinct point may
  // hold most rows of the part); each slice finds its first point.
  const int64_t at = begin[d0], rows = begin[d0 + n_distinct] - at;
  const int64_t slice = std::max<int64_t>(256, (1 << 20) / ((int64_t)k * 16));
  cpu::parallel_for((rows + slice - 1) / slice, query_order_.n_threads, ctx_.cancel,
                    [&](int64_t sl, int) {
    const int64_t lo = at + sl * slice, hi = std::min(at + rows, lo + slice);
    int64_t d = std::upper_bound(begin.begin() + d0, begin.begin() + d0 + n_distinct + 1, lo) -
                begin.begin() - 1 - d0;
    for (; d < n_distinct && begin[d0 + d] < hi; d++) {
      const float *value = list_value + d * kp;
      const int32_t *row = list_row + d * kp;

      const int64_t from = std::max(lo, begin[d0 + d]), to = std::min(hi, begin[d0 + d + 1]);
      for (int64_t pos = from; pos < to; pos++) {
        const int64_t q = query_order_.row(pos);
        const int64_t own_key = exclude_ ? p_.query_keys[q] : 0;
        if (l1)
          expand_list<KNN_METRIC_L1>(value, row, k, kp, target_keys, own_key, neighbors + q * k,
                                     distances + q * k);
        else
          expand_list<KNN_METRIC_L2>(value, row, k, kp, target_keys, own_key, neighbors + q * k,
                                     distances + q * k);
      }
    }
  });
}

// Query part `index` against all target parts.
KnnStatus OutOfCoreJoin::query_part(int index, bool *finite, int64_t *neighbors,
                                    double *distances) {
  const int64_t first = plan_.query_first(index), count = plan_.query_count(index);
  // The query part's own accounting: what it leaves behind goes with it.
  MemoryBudget mem(plan_.budget - std::min(plan_.budget, fixed_mem_.used()));
  Clock::time_point t0 = Clock::now();
  DistinctSet built_set;
  ClusterSet built;
  UploadedSet upload;
  float query_max_abs = 0;
  // Shared parts: the query part is target part `index`, copied back (its
  // clusters serve as the queries, and as the targets of its own pair).
  TargetPart own;
  const bool shared = plan_.shared_parts && targets_.cached();
  if (shared) {
    KNN_TRY(targets_.get(index, 0.0f, own, finite, mem));
    if (!*finite) return KNN_OK;
    query_max_abs = own.max_abs;
  }
  DistinctSet &query_set = shared ? own.set : built_set;
  const ClusterSet &queries = shared ? own.clusters : built;
  if (shared) {
    // (own.set holds the part's counts and rows: all the lists need.)
  } else if (ordered_) {
    // Distinct points gathered on the host (ti_part_upload.cu), by a host
    // thread while the device filtered the query part before; this one's
    // gather started here, the next one's queued.
    PartStaging &staging = gather_query_part(index);
    KNN_TRY(ctx_.cancel_point());  // a cancelled gather leaves its staging unfilled
    KNN_TRY(send_ordered_part(staging, stride_, query_set, &query_max_abs, mem, ctx_));
    lap(&query_upload_seconds_, &t0);
  } else {
    DeviceBuffer<unsigned> max_abs;
    KNN_TRY(mem.allocate(ctx_, max_abs, 1, "value range"));
    CUDA_CHECK(ctx_, cudaMemsetAsync(max_abs.get(), 0, sizeof(unsigned), ctx_.stream));
    KNN_TRY(upload_points(float_rows(p_.queries) + first * p_.dim, count, p_.dim, stride_, upload,
                          max_abs.get(), mem, ctx_));
    KNN_TRY(read_max_abs(max_abs.get(), &query_max_abs, ctx_));
    mem.release(max_abs);
  }
  if (!distances_stay_finite(p_.metric, p_.dim, query_max_abs)) {
    *finite = false;
    return KNN_OK;
  }
  if (!ordered_) KNN_TRY(build_distinct_set(upload.points, options_.dedup, query_set, mem, ctx_));
  KNN_TRY(ctx_.cancel_point());
  if (!shared) {
    const int32_t mq = plan_.query_clusters_for(query_set.n_distinct);
    KNN_TRY(build_clusters(query_set, p_.metric, mq, options_.landmark_candidate_sets,
                           options_.gemm_assign_min_stride, built, mem, ctx_));
    mem.release(upload.padded);
    mem.release(query_set.x);
  }
  query_clusters_ += queries.m;

  // Row ranges: the part's keys on the device (ordered parts apply keys on
  // the host).
  const int64_t *query_keys = nullptr;
  if (exclude_ && !ordered_) {
    if (p_.query_keys == p_.target_keys && p_.queries == p_.targets) {
      query_keys = target_keys_.get() + first;  // the same rows' keys
    } else {
      KNN_TRY(mem.allocate(ctx_, query_keys_, count, "keys"));
      CUDA_CHECK(ctx_, cudaMemcpyAsync(query_keys_.get(), p_.query_keys + first,
                                       count * sizeof(int64_t), cudaMemcpyHostToDevice,
                                       ctx_.stream));
      // Pageable source: taken by the time the call returns.
      query_keys = query_keys_.get();
    }
  }
  KNN_TRY(allocate_lists(index, query_set.n_distinct, mem));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  cluster_seconds_ += seconds_since(t0);
  KNN_TRY(ctx_.cancel_point());

  t0 = Clock::now();
  const int query_index = index;
  // The host queues part i while the device works on part i - 1, and waits
  // for that one before going on: no gap between parts, and a cancel is
  // seen within about two parts' work.
  Event done[2];
  KNN_TRY(done[0].create(ctx_));
  KNN_TRY(done[1].create(ctx_));
  std::vector<std::pair<double, int>> order;
  order_target_parts(query_index, first, count, &order);
  // The query clusters' carried bounds, recomputed before each part but
  // the first.
  DeviceBuffer<float> carried;
  KNN_TRY(mem.allocate(ctx_, carried, (size_t)std::max<int32_t>(1, queries.m), "carried bounds"));
  // Gathering: the nearest part(s) alone, then the far clusters of all others.
  const int direct =
      gathering_ ? std::min(direct_parts(), plan_.target_parts()) : plan_.target_parts();
  for (int i = 0; i < direct; i++) {
    KNN_TRY(ctx_.cancel_point());
    const int target = order[i].second;
    if (i > 0) {
      // Skip this part and every farther one when its bound is beyond the
      // largest theta of the part's queries; skip this part alone when
      // none of its targets can come nearer than theta and all its rows
      // come after every list's last row (header: exactness), or when it
      // is cached and none of its clusters can come within any query's
      // k'-th entry (part_needed_kernel: exact).
      double theta;
      int64_t last_row;
      bool needed;
      const Clock::time_point t_theta = Clock::now();
      KNN_TRY(pair_tests(queries, query_set, target, &theta, &last_row, &needed, mem));
      theta_seconds_ += seconds_since(t_theta);
      if (ordered_) {
        const double bound = order[i].first;
        const double widened = theta + rounding_(std::max(0.0, bound) + theta);
        if (bound > 0 && bound > widened) {
          pairs_skipped_ += plan_.target_parts() - i;
          break;
        }
        const bool never_nearer = theta == 0 || (bound > 0 && bound >= widened);
        if (never_nearer && part_min_row_[target] > last_row) {
          pairs_skipped_++;
          continue;
        }
      }
      if (!needed) {
        pairs_skipped_++;
        cluster_skipped_++;
        continue;
      }
      KNN_TRY(carried_bounds(queries, carried.get()));
    }
    {
      // Each target part's memory is its own, released (in stream order)
      // before the next part's is allocated.
      MemoryBudget part_mem(mem.budget() - std::min(mem.budget(), mem.used()));
      TargetPart loaded;
      Clock::time_point t_get = Clock::now();
      if (!(shared && target == index)) {
        KNN_TRY(targets_.get(target, query_max_abs, loaded, finite, part_mem));
        if (!*finite) return KNN_OK;
      }
      const TargetPart &part = shared && target == index ? own : loaded;
      lap(&get_seconds_, &t_get);
      pairs_visited_++;
      KNN_TRY(filter_part(queries, part, i > 0 ? carried.get() : nullptr, i >= kNearPairs,
                          part_mem));
    }
    CUDA_CHECK(ctx_, cudaEventRecord(done[i % 2].get(), ctx_.stream));
    if (i > 0) CUDA_CHECK(ctx_, cudaEventSynchronize(done[(i - 1) % 2].get()));
  }
  if (gathering_ && direct > 0) {
    KNN_TRY(filter_gathered(queries, order, direct, query_max_abs, carried.get(), finite, mem));
    if (!*finite) return KNN_OK;
  }
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  filter_seconds_ += seconds_since(t0);
  KNN_TRY(ctx_.cancel_point());

  t0 = Clock::now();
  if (ordered_)
    KNN_TRY(output_ordered_part(index, queries, query_set.n_distinct, neighbors, distances));
  else
    KNN_TRY(output_part(query_set, first, query_keys, mem, neighbors, distances));
  output_seconds_ += seconds_since(t0);
  mem.release(result_value_);
  mem.release(result_row_);
  mem.release(last_value_);
  mem.release(last_row_);
  mem.release(query_keys_);
  return KNN_OK;
}

// The mapped blocks (two where there are several query parts, the host
// expanding one part's lists while the device fills the next), each for
// the largest query part, allocated by a host thread while the target
// parts are built; here, if no thread can be had.
void OutOfCoreJoin::start_mapping() {
  if (!plan_.mapped_lists) return;
  int64_t largest = 0;
  for (int i = 0; i < plan_.query_parts(); i++)
    largest = std::max(largest, plan_.query_distinct_count(i));
  // Tiles of 32 positions (Level2Config::tiled_lists).
  const size_t entries = (size_t)((largest + kWarp - 1) / kWarp * kWarp) * plan_.kprime;
  const int blocks = plan_.query_parts() > 1 ? 2 : 1;
  const int device = ctx_.device;
  const int32_t *cancel = ctx_.cancel;
  const int32_t *stop = &stop_pinning_;
  auto pin = [this, entries, blocks, device, cancel, stop] {
    cudaError_t err = cudaSuccess;
    for (int b = 0; b < blocks && err == cudaSuccess; b++) {
      if ((cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED)) ||
          __atomic_load_n(stop, __ATOMIC_RELAXED))
        break;
      err = mapped_[b].allocate(device, entries, cancel, stop);
    }
    return err;
  };
  try {
    mapping_ = std::async(std::launch::async, pin);
  } catch (const std::system_error &) {
    std::promise<cudaError_t> done;
    done.set_value(pin());
    mapping_ = done.get_future();
  }
}

KnnStatus OutOfCoreJoin::wait_mapping() {
  if (!mapping_.valid()) return KNN_OK;
  const Clock::time_point t0 = Clock::now();
  const cudaError_t err = mapping_.get();
  mapping_wait_seconds_ += seconds_since(t0);
  KNN_TRY(ctx_.cancel_point());  // a cancelled pinning holds nothing
  if (err != cudaSuccess) {
    pinning_failed_ = true;
    return record_failure(ctx_, err, "pinning the mapped kNN lists", __FILE__, __LINE__);
  }
  return KNN_OK;
}

// The engine tests' hook (TiOptions::pinning_hook, knn_cuda_testing.h):
// a failure of the join's own while its pinning runs, or once it is done.
// Only the first try parks (a retry after a failed pinning runs on).
KnnStatus OutOfCoreJoin::pinning_test_hook() {
  int32_t *hook = options_.pinning_hook;
  int32_t idle = 0;
  if (hook == nullptr || !mapping_.valid() ||
      !__atomic_compare_exchange_n(hook, &idle, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return KNN_OK;
  int32_t told;
  while ((told = __atomic_load_n(hook, __ATOMIC_ACQUIRE)) == 1) {
    KNN_TRY(ctx_.cancel_point());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (told == 3) KNN_TRY(wait_mapping());
  ctx_.error = KNN_CUDA_TEST_PINNING_FAILURE;
  return KNN_DEVICE_ERROR;
}

// Query part `index`'s lists (n_distinct x k'): in mapped block index % 2
// or on the device; each list's k'-th entry on the device (written by
// level 2 with the list).
KnnStatus OutOfCoreJoin::allocate_lists(int index, int64_t n_distinct, MemoryBudget &mem) {
  size_t slots = (size_t)n_distinct * plan_.kprime;
  if (plan_.mapped_lists) {
    slots = (size_t)((n_distinct + kWarp - 1) / kWarp * kWarp) * plan_.kprime;  // tiles
    KNN_TRY(wait_mapping());
    const MappedLists &block = mapped_[plan_.query_parts() > 1 ? index % 2 : 0];
    if (block.entries() < slots) {  // (the plan's largest part holds every part)
      if (ctx_.error.empty()) ctx_.error = "TI join: a query part outgrew its mapped kNN lists";
      return KNN_DEVICE_ERROR;
    }
    lists_value_ = block.device_value();
    lists_row_ = block.device_row();
  } else {
    KNN_TRY(mem.allocate(ctx_, result_value_, slots, "results"));
    KNN_TRY(mem.allocate(ctx_, result_row_, slots, "results"));
    lists_value_ = result_value_.get();
    lists_row_ = result_row_.get();
  }
  const size_t n = (size_t)std::max<int64_t>(1, n_distinct);
  KNN_TRY(mem.allocate(ctx_, last_value_, n, "list bounds"));
  KNN_TRY(mem.allocate(ctx_, last_row_, n, "list bounds"));
  return KNN_OK;
}

void OutOfCoreJoin::describe(KnnStats *stats) const {
  stats->method = KNN_METHOD_TI;
  stats->pairs = p_.n_queries * p_.n_targets;
  // "ti/out-of-core QxT parts of RqxRt[ skip S][/cached[/self]][/xP[+F]]/<list place>": query
  // parts x target parts, rows per query part x rows per target part;
  // target parts cached in host memory (/self: a self-join's query parts
  // are its cached target parts); P threads per query (of the last near
  // pair's level 2; "+F": F for the far pairs, where that differs).
  // " skip S": (query part, target part) pairs skipped by their bound or
  // by their clusters (part_needed; also for row ranges); " gathered G":
  // past each query part's nearest target part(s), G parts of the clusters
  // still needed, gathered from all the others (filter_gathered; " skip S"
  // then counts the nearest parts skipped, with KNN_TI_DIRECT_PARTS > 1).
  char parts[24] = "", skipped[48] = "";
  if (far_parts_ > 0 && far_parts_ != used_.parts)
    std::snprintf(parts, sizeof parts, "/x%d+%d", used_.parts, far_parts_);
  else if (used_.parts > 1)
    std::snprintf(parts, sizeof parts, "/x%d", used_.parts);
  if (gathering_ && pairs_skipped_ > 0)
    std::snprintf(skipped, sizeof skipped, " skip %lld gathered %lld", (long long)pairs_skipped_,
                  (long long)gathered_sets_);
  else if (gathering_)
    std::snprintf(skipped, sizeof skipped, " gathered %lld", (long long)gathered_sets_);
  else if (ordered_ || pairs_skipped_ > 0)
    std::snprintf(skipped, sizeof skipped, " skip %lld", (long long)pairs_skipped_);
  std::snprintf(stats->variant, sizeof stats->variant,
                "ti/out-of-core %dx%d parts of %lldx%lld%s%s%s/%s", plan_.query_parts(),
                plan_.target_parts(), (long long)plan_.query_rows, (long long)plan_.target_rows,
                skipped, !targets_.cached() ? "" : plan_.shared_parts ? "/cached/self" : "/cached",
                parts, place_name(used_.place));
  stats->query_clusters = query_clusters_;
  stats->target_clusters = targets_.clusters();
  stats->distance_computations = (int64_t)computed_;
  stats->threads_per_query = used_.parts;
  stats->seconds_transfer = 0;  // uploads overlap the stages; counted in them
  stats->seconds_cluster = cluster_seconds_ + targets_.cluster_seconds();
  stats->seconds_filter = filter_seconds_;
  stats->seconds_select = output_seconds_;
  stats->seconds_total = seconds_since(t_start_);
}

KnnStatus OutOfCoreJoin::run(int64_t *neighbors, double *distances, KnnStats *stats,
                             bool *finite) {
  *finite = true;
  KNN_TRY(upload_target_keys());
  KNN_TRY(fixed_mem_.allocate(ctx_, counter_, 1, "distance counter"));
  KNN_TRY(fixed_mem_.allocate(ctx_, theta_bits_, 3, "list bound and part test"));
  KNN_TRY(fixed_mem_.allocate(ctx_, stop_word_, 1, "cancel word"));
  CUDA_CHECK(ctx_, cudaMemsetAsync(stop_word_.get(), 0, sizeof(int32_t), ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));  // zero before the watch may set it
  cancel_watch_.start(ctx_.device, ctx_.cancel, stop_word_.get());
  if (ordered_) {
    // The smallest original row of each target part.
    part_min_row_.assign(plan_.target_parts(), INT64_MAX);
    for (int i = 0; i < plan_.target_parts(); i++)
      for (int64_t j = 0; j < plan_.target_count(i); j++)
        part_min_row_[i] = std::min<int64_t>(part_min_row_[i],
                                             target_order_.row(plan_.target_first(i) + j));
  }
  CUDA_CHECK(ctx_, cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), ctx_.stream));
  start_mapping();
  KNN_TRY(pinning_test_hook());
  if (plan_.cache_targets) {
    // Every target part built and cached first, each with the whole budget
    // (ti_part_plan.cu). Their own values are checked here; the queries'
    // are checked against each part as it is copied back.
    for (int i = 0; i < plan_.target_parts(); i++) {
      KNN_TRY(ctx_.cancel_point());
      MemoryBudget mem(plan_.budget - std::min(plan_.budget, fixed_mem_.used()));
      TargetPart part;
      KNN_TRY(targets_.get(i, 0.0f, part, finite, mem));
      if (!*finite) return KNN_OK;
    }
    // The far clusters gathered (ordered sides, every part cached in a
    // mapped block), where all clusters' centres take a small share of the
    // budget (the parts were cut for the rest).
    if (ordered_ && targets_.cached() && plan_.target_parts() > 1 && gather_far_clusters()) {
      const size_t room = std::min(plan_.budget / 32, plan_.budget - std::min(plan_.budget,
                                                                              fixed_mem_.used()));
      KNN_TRY(gathered_.build(targets_, plan_.target_parts(), stride_, room, fixed_mem_, ctx_,
                              &gathering_));
    }
  }
  for (int q = 0; q < plan_.query_parts(); q++) {
    KNN_TRY(ctx_.cancel_point());
    KNN_TRY(query_part(q, finite, neighbors, distances));
    if (!*finite) return KNN_OK;
  }
  const Clock::time_point t_wait = Clock::now();
  wait_output();
  output_seconds_ += seconds_since(t_wait);
  // A cancel may have cut the last expansion short: never report it done.
  KNN_TRY(ctx_.cancel_point());
  CUDA_CHECK(ctx_, cudaMemcpyAsync(&computed_, counter_.get(), sizeof computed_,
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  if (stats != nullptr) describe(stats);
  trace();
  return KNN_OK;
}

}  // namespace

KnnStatus out_of_core_join(const KnnProblem &problem, const TiOptions &options,
                           int64_t *neighbors, double *distances, KnnStats *stats, bool *finite,
                           DeviceContext &ctx) {
  size_t budget = ctx.memory_budget;
  if (budget == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(ctx, cudaMemGetInfo(&free_bytes, &total_bytes));
    budget = free_bytes;
  }
  PartPlan plan(problem, options, budget);
  // Each side's spatial order, built once (a self-join's serves both).
  const Clock::time_point t0 = Clock::now();
  SpatialOrder query_order, target_order;
  const bool self = problem.queries == problem.targets && problem.n_queries == problem.n_targets;
  const int32_t groups = order_groups(plan);
  query_order.n_threads = target_order.n_threads = cpu::resolve_threads(problem.n_threads);
  // KNN_TI_ROW_RANGES=1 keeps plain row ranges: the join as it was before
  // the spatial order, for A/B benchmarks in one run.
  const char *row_ranges = std::getenv("KNN_TI_ROW_RANGES");
  if (problem.n_queries >= (int64_t)INT32_MAX || problem.n_targets >= (int64_t)INT32_MAX ||
      problem.element != KNN_ELEMENT_FLOAT32 || (row_ranges != nullptr && row_ranges[0] == '1')) {
    // Row ranges (lists hold int32 rows; only float rows are gathered).
  } else {
    // (The engine tests' probe, TiOptions::order_probe: the order starts.)
    if (options.order_probe != nullptr) __atomic_store_n(options.order_probe, 1, __ATOMIC_RELEASE);
    KnnStatus status =
        target_order.build(float_rows(problem.targets), problem.n_targets, problem.dim,
                           problem.metric, groups, options.dedup, budget, ctx);
    if (status == KNN_OK) {
      if (self) query_order = target_order;
      else
        status = query_order.build(float_rows(problem.queries), problem.n_queries, problem.dim,
                                   problem.metric, groups, options.dedup, budget, ctx);
    }
    // (The probe: both orders ran to their end. A cancel they answered
    // returns before this.)
    if (status == KNN_OK && options.order_probe != nullptr)
      __atomic_store_n(options.order_probe, 2, __ATOMIC_RELEASE);
    // A budget too small for the landmarks: row ranges, as before.
    if (status == KNN_OUT_OF_MEMORY && !ctx.cancelled()) {
      CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
      ctx.error.clear();
      query_order.perm.clear();
      target_order.perm.clear();
    } else if (status != KNN_OK) {
      return status;
    }
  }
  std::vector<double> centre;
  if (query_order.ordered() && target_order.ordered()) {
    centre = landmark_distances(query_order, target_order, problem.metric, ctx.cancel);
    plan.cut_distinct(query_order, target_order);
  }
  KNN_TRY(ctx.cancel_point());
  const double order_seconds = seconds_since(t0);
  const char *trace = std::getenv("KNN_TI_TRACE");
  if (trace != nullptr && trace[0] == '1')
    std::fprintf(stderr,
                 "[ti out-of-core] orders %.4f s (targets: assignment %.4f (split %.4f, %d "
                 "groups), duplicates %.4f; %lld distinct of %lld rows)\n",
                 order_seconds, target_order.assign_seconds, target_order.split_seconds,
                 (int)target_order.radius.size(), target_order.dedup_seconds,
                 (long long)target_order.n_distinct(), (long long)problem.n_targets);
  // The plan's sizes are estimates: where a part still does not fit, the
  // join starts again with parts half as large, down to a floor. Where the
  // mapped lists cannot be pinned, it starts again with the lists on the
  // device (smaller device shares would not help); should that fail too,
  // its error says what the pinning's was.
  std::string pinning_error;
  for (;;) {
    KnnStatus status;
    bool pinning_failed;
    {
      OutOfCoreJoin join(problem, options, plan, query_order, target_order, centre, ctx);
      status = join.run(neighbors, distances, stats, finite);
      pinning_failed = join.pinning_failed();
    }
    if (status == KNN_OK && stats != nullptr && *finite) {
      stats->seconds_cluster += order_seconds;
      stats->seconds_total += order_seconds;
    }
    if (status != KNN_OK && pinning_failed && plan.mapped_lists && !ctx.cancelled()) {
      pinning_error = ctx.error;
      CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
      ctx.error.clear();
      plan.keep_lists_on_device();
      continue;
    }
    if (status != KNN_OUT_OF_MEMORY || ctx.cancelled() || !plan.halve()) {
      if (status != KNN_OK && !ctx.cancelled() && !pinning_error.empty())
        ctx.error += " (lists on the device after pinning them in host memory failed: " +
                     pinning_error + ")";
      return status;
    }
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));  // the failed try's frees
    ctx.error.clear();
  }
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
