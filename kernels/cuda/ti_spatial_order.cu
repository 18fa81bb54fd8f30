// ti_spatial_order.cu -- a spatially coherent order of one side's rows for
// the out-of-core TI join (SpatialOrder of ti_parts.cuh).
//
// Row ranges of unordered data each span the whole space: level 1 then
// prunes little between parts and every (query part, target part) pair is
// uploaded and filtered. Here the rows are grouped around landmarks
// sampled evenly from the whole side and the groups are laid out along a
// greedy nearest-neighbour tour of the landmarks, so that consecutive
// positions form compact regions; each group keeps a bound on its members'
// distance to the landmark. The nearest landmark is searched in float; the
// distance of each row to the landmark it got is summed in double on
// the device and the landmarks' distances in double on the host: next to
// the float distances of the join they are exact, and the radii are still
// widened by a relative 1e-9.
//
// The assignment is pipelined (assign_rows): chunks of rows go up through
// two pinned buffers, and their results (group, hash) come down into two
// others, so that the host fills and empties one pair while the device
// works on the other; each group's largest value (its radius) is kept on
// the device. The host's passes over the rows (the counting sort by group,
// the duplicates) run on all the join's threads.
//
// Duplicates: the same pass hashes each row's bits (64 bits). Equal rows
// get the same landmark (the search is a function of the bits), so they
// share a group; within a group
// (rows ascending) each row is looked up by its hash among the group's
// distinct points so far and compared bit for bit with their first rows:
// equal, it joins that point; else it starts a new one. The group's
// positions are then laid out point by point (first occurrence order),
// each point's rows ascending. Linear in the rows, and a group of many
// copies of a few points (kdd's largest) costs a lookup and a compare a
// row. Large groups are cut into pieces that are deduplicated in parallel
// and merged (mark_distinct): the same points, in the same order.
//
// Landmarks sampled evenly from the rows miss the small clusters of a
// clustered set; their rows widen some far landmark's group and spoil the
// bounds of every part that touches it. KNN_TI_ORDER_SPLIT=F splits the
// widest groups after the assignment (split_wide_groups), up to F times
// the groups asked for (an A/B knob: not worth its cost so far).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include <math_constants.h>

#include "../cpu/parallel_for.h"
#include "host_transfer.cuh"
#include "ti_parts.cuh"
#include "../hash_seed.h"
#include "../stopwatch.h"

