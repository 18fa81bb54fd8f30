// range_join.cu -- the GPU range join (range_join.cuh).
//
// On the device for the whole join: the query and target rows, padded to
// the TI stride (ti_distance.cuh: the padding changes no sum), or bit rows
// packed as the bit join packs them (bit_rows.cuh); cosine's row norms; the
// keys and groups that decide whether a pair may be returned.
//
// Pruning (L2 and L1, a finite radius, rows whose distances stay finite,
// enough pairs): the targets' duplicate rows are grouped (ti_dedup.cu) and
// the distinct rows clustered around landmarks (ti_clustering.cu), each
// cluster's members by descending distance to its centre. A query skips
// cluster c when D(q,c) - R_c - m > r, and in a cluster it visits only the
// members with D(t,c) in [D(q,c) - r - m, D(q,c) + r + m] (two binary
// searches): the CPU range engine's bounds, on computed distances widened
// by the rounding margin m of ../rounding_margin.h, so that no pair within
// the radius is lost. Every pair visited is decided on its canonical
// distance (knn_distance.h, through ti_distance.cuh or exact_pair.cuh), so
// the pairs and distances are the CPU engine's bit for bit. Otherwise every
// pair is compared.
//
// The queries go in chunks of rows, one warp per query:
//  1. find: each pair within the radius and eligible goes to the chunk's
//     buffer at a slot the warp reserves atomically, as a 128-bit key
//     (query in the chunk, order key of the distance, target row); each
//     query's count and the slots asked for are kept even past the end of
//     the buffer.
//  2. A chunk that asked for more slots than the buffer has is cut to the
//     queries that fit (one query alone that does not fit grows the buffer)
//     and found again.
//  3. order: a radix sort of the keys is the result order (query, then
//     distance, then target row: ties by row); scans of the counts, capped
//     at k, place each query's first k pairs, written as (query, row) and
//     float8 distance into pinned host memory.
//  4. The host hands each query's pairs to the sink.
// Double buffering: while the host hands chunk i over (the sink may wait on
// a full queue), the GPU finds chunk i + 1 and, as soon as its slot count
// shows that it fits, orders it into the other pinned buffer.
#include <cub/cub.cuh>
#include <cuda/std/tuple>
#include <math_constants.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../knn_distance.h"
#include "../problem_check.h"
#include "../rounding_margin.h"
#include "../stopwatch.h"
#include "../value_range.h"
#include "bit_rows.cuh"
#include "brute_kernels.cuh"
#include "exact_pair.cuh"
#include "range_join.cuh"
#include "select_keys.cuh"
#include "ti_common.cuh"
#include "ti_distance.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;  // queries per block
constexpr unsigned kFullMask = 0xffffffffu;
// Pairs a chunk's buffers hold (fewer where the budget is small; a query
// with more pairs grows them to its count).
constexpr int64_t kChunkPairs = int64_t{1} << 20;
// Query rows of one chunk at most (the size of its count arrays).
constexpr int64_t kMaxChunkQueries = int64_t{1} << 20;
// Work of one find launch, in float (or word) operations of the distances
// it may compute: a few milliseconds, so that a cancel is seen soon.
constexpr double kWorkPerLaunch = 2.0 * 1024 * 1024 * 1024;
// AUTO prunes from this many pairs on; below, clustering costs more than
// the distances it saves.
constexpr double kAutoPruneMinPairs = 1e6;
// Runs handed to the sink between two looks at the next chunk's progress.
constexpr int kRunsPerPoll = 256;

// ---- pairs as sort keys ----

// One pair in a chunk's buffer, a 128-bit key whose unsigned order is the
// result order: query in the chunk (32 bits), order key of the distance
// (select_keys.cuh, 64 bits), target row (32 bits).
struct PairKey {
  uint64_t hi;
  uint64_t lo;
};

// The key's parts for cub's radix sort, most significant first.
struct PairKeyParts {
  __host__ __device__ ::cuda::std::tuple<uint64_t &, uint64_t &> operator()(PairKey &k) const {
    return {k.hi, k.lo};
  }
};

__device__ __forceinline__ PairKey pair_key(uint32_t query, uint64_t order, uint32_t row) {
  return PairKey{(static_cast<uint64_t>(query) << 32) | (order >> 32), (order << 32) | row};
}

// The float8 distance of an order key. The key does not keep two things
// apart: NaNs (PostgreSQL's float8 has one NaN) and the sign of zero. Only
// inner product has a negative zero, and every zero it returns is one:
// -(dot) where the dot's lanes start at +0 and never become -0.
__device__ __forceinline__ double key_distance(KnnMetric metric, uint64_t order) {
  if (order == kNanKey) return CUDART_NAN;
  const double v = key_value(order);
  return v == 0.0 && metric == KNN_METRIC_IP ? -0.0 : v;
}

// ---- find ----

