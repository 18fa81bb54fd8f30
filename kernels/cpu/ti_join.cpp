// ti_join.cpp -- the triangle-inequality join (ti_join.h).
//
// Notation: q a query, t a target, cq / ct their cluster centres, R_q / R_t
// the radii of their clusters, D(.,.) a computed distance. All pruning
// compares a bound widened by RoundingMargin with a threshold and prunes
// only when the bound is strictly beyond it (rounding_margin.h explains
// why this never loses a neighbour or a tie).
#include "ti_join.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "lane_sums.h"
#include "parallel_for.h"
#include "row_distance.h"
#include "top_k.h"
#include "../exclusion_runs.h"
#include "../rounding_margin.h"
#include "../value_range.h"

namespace knn {
namespace cpu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// How often (in member visits) level 2 looks at the cancel flag.
constexpr int kCancelPollInterval = 2048;

// Level 2 walks the queries of a cluster together in chunks of at most
// this many (each holds a top-k list, so fewer when k is large).
int64_t query_chunk(int64_t capacity) {
  return std::max<int64_t>(8, std::min<int64_t>(256, (int64_t{1} << 20) / capacity));
}

// Below this many dimensions a distance is so cheap that batching does not
// pay; each target is then computed (and theta tightened) at once.
constexpr int kBatchMinDim = 16;

// Queries TI joins to judge whether it beats brute force (see ti_join.h).
constexpr int64_t kSampleQueries = 64;

// Share of all pairs above which TI is slower than brute force. Per pair it
// computes, TI pays a fixed cost (bounds, scattered rows) on top of a
// distance somewhat dearer than brute force's; measured on uniform data
// (2 threads, k = 20), TI broke even at 25% of pairs computed in 16
// dimensions, 31% in 64 and 61% in 784. This fit stays a little below.
double brute_force_break_even(int dim) {
  return 0.2 + 0.4 * dim / (dim + 200.0);
}

// Targets waiting for their exact distance to one query.
constexpr int kMaxBatch = 8;
struct Batch {
  const float *rows[kMaxBatch];
  int64_t targets[kMaxBatch];
  float sums[kMaxBatch];
  int count = 0;
};

// Level 2 state of one query.
struct QueryState {
  TopK best;         // keyed by ordering_key (no sqrt per pair for L2)
  double theta = 0;  // no neighbour of the query is farther than this
  double worst = 0;  // distance of best's worst pair, when best is full
};

// Per-thread working space, reused across query clusters.
struct Scratch {
  Batch batch;
  std::vector<float> sums;                             // lane sums to centres
  std::vector<std::pair<double, int64_t>> by_centre;  // (D(cq,ct), ct)
  std::vector<double> bounds;                          // max-heap of upper bounds
  std::vector<int64_t> candidates;                     // target clusters kept
  std::vector<QueryState> queries;                     // one per query of a chunk
  int64_t distances = 0;
  int64_t landmark_distances = 0;
  double seconds_level1 = 0;
  double seconds_level2 = 0;
};

class TiJoin {
 public:
  TiJoin(const JoinInput &input, const JoinOutput &output,
         const Clustering &queries, const Clustering &targets)
      : in_(input),
        out_(output),
        qc_(queries),
        tc_(targets),
        margin_(input.metric, input.dim),
        // A query may lose every target sharing its key to exclusion, so
        // level 1 needs that many more upper bounds than k.
        bounds_needed_(input.k + max_rows_per_key(input.target_keys, input.n_targets)),
        batch_size_(input.dim >= kBatchMinDim ? kMaxBatch : 1) {}

