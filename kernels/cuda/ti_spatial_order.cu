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
// Duplicates: the same pass hashes each row's bits (64 bits). Equal rows
// get the same landmark (the search is a function of the bits), so they
// share a group; within a group
// (rows ascending) each row is looked up by its hash among the group's
// distinct points so far and compared bit for bit with their first rows:
// equal, it joins that point; else it starts a new one. The group's
// positions are then laid out point by point (first occurrence order),
// each point's rows ascending. Linear in the rows, and a group of many
// copies of a few points (kdd's largest) costs a lookup and a compare a
// row.
//
// Landmarks sampled evenly from the rows miss the small clusters of a
// clustered set; their rows widen some far landmark's group and spoil the
// bounds of every part that touches it. KNN_TI_ORDER_SPLIT=F splits the
// widest groups after the assignment (split_wide_groups), up to F times
// the groups asked for (an A/B knob: not worth its cost so far).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_map>

#include <math_constants.h>

#include "../cpu/parallel_for.h"
#include "host_transfer.cuh"
#include "ti_parts.cuh"
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
// double. Any landmark would do for exactness (the group's radius is what
// the bounds use, and it comes from the double value); the float search is
// only there to make groups compact, and it is a function of the row's
// bits, so equal rows always get the same landmark. Each thread holds
// kBatch sums, so that a row value read serves kBatch landmarks.
constexpr int kBatch = 8;