struct FindArgs {
  // This launch's queries: rows first .. first + count - 1.
  int64_t first = 0;
  int count = 0;
  KnnMetric metric = KNN_METRIC_L2;
  double radius = 0;
  bool inclusive = false;
  // Float rows, `stride` floats each; norms for cosine (else null).
  int stride = 0;
  const float *queries = nullptr;
  const float *targets = nullptr;
  const float *query_norms = nullptr;
  const float *target_norms = nullptr;
  int64_t n_targets = 0;
  // Bit rows: queries row-major, targets word-major, `words` words a row.
  const uint64_t *query_bits = nullptr;
  const uint64_t *target_bits = nullptr;
  int words = 0;
  // Pruned joins: the target clusters and the rows of each distinct target.
  ti::ClusterView clusters{};
  int n_clusters = 0;
  const int32_t *cluster_rows = nullptr;
  double margin_relative = 0;
  double margin_absolute = 0;
  // Which pairs may be returned (null: all).
  const int64_t *query_keys = nullptr;
  const int64_t *target_keys = nullptr;
  const int64_t *query_groups = nullptr;
  const int64_t *target_groups = nullptr;
  // The chunk's buffer.
  PairKey *pairs = nullptr;
  unsigned long long capacity = 0;
  unsigned long long *asked = nullptr;     // slots asked for (may pass capacity)
  unsigned long long *computed = nullptr;  // distances evaluated
  long long *counts = nullptr;             // pairs of each query of the chunk
};

__device__ __forceinline__ bool eligible(const FindArgs &a, int64_t q, int64_t t) {
  if (a.query_keys != nullptr && a.query_keys[q] == a.target_keys[t]) return false;
  if (a.query_groups != nullptr && a.query_groups[q] != a.target_groups[t]) return false;
  return true;
}

// The pairs of one query, found by one warp: its lanes offer candidates
// together and append the pairs within the radius.
class WarpPairs {
 public:
  __device__ WarpPairs(const FindArgs &a, int local)
      : a_(a), local_(local), q_(a.first + local), lane_(threadIdx.x % 32) {}

  __device__ int64_t query() const { return q_; }
  __device__ int lane() const { return lane_; }
  // A pair's distance was evaluated (the statistics count these, as the
  // CPU range engine does: centre distances are the clusters' overhead).
  __device__ void computed() { computed_++; }

  // Every lane calls this: when `offered`, the lane offers the target rows
  // row_at(0 .. n-1), all at distance d (one distinct target).
  template <class RowAt>
  __device__ void offer(bool offered, double d, int n, RowAt row_at) {
    unsigned long long mine = 0;
    if (offered && knn_within_radius(d, a_.radius, a_.inclusive))
      for (int i = 0; i < n; i++) mine += eligible(a_, q_, row_at(i)) ? 1 : 0;
    unsigned long long upto = mine;  // inclusive scan over the lanes
    for (int off = 1; off < 32; off <<= 1) {
      const unsigned long long v = __shfl_up_sync(kFullMask, upto, off);
      if (lane_ >= off) upto += v;
    }
    const unsigned long long total = __shfl_sync(kFullMask, upto, 31);
    if (total == 0) return;
    unsigned long long base = 0;
    if (lane_ == 31) base = atomicAdd(a_.asked, total);
    unsigned long long slot = __shfl_sync(kFullMask, base, 31) + upto - mine;
    count_ += total;
    if (mine == 0) return;
    const uint64_t order = order_key(d);
    for (int i = 0; i < n; i++) {
      const int64_t t = row_at(i);
      if (!eligible(a_, q_, t)) continue;
      if (slot < a_.capacity)
        a_.pairs[slot] = pair_key(static_cast<uint32_t>(local_), order, static_cast<uint32_t>(t));
      slot++;
    }
  }

  // Every lane calls this once, at the end.
  __device__ void finish() {
    unsigned long long c = computed_;
    for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(kFullMask, c, off);
    if (lane_ == 0) {
      a_.counts[local_] = static_cast<long long>(count_);
      if (c > 0) atomicAdd(a_.computed, c);
    }
  }

 private:
  const FindArgs &a_;
  const int local_;
  const int64_t q_;
  const int lane_;
  unsigned long long count_ = 0;     // the warp's pairs (the same in every lane)
  unsigned long long computed_ = 0;  // this lane's distances
};

