// range_join.cpp -- the range join (range_join.h): query blocks in row
// order, each block's queries on all threads, each query's pairs sorted
// (and capped) before the block is handed to the sink in query order.
#include "range_join.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "bit_join.h"
#include "brute_force.h"
#include "clustering.h"
#include "join_input.h"
#include "parallel_for.h"
#include "row_distance.h"
#include "ti_join.h"
#include "../entry_guard.h"
#include "../problem_check.h"
#include "../rounding_margin.h"

namespace knn {
namespace cpu {
namespace {

using Clock = std::chrono::steady_clock;

// Below this many pairs AUTO uses brute force: clustering costs more.
constexpr double kAutoTiMinPairs = 1e5;
// A block's lists hold at most about this many pairs in the worst case
// (every target within the radius), bounding the memory of a huge radius.
constexpr int64_t kBlockPairs = int64_t{1} << 22;
constexpr int64_t kMaxBlockQueries = 1024;

// Bit rows as 64-bit words, bits past dim cleared (only popcounts of equal
// positions are taken, so byte order within a word does not matter).
struct BitRows {
  std::vector<uint64_t> words;
  std::vector<uint64_t> ones;
  int64_t per_row = 0;
  const uint64_t *row(int64_t i) const { return words.data() + i * per_row; }
};

BitRows pack_bits(const void *rows, int64_t n, int dim) {
  BitRows b;
  const int64_t row_bytes = (static_cast<int64_t>(dim) + 7) / 8;
  b.per_row = (row_bytes + 7) / 8;
  b.words.assign(static_cast<size_t>(n * b.per_row), 0);
  b.ones.assign(static_cast<size_t>(n), 0);
  const unsigned char last_mask =
      dim % 8 == 0 ? 0xFF : static_cast<unsigned char>(0xFF << (8 - dim % 8));
  const auto *bytes = static_cast<const unsigned char *>(rows);
  for (int64_t i = 0; i < n; i++) {
    auto *out = reinterpret_cast<unsigned char *>(b.words.data() + i * b.per_row);
    std::memcpy(out, bytes + i * row_bytes, static_cast<size_t>(row_bytes));
    out[row_bytes - 1] &= last_mask;
    uint64_t c = 0;
    for (int64_t w = 0; w < b.per_row; w++) c += __builtin_popcountll(b.row(i)[w]);
    b.ones[i] = c;
  }
  return b;
}

struct Pair {
  double distance;
  int64_t target;
};

class RangeJoin {
 public:
  RangeJoin(const KnnProblem &p, const int32_t *cancel)
      : p_(p), cancel_(cancel), radius_(p.max_distance),
        inclusive_(p.range == KNN_RANGE_AT_MOST), threads_(resolve_threads(p.n_threads)),
        margin_(p.metric, p.dim) {}

  bool cancelled() const { return __atomic_load_n(cancel_, __ATOMIC_RELAXED) != 0; }

  // Rows, norms and (for TI) the target clusters. False when cancelled.
  bool prepare(JoinReport *report) {
    if (p_.element == KNN_ELEMENT_BIT) {
      qbits_ = pack_bits(p_.queries, p_.n_queries, p_.dim);
      tbits_ = pack_bits(p_.targets, p_.n_targets, p_.dim);
      report->variant = "range/bit popcount";
      return !cancelled();
    }
    input_.queries = float_rows(p_.queries);
    input_.n_queries = p_.n_queries;
    input_.targets = float_rows(p_.targets);
    input_.n_targets = p_.n_targets;
    input_.dim = p_.dim;
    input_.k = 1;
    input_.metric = p_.metric;
    input_.n_threads = threads_;
    input_.cancel = cancel_;
    if (p_.metric == KNN_METRIC_COSINE) {
      query_norms_ = squared_norms(input_.queries, input_.n_queries, input_.dim, input_);
      target_norms_ = squared_norms(input_.targets, input_.n_targets, input_.dim, input_);
    }
    const double pairs = static_cast<double>(p_.n_queries) * static_cast<double>(p_.n_targets);
    use_ti_ = p_.method != KNN_METHOD_BRUTE && std::isfinite(radius_) &&
              (p_.method == KNN_METHOD_TI || pairs >= kAutoTiMinPairs) &&
              ti_join_supports(input_);
    report->variant = use_ti_ ? "range/ti" : "range/brute";
    if (!use_ti_) return !cancelled();
    const Clock::time_point start = Clock::now();
    if (!build_clustering(input_.targets, input_.n_targets, input_.dim, p_.metric,
                          ClusteringOptions(), threads_, cancel_, &clusters_,
                          &report->landmark_distances))
      return false;
    report->target_clusters = clusters_.n_clusters;
    report->seconds_cluster = std::chrono::duration<double>(Clock::now() - start).count();
    return !cancelled();
  }