template <bool L1>
__global__ void nearest_landmark_kernel(const float *rows, int64_t n, int dim,
                                        const float *landmarks, int32_t m, int32_t *group,
                                        double *value, uint64_t *hash) {
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
    value[i] = v;
    group[i] = best_index;
    // The row's bits, mixed word by word (splitmix-style finaliser).
    uint64_t h = 0x6a09e667f3bcc909ull + (uint64_t)dim;
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
                       std::vector<float> *landmarks, int32_t *m, std::vector<int32_t> *group,
                       std::vector<double> *value) {
  const bool l1 = metric == KNN_METRIC_L1;
  std::vector<int64_t> begin;
  std::vector<int64_t> member(n);
  for (int round = 0; round < 16 && *m < max_groups; round++) {
    const int32_t groups = *m;
    // Members by group (a stable counting sort).
    begin.assign((size_t)groups + 1, 0);
    for (int64_t i = 0; i < n; i++) begin[(size_t)(*group)[i] + 1]++;
    for (int32_t g = 0; g < groups; g++) begin[g + 1] += begin[g];
    {
      std::vector<int64_t> next(begin.begin(), begin.end() - 1);
      for (int64_t i = 0; i < n; i++) member[next[(*group)[i]]++] = i;
    }
    // Each group's farthest member (the first of the largest value).
    std::vector<int64_t> far(groups, -1);
    std::vector<double> widest(groups, 0.0);
    cpu::parallel_for(groups, n_threads, cancel, [&](int64_t g, int) {
      for (int64_t j = begin[g]; j < begin[g + 1]; j++) {
        const double v = (*value)[member[j]];
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
        if (v < (*value)[i]) {
          (*value)[i] = v;
          (*group)[i] = fresh;
        }
      }
    });
    if (cancel != nullptr && *cancel) return;
    *m = groups + (int32_t)splits;
  }
}

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

  const Clock::time_point t0 = Clock::now();
  // Assignment, streamed through the device in chunks within the budget.
  std::vector<int32_t> group(n);
  std::vector<double> value(n);
  std::vector<uint64_t> hash(n);
  {
    MemoryBudget mem(budget);
    DeviceBuffer<float> landmarks;
    KNN_TRY(mem.allocate(ctx, landmarks, sample.size(), "landmarks"));
    CUDA_CHECK(ctx, cudaMemcpyAsync(landmarks.get(), sample.data(), sample.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, ctx.stream));
    const size_t per_row =
        (size_t)dim * sizeof(float) + sizeof(int32_t) + sizeof(double) + sizeof(uint64_t);
    const size_t room = budget > mem.used() ? (budget - mem.used()) / 2 : 0;
    const int64_t chunk = std::min<int64_t>(n, std::max<int64_t>(64, room / per_row));
    DeviceBuffer<float> x;
    DeviceBuffer<int32_t> g;
    DeviceBuffer<double> v;
    DeviceBuffer<uint64_t> h;
    KNN_TRY(mem.allocate(ctx, x, (size_t)chunk * dim, "points"));
    KNN_TRY(mem.allocate(ctx, h, (size_t)chunk, "row hashes"));
    KNN_TRY(mem.allocate(ctx, g, (size_t)chunk, "landmark assignment"));
    KNN_TRY(mem.allocate(ctx, v, (size_t)chunk, "landmark assignment"));
    // Through the device's pinned staging (host_transfer.cuh), which wants
    // its destinations allocated and synchronized; each chunk's downloads
    // wait for its kernel, so the next upload may overwrite x.
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    for (int64_t first = 0; first < n; first += chunk) {
      KNN_TRY(ctx.cancel_point());
      const int64_t count = std::min(chunk, n - first);
      KNN_TRY(upload_to_device(ctx, x.get(), rows + first * dim,
                               (size_t)count * dim * sizeof(float)));
      const unsigned grid = grid_for(count, kAssignThreads);
      if (metric == KNN_METRIC_L1)
        nearest_landmark_kernel<true><<<grid, kAssignThreads, 0, ctx.stream>>>(
            x.get(), count, dim, landmarks.get(), m, g.get(), v.get(), h.get());
      else
        nearest_landmark_kernel<false><<<grid, kAssignThreads, 0, ctx.stream>>>(
            x.get(), count, dim, landmarks.get(), m, g.get(), v.get(), h.get());
      CUDA_CHECK_LAUNCH(ctx, "nearest_landmark_kernel");
      KNN_TRY(download_to_host(ctx, group.data() + first, g.get(), count * sizeof(int32_t)));
      KNN_TRY(download_to_host(ctx, value.data() + first, v.get(), count * sizeof(double)));
      KNN_TRY(download_to_host(ctx, hash.data() + first, h.get(), count * sizeof(uint64_t)));
    }
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    mem.release(x);
    mem.release(g);
    mem.release(v);
    mem.release(h);
    mem.release(landmarks);
  }

  // The widest groups split where KNN_TI_ORDER_SPLIT=F (A/B), up to F
  // times the groups (2..8; 1 means 4): on the 5M x 8 clustered set at 1/4
  // four times cut the visited pairs from 1084 to 888 but cost as much in
  // the order (2048 groups) as it saved (H100), and on kdd it only slowed
  // the order; so the sampled landmarks stay the default.
  const Clock::time_point t_split = Clock::now();
  const char *split = std::getenv("KNN_TI_ORDER_SPLIT");
  const int factor = split == nullptr ? 0 : std::atoi(split) == 1 ? 4 : std::atoi(split);
  if (factor >= 2) {
    const int32_t most = (int32_t)std::min<int64_t>(
        {n, (int64_t)kMaxGroups, (int64_t)std::min(factor, 8) * m, fit});
    split_wide_groups(rows, n, dim, metric, most, n_threads, ctx.cancel, &sample,
                      &m, &group, &value);
    KNN_TRY(ctx.cancel_point());
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

  // Rows by group in tour order (a stable counting sort), group radii.
  group_begin.assign((size_t)m + 1, 0);
  radius.assign(m, 0.0);
  for (int64_t i = 0; i < n; i++) {
    const int32_t r = rank[group[i]];
    group_begin[(size_t)r + 1]++;
    const double d = metric == KNN_METRIC_L1 ? value[i] : std::sqrt(value[i]);
    // NaN (non-finite rows, which the join sends to brute force later)
    // makes the radius infinite: nothing is ever skipped past it.
    radius[r] = std::isnan(d) ? std::numeric_limits<double>::infinity()
                              : std::max(radius[r], d * (1 + kHostSlack));
  }
  for (int32_t r = 0; r < m; r++) group_begin[(size_t)r + 1] += group_begin[r];
  perm.resize(n);
  std::vector<int64_t> next(group_begin.begin(), group_begin.end() - 1);
  for (int64_t i = 0; i < n; i++) perm[next[rank[group[i]]]++] = (int32_t)i;
  const Clock::time_point t1 = Clock::now();
  mark_distinct(rows, hash, dedup, ctx.cancel);
  KNN_TRY(ctx.cancel_point());
  dedup_seconds = seconds_since(t1);
  assign_seconds = std::chrono::duration<double>(t1 - t0).count();
  landmark.resize(sample.size());
  for (int32_t r = 0; r < m; r++)
    std::memcpy(landmark.data() + (size_t)r * dim, sample.data() + (size_t)tour[r] * dim,
                dim * sizeof(float));
  return KNN_OK;
}