// First position in [lo, hi) of a cluster (members by descending
// distance to the centre) whose distance is <= x, or < x when strict.
__device__ __forceinline__ int first_member_within(const float *dist, int lo, int hi, double x,
                                                   bool strict) {
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    const double v = dist[mid];
    if (strict ? v >= x : v > x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Pruned find (L2, L1). Lane i bounds clusters i, i + 32, ...; then the
// warp walks the members each lane kept, 32 at a time.
template <int METRIC, int DPAD>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) find_pruned_kernel(FindArgs a) {
  const int local = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (local >= a.count) return;  // the whole warp
  WarpPairs w(a, local);
  ti::QueryRow<DPAD> q;
  q.load(a.queries + w.query() * a.stride, a.stride);
  const ti::ClusterView &cl = a.clusters;
  const double r = a.radius;
  for (int c0 = 0; c0 < a.n_clusters; c0 += 32) {
    const int c = c0 + w.lane();
    int begin = 0, end = 0;
    if (c < a.n_clusters) {
      const double dqc = ti::MetricOps<METRIC>::result(
          q.template value_to<METRIC>(cl.centers + static_cast<int64_t>(c) * a.stride));
      const double rc = cl.radius[c];
      // Every bound of this cluster sums to at most dqc + rc + |r|.
      const double m = a.margin_relative * (fabs(dqc) + rc + fabs(r)) + a.margin_absolute;
      if (!(dqc - rc - m > r)) {
        begin = first_member_within(cl.dist, cl.begin[c], cl.begin[c + 1], dqc + r + m, false);
        end = first_member_within(cl.dist, begin, cl.begin[c + 1], dqc - r - m, true);
      }
    }
    for (unsigned todo = __ballot_sync(kFullMask, end > begin); todo != 0; todo &= todo - 1) {
      const int src = __ffs(todo) - 1;
      const int b = __shfl_sync(kFullMask, begin, src), e = __shfl_sync(kFullMask, end, src);
      for (int64_t p0 = b; p0 < e; p0 += 32) {  // int64: e may be near 2^31
        const int64_t p = p0 + w.lane();
        const bool valid = p < e;
        double d = 0;
        const int32_t *rows = a.cluster_rows;
        int mult = 0;
        if (valid) {
          d = ti::MetricOps<METRIC>::result(
              q.template value_to<METRIC>(cl.x + static_cast<int64_t>(p) * a.stride));
          w.computed();
          rows += cl.rows_begin[p];
          mult = cl.mult[p];
        }
        w.offer(valid, d, mult, [rows](int i) { return static_cast<int64_t>(rows[i]); });
      }
    }
  }
  w.finish();
}

// Every pair, float rows, any float metric.
__global__ void __launch_bounds__(kWarpsPerBlock * 32) find_all_kernel(FindArgs a) {
  const int local = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (local >= a.count) return;
  WarpPairs w(a, local);
  const float *q = a.queries + w.query() * a.stride;
  const float q_norm = a.query_norms != nullptr ? a.query_norms[w.query()] : 0.0f;
  for (int64_t t0 = 0; t0 < a.n_targets; t0 += 32) {
    const int64_t t = t0 + w.lane();
    const bool valid = t < a.n_targets;
    double value = 0, d = 0;
    if (valid) {
      const float t_norm = a.target_norms != nullptr ? a.target_norms[t] : 0.0f;
      exact_pair(a.metric, q, a.targets + t * a.stride, a.stride, q_norm, t_norm, &value, &d);
      w.computed();
    }
    w.offer(valid, d, 1, [t](int) { return t; });
  }
  w.finish();
}

// Every pair, bit rows (Hamming, Jaccard).
template <bool kJaccard>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) find_bits_kernel(FindArgs a) {
  const int local = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (local >= a.count) return;
  WarpPairs w(a, local);
  const uint64_t *q = a.query_bits + w.query() * a.words;
  unsigned long long q_ones = 0;
  if (kJaccard) {
    for (int i = w.lane(); i < a.words; i += 32) q_ones += __popcll(q[i]);
    for (int off = 16; off > 0; off >>= 1) q_ones += __shfl_xor_sync(kFullMask, q_ones, off);
  }
  for (int64_t t0 = 0; t0 < a.n_targets; t0 += 32) {
    const int64_t t = t0 + w.lane();
    const bool valid = t < a.n_targets;
    double d = 0;
    if (valid) {
      d = bit_pair_distance<kJaccard>(q, a.target_bits, a.n_targets, t, a.words, q_ones);
      w.computed();
    }
    w.offer(valid, d, 1, [t](int) { return t; });
  }
  w.finish();
}

// ---- order ----

// capped[i] = min(counts[i], cap) for i < n, capped[n] = 0.
__global__ void cap_counts_kernel(const long long *counts, int n, int cap, long long *capped) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) capped[i] = counts[i] < cap ? counts[i] : cap;
  if (i == n) capped[n] = 0;
}

// The sorted pairs of a chunk, each query's first `cap` (0: all) written
// at the query's place in the output: (query in chunk << 32 | row), float8.
__global__ void emit_kernel(const PairKey *sorted, long long n, const long long *offsets,
                            const long long *out_offsets, int cap, KnnMetric metric,
                            int64_t *query_row, double *distance) {
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<long long>(gridDim.x) * blockDim.x) {
    const PairKey k = sorted[j];
    const uint32_t q = static_cast<uint32_t>(k.hi >> 32);
    const long long rank = j - offsets[q];
    if (cap > 0 && rank >= cap) continue;
    const long long out = out_offsets[q] + rank;
    query_row[out] = static_cast<int64_t>((static_cast<uint64_t>(q) << 32) | (k.lo & 0xffffffffu));
    distance[out] = key_distance(metric, (k.hi << 32) | (k.lo >> 32));
  }
}

// ---- the join ----