  // Level 1 for queries of cluster cq that all lie within rq of its centre
  // (a whole cluster, or a slice of its members): the upper bound of every
  // such query's k-th distance, and in s.candidates the target clusters
  // that may hold a neighbour (nearest centre first). Returns the bound.
  double level1(int64_t cq, double rq, Scratch &s) const {
    const int dim = in_.dim;
    const int64_t mt = tc_.n_clusters;

    s.sums.resize(mt);
    lane_sums(in_.metric, qc_.centre(cq), tc_.centres.data(), mt, dim, s.sums.data());
    s.landmark_distances += mt;
    s.by_centre.resize(mt);
    for (int64_t ct = 0; ct < mt; ct++)
      s.by_centre[ct] = {distance_from_sum(in_.metric, s.sums[ct], 0, 0), ct};
    std::sort(s.by_centre.begin(), s.by_centre.end());

    // Upper bounds R_q + D(cq,ct) + D(ct,t), each valid for every query
    // within R_q of cq and one distinct target t; the bounds_needed_-th
    // smallest bounds the k-th distance of every such query (after
    // exclusions). Nearest clusters and, within a cluster, the members
    // nearest the centre come first, so both loops stop as soon as no
    // smaller bound can follow (the paper's footnote 1).
    std::vector<double> &heap = s.bounds;
    heap.clear();
    const size_t needed = static_cast<size_t>(bounds_needed_);
    for (const auto &[dcc, ct] : s.by_centre) {
      const double base = rq + dcc;
      if (heap.size() == needed && base + margin_(base) >= heap.front()) break;
      for (int64_t j = tc_.begin[ct + 1] - 1; j >= tc_.begin[ct]; j--) {
        const double sum = base + tc_.member_distance[j];
        const double bound = sum + margin_(sum);
        if (heap.size() < needed) {
          heap.push_back(bound);
          std::push_heap(heap.begin(), heap.end());
        } else if (bound < heap.front()) {
          std::pop_heap(heap.begin(), heap.end());
          heap.back() = bound;
          std::push_heap(heap.begin(), heap.end());
        } else {
          break;
        }
      }
    }
    const double ub = heap.size() == needed ? heap.front() : kInfinity;

    // Keep a target cluster unless its lower bound
    // D(cq,ct) - R_q - R_t is strictly beyond ub for every pair.
    s.candidates.clear();
    for (const auto &[dcc, ct] : s.by_centre) {
      const double rt = tc_.radius[ct];
      const double lb = dcc - rq - rt - margin_(dcc + rq + rt);
      if (!(lb > ub)) s.candidates.push_back(ct);
    }
    return ub;
  }

  // Level 2 for the queries in member slots [first, last) of one query
  // cluster (after level1 for them). Each query visits the candidate
  // clusters' members and computes only those that the 1-landmark bound
  // |D(q,ct) - D(t,ct)| cannot rule out. The loop runs target cluster by
  // target cluster over all these queries, so a cluster's rows are read
  // from cache by every query after the first. Returns false when
  // cancelled.
  bool level2(int64_t first, int64_t last, double ub, Scratch &s) const {
    const int64_t n = last - first;
    for (int64_t i = 0; i < n; i++) {
      s.queries[i].best.clear();
      s.queries[i].theta = ub;
    }
    s.sums.resize(n);
    for (const int64_t ct : s.candidates) {
      if (in_.cancelled()) return false;
      // D(q, ct) for every query at once (each term is symmetric, so
      // centre-against-queries gives the same bits as query-against-centre).
      lane_sums(in_.metric, tc_.centre(ct), qc_.member(first), n, in_.dim,
                s.sums.data());
      s.landmark_distances += n;
      int poll = kCancelPollInterval;
      for (int64_t i = 0; i < n; i++) {
        const double dqc = distance_from_sum(in_.metric, s.sums[i], 0, 0);
        if (!scan_cluster(first + i, ct, dqc, ub, s.queries[i], s, poll)) return false;
      }
    }
    for (int64_t i = 0; i < n; i++) {
      const int64_t q = qc_.member_row[first + i];
      s.queries[i].best.write_sorted(
          in_.k, out_.neighbors + q * in_.k, out_.distances + q * in_.k,
          [this](double key) { return distance_from_key(in_.metric, key); });
    }
    return true;
  }