  bool uses_ti() const { return use_ti_; }

  // Every pair of query q within the radius, sorted and capped.
  void collect(int64_t q, std::vector<Pair> &out, int64_t *computed) const {
    out.clear();
    if (use_ti_) {
      collect_ti(q, out, computed);
    } else {
      for (int64_t t = 0; t < p_.n_targets; t++) {
        // One query against millions of targets is seconds: a cancel is
        // answered within it (the cancelled block's lists are dropped).
        if ((t & 65535) == 65535 && cancelled()) return;
        offer(q, t, out, computed);
      }
    }
    if (cancelled()) return;
    auto before = [](const Pair &a, const Pair &b) {
      return knn_result_before(a.distance, a.target, b.distance, b.target);
    };
    const size_t cap = static_cast<size_t>(p_.k);
    if (cap > 0 && out.size() > cap) {
      std::partial_sort(out.begin(), out.begin() + cap, out.end(), before);
      out.resize(cap);
    } else {
      std::sort(out.begin(), out.end(), before);
    }
  }

 private:
  bool eligible(int64_t q, int64_t t) const {
    if (p_.query_keys != nullptr && p_.query_keys[q] == p_.target_keys[t]) return false;
    if (p_.query_groups != nullptr && p_.query_groups[q] != p_.target_groups[t]) return false;
    return true;
  }

  double distance(int64_t q, int64_t t) const {
    if (p_.element == KNN_ELEMENT_BIT) {
      const uint64_t *a = qbits_.row(q), *b = tbits_.row(t);
      uint64_t n = 0;
      if (p_.metric == KNN_METRIC_JACCARD) {
        for (int64_t w = 0; w < qbits_.per_row; w++) n += __builtin_popcountll(a[w] & b[w]);
        return jaccard_from_counts(n, qbits_.ones[q], tbits_.ones[t]);
      }
      for (int64_t w = 0; w < qbits_.per_row; w++) n += __builtin_popcountll(a[w] ^ b[w]);
      return hamming_from_count(n);
    }
    const float sum = pair_sum(p_.metric, input_.query_row(q), input_.target_row(t), p_.dim);
    if (p_.metric == KNN_METRIC_COSINE)
      return distance_from_sum(p_.metric, sum, query_norms_[q], target_norms_[t]);
    return distance_from_sum(p_.metric, sum, 0.0f, 0.0f);
  }

  void offer(int64_t q, int64_t t, std::vector<Pair> &out, int64_t *computed) const {
    if (!eligible(q, t)) return;
    const double d = distance(q, t);
    ++*computed;
    if (knn_within_radius(d, radius_, inclusive_)) out.push_back({d, t});
  }

  // L2 and L1 with a finite radius r. Members of a cluster are sorted by
  // descending distance to the centre, so the targets that the point bound
  // keeps, D(t,c) in [D(q,c) - r, D(q,c) + r] (widened), are one run.
  void collect_ti(int64_t q, std::vector<Pair> &out, int64_t *computed) const {
    const float *row = input_.query_row(q);
    const Clustering &cl = clusters_;
    const double r = radius_;
    for (int64_t c = 0; c < cl.n_clusters; c++) {
      if ((c & 255) == 255 && cancelled()) return;
      const double dqc = pair_distance(p_.metric, row, cl.centre(c), p_.dim);
      const double rc = cl.radius[c];
      // Every bound of this cluster sums to at most dqc + rc + |r|.
      const double m = margin_(std::fabs(dqc) + rc + std::fabs(r));
      if (dqc - rc - m > r) continue;
      const double hi = dqc + r + m, lo = dqc - r - m;
      const auto first = cl.member_distance.begin() + cl.begin[c];
      const auto last = cl.member_distance.begin() + cl.begin[c + 1];
      auto it = std::partition_point(first, last, [hi](double d) { return d > hi; });
      for (; it != last && *it >= lo; ++it)
        offer(q, cl.member_row[it - cl.member_distance.begin()], out, computed);
    }
  }