// A chunk of query rows on its way through find, order and hand-over.
struct Chunk {
  int64_t first = 0;
  int64_t count = 0;
  int buffer = 0;         // the pinned buffer its pairs go to
  bool ordered = false;   // order launched
  int64_t asked = 0;      // pairs found (before the cap)
};

class RangeJoin {
 public:
  RangeJoin(const KnnProblem &p, knn_cuda_pair_sink_fn sink, void *sink_context,
            DeviceContext &ctx)
      : p_(p),
        sink_(sink),
        sink_context_(sink_context),
        ctx_(ctx),
        mem_(ctx.memory_budget),
        bits_(p.element == KNN_ELEMENT_BIT),
        self_(p.queries == p.targets && p.n_queries == p.n_targets),
        stride_(bits_ ? 0 : ti::padded_stride(p.dim)),
        words_(bits_ ? static_cast<int>(bit_row_words(p.dim)) : 0) {}

  // Buffers freed below may still be read by queued work: wait for it.
  ~RangeJoin() {
    if (ctx_.stream != nullptr) (void)cudaStreamSynchronize(ctx_.stream);
    (void)cudaGetLastError();
  }

  KnnStatus run(KnnStats *stats);

 private:
  KnnStatus upload();
  KnnStatus upload_float_rows(bool *finite);
  KnnStatus upload_bit_rows();
  KnnStatus upload_keys_and_groups();
  KnnStatus cluster();
  KnnStatus reserve_chunks(int64_t pairs);
  int64_t next_chunk_size(int64_t first) const;
  KnnStatus find(Chunk &c);
  KnnStatus settle(Chunk &c);
  KnnStatus order(Chunk &c);
  KnnStatus hand_over(const Chunk &c, Chunk *next);
  KnnStatus run_chunks();
  void describe(KnnStats *stats) const;

  template <class T>
  KnnStatus upload_array(DeviceBuffer<T> &out, const T *host, int64_t n, const char *what) {
    KNN_TRY(mem_.allocate(ctx_, out, static_cast<size_t>(n), what));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(out.get(), host, static_cast<size_t>(n) * sizeof(T),
                                     cudaMemcpyHostToDevice, ctx_.stream));
    return KNN_OK;
  }

  const KnnProblem &p_;
  const knn_cuda_pair_sink_fn sink_;
  void *const sink_context_;
  DeviceContext &ctx_;
  ti::MemoryBudget mem_;
  const bool bits_, self_;
  const int stride_, words_;
  bool pruned_ = false;

  // Rows and what decides a pair's eligibility.
  ti::UploadedSet query_rows_, target_rows_;
  DeviceBuffer<float> query_norms_, target_norms_;
  DeviceBuffer<uint64_t> query_bits_, target_bits_;
  DeviceBuffer<int64_t> query_keys_, target_keys_, query_groups_, target_groups_;
  ti::DistinctSet target_set_;
  ti::ClusterSet clusters_;
  FindArgs args_;

  // A chunk's device buffers (capacity_ pairs) and counters.
  int64_t capacity_ = 0;
  int64_t chunk_queries_ = 0;
  DeviceBuffer<PairKey> found_, sorted_;
  DeviceBuffer<int64_t> query_row_d_;
  DeviceBuffer<double> distance_d_;
  DeviceBuffer<unsigned char> temp_;
  DeviceBuffer<long long> counts_, offsets_, capped_, out_offsets_;
  DeviceBuffer<unsigned long long> counters_;  // asked, computed
  // Pinned host memory: the pairs of two chunks, and their counters
  // (asked, computed, emitted).
  PinnedBuffer<int64_t> query_row_h_[2];
  PinnedBuffer<double> distance_h_[2];
  PinnedBuffer<unsigned long long> counters_h_[2];
  Event found_event_, ordered_event_[2];

  // Totals.
  int64_t queries_done_ = 0;
  int64_t asked_total_ = 0;
  int64_t computed_total_ = 0;
  int64_t returned_ = 0;
  int64_t chunks_ = 0;
  double seconds_upload_ = 0, seconds_cluster_ = 0, seconds_find_ = 0, seconds_hand_over_ = 0;
};