 private:
  // Offers the members of target cluster ct to the query in slot j, whose
  // distance to the centre is dqc.
  bool scan_cluster(int64_t j, int64_t ct, double dqc, double ub,
                    QueryState &state, Scratch &s, int &poll) const {
    double &theta = state.theta;
    TopK &best = state.best;
    const double rt = tc_.radius[ct];
    if (dqc - rt - margin_(dqc + rt + theta) > theta) return true;

    const int64_t q = qc_.member_row[j];
    const float *q_row = qc_.member(j);
    // Targets that pass the filters are computed in small batches, which
    // lane_sums_scattered evaluates side by side (much faster per pair in
    // high dimensions). Meanwhile the filters use the theta from before the
    // batch, which is larger, so they stay safe.
    Batch &batch = s.batch;
    batch.count = 0;
    auto flush = [&] {
      if (batch.count == 1)
        batch.sums[0] = pair_sum(in_.metric, q_row, batch.rows[0], in_.dim);
      else
        lane_sums_scattered(in_.metric, q_row, batch.rows, batch.count, in_.dim,
                            batch.sums);
      for (int r = 0; r < batch.count; r++) {
        const double key = ordering_key(in_.metric, batch.sums[r], 0, 0);
        if (best.offer(key, batch.targets[r]) && best.full()) {
          state.worst = distance_from_key(in_.metric, best.worst_key());
          theta = std::min(ub, state.worst);
        }
      }
      s.distances += batch.count;
      batch.count = 0;
    };

    // Members are sorted by descending D(t,ct). The first ones may lie
    // beyond theta on the outside (D(t,ct) - D(q,ct) > theta); skip them by
    // binary search. After them the inside bound D(q,ct) - D(t,ct) only
    // grows, so the first member beyond theta ends the cluster.
    const double *dist = tc_.member_distance.data();
    int64_t lo = tc_.begin[ct], hi = tc_.begin[ct + 1];
    const int64_t end = hi;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (dist[mid] - dqc - margin_(dist[mid] + dqc + theta) > theta)
        lo = mid + 1;
      else
        hi = mid;
    }
    for (int64_t m = lo; m < end; m++) {
      if (--poll == 0) {
        poll = kCancelPollInterval;
        if (in_.cancelled()) return false;
      }
      const double dt = dist[m];
      const double inside = dqc - dt;
      const double slack = margin_(dqc + dt + theta);
      if (inside - slack > theta) break;
      // D(q,t) >= lower (and >= 0: L2 and L1 sums are never negative).
      const double lower = std::max(0.0, std::fabs(inside) - slack);
      if (lower > theta) continue;
      const int64_t t = tc_.member_row[m];
      if (best.full() && lower >= state.worst && t > best.worst_row()) {
        // Even a tie with the current k-th would lose on the row number.
        // So would the rest of this run of equal D(t,ct): same bound,
        // larger rows. Jump past the run (duplicate points make such runs
        // as long as the data set).
        m = std::upper_bound(dist + m, dist + end, dt, std::greater<double>()) - dist - 1;
        continue;
      }
      if (in_.excluded(q, t)) continue;
      batch.rows[batch.count] = tc_.member(m);
      batch.targets[batch.count] = t;
      if (++batch.count == batch_size_) flush();
    }
    if (batch.count > 0) flush();
    return true;
  }

  const JoinInput &in_;
  const JoinOutput &out_;
  const Clustering &qc_;
  const Clustering &tc_;
  const RoundingMargin margin_;
  const int64_t bounds_needed_;
  const int batch_size_;
};

}  // namespace

bool ti_join_supports(const JoinInput &input) {
  if (input.metric != KNN_METRIC_L2 && input.metric != KNN_METRIC_L1) return false;
  // The largest magnitude; any NaN or infinity fails `finite` (a loop
  // without early exit, so that it vectorises).
  float largest = 0.0f;
  bool finite = true;
  auto scan = [&](const float *v, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
      const float a = std::fabs(v[i]);
      finite &= a <= std::numeric_limits<float>::max();
      largest = a > largest ? a : largest;
    }
  };
  scan(input.queries, input.n_queries * input.dim);
  if (!input.same_rows()) scan(input.targets, input.n_targets * input.dim);
  return finite && distances_stay_finite(input.metric, input.dim, largest);
}