namespace knn {
namespace cuda {
namespace ti {
namespace {

constexpr int kAssignThreads = 128;
constexpr int kTileFloats = 4096;  // landmarks per shared tile: 16 kB
constexpr double kHostSlack = 1e-9;
// Groups after the widest are split (split_wide_groups): the landmarks'
// distance matrices hold m^2 doubles.
constexpr int32_t kMaxGroups = 2048;

// The nearest landmark of each row, searched in float (ties: the lowest
// index), and the row's value to it (squared sum for L2, sum for L1) in
// double, whose largest per group (widest) gives the group's radius. Any
// landmark would do for exactness (the group's radius is what the bounds
// use, and it comes from the double value); the float search is
// only there to make groups compact, and it is a function of the row's
// bits, so equal rows always get the same landmark. Each thread holds
// kBatch sums, so that a row value read serves kBatch landmarks.
constexpr int kBatch = 8;

template <bool L1>
__global__ void nearest_landmark_kernel(const float *rows, int64_t n, int dim,
                                        const float *landmarks, int32_t m, int32_t *group,
                                        double *value, uint64_t *hash,
                                        unsigned long long *widest, uint64_t seed) {
  __shared__ float tile[kTileFloats];
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const float *x = rows + (i < n ? i : 0) * (int64_t)dim;
  const int per_tile = max(1, kTileFloats / dim);
  float best = CUDART_INF_F;
  int32_t best_index = 0;
  for (int32_t base = 0; base < m; base += per_tile) {
    const int count = min(per_tile, m - base);
    __syncthreads();
    for (int j = threadIdx.x; j < count * dim; j += blockDim.x)
      tile[j] = landmarks[(int64_t)base * dim + j];
    __syncthreads();
    if (i >= n) continue;
    for (int c = 0; c < count; c += kBatch) {
      const int last = min(kBatch, count - c) - 1;
      float s[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; j++) s[j] = 0.0f;
      for (int d = 0; d < dim; d++) {
        const float xd = x[d];
#pragma unroll
        for (int j = 0; j < kBatch; j++) {
          const float diff = xd - tile[(c + min(j, last)) * dim + d];
          s[j] += L1 ? fabsf(diff) : diff * diff;
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; j++)
        if (j <= last && s[j] < best) {
          best = s[j];
          best_index = base + c + j;
        }
    }
  }
  if (i < n) {
    const float *l = landmarks + (int64_t)best_index * dim;
    double v = 0;
    for (int d = 0; d < dim; d++) {
      const double diff = (double)x[d] - (double)l[d];
      v += L1 ? fabs(diff) : diff * diff;
    }
    if (value != nullptr) value[i] = v;  // (only where the host splits groups)
    group[i] = best_index;
    // The group's largest value, as bits (non-negative doubles order as
    // their bits, NaN above +inf). A stale read only skips an atomic that
    // could not raise the maximum.
    const unsigned long long bits = (unsigned long long)__double_as_longlong(v);
    if (bits > widest[best_index]) atomicMax(widest + best_index, bits);
    // The row's bits, mixed word by word (splitmix-style finaliser), from
    // the secret seed (../hash_seed.h).
    uint64_t h = seed + (uint64_t)dim;
    for (int d = 0; d < dim; d++) {
      h = (h ^ __float_as_uint(x[d])) * 0x9e3779b97f4a7c15ull;
      h ^= h >> 29;
    }
    hash[i] = h;
  }
}

double host_distance(const float *a, const float *b, int dim, KnnMetric metric) {
  double s = 0;
  for (int d = 0; d < dim; d++) {
    const double diff = (double)a[d] - (double)b[d];
    s += metric == KNN_METRIC_L1 ? std::fabs(diff) : diff * diff;
  }
  return metric == KNN_METRIC_L1 ? s : std::sqrt(s);
}

// Orders ids[0, n) (landmark indices; d: their distance matrix, m wide)
// as the leaves of a recursive bisection.
void bisect(int32_t *ids, int32_t n, const double *d, int32_t m) {
  if (n <= 2) return;
  auto dist = [&](int32_t a, int32_t b) { return d[(size_t)a * m + b]; };
  auto farthest = [&](int32_t from) {
    int32_t best = ids[0];
    for (int32_t i = 1; i < n; i++)
      if (dist(from, ids[i]) > dist(from, best)) best = ids[i];
    return best;
  };
  const int32_t a = farthest(ids[0]), b = farthest(a);
  // Nearer to a first (stable); NaN distances go to b's side.
  const int32_t *mid = std::stable_partition(ids, ids + n, [&](int32_t x) {
    return dist(x, a) <= dist(x, b);
  });
  int32_t left = (int32_t)(mid - ids);
  if (left == 0 || left == n) left = n / 2;  // all equidistant: halves
  bisect(ids, left, d, m);
  bisect(ids + left, n - left, d, m);
}

// Splits the widest groups, round after round, until there are
// max_groups (or no group with two different members is left): a group's
// member farthest from its landmark becomes the landmark of a new group,
// and each of the group's members goes to the nearer of the two (ties:
// the old one), by its value in double computed here. Landmarks sampled
// evenly from the rows miss the small clusters of a clustered set, whose
// rows then widen the group of some far landmark, and one such group
// makes every bound of the parts it touches useless; the widest groups
// are exactly those (a batched farthest-point traversal, each split a
// group's own). The choice is a function of the row's bits, so equal rows
// stay in one group; any assignment is exact, as the radii come from the
// values. Each round at most doubles the groups.
void split_wide_groups(const float *rows, int64_t n, int dim, KnnMetric metric,
                       int32_t max_groups, int n_threads, const int32_t *cancel,
                       std::vector<float> *landmarks, int32_t *m, int32_t *group,
                       double *value) {
  const bool l1 = metric == KNN_METRIC_L1;
  std::vector<int64_t> begin;
  std::vector<int64_t> member(n);
  for (int round = 0; round < 16 && *m < max_groups; round++) {
    const int32_t groups = *m;
    // Members by group (a stable counting sort).
    begin.assign((size_t)groups + 1, 0);
    for (int64_t i = 0; i < n; i++) begin[(size_t)group[i] + 1]++;
    for (int32_t g = 0; g < groups; g++) begin[g + 1] += begin[g];
    {
      std::vector<int64_t> next(begin.begin(), begin.end() - 1);
      for (int64_t i = 0; i < n; i++) member[next[group[i]]++] = i;
    }
    // Each group's farthest member (the first of the largest value).
    std::vector<int64_t> far(groups, -1);
    std::vector<double> widest(groups, 0.0);
    cpu::parallel_for(groups, n_threads, cancel, [&](int64_t g, int) {
      for (int64_t j = begin[g]; j < begin[g + 1]; j++) {
        const double v = value[member[j]];
        if (v > widest[g]) {
          widest[g] = v;
          far[g] = member[j];
        }
      }
    });
    std::vector<int32_t> by_width;
    for (int32_t g = 0; g < groups; g++)
      if (far[g] >= 0) by_width.push_back(g);
    if (by_width.empty()) return;
    std::stable_sort(by_width.begin(), by_width.end(),
                     [&](int32_t a, int32_t b) { return widest[a] > widest[b]; });
    const size_t splits = std::min<size_t>(by_width.size(), (size_t)(max_groups - groups));
    landmarks->resize((size_t)(groups + splits) * dim);
    for (size_t s = 0; s < splits; s++)
      std::memcpy(landmarks->data() + (groups + s) * dim, rows + far[by_width[s]] * dim,
                  dim * sizeof(float));
    cpu::parallel_for((int64_t)splits, n_threads, cancel, [&](int64_t s, int) {
      const int32_t g = by_width[s], fresh = groups + (int32_t)s;
      const float *l = landmarks->data() + (size_t)fresh * dim;
      for (int64_t j = begin[g]; j < begin[g + 1]; j++) {
        const int64_t i = member[j];
        const float *x = rows + i * dim;
        double v = 0;
        for (int d = 0; d < dim; d++) {
          const double diff = (double)x[d] - (double)l[d];
          v += l1 ? std::fabs(diff) : diff * diff;
        }
        if (v < value[i]) {
          value[i] = v;
          group[i] = fresh;
        }
      }
    });
    if (cancel != nullptr && *cancel) return;
    *m = groups + (int32_t)splits;
  }
}

// Copies of host arrays, cut into pieces of about 1 MB shared among up to
// n_threads threads (one thread moves some 10 GB/s; the assignment's
// chunks move several MB each way).
struct HostCopy {
  void *dst;
  const void *src;
  size_t bytes;
};

void parallel_copies(const HostCopy *copies, int n_copies, int n_threads) {
  constexpr size_t kPiece = size_t(1) << 20;
  std::vector<std::pair<int, size_t>> pieces;  // (copy, offset)
  for (int c = 0; c < n_copies; c++)
    for (size_t at = 0; at < copies[c].bytes; at += kPiece) pieces.emplace_back(c, at);
  cpu::parallel_for((int64_t)pieces.size(), n_threads, nullptr, [&](int64_t i, int) {
    const HostCopy &c = copies[pieces[i].first];
    const size_t at = pieces[i].second;
    std::memcpy(static_cast<unsigned char *>(c.dst) + at,
                static_cast<const unsigned char *>(c.src) + at, std::min(kPiece, c.bytes - at));
  });
}

// The assignment's pinned host memory: two buffers of rows going up and
// two of results coming down, so that the host fills and empties one pair
// while the device works on the other. The device's staging slices
// (host_transfer.cuh: no other transfer of the join runs meanwhile), else
// allocated here.
struct ChunkBuffers {
  unsigned char *in[2] = {nullptr, nullptr}, *out[2] = {nullptr, nullptr};
  size_t bytes = 0;  // of each
  PinnedBuffer<unsigned char> own[4];

  KnnStatus reserve(DeviceContext &ctx, size_t want) {
    if (ctx.staging != nullptr) {
      KNN_TRY(ctx.staging->reserve(ctx, 2));  // slices 0..3
      bytes = PinnedStaging::kSliceBytes;
      for (int b = 0; b < 2; b++) {
        in[b] = ctx.staging->slice(b);
        out[b] = ctx.staging->slice(2 + b);
      }
      return KNN_OK;
    }
    bytes = std::max<size_t>(want, 1);
    for (int i = 0; i < 4; i++) KNN_TRY(own[i].allocate(ctx, bytes));
    for (int b = 0; b < 2; b++) {
      in[b] = own[b].get();
      out[b] = own[2 + b].get();
    }
    return KNN_OK;
  }
};

// Waits for the streams when it goes out of scope (every return path):
// the pinned buffers must not be reused or freed under a copy still queued,
// nor the device buffers freed (on ctx.stream) under the other's work.
struct StreamsWait {
  cudaStream_t a, b;
  ~StreamsWait() {
    if (b != nullptr) (void)cudaStreamSynchronize(b);
    (void)cudaStreamSynchronize(a);
  }
};

// Every row's nearest landmark (group), the hash of its bits and, where
// `value` is not null, its value to the landmark; widest[g]: group g's
// largest value as bits (nearest_landmark_kernel). Streamed in chunks
// within the budget, pipelined: chunk c goes on stream c % 2 (ctx.stream
// and one of its own), each with its device buffers and its pair of pinned
// buffers, so that one chunk's upload overlaps the other's kernel and
// download, and the host empties chunk c - 2's results and fills chunk c's
// rows while the device works on chunk c - 1 (one event per pair says when
// the device is done with it). *chunks: how many (trace).
KnnStatus assign_rows(const float *rows, int64_t n, int dim, KnnMetric metric,
                      const std::vector<float> &sample, int32_t m, size_t budget, int n_threads,
                      int32_t *group, uint64_t *hash, double *value, unsigned long long *widest,
                      int64_t *chunks_used, DeviceContext &ctx) {
  MemoryBudget mem(budget);
  DeviceBuffer<float> landmarks;
  DeviceBuffer<unsigned long long> widest_device;
  KNN_TRY(mem.allocate(ctx, landmarks, sample.size(), "landmarks"));
  KNN_TRY(mem.allocate(ctx, widest_device, (size_t)m, "landmark assignment"));
  CUDA_CHECK(ctx, cudaMemcpyAsync(landmarks.get(), sample.data(), sample.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, ctx.stream));
  CUDA_CHECK(ctx, cudaMemsetAsync(widest_device.get(), 0, (size_t)m * sizeof(unsigned long long),
                                  ctx.stream));
  const size_t row_bytes = (size_t)dim * sizeof(float);
  // Results of a row: hash, value (only to split groups), group.
  const size_t out_bytes =
      sizeof(uint64_t) + (value != nullptr ? sizeof(double) : 0) + sizeof(int32_t);
  // Two chunks' buffers within half of what is left (as one was before).
  const size_t room = budget > mem.used() ? (budget - mem.used()) / 4 : 0;
  int64_t chunk = std::min<int64_t>(n, std::max<int64_t>(64, room / (row_bytes + out_bytes)));
  ChunkBuffers buffers;
  KNN_TRY(buffers.reserve(ctx, std::min(PinnedStaging::kSliceBytes,
                                        (size_t)chunk * std::max(row_bytes, out_bytes))));
  chunk = std::max<int64_t>(
      1, std::min<int64_t>({chunk, (int64_t)(buffers.bytes / row_bytes),
                            (int64_t)(buffers.bytes / out_bytes)}));
  const int64_t chunks = (n + chunk - 1) / chunk;
  *chunks_used = chunks;
  const uint64_t seed = hash_seed();
  const int lanes = chunks > 1 ? 2 : 1;
  DeviceBuffer<float> x[2];
  DeviceBuffer<int32_t> g[2];
  DeviceBuffer<double> v[2];
  DeviceBuffer<uint64_t> h[2];
  for (int b = 0; b < lanes; b++) {
    KNN_TRY(mem.allocate(ctx, x[b], (size_t)chunk * dim, "points"));
    KNN_TRY(mem.allocate(ctx, h[b], (size_t)chunk, "row hashes"));
    KNN_TRY(mem.allocate(ctx, g[b], (size_t)chunk, "landmark assignment"));
    if (value != nullptr) KNN_TRY(mem.allocate(ctx, v[b], (size_t)chunk, "landmark assignment"));
  }
  Stream side;
  if (lanes > 1) KNN_TRY(side.create(ctx));
  const cudaStream_t stream[2] = {ctx.stream, side.get()};
  Event done[2];
  KNN_TRY(done[0].create(ctx));
  KNN_TRY(done[1].create(ctx));
  const StreamsWait wait{ctx.stream, side.get()};
  // The buffers were allocated on ctx.stream: usable on the other once it
  // is waited for.
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  // Where chunk c's results lie in its pinned buffer.
  const size_t hash_at = 0, value_at = (size_t)chunk * sizeof(uint64_t),
               group_at = value_at + (value != nullptr ? (size_t)chunk * sizeof(double) : 0);
  // The host's copies of one step, on several threads at once: chunk
  // `take`'s results out of its pinned buffer (its event waited for first)
  // and chunk `fill`'s rows into its own (-1: none).
  auto host_step = [&](int64_t take, int64_t fill) -> KnnStatus {
    HostCopy copies[4];
    int n_copies = 0;
    if (take >= 0) {
      const int b = (int)(take % 2);
      const int64_t first = take * chunk, count = std::min(chunk, n - first);
      CUDA_CHECK(ctx, cudaEventSynchronize(done[b].get()));
      const unsigned char *o = buffers.out[b];
      copies[n_copies++] = {hash + first, o + hash_at, (size_t)count * sizeof(uint64_t)};
      copies[n_copies++] = {group + first, o + group_at, (size_t)count * sizeof(int32_t)};
      if (value != nullptr)
        copies[n_copies++] = {value + first, o + value_at, (size_t)count * sizeof(double)};
    }
    if (fill >= 0) {
      const int64_t first = fill * chunk, count = std::min(chunk, n - first);
      copies[n_copies++] = {buffers.in[fill % 2], rows + first * dim, (size_t)count * row_bytes};
    }
    parallel_copies(copies, n_copies, n_threads);
    return KNN_OK;
  };
  // Queues chunk c (its rows filled) on its stream.
  auto queue_chunk = [&](int64_t c) -> KnnStatus {
    const int b = (int)(c % 2);
    const cudaStream_t s = stream[b];
    const int64_t first = c * chunk, count = std::min(chunk, n - first);
    CUDA_CHECK(ctx, cudaMemcpyAsync(x[b].get(), buffers.in[b], (size_t)count * row_bytes,
                                    cudaMemcpyHostToDevice, s));
    const unsigned grid = grid_for(count, kAssignThreads);
    if (metric == KNN_METRIC_L1)
      nearest_landmark_kernel<true><<<grid, kAssignThreads, 0, s>>>(
          x[b].get(), count, dim, landmarks.get(), m, g[b].get(), v[b].get(), h[b].get(),
          widest_device.get(), seed);
    else
      nearest_landmark_kernel<false><<<grid, kAssignThreads, 0, s>>>(
          x[b].get(), count, dim, landmarks.get(), m, g[b].get(), v[b].get(), h[b].get(),
          widest_device.get(), seed);
    CUDA_CHECK_LAUNCH(ctx, "nearest_landmark_kernel");
    unsigned char *o = buffers.out[b];
    CUDA_CHECK(ctx, cudaMemcpyAsync(o + hash_at, h[b].get(), (size_t)count * sizeof(uint64_t),
                                    cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(ctx, cudaMemcpyAsync(o + group_at, g[b].get(), (size_t)count * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, s));
    if (value != nullptr)
      CUDA_CHECK(ctx, cudaMemcpyAsync(o + value_at, v[b].get(), (size_t)count * sizeof(double),
                                      cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(ctx, cudaEventRecord(done[b].get(), s));
    return KNN_OK;
  };
  // Step c: chunk c - 2's results taken and chunk c's rows filled (pair
  // c % 2, which chunk c - 2 has just given back), while the device works
  // on chunk c - 1; then chunk c queued.
  for (int64_t c = 0; c < chunks; c++) {
    KNN_TRY(ctx.cancel_point());
    KNN_TRY(host_step(c >= 2 ? c - 2 : -1, c));
    KNN_TRY(queue_chunk(c));
  }
  for (int64_t c = std::max<int64_t>(0, chunks - 2); c < chunks; c++) KNN_TRY(host_step(c, -1));
  // Every chunk's kernel is done (its event waited for).
  CUDA_CHECK(ctx, cudaMemcpyAsync(widest, widest_device.get(),
                                  (size_t)m * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                  ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  return KNN_OK;
}

// A group's radius from its largest value's bits (NaN: infinite, so that
// nothing is ever skipped past it), widened by kHostSlack.
double radius_of(unsigned long long widest_bits, KnnMetric metric) {
  if (widest_bits > 0x7ff0000000000000ull) return std::numeric_limits<double>::infinity();
  double v;
  std::memcpy(&v, &widest_bits, sizeof v);
  const double d = metric == KNN_METRIC_L1 ? v : std::sqrt(v);
  return std::max(0.0, d * (1 + kHostSlack));
}

// Duplicates are found piece by piece, in parallel: a group is cut into
// pieces of at most kDedupPiece consecutive positions, and each piece's
// points are found in first-occurrence order. A group of several pieces
// then merges its pieces' points: taken piece after piece they come by
// ascending first position, and dealt by hash into buckets (equal rows,
// equal hashes: all the pieces' points of one distinct point meet in one
// bucket), each merging its share in parallel; the group's points are
// those that come first, in that order, and each point's rows stay
// ascending (piece after piece, each piece's ascending).
constexpr int64_t kDedupPiece = 16384;

// A piece's arrays lie in scratch memory the order no longer needs, at the
// piece's positions (a piece has at most as many points as positions):
// id, per position, its point in the piece; first and count, per point, its
// first position and its rows, then where its next row goes.
struct DedupPiece {
  int64_t begin = 0, end = 0;      // positions
  int64_t points = 0;
  int32_t *id = nullptr, *first = nullptr, *count = nullptr;
};

// A group of several pieces, merged: its pieces' points one after the
// other (flat), each with the first of them equal to it (same) and the
// group's point it is (point).
struct DedupMerge {
  std::vector<int32_t> first, count, same, point;
  std::vector<std::vector<int32_t>> bucket;  // flat indices, ascending
  std::vector<int64_t> rows_of;              // per group point
};

// Open addressing: point ids by their rows' hash. slot() returns the slot
// of the point that `same` accepts, or the empty slot (-1) where it goes.
// The start slot is a multiplicative mix of the whole hash, so that hashes
// differing in any bits spread over the table.
class PointTable {
 public:
  void reset(size_t points) {
    int bits = 4;
    while (((size_t)1 << bits) < 2 * points) bits++;
    shift_ = 64 - bits;
    slots_.assign((size_t)1 << bits, -1);
  }
  template <class Same>
  int32_t *slot(uint64_t h, Same same) {
    const size_t mask = slots_.size() - 1;
    for (size_t s = (size_t)((h * 0x9e3779b97f4a7c15ull) >> shift_);; s = (s + 1) & mask) {
      int32_t &e = slots_[s];
      if (e < 0 || same(e)) return &e;
    }
  }

 private:
  std::vector<int32_t> slots_;
  int shift_ = 60;
};

}  // namespace

KnnStatus SpatialOrder::build(const float *rows, int64_t n, int dim_, KnnMetric metric,
                              int32_t groups, bool dedup, size_t budget, DeviceContext &ctx) {
  dim = dim_;
  perm.clear();
  distinct_begin.clear();
  if ((metric != KNN_METRIC_L2 && metric != KNN_METRIC_L1) || n < 2 || dim < 1 ||
      dim > kTileFloats)
    return KNN_OK;
  // Landmarks take at most an eighth of the budget.
  const int64_t fit = (int64_t)(budget / 8 / ((size_t)dim * sizeof(float)));
  int32_t m = (int32_t)std::max<int64_t>(1, std::min<int64_t>({(int64_t)groups, n, fit}));
  // Landmarks: rows spread evenly over the side.
  std::vector<float> sample((size_t)m * dim);
  for (int32_t g = 0; g < m; g++)
    std::memcpy(sample.data() + (size_t)g * dim, rows + (n * g / m) * (int64_t)dim,
                dim * sizeof(float));

  // The widest groups split where KNN_TI_ORDER_SPLIT=F (A/B), up to F
  // times the groups (2..8; 1 means 4): on the 5M x 8 clustered set at 1/4
  // four times cut the visited pairs from 1084 to 888 but cost as much in
  // the order (2048 groups) as it saved (H100), and on kdd it only slowed
  // the order; so the sampled landmarks stay the default. Only the split
  // needs each row's value on the host.
  const char *split = std::getenv("KNN_TI_ORDER_SPLIT");
  const int factor = split == nullptr ? 0 : std::atoi(split) == 1 ? 4 : std::atoi(split);

  const Clock::time_point t0 = Clock::now();
  // Assignment, streamed through the device (assign_rows). The per-row
  // arrays are left uninitialized: the copies out of the pinned buffers
  // touch their pages first, on several threads.
  std::unique_ptr<int32_t[]> group(new int32_t[n]);
  std::unique_ptr<uint64_t[]> hash(new uint64_t[n]);
  std::unique_ptr<double[]> value(factor >= 2 ? new double[n] : nullptr);
  // Their pages touched first on all threads, not in the pipeline's copies.
  {
    const int64_t slice = 1 << 18;
    cpu::parallel_for((n + slice - 1) / slice, n_threads, nullptr, [&](int64_t s, int) {
      const int64_t first = s * slice, count = std::min(slice, n - first);
      std::memset(group.get() + first, 0, (size_t)count * sizeof(int32_t));
      std::memset(hash.get() + first, 0, (size_t)count * sizeof(uint64_t));
    });
  }
  std::vector<unsigned long long> widest((size_t)m);
  int64_t chunks = 0;
  KNN_TRY(assign_rows(rows, n, dim, metric, sample, m, budget, n_threads, group.get(), hash.get(),
                      value.get(), widest.data(), &chunks, ctx));
  const double transfer_seconds = seconds_since(t0);

  const Clock::time_point t_split = Clock::now();
  if (factor >= 2) {
    const int32_t most = (int32_t)std::min<int64_t>(
        {n, (int64_t)kMaxGroups, (int64_t)std::min(factor, 8) * m, fit});
    split_wide_groups(rows, n, dim, metric, most, n_threads, ctx.cancel, &sample, &m,
                      group.get(), value.get());
    KNN_TRY(ctx.cancel_point());
    // The groups' largest values again, after the split.
    widest.assign((size_t)m, 0);
    for (int64_t i = 0; i < n; i++) {
      unsigned long long bits;
      std::memcpy(&bits, &value[i], sizeof bits);
      widest[group[i]] = std::max(widest[group[i]], bits);
    }
  }
  split_seconds = seconds_since(t_split);

  // The landmarks' order: leaves of a recursive bisection (two far-apart
  // pivots, each landmark to the nearer one), depth first. Any run of
  // consecutive groups then lies mostly within one small subtree, where a
  // greedy nearest-neighbour tour leaves a tail hopping between regions.
  std::vector<double> between((size_t)m * m);
  cpu::parallel_for(m, n_threads, ctx.cancel, [&](int64_t a, int) {
    for (int32_t b = 0; b < m; b++)
      between[(size_t)a * m + b] = host_distance(sample.data() + (size_t)a * dim,
                                                 sample.data() + (size_t)b * dim, dim, metric);
  });
  KNN_TRY(ctx.cancel_point());
  std::vector<int32_t> tour(m);
  for (int32_t a = 0; a < m; a++) tour[a] = a;
  bisect(tour.data(), m, between.data(), m);
  std::vector<int32_t> rank(m);
  for (int32_t r = 0; r < m; r++) rank[tour[r]] = r;

  // Group radii (from the largest value, the same as the largest of the
  // rows' radii: the square root and the widening are monotone).
  radius.assign(m, 0.0);
  for (int32_t r = 0; r < m; r++) radius[r] = radius_of(widest[tour[r]], metric);
  // Rows by group in tour order: a stable counting sort in slices of rows,
  // in parallel (each slice's rows of a group go after the slices' before).
  const Clock::time_point t_sort = Clock::now();
  const int64_t slice =
      std::max<int64_t>(1 << 16, (n + 4 * (int64_t)n_threads - 1) / (4 * (int64_t)n_threads));
  const int64_t slices = (n + slice - 1) / slice;
  std::vector<int64_t> at((size_t)(slices * m), 0);
  cpu::parallel_for(slices, n_threads, ctx.cancel, [&](int64_t s, int) {
    int64_t *count = at.data() + s * m;
    for (int64_t i = s * slice, end = std::min(n, (s + 1) * slice); i < end; i++)
      count[rank[group[i]]]++;
  });
  KNN_TRY(ctx.cancel_point());
  group_begin.assign((size_t)m + 1, 0);
  int64_t total = 0;
  for (int32_t r = 0; r < m; r++) {
    group_begin[r] = total;
    for (int64_t s = 0; s < slices; s++) {
      const int64_t c = at[(size_t)(s * m + r)];
      at[(size_t)(s * m + r)] = total;
      total += c;
    }
  }
  group_begin[m] = total;
  perm.resize(n);
  // With each position, its row's hash (what the duplicates pass reads,
  // position after position).
  std::unique_ptr<uint64_t[]> hash_at(dedup ? new uint64_t[n] : nullptr);
  cpu::parallel_for(slices, n_threads, ctx.cancel, [&](int64_t s, int) {
    int64_t *next = at.data() + s * m;
    for (int64_t i = s * slice, end = std::min(n, (s + 1) * slice); i < end; i++) {
      const int64_t p = next[rank[group[i]]]++;
      perm[p] = (int32_t)i;
      if (dedup) hash_at[p] = hash[i];
    }
  });
  KNN_TRY(ctx.cancel_point());
  const double sort_seconds = seconds_since(t_sort);
  const Clock::time_point t1 = Clock::now();
  // (The per-row arrays, no longer needed, are the duplicates' scratch.)
  mark_distinct(rows, hash_at.get(), group.get(), reinterpret_cast<int32_t *>(hash.get()), dedup,
                ctx.cancel);
  KNN_TRY(ctx.cancel_point());
  dedup_seconds = seconds_since(t1);
  assign_seconds = std::chrono::duration<double>(t1 - t0).count();
  landmark.resize(sample.size());
  for (int32_t r = 0; r < m; r++)
    std::memcpy(landmark.data() + (size_t)r * dim, sample.data() + (size_t)tour[r] * dim,
                dim * sizeof(float));
  const char *trace = std::getenv("KNN_TI_TRACE");
  if (trace != nullptr && trace[0] == '1')
    std::fprintf(stderr,
                 "[ti order] %lld x %d: assignment %.4f s (device loop %.4f: %lld chunks; "
                 "sort %.4f), duplicates %.4f s (pieces %.4f, merges %.4f, starts %.4f, "
                 "layout %.4f, rows %.4f)\n",
                 (long long)n, dim, assign_seconds, transfer_seconds, (long long)chunks,
                 sort_seconds, dedup_seconds, dedup_phase_seconds[0], dedup_phase_seconds[1],
                 dedup_phase_seconds[2], dedup_phase_seconds[3], dedup_phase_seconds[4]);
  return KNN_OK;
}

void SpatialOrder::mark_distinct(const float *rows, uint64_t *hash_at, int32_t *id_scratch,
                                 int32_t *point_scratch, bool dedup, const int32_t *cancel) {
  const int64_t n = (int64_t)perm.size();
  const int64_t groups = (int64_t)group_begin.size() - 1;
  distinct_begin.clear();
  if (!dedup) {
    distinct_begin.resize(n + 1);
    for (int64_t i = 0; i <= n; i++) distinct_begin[i] = i;
    return;
  }
  auto cancelled = [&] { return cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED); };
  Clock::time_point t_phase = Clock::now();
  auto lap = [&](int phase) {
    const Clock::time_point now = Clock::now();
    dedup_phase_seconds[phase] = std::chrono::duration<double>(now - t_phase).count();
    t_phase = now;
  };
  const size_t row_bytes = (size_t)dim * sizeof(float);
  // Whether the rows at positions a and b are bitwise equal.
  auto equal_at = [&](int64_t a, int64_t b) {
    return hash_at[a] == hash_at[b] &&
           std::memcmp(rows + (int64_t)perm[a] * dim, rows + (int64_t)perm[b] * dim,
                       row_bytes) == 0;
  };
  // The pieces, group by group (piece_at: each group's first).
  std::vector<DedupPiece> pieces;
  std::vector<int64_t> piece_at((size_t)groups + 1, 0);
  for (int64_t g = 0; g < groups; g++) {
    piece_at[g] = (int64_t)pieces.size();
    for (int64_t b = group_begin[g]; b < group_begin[g + 1]; b += kDedupPiece) {
      pieces.emplace_back();
      DedupPiece &piece = pieces.back();
      piece.begin = b;
      piece.end = std::min(group_begin[g + 1], b + kDedupPiece);
      piece.id = id_scratch + b;
      piece.first = point_scratch + b;
      piece.count = point_scratch + n + b;
    }
  }
  piece_at[groups] = (int64_t)pieces.size();
  const int64_t n_pieces = (int64_t)pieces.size();
  auto several = [&](int64_t g) { return piece_at[g + 1] - piece_at[g] > 1; };
  std::vector<PointTable> tables(
      (size_t)cpu::parallel_workers(std::max<int64_t>(n_pieces, 1), n_threads));

  // 1. Each piece's points: a row is looked up by its hash among the
  // piece's points so far and compared bit for bit with their first rows
  // (after the point of the row before: copies often come in runs).
  cpu::parallel_for(n_pieces, n_threads, cancel, [&](int64_t i, int worker) {
    DedupPiece &piece = pieces[i];
    const int64_t size = piece.end - piece.begin;
    PointTable &table = tables[worker];
    table.reset((size_t)size);
    int32_t previous = -1;
    for (int64_t e = 0; e < size; e++) {
      const int64_t j = piece.begin + e;
      if (previous >= 0 && equal_at(j, piece.first[previous])) {
        piece.id[e] = previous;
        piece.count[previous]++;
        continue;
      }
      int32_t *slot =
          table.slot(hash_at[j], [&](int32_t c) { return equal_at(j, piece.first[c]); });
      if (*slot < 0) {
        *slot = (int32_t)piece.points;
        piece.first[piece.points] = (int32_t)j;
        piece.count[piece.points++] = 0;
      }
      piece.id[e] = *slot;
      piece.count[*slot]++;
      previous = *slot;
    }
  });
  if (cancelled()) return;
  lap(0);

  // 2. Groups of several pieces: their pieces' points dealt into buckets,
  // by hash (the groups of the most pieces first: the longest passes).
  std::vector<int64_t> by_size(groups);
  for (int64_t g = 0; g < groups; g++) by_size[g] = g;
  std::stable_sort(by_size.begin(), by_size.end(), [&](int64_t a, int64_t b) {
    return piece_at[a + 1] - piece_at[a] > piece_at[b + 1] - piece_at[b];
  });
  std::vector<DedupMerge> merges((size_t)groups);
  cpu::parallel_for(groups, n_threads, cancel, [&](int64_t i, int) {
    const int64_t g = by_size[i];
    if (!several(g)) return;
    DedupMerge &merge = merges[g];
    for (int64_t p = piece_at[g]; p < piece_at[g + 1]; p++) {
      const DedupPiece &piece = pieces[p];
      merge.first.insert(merge.first.end(), piece.first, piece.first + piece.points);
      merge.count.insert(merge.count.end(), piece.count, piece.count + piece.points);
    }
    const int64_t flat = (int64_t)merge.first.size();
    const int64_t nb = (flat + kDedupPiece - 1) / kDedupPiece;
    merge.bucket.resize(nb);
    merge.same.resize(flat);
    for (int64_t f = 0; f < flat; f++)
      merge.bucket[(hash_at[merge.first[f]] >> 32) % (uint64_t)nb].push_back((int32_t)f);
  });
  if (cancelled()) return;
  // Each bucket: each of its points to the first equal to it.
  std::vector<std::pair<int64_t, int64_t>> merge_buckets;  // (group, bucket)
  for (int64_t g = 0; g < groups; g++)
    for (size_t b = 0; b < merges[g].bucket.size(); b++) merge_buckets.emplace_back(g, b);
  cpu::parallel_for((int64_t)merge_buckets.size(), n_threads, cancel, [&](int64_t i, int worker) {
    DedupMerge &merge = merges[merge_buckets[i].first];
    const std::vector<int32_t> &share = merge.bucket[merge_buckets[i].second];
    PointTable &table = tables[worker % tables.size()];
    table.reset(share.size());
    for (int32_t f : share) {
      const int64_t j = merge.first[f];
      int32_t *slot =
          table.slot(hash_at[j], [&](int32_t c) { return equal_at(j, merge.first[c]); });
      if (*slot < 0) *slot = f;
      merge.same[f] = *slot;
    }
  });
  if (cancelled()) return;

  // 3. The group's points: those first of their kind, by first position
  // (flat order), and the rows of each. points: per group.
  std::vector<int64_t> points((size_t)groups + 1, 0);
  cpu::parallel_for(groups, n_threads, cancel, [&](int64_t i, int) {
    const int64_t g = by_size[i];
    if (!several(g)) {
      points[g] = piece_at[g + 1] > piece_at[g] ? pieces[piece_at[g]].points : 0;
      return;
    }
    DedupMerge &merge = merges[g];
    const size_t flat = merge.first.size();
    merge.point.resize(flat);
    for (size_t f = 0; f < flat; f++) {
      if (merge.same[f] == (int32_t)f) {
        merge.point[f] = (int32_t)merge.rows_of.size();
        merge.rows_of.push_back(0);
      } else {
        merge.point[f] = merge.point[merge.same[f]];
      }
      merge.rows_of[merge.point[f]] += merge.count[f];
    }
    points[g] = (int64_t)merge.rows_of.size();
  });
  if (cancelled()) return;
  lap(1);

  // 4. The distinct points' starts, and where each piece's rows of each of
  // its points go (its count becomes that place).
  std::vector<int64_t> first_point((size_t)groups + 1, 0);
  for (int64_t g = 0; g < groups; g++) first_point[g + 1] = first_point[g] + points[g];
  distinct_begin.resize((size_t)first_point[groups] + 1);
  distinct_begin[first_point[groups]] = n;
  lap(2);
  cpu::parallel_for(groups, n_threads, cancel, [&](int64_t i, int) {
    const int64_t g = by_size[i];
    int64_t *starts = distinct_begin.data() + first_point[g];
    int64_t at = group_begin[g];
    if (!several(g)) {
      if (piece_at[g + 1] == piece_at[g]) return;
      const DedupPiece &piece = pieces[piece_at[g]];
      int32_t *count = piece.count;
      for (int64_t c = 0; c < piece.points; c++) {
        starts[c] = at;
        const int32_t rows_of = count[c];
        count[c] = (int32_t)at;
        at += rows_of;
      }
      return;
    }
    const DedupMerge &merge = merges[g];
    std::vector<int64_t> next(merge.rows_of.size());
    for (size_t q = 0; q < next.size(); q++) {
      starts[q] = at;
      next[q] = at;
      at += merge.rows_of[q];
    }
    size_t f = 0;
    for (int64_t p = piece_at[g]; p < piece_at[g + 1]; p++)
      for (int64_t c = 0; c < pieces[p].points; c++) {
        int32_t &count = pieces[p].count[c];
        const int32_t q = merge.point[f++];
        const int32_t rows_of = count;
        count = (int32_t)next[q];
        next[q] += rows_of;
      }
  });
  if (cancelled()) return;
  lap(3);

  // 5. Point by point, rows ascending: each piece's rows to their places
  // (in the hashes' memory, no longer read), then back into perm.
  int32_t *sorted = reinterpret_cast<int32_t *>(hash_at);
  cpu::parallel_for(n_pieces, n_threads, cancel, [&](int64_t i, int) {
    DedupPiece &piece = pieces[i];
    for (int64_t j = piece.begin; j < piece.end; j++)
      sorted[piece.count[piece.id[j - piece.begin]]++] = perm[j];
  });
  if (cancelled()) return;
  cpu::parallel_for(n_pieces, n_threads, cancel, [&](int64_t i, int) {
    const DedupPiece &piece = pieces[i];
    std::memcpy(perm.data() + piece.begin, sorted + piece.begin,
                (size_t)(piece.end - piece.begin) * sizeof(int32_t));
  });
  lap(4);
}

void SpatialOrder::gather(const float *rows, int64_t first, int64_t count, float *out) const {
  // Slices of about 4 MB: a small part is copied without starting threads.
  const int64_t slice = std::max<int64_t>(1024, (4 << 20) / ((int64_t)dim * sizeof(float)));
  cpu::parallel_for((count + slice - 1) / slice, n_threads, nullptr, [&](int64_t s, int) {
    const int64_t end = std::min(count, (s + 1) * slice);
    for (int64_t i = s * slice; i < end; i++)
      std::memcpy(out + i * dim, rows + (int64_t)perm[first + i] * dim, dim * sizeof(float));
  });
}

void SpatialOrder::groups_of(int64_t first, int64_t count, int32_t *lo, int32_t *hi) const {
  auto group_at = [&](int64_t position) {
    return (int32_t)(std::upper_bound(group_begin.begin(), group_begin.end(), position) -
                     group_begin.begin() - 1);
  };
  *lo = group_at(first);
  *hi = group_at(first + std::max<int64_t>(count, 1) - 1);
}

std::vector<double> landmark_distances(const SpatialOrder &q, const SpatialOrder &t,
                                       KnnMetric metric, const int32_t *cancel) {
  const int64_t mq = (int64_t)q.radius.size(), mt = (int64_t)t.radius.size();
  std::vector<double> out((size_t)(mq * mt));
  cpu::parallel_for(mq, q.n_threads, cancel, [&](int64_t a, int) {
    for (int64_t b = 0; b < mt; b++)
      out[(size_t)(a * mt + b)] = host_distance(q.landmark.data() + a * q.dim,
                                                t.landmark.data() + b * t.dim, q.dim, metric);
  });
  return out;
}

double part_distance_bound(const SpatialOrder &q, int64_t qf, int64_t qc, const SpatialOrder &t,
                           int64_t tf, int64_t tc, const std::vector<double> &centre,
                           KnnMetric metric) {
  (void)metric;
  int32_t qlo, qhi, tlo, thi;
  q.groups_of(qf, qc, &qlo, &qhi);
  t.groups_of(tf, tc, &tlo, &thi);
  const size_t mt = t.radius.size();
  double bound = std::numeric_limits<double>::infinity();
  for (int32_t a = qlo; a <= qhi; a++)
    for (int32_t b = tlo; b <= thi; b++) {
      const double c = centre[(size_t)a * mt + b];
      const double lb = c - q.radius[a] - t.radius[b] - kHostSlack * (c + q.radius[a] + t.radius[b]);
      if (std::isnan(lb)) return -std::numeric_limits<double>::infinity();
      bound = std::min(bound, lb);
    }
  return bound;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