KnnStatus RangeJoin::upload_float_rows(bool *finite) {
  DeviceBuffer<unsigned> max_abs;
  KNN_TRY(mem_.allocate(ctx_, max_abs, 1, "value range"));
  CUDA_CHECK(ctx_, cudaMemsetAsync(max_abs.get(), 0, sizeof(unsigned), ctx_.stream));
  KNN_TRY(ti::upload_points(float_rows(p_.queries), p_.n_queries, p_.dim, stride_, query_rows_,
                            max_abs.get(), mem_, ctx_));
  if (!self_)
    KNN_TRY(ti::upload_points(float_rows(p_.targets), p_.n_targets, p_.dim, stride_,
                              target_rows_, max_abs.get(), mem_, ctx_));
  const ti::DevicePoints &targets = self_ ? query_rows_.points : target_rows_.points;
  if (p_.metric == KNN_METRIC_COSINE) {
    // The canonical norms (knn_dot(x, x)); padding adds +0 to a lane.
    DeviceBuffer<uint8_t> zero;
    KNN_TRY(mem_.allocate(ctx_, query_norms_, p_.n_queries, "row norms"));
    KNN_TRY(mem_.allocate(ctx_, zero, std::max(p_.n_queries, p_.n_targets), "row norms"));
    KNN_TRY(launch_row_stats(ctx_, query_rows_.points.x, p_.n_queries, stride_,
                             query_norms_.get(), zero.get()));
    if (!self_) {
      KNN_TRY(mem_.allocate(ctx_, target_norms_, p_.n_targets, "row norms"));
      KNN_TRY(launch_row_stats(ctx_, targets.x, p_.n_targets, stride_, target_norms_.get(),
                               zero.get()));
    }
    mem_.release(zero);
  }
  float max_abs_value;
  KNN_TRY(ti::read_max_abs(max_abs.get(), &max_abs_value, ctx_));
  *finite = distances_stay_finite(p_.metric, p_.dim, max_abs_value);
  args_.stride = stride_;
  args_.queries = query_rows_.points.x;
  args_.targets = targets.x;
  args_.query_norms = query_norms_.get();
  args_.target_norms = self_ ? query_norms_.get() : target_norms_.get();
  return KNN_OK;
}

KnnStatus RangeJoin::upload_bit_rows() {
  const std::vector<uint64_t> queries =
      pack_bit_rows(p_.queries, p_.n_queries, p_.dim, words_, false);
  const std::vector<uint64_t> targets =
      pack_bit_rows(p_.targets, p_.n_targets, p_.dim, words_, true);
  KNN_TRY(upload_array(query_bits_, queries.data(), static_cast<int64_t>(queries.size()),
                       "bit rows"));
  KNN_TRY(upload_array(target_bits_, targets.data(), static_cast<int64_t>(targets.size()),
                       "bit rows"));
  // The host vectors go out of scope: the copies must be done.
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  args_.query_bits = query_bits_.get();
  args_.target_bits = target_bits_.get();
  args_.words = words_;
  return KNN_OK;
}

KnnStatus RangeJoin::upload_keys_and_groups() {
  const int64_t nq = p_.n_queries, nt = p_.n_targets;
  if (p_.query_keys != nullptr) {
    KNN_TRY(upload_array(query_keys_, p_.query_keys, nq, "keys"));
    KNN_TRY(upload_array(target_keys_, p_.target_keys, nt, "keys"));
    args_.query_keys = query_keys_.get();
    args_.target_keys = target_keys_.get();
  }
  if (p_.query_groups != nullptr) {
    KNN_TRY(upload_array(query_groups_, p_.query_groups, nq, "groups"));
    KNN_TRY(upload_array(target_groups_, p_.target_groups, nt, "groups"));
    args_.query_groups = query_groups_.get();
    args_.target_groups = target_groups_.get();
  }
  return KNN_OK;
}

// Rows, norms, keys and groups on the device; decides whether to prune.
KnnStatus RangeJoin::upload() {
  const Clock::time_point start = Clock::now();
  args_.metric = p_.metric;
  args_.radius = p_.max_distance;
  args_.inclusive = p_.range == KNN_RANGE_AT_MOST;
  args_.n_targets = p_.n_targets;
  bool finite = false;
  if (bits_)
    KNN_TRY(upload_bit_rows());
  else
    KNN_TRY(upload_float_rows(&finite));
  KNN_TRY(upload_keys_and_groups());
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  const double pairs = static_cast<double>(p_.n_queries) * static_cast<double>(p_.n_targets);
  pruned_ = !bits_ && (p_.metric == KNN_METRIC_L2 || p_.metric == KNN_METRIC_L1) && finite &&
            std::isfinite(p_.max_distance) && p_.method != KNN_METHOD_BRUTE &&
            (p_.method == KNN_METHOD_TI || pairs >= kAutoPruneMinPairs);
  seconds_upload_ = seconds_since(start);
  return ctx_.cancel_point();
}

// Pruned joins: the targets' distinct rows clustered (ti_clustering.cu).
KnnStatus RangeJoin::cluster() {
  const Clock::time_point start = Clock::now();
  const ti::TiOptions options;
  const ti::DevicePoints &targets = self_ ? query_rows_.points : target_rows_.points;
  KNN_TRY(ti::build_distinct_set(targets, options.dedup, target_set_, mem_, ctx_));
  KNN_TRY(ctx_.cancel_point());
  const int32_t m = ti::landmarks_for(options.landmark_factor, target_set_.n_distinct);
  KNN_TRY(ti::build_clusters(target_set_, p_.metric, m, options.landmark_candidate_sets,
                             options.gemm_assign_min_stride, clusters_, mem_, ctx_));
  // The clusters hold their members' rows; the distinct rows and (unless
  // they are the queries') the targets' rows are not needed any more.
  mem_.release(target_set_.x);
  mem_.release(target_rows_.padded);
  args_.targets = nullptr;
  args_.clusters = clusters_.view();
  args_.n_clusters = clusters_.m;
  args_.cluster_rows = target_set_.rows.get();
  const RoundingMargin margin(p_.metric, stride_);
  args_.margin_relative = margin.relative();
  args_.margin_absolute = margin(0.0);
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  seconds_cluster_ = seconds_since(start);
  return ctx_.cancel_point();
}