  const KnnProblem &p_;
  const int32_t *cancel_;
  const double radius_;
  const bool inclusive_;
  const int threads_;
  const RoundingMargin margin_;
  JoinInput input_;
  std::vector<float> query_norms_, target_norms_;
  BitRows qbits_, tbits_;
  bool use_ti_ = false;
  Clustering clusters_;
};

// Returns false when cancelled or when the sink stopped the join.
bool run_blocks(const KnnProblem &p, const RangeJoin &join, const PairSink &sink, int threads,
                int64_t *computed, int64_t *returned, const int32_t *cancel) {
  const int64_t per_block = std::max<int64_t>(
      threads, std::min<int64_t>(kMaxBlockQueries, kBlockPairs / std::max<int64_t>(1, p.n_targets)));
  std::vector<std::vector<Pair>> lists(static_cast<size_t>(per_block));
  std::vector<int64_t> counted(static_cast<size_t>(per_block));
  std::vector<int64_t> rows;
  std::vector<double> distances;
  for (int64_t first = 0; first < p.n_queries; first += per_block) {
    const int64_t n = std::min(per_block, p.n_queries - first);
    std::fill(counted.begin(), counted.end(), 0);
    parallel_for(n, threads, cancel, [&](int64_t i, int) {
      join.collect(first + i, lists[i], &counted[i]);
    });
    if (__atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) return false;
    for (int64_t i = 0; i < n; i++) {
      const std::vector<Pair> &list = lists[i];
      *computed += counted[i];
      *returned += static_cast<int64_t>(list.size());
      if (list.empty()) continue;
      rows.resize(list.size());
      distances.resize(list.size());
      for (size_t j = 0; j < list.size(); j++) {
        rows[j] = list[j].target;
        distances[j] = list[j].distance;
      }
      if (!sink(first + i, rows.data(), distances.data(), static_cast<int64_t>(list.size())))
        return false;
    }
  }
  return true;
}

KnnStatus run(const KnnProblem &p, const PairSink &sink, KnnStats *stats, const int32_t *cancel,
              char *errbuf, size_t errlen) {
  const Clock::time_point start = Clock::now();
  if (const char *why = range_problem_invalid_reason(p)) {
    copy_message(errbuf, errlen, why);
    return KNN_INVALID_ARGUMENT;
  }
  const int threads = resolve_threads(p.n_threads);
  JoinReport report;
  report.variant = "range/empty";
  int64_t computed = 0, returned = 0;
  bool completed = true;
  bool used_ti = false;
  if (p.n_queries > 0 && p.n_targets > 0) {
    RangeJoin join(p, cancel);
    completed = join.prepare(&report);
    used_ti = join.uses_ti();
    const Clock::time_point join_start = Clock::now();
    if (completed) completed = run_blocks(p, join, sink, threads, &computed, &returned, cancel);
    report.seconds_filter = std::chrono::duration<double>(Clock::now() - join_start).count();
  }
  if (stats != nullptr) {
    std::memset(stats, 0, sizeof *stats);
    stats->device = KNN_DEVICE_CPU;
    stats->method = used_ti ? KNN_METHOD_TI : KNN_METHOD_BRUTE;
    std::snprintf(stats->device_name, sizeof stats->device_name, "cpu (%d thread%s)", threads,
                  threads == 1 ? "" : "s");
    std::snprintf(stats->variant, sizeof stats->variant, "%s, %lld pairs within radius",
                  report.variant, static_cast<long long>(returned));
    stats->target_clusters = report.target_clusters;
    stats->distance_computations = computed;
    stats->pairs = p.n_queries * p.n_targets;
    stats->threads_per_query = 1;
    stats->seconds_cluster = report.seconds_cluster;
    stats->seconds_filter = report.seconds_filter;
    stats->seconds_total = std::chrono::duration<double>(Clock::now() - start).count();
  }
  if (!completed || __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) {
    copy_message(errbuf, errlen, "cancelled");
    return KNN_CANCELLED;
  }
  return KNN_OK;
}

}  // namespace

KnnStatus range_run(const KnnProblem &problem, const PairSink &sink, KnnStats *stats,
                    const int32_t *cancel, char *errbuf, size_t errlen) noexcept {
  static const int32_t never = 0;
  return guarded("CPU range join", errbuf, errlen, [&] {
    return run(problem, sink, stats, cancel != nullptr ? cancel : &never, errbuf, errlen);
  });
}

}  // namespace cpu
}  // namespace knn