TiOutcome ti_join(const JoinInput &input, const JoinOutput &output,
                  const ClusteringOptions &options, bool may_decline,
                  JoinReport *report) {
  const Clock::time_point start = Clock::now();
  Clustering targets, own_queries;
  if (!build_clustering(input.targets, input.n_targets, input.dim, input.metric,
                        options, input.n_threads, input.cancel, &targets,
                        &report->landmark_distances))
    return TiOutcome::kCancelled;
  // A self-join clusters its one matrix once.
  const bool shared = input.same_rows();
  if (!shared && !build_clustering(input.queries, input.n_queries, input.dim,
                                   input.metric, options, input.n_threads,
                                   input.cancel, &own_queries,
                                   &report->landmark_distances))
    return TiOutcome::kCancelled;
  const Clustering &queries = shared ? targets : own_queries;
  report->query_clusters = queries.n_clusters;
  report->target_clusters = targets.n_clusters;
  report->variant = shared ? "two-level/shared-clusters" : "two-level";
  report->seconds_cluster = seconds_since(start);

  // Work items are slices of at most `chunk` queries of one cluster. Each
  // item runs level 1 for its own slice: members are sorted by descending
  // distance to the centre, so a slice's radius is its first member's
  // distance, and slices nearer the centre get tighter bounds. Items of the
  // largest clusters go first.
  const int64_t capacity = std::min<int64_t>(input.k, input.n_targets);
  const int64_t chunk = query_chunk(capacity);
  struct Slice {
    int64_t cluster, first, last;
  };
  std::vector<Slice> slices;
  for (int64_t c = 0; c < queries.n_clusters; c++)
    for (int64_t j = queries.begin[c]; j < queries.begin[c + 1]; j += chunk)
      slices.push_back({c, j, std::min(j + chunk, queries.begin[c + 1])});
  std::stable_sort(slices.begin(), slices.end(), [&](const Slice &a, const Slice &b) {
    return queries.size(a.cluster) > queries.size(b.cluster);
  });

  if (input.cancelled()) return TiOutcome::kCancelled;
  const TiJoin join(input, output, queries, targets);
  const int64_t n_slices = static_cast<int64_t>(slices.size());
  const int workers = parallel_workers(n_slices, input.n_threads);
  std::vector<Scratch> scratch(workers);
  for (Scratch &s : scratch) s.queries.assign(chunk, QueryState{TopK(capacity)});

  const Clock::time_point join_start = Clock::now();
  if (may_decline) {
    // Join a few queries spread over the set, one per item (a one-query
    // slice: its radius is its own distance to the centre). Their results
    // are exact and simply recomputed below if TI goes on.
    const int64_t n_sample = std::min<int64_t>(kSampleQueries, input.n_queries);
    parallel_for(n_sample, input.n_threads, input.cancel, [&](int64_t i, int worker) {
      const int64_t j = i * input.n_queries / n_sample;
      const int64_t cluster =
          std::upper_bound(queries.begin.begin(), queries.begin.end(), j) -
          queries.begin.begin() - 1;
      const double ub = join.level1(cluster, queries.member_distance[j], scratch[worker]);
      join.level2(j, j + 1, ub, scratch[worker]);
    });
    if (input.cancelled()) return TiOutcome::kCancelled;
    int64_t computed = 0;
    for (const Scratch &s : scratch) computed += s.distances;
    report->ti_sample_share =
        static_cast<double>(computed) / (static_cast<double>(n_sample) * input.n_targets);
    if (report->ti_sample_share > brute_force_break_even(input.dim))
      return TiOutcome::kBruteForceIsFaster;
  }
  parallel_for(n_slices, input.n_threads, input.cancel, [&](int64_t item, int worker) {
    Scratch &s = scratch[worker];
    const Slice &slice = slices[item];
    const Clock::time_point t0 = Clock::now();
    const double ub =
        join.level1(slice.cluster, queries.member_distance[slice.first], s);
    const Clock::time_point t1 = Clock::now();
    join.level2(slice.first, slice.last, ub, s);
    s.seconds_level1 += std::chrono::duration<double>(t1 - t0).count();
    s.seconds_level2 += seconds_since(t1);
  });
  const double join_seconds = seconds_since(join_start);

  double level1 = 0, level2 = 0;
  for (const Scratch &s : scratch) {
    report->distance_computations += s.distances;
    report->landmark_distances += s.landmark_distances;
    level1 += s.seconds_level1;
    level2 += s.seconds_level2;
  }
  // The phases interleave on every thread; split the wall time in the
  // proportion of the time the threads spent in each.
  const double total = level1 + level2;
  report->seconds_filter = total > 0 ? join_seconds * level1 / total : 0;
  report->seconds_select = total > 0 ? join_seconds * level2 / total : 0;
  return input.cancelled() ? TiOutcome::kCancelled : TiOutcome::kDone;
}

}  // namespace cpu
}  // namespace knn