// The buffers of one chunk for `pairs` pairs (and the count arrays for
// the most queries a chunk takes), device and pinned. Nothing may be in
// flight.
KnnStatus RangeJoin::reserve_chunks(int64_t pairs) {
  for (auto *b : {&found_, &sorted_}) mem_.release(*b);
  mem_.release(query_row_d_);
  mem_.release(distance_d_);
  mem_.release(temp_);
  capacity_ = pairs;
  KNN_TRY(mem_.allocate(ctx_, found_, pairs, "range pairs"));
  KNN_TRY(mem_.allocate(ctx_, sorted_, pairs, "range pairs"));
  KNN_TRY(mem_.allocate(ctx_, query_row_d_, pairs, "range pairs"));
  KNN_TRY(mem_.allocate(ctx_, distance_d_, pairs, "range pairs"));
  for (int b = 0; b < 2; b++) {
    KNN_TRY(query_row_h_[b].allocate(ctx_, pairs));
    KNN_TRY(distance_h_[b].allocate(ctx_, pairs));
  }
  if (counts_.get() == nullptr) {
    chunk_queries_ = std::min(p_.n_queries, kMaxChunkQueries);
    for (auto *b : {&counts_, &offsets_, &capped_, &out_offsets_})
      KNN_TRY(mem_.allocate(ctx_, *b, chunk_queries_ + 1, "range counts"));
    KNN_TRY(mem_.allocate(ctx_, counters_, 2, "range counters"));
    for (int b = 0; b < 2; b++) KNN_TRY(counters_h_[b].allocate(ctx_, 3));
    KNN_TRY(found_event_.create(ctx_));
    for (int b = 0; b < 2; b++) KNN_TRY(ordered_event_[b].create(ctx_));
  }
  return KNN_OK;
}

// Query rows for the chunk from `first` on: as many as the buffer is
// expected to hold (from the pairs per query so far) and one launch's work
// allows (from the distances per query so far).
int64_t RangeJoin::next_chunk_size(int64_t first) const {
  const double unit = bits_ ? words_ : stride_;
  const double work =
      clusters_.m + (queries_done_ > 0
                         ? std::max(1.0, static_cast<double>(computed_total_) / queries_done_)
                         : static_cast<double>(p_.n_targets));
  const double pairs = queries_done_ > 0 ? static_cast<double>(asked_total_) / queries_done_ : 0;
  double n = kWorkPerLaunch / (work * unit);
  if (pairs > 0) n = std::min(n, 0.75 * static_cast<double>(capacity_) / pairs);
  n = std::min(n, static_cast<double>(std::min(chunk_queries_, p_.n_queries - first)));
  return std::max<int64_t>(1, static_cast<int64_t>(n));
}

// Launches the find of chunk c and the copy of its counters.
KnnStatus RangeJoin::find(Chunk &c) {
  FindArgs a = args_;
  a.first = c.first;
  a.count = static_cast<int>(c.count);
  a.pairs = found_.get();
  a.capacity = static_cast<unsigned long long>(capacity_);
  a.asked = counters_.get();
  a.computed = counters_.get() + 1;
  a.counts = counts_.get();
  CUDA_CHECK(ctx_, cudaMemsetAsync(counters_.get(), 0, 2 * sizeof(unsigned long long),
                                   ctx_.stream));
  const unsigned blocks = grid_for(c.count, kWarpsPerBlock);
  const unsigned threads = kWarpsPerBlock * 32;
  if (bits_) {
    if (p_.metric == KNN_METRIC_JACCARD)
      find_bits_kernel<true><<<blocks, threads, 0, ctx_.stream>>>(a);
    else
      find_bits_kernel<false><<<blocks, threads, 0, ctx_.stream>>>(a);
  } else if (!pruned_) {
    find_all_kernel<<<blocks, threads, 0, ctx_.stream>>>(a);
  } else {
    ti::with_register_stride(stride_, [&](auto d) {
      constexpr int kStride = decltype(d)::value;
      if (p_.metric == KNN_METRIC_L1)
        find_pruned_kernel<KNN_METRIC_L1, kStride><<<blocks, threads, 0, ctx_.stream>>>(a);
      else
        find_pruned_kernel<KNN_METRIC_L2, kStride><<<blocks, threads, 0, ctx_.stream>>>(a);
    });
  }
  CUDA_CHECK_LAUNCH(ctx_, "range find kernel");
  CUDA_CHECK(ctx_, cudaMemcpyAsync(counters_h_[c.buffer].get(), counters_.get(),
                                   2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                   ctx_.stream));
  CUDA_CHECK(ctx_, cudaEventRecord(found_event_.get(), ctx_.stream));
  c.ordered = false;
  return KNN_OK;
}

