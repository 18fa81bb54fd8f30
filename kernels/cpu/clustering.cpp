// clustering.cpp -- landmarks and clusters for the TI join (clustering.h).
#include "clustering.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "landmark_search.h"
#include "parallel_for.h"
#include "row_distance.h"
#include "ti_padded_sum.h"

namespace knn {
namespace cpu {
namespace {

// Scoring a candidate landmark set looks at no more pairs than this; above
// it a fixed random sample of pairs stands in for all of them.
constexpr int64_t kMaxScoredPairs = 50000;
constexpr int64_t kRowsPerAssignItem = 256;

// splitmix64: tiny, fixed, and the same on every platform, so the same
// input always gives the same landmarks.
struct Random {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

// Any hash of the row's bits will do: equal rows must hash equal.
uint64_t hash_row(const float *row, int dim) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (int j = 0; j < dim; j++) {
    uint32_t bits;
    std::memcpy(&bits, &row[j], sizeof(bits));
    h = (h ^ bits) * 0xff51afd7ed558ccdULL;
  }
  return h ^ (h >> 29);
}

// Up to m random rows out of n, no two with equal values (a duplicate
// landmark would only leave an empty cluster). Fewer when the data has
// fewer distinct rows than a bounded number of draws finds.
std::vector<int64_t> sample_rows(const float *rows, int64_t n, int dim,
                                 int64_t m, Random &random) {
  std::vector<int64_t> picked;
  picked.reserve(m);
  std::unordered_map<uint64_t, int64_t> by_hash;  // value hash -> a picked row
  auto try_pick = [&](int64_t r) {
    const float *row = rows + r * dim;
    const auto [it, inserted] = by_hash.emplace(hash_row(row, dim), r);
    // Equal hash: the same values unless a rare collision (then keep both).
    if (!inserted && std::memcmp(rows + it->second * dim, row, sizeof(float) * dim) == 0)
      return;
    picked.push_back(r);
  };
  if (m * 2 > n) {
    // Small set: a random permutation, taken in order.
    std::vector<int64_t> all(n);
    for (int64_t i = 0; i < n; i++) all[i] = i;
    for (int64_t i = 0; i + 1 < n; i++) std::swap(all[i], all[i + random.below(n - i)]);
    for (int64_t i = 0; i < n && static_cast<int64_t>(picked.size()) < m; i++)
      try_pick(all[i]);
  } else {
    std::unordered_set<int64_t> drawn;
    for (int64_t draws = 0; static_cast<int64_t>(picked.size()) < m && draws < 8 * m + 64;
         draws++) {
      const int64_t r = random.below(n);
      if (drawn.insert(r).second) try_pick(r);
    }
  }
  return picked;
}

// Sum of the pairwise distances of the landmark rows `set`, estimated
// from kMaxScoredPairs random pairs when it has more pairs than that.
// *scored counts the distances evaluated; NaN when cancelled.
double spread(const float *rows, int dim, KnnMetric metric, const std::vector<int64_t> &set,
              Random &random, const int32_t *cancel, int64_t *scored) {
  const int64_t size = static_cast<int64_t>(set.size());
  const double pair_count = 0.5 * static_cast<double>(size) * static_cast<double>(size - 1);
  double sum = 0;
  int64_t count = 0;
  auto add = [&](int64_t i, int64_t j) {
    if ((count & 1023) == 0 && cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED))
      return false;
    sum += pair_distance(metric, rows + set[i] * dim, rows + set[j] * dim, dim);
    count++;
    return true;
  };
  if (pair_count <= kMaxScoredPairs) {
    for (int64_t i = 0; i < size; i++)
      for (int64_t j = i + 1; j < size; j++)
        if (!add(i, j)) return std::nan("");
  } else {
    while (count < kMaxScoredPairs) {
      const int64_t i = random.below(size), j = random.below(size);
      if (i != j && !add(i, j)) return std::nan("");
    }
  }
  *scored = count;
  return count == 0 ? 0 : sum / static_cast<double>(count) * pair_count;
}

// The most spread-out of options.candidate_sets random sets of up to m
// rows (spread() above). Each set is drawn from a generator of its own, so
// that the sets are drawn and scored in parallel and the same input still
// gives the same landmarks.
std::vector<int64_t> choose_landmarks(const float *rows, int64_t n, int dim,
                                      KnnMetric metric, int64_t m,
                                      const ClusteringOptions &options,
                                      int n_threads, const int32_t *cancel,
                                      int64_t *evaluated) {
  const int n_sets = std::max(1, options.candidate_sets);
  struct Candidate {
    std::vector<int64_t> rows;
    double score = 0;
    int64_t scored = 0;
  };
  std::vector<Candidate> sets(n_sets);
  parallel_for(n_sets, n_threads, cancel, [&](int64_t index, int) {
    Random random{Random{options.seed + static_cast<uint64_t>(index)}.next()};
    Candidate &s = sets[index];
    s.rows = sample_rows(rows, n, dim, m, random);
    if (n_sets > 1) s.score = spread(rows, dim, metric, s.rows, random, cancel, &s.scored);
  });
  int best = 0;
  for (int s = 0; s < n_sets; s++) {
    *evaluated += sets[s].scored;
    if (sets[s].score > sets[best].score) best = s;
  }
  return sets[best].rows;
}

}  // namespace

bool build_clustering(const float *rows, int64_t n, int dim, KnnMetric metric,
                      const ClusteringOptions &options, int n_threads,
                      const int32_t *cancel, Clustering *out,
                      int64_t *landmark_distances) {
  auto cancelled = [cancel] {
    return cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0;
  };
  if (cancelled()) return false;
  int64_t m = static_cast<int64_t>(
      std::llround(options.landmarks_per_sqrt_n * std::sqrt(static_cast<double>(n))));
  m = std::max<int64_t>(1, std::min({m, n, options.max_landmarks}));

  const std::vector<int64_t> landmark_rows = choose_landmarks(
      rows, n, dim, metric, m, options, n_threads, cancel, landmark_distances);
  if (cancelled()) return false;
  m = static_cast<int64_t>(landmark_rows.size());  // fewer if rows repeat
  std::vector<float> landmarks(static_cast<size_t>(m) * dim);
  for (int64_t c = 0; c < m; c++)
    std::memcpy(&landmarks[c * dim], rows + landmark_rows[c] * dim,
                sizeof(float) * dim);

  // Each row joins its nearest landmark. The distance to it is computed
  // the canonical way, since the join's bounds rely on it.
  const LandmarkSearch search(landmarks.data(), m, dim, metric, n_threads, cancel);
  if (cancelled()) return false;
  std::vector<int32_t> nearest(n);
  std::vector<double> distance(n);
  const int64_t n_items = (n + kRowsPerAssignItem - 1) / kRowsPerAssignItem;
  const int workers = parallel_workers(n_items, n_threads);
  std::vector<std::vector<float>> scratch(workers, std::vector<float>(m));
  std::vector<int64_t> evaluated(workers, 0);
  parallel_for(n_items, n_threads, cancel, [&](int64_t item, int worker) {
    const int64_t end = std::min(n, (item + 1) * kRowsPerAssignItem);
    int64_t count = 0;  // a local count: the workers' slots share a cache line
    for (int64_t i = item * kRowsPerAssignItem; i < end; i++) {
      const float *row = rows + i * dim;
      const int64_t c = search.nearest(row, scratch[worker].data(), &count);
      nearest[i] = static_cast<int32_t>(c);
      distance[i] = pair_distance(metric, row, &landmarks[c * dim], dim);
    }
    evaluated[worker] += count;
  });
  for (int64_t e : evaluated) *landmark_distances += e;
  *landmark_distances += n;
  if (cancelled()) return false;

  // Drop landmarks nobody joined, then lay the members out cluster by
  // cluster (rows ascending, so a stable sort by distance keeps equal
  // distances in row order).
  std::vector<int64_t> count(m, 0);
  for (int64_t i = 0; i < n; i++) count[nearest[i]]++;
  std::vector<int64_t> renumber(m, -1);
  int64_t kept = 0;
  for (int64_t c = 0; c < m; c++)
    if (count[c] > 0) renumber[c] = kept++;

  Clustering &cl = *out;
  cl.dim = dim;
  cl.stride = padded_stride(dim);
  cl.n_clusters = kept;
  cl.centres.assign(static_cast<size_t>(kept) * cl.stride, 0.0f);
  cl.begin.assign(kept + 1, 0);
  for (int64_t c = 0; c < m; c++)
    if (renumber[c] >= 0) {
      std::memcpy(&cl.centres[renumber[c] * cl.stride], &landmarks[c * dim],
                  sizeof(float) * dim);
      cl.begin[renumber[c] + 1] = count[c];
    }
  for (int64_t c = 0; c < kept; c++) cl.begin[c + 1] += cl.begin[c];

  cl.member_row.resize(n);
  cl.member_distance.resize(n);
  std::vector<int64_t> fill(cl.begin.begin(), cl.begin.end() - 1);
  for (int64_t i = 0; i < n; i++) {
    const int64_t j = fill[renumber[nearest[i]]]++;
    cl.member_row[j] = i;
    cl.member_distance[j] = distance[i];
  }

  cl.radius.assign(kept, 0.0);
  cl.member_data.reset(new float[static_cast<size_t>(n) * cl.stride]);  // filled below
  parallel_for(kept, n_threads, cancel, [&](int64_t c, int) {
    const int64_t b = cl.begin[c], e = cl.begin[c + 1];
    std::vector<std::pair<double, int64_t>> order(e - b);
    for (int64_t j = b; j < e; j++) order[j - b] = {cl.member_distance[j], cl.member_row[j]};
    std::stable_sort(order.begin(), order.end(),
                     [](const auto &x, const auto &y) { return x.first > y.first; });
    for (int64_t j = b; j < e; j++) {
      cl.member_distance[j] = order[j - b].first;
      cl.member_row[j] = order[j - b].second;
      float *member = &cl.member_data[j * cl.stride];
      std::memcpy(member, rows + order[j - b].second * dim, sizeof(float) * dim);
      std::fill(member + dim, member + cl.stride, 0.0f);
    }
    cl.radius[c] = cl.member_distance[b];
  });
  return !cancelled();
}

}  // namespace cpu
}  // namespace knn