void SpatialOrder::mark_distinct(const float *rows, const std::vector<uint64_t> &hash,
                                 bool dedup, const int32_t *cancel) {
  const int64_t n = (int64_t)perm.size();
  const int64_t groups = (int64_t)group_begin.size() - 1;
  distinct_begin.clear();
  if (!dedup) {
    distinct_begin.resize(n + 1);
    for (int64_t i = 0; i <= n; i++) distinct_begin[i] = i;
    return;
  }
  std::vector<unsigned char> start(n, 0);
  const size_t row_bytes = (size_t)dim * sizeof(float);
  // The largest groups first: one of them may be most of the side.
  std::vector<int64_t> by_size(groups);
  for (int64_t g = 0; g < groups; g++) by_size[g] = g;
  std::sort(by_size.begin(), by_size.end(), [&](int64_t a, int64_t b) {
    return group_begin[a + 1] - group_begin[a] > group_begin[b + 1] - group_begin[b];
  });
  cpu::parallel_for(groups, n_threads, cancel, [&](int64_t i, int) {
    const int64_t g = by_size[i];
    int32_t *a = perm.data() + group_begin[g];
    const int64_t size = group_begin[g + 1] - group_begin[g];
    if (size == 0) return;
    // Distinct points of the group: first row, next point of equal hash.
    std::vector<int32_t> first_row, same_hash, count, id(size);
    std::unordered_map<uint64_t, int32_t> by_hash;
    int32_t previous = -1;  // the point of the row before: copies often come in runs
    for (int64_t j = 0; j < size; j++) {
      const int32_t r = a[j];
      if (previous >= 0 && hash[r] == hash[first_row[previous]] &&
          std::memcmp(rows + (int64_t)r * dim, rows + (int64_t)first_row[previous] * dim,
                      row_bytes) == 0) {
        id[j] = previous;
        count[previous]++;
        continue;
      }
      const auto found = by_hash.find(hash[r]);
      int32_t point = -1;
      if (found != by_hash.end())
        for (int32_t c = found->second; c >= 0 && point < 0; c = same_hash[c])
          if (std::memcmp(rows + (int64_t)r * dim, rows + (int64_t)first_row[c] * dim,
                          row_bytes) == 0)
            point = c;
      if (point < 0) {
        point = (int32_t)first_row.size();
        first_row.push_back(r);
        same_hash.push_back(found != by_hash.end() ? found->second : -1);
        count.push_back(0);
        by_hash[hash[r]] = point;
      }
      id[j] = point;
      count[point]++;
      previous = point;
    }
    // Point by point, rows ascending (a stable counting sort by point).
    std::vector<int32_t> offset(count.size() + 1, 0), sorted(size);
    for (size_t c = 0; c < count.size(); c++) offset[c + 1] = offset[c] + count[c];
    for (size_t c = 0; c < count.size(); c++) start[group_begin[g] + offset[c]] = 1;
    for (int64_t j = 0; j < size; j++) sorted[offset[id[j]]++] = a[j];
    std::copy(sorted.begin(), sorted.end(), a);
  });
  for (int64_t i = 0; i < n; i++)
    if (start[i]) distinct_begin.push_back(i);
  distinct_begin.push_back(n);
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