// Waits for chunk c's find. A chunk that did not fit its buffer is cut to
// the queries that fit (one query that alone does not fit grows the
// buffers: nothing else is in flight here) and found again.
KnnStatus RangeJoin::settle(Chunk &c) {
  CUDA_CHECK(ctx_, cudaEventSynchronize(found_event_.get()));
  c.asked = static_cast<int64_t>(counters_h_[c.buffer].get()[0]);
  if (c.asked <= capacity_) return KNN_OK;
  std::vector<long long> counts(static_cast<size_t>(c.count));
  CUDA_CHECK(ctx_, cudaMemcpyAsync(counts.data(), counts_.get(),
                                   counts.size() * sizeof(long long), cudaMemcpyDeviceToHost,
                                   ctx_.stream));
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  int64_t fit = 0, sum = 0;
  while (fit < c.count && sum + counts[fit] <= capacity_) sum += counts[fit++];
  if (fit == 0) {
    KNN_TRY(reserve_chunks(counts[0]));
    fit = 1;
  }
  c.count = fit;
  KNN_TRY(find(c));
  CUDA_CHECK(ctx_, cudaEventSynchronize(found_event_.get()));
  c.asked = static_cast<int64_t>(counters_h_[c.buffer].get()[0]);
  return KNN_OK;
}

// Launches the order of chunk c (its find fitted) and the copy of its
// pairs to its pinned buffer.
KnnStatus RangeJoin::order(Chunk &c) {
  const int n = static_cast<int>(c.count);
  const int cap = p_.k;
  int query_bits = 1;
  while ((int64_t{1} << query_bits) < n) query_bits++;
  size_t sort_bytes = 0, scan_bytes = 0;
  CUDA_CHECK(ctx_, cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, found_.get(),
                                                   sorted_.get(), c.asked, PairKeyParts{}, 0,
                                                   96 + query_bits, ctx_.stream));
  CUDA_CHECK(ctx_, cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts_.get(),
                                                 offsets_.get(), n + 1, ctx_.stream));
  const size_t temp_bytes = std::max<size_t>({sort_bytes, scan_bytes, 1});
  if (temp_.bytes() < temp_bytes) {
    mem_.release(temp_);
    KNN_TRY(mem_.allocate(ctx_, temp_, temp_bytes, "range sort workspace"));
  }
  CUDA_CHECK(ctx_, cub::DeviceRadixSort::SortKeys(temp_.get(), sort_bytes, found_.get(),
                                                   sorted_.get(), c.asked, PairKeyParts{}, 0,
                                                   96 + query_bits, ctx_.stream));
  CUDA_CHECK(ctx_, cudaMemsetAsync(counts_.get() + n, 0, sizeof(long long), ctx_.stream));
  CUDA_CHECK(ctx_, cub::DeviceScan::ExclusiveSum(temp_.get(), scan_bytes, counts_.get(),
                                                 offsets_.get(), n + 1, ctx_.stream));
  const long long *out_offsets = offsets_.get();
  if (cap > 0) {
    cap_counts_kernel<<<grid_for(n + 1, 256), 256, 0, ctx_.stream>>>(counts_.get(), n, cap,
                                                                      capped_.get());
    CUDA_CHECK_LAUNCH(ctx_, "cap_counts_kernel");
    CUDA_CHECK(ctx_, cub::DeviceScan::ExclusiveSum(temp_.get(), scan_bytes, capped_.get(),
                                                   out_offsets_.get(), n + 1, ctx_.stream));
    out_offsets = out_offsets_.get();
  }
  if (c.asked > 0) {
    emit_kernel<<<grid_stride_blocks(c.asked, 256), 256, 0, ctx_.stream>>>(
        sorted_.get(), c.asked, offsets_.get(), out_offsets, cap, p_.metric,
        query_row_d_.get(), distance_d_.get());
    CUDA_CHECK_LAUNCH(ctx_, "emit_kernel");
  }
  // What is emitted is at most what was found, and at most cap a query.
  int64_t most = c.asked;
  if (cap > 0) most = std::min<int64_t>(most, c.count * cap);
  unsigned long long *counters_h = counters_h_[c.buffer].get();
  CUDA_CHECK(ctx_, cudaMemcpyAsync(counters_h + 2, out_offsets + n, sizeof(long long),
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  if (most > 0) {
    CUDA_CHECK(ctx_, cudaMemcpyAsync(query_row_h_[c.buffer].get(), query_row_d_.get(),
                                     most * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                     ctx_.stream));
    CUDA_CHECK(ctx_, cudaMemcpyAsync(distance_h_[c.buffer].get(), distance_d_.get(),
                                     most * sizeof(double), cudaMemcpyDeviceToHost,
                                     ctx_.stream));
  }
  CUDA_CHECK(ctx_, cudaEventRecord(ordered_event_[c.buffer].get(), ctx_.stream));
  c.ordered = true;
  return KNN_OK;
}

// Hands chunk c's pairs to the sink, query by query. Meanwhile, when
// `next` has been found and fits its buffer, launches its order.
KnnStatus RangeJoin::hand_over(const Chunk &c, Chunk *next) {
  CUDA_CHECK(ctx_, cudaEventSynchronize(ordered_event_[c.buffer].get()));
  const unsigned long long *counters = counters_h_[c.buffer].get();
  const int64_t emitted = static_cast<int64_t>(counters[2]);
  computed_total_ += static_cast<int64_t>(counters[1]);
  asked_total_ += c.asked;
  queries_done_ += c.count;
  returned_ += emitted;
  chunks_++;
  const Clock::time_point start = Clock::now();
  int64_t *rows = query_row_h_[c.buffer].get();
  const double *dist = distance_h_[c.buffer].get();
  int runs = 0;
  for (int64_t j = 0; j < emitted;) {
    const int64_t local = rows[j] >> 32;
    int64_t e = j;
    for (; e < emitted && (rows[e] >> 32) == local; e++) rows[e] &= 0xffffffff;
    if (sink_(sink_context_, c.first + local, rows + j, dist + j, e - j) == 0) {
      if (ctx_.error.empty()) ctx_.error = "cancelled";
      return KNN_CANCELLED;
    }
    j = e;
    if (next != nullptr && !next->ordered && ++runs % kRunsPerPoll == 0) {
      KNN_TRY(ctx_.cancel_point());
      const cudaError_t done = cudaEventQuery(found_event_.get());
      if (done == cudaSuccess) {
        next->asked = static_cast<int64_t>(counters_h_[next->buffer].get()[0]);
        if (next->asked <= capacity_) KNN_TRY(order(*next));
      } else if (done != cudaErrorNotReady) {
        CUDA_CHECK(ctx_, done);
      }
    }
  }
  seconds_hand_over_ += seconds_since(start);
  return KNN_OK;
}

// Chunk after chunk: find i + 1 while i is handed over.
KnnStatus RangeJoin::run_chunks() {
  const double all = static_cast<double>(p_.n_queries) * static_cast<double>(p_.n_targets);
  const double budget_pairs = static_cast<double>(ctx_.memory_budget) / 4 / 64;
  const double pairs = std::min({static_cast<double>(kChunkPairs), all, budget_pairs});
  KNN_TRY(reserve_chunks(std::max<int64_t>(1024, static_cast<int64_t>(pairs))));
  const Clock::time_point start = Clock::now();
  Chunk ready, next;
  bool have_ready = false;
  int buffer = 0;
  for (int64_t first = 0; first < p_.n_queries || have_ready;) {
    KNN_TRY(ctx_.cancel_point());
    const bool more = first < p_.n_queries;
    if (more) {
      next = Chunk{first, next_chunk_size(first), buffer};
      KNN_TRY(find(next));
    }
    if (have_ready) KNN_TRY(hand_over(ready, more ? &next : nullptr));
    have_ready = false;
    if (!more) break;
    if (!next.ordered) {
      KNN_TRY(settle(next));
      KNN_TRY(order(next));
    }
    ready = next;
    have_ready = true;
    first = next.first + next.count;
    buffer ^= 1;
  }
  seconds_find_ = seconds_since(start) - seconds_hand_over_;
  return KNN_OK;
}

void RangeJoin::describe(KnnStats *stats) const {
  stats->method = pruned_ ? KNN_METHOD_TI : KNN_METHOD_BRUTE;
  const char *variant = p_.n_queries == 0 || p_.n_targets == 0 ? "range/empty"
                        : bits_                                 ? "range/bit popcount"
                        : pruned_                               ? "range/ti"
                                                                : "range/brute";
  std::snprintf(stats->variant, sizeof stats->variant, "%s, %lld pairs within radius", variant,
                static_cast<long long>(returned_));
  stats->target_clusters = pruned_ ? clusters_.m : 0;
  stats->distance_computations = computed_total_;
  stats->threads_per_query = 32;
  stats->seconds_transfer = seconds_upload_;
  stats->seconds_cluster = seconds_cluster_;
  stats->seconds_filter = seconds_find_;
  stats->seconds_select = seconds_hand_over_;
}

KnnStatus RangeJoin::run(KnnStats *stats) {
  KnnStatus st = KNN_OK;
  if (p_.n_queries > 0 && p_.n_targets > 0) {
    st = upload();
    if (st == KNN_OK && pruned_) st = cluster();
    if (st == KNN_OK) st = run_chunks();
  }
  describe(stats);
  return st;
}

}  // namespace

KnnStatus range_join(const KnnProblem &problem, knn_cuda_pair_sink_fn sink, void *sink_context,
                     KnnStats *stats, DeviceContext &ctx) {
  *stats = KnnStats{};
  if (problem.n_targets > KNN_CUDA_RANGE_MAX_TARGETS) {
    ctx.error = "the GPU range join takes fewer than 2^31 - 1 targets";
    return KNN_INVALID_ARGUMENT;
  }
  KnnStatus status;
  {
    RangeJoin join(problem, sink, sink_context, ctx);
    status = join.run(stats);
  }
  // Every buffer of the join has been handed to cudaFreeAsync by now.
  return ti::release_join_memory(status, ctx);
}

}  // namespace cuda
}  // namespace knn
