// ti_filters.cpp -- level 1 and level 2 of the TI join (ti_filters.h).
#include "ti_filters.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "lane_sums.h"
#include "row_distance.h"
#include "ti_padded_sum.h"
#include "../exclusion_runs.h"
#include "../result_padding.h"

namespace knn {
namespace cpu {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// How often (in member visits) level 2 looks at the cancel flag.
constexpr int kCancelPollInterval = 2048;

// Level 2 computes a target that passes the filters at once when a row
// has at most 4 lane blocks (32 dimensions), in a loop unrolled for the row
// length: the CPU overlaps consecutive distances by itself and each result
// tightens theta at once. Longer rows are computed in batches of this many,
// which lane_sums_scattered evaluates side by side.
constexpr int kMaxBatch = 8;

}  // namespace

TiFilters::TiFilters(const JoinInput &input, const JoinOutput &output, const TiSides &sides)
    : in_(input),
      out_(output),
      qd_(*sides.queries),
      td_(*sides.targets),
      qc_(*sides.query_clusters),
      tc_(*sides.target_clusters),
      margin_(input.metric, input.dim),
      filter_at_output_(input.query_keys != nullptr && sides.excluded_at_output > 0),
      exclude_in_scan_(input.query_keys != nullptr && sides.excluded_at_output == 0),
      capacity_(std::min<int64_t>(input.k + sides.excluded_at_output, input.n_targets)),
      // A query may lose every target sharing its key to exclusion, so
      // level 1 needs that many more upper bounds than k.
      bounds_needed_(input.k + max_rows_per_key(input.target_keys, input.n_targets)),
      blocks_(padded_stride(input.dim) / KNN_LANES) {
  const int64_t members = tc_.begin[tc_.n_clusters];
  member_first_row_.resize(members);
  for (int64_t j = 0; j < members; j++) member_first_row_[j] = td_.first_row(tc_.member_row[j]);
}

void TiFilters::prepare_scratch(int64_t slice, TiScratch *s) const {
  s->queries.assign(slice, TiQueryState{TiTopK(capacity_)});
}

double TiFilters::level1(int64_t cq, double rq, TiScratch &s) const {
  const int64_t mt = tc_.n_clusters;
  s.sums.resize(mt);
  lane_sums_strided(in_.metric, qc_.centre(cq), tc_.centres.data(), mt, in_.dim, tc_.stride,
                    s.sums.data());
  s.landmark_distances += mt;
  s.by_centre.resize(mt);
  for (int64_t ct = 0; ct < mt; ct++)
    s.by_centre[ct] = {distance_from_sum(in_.metric, s.sums[ct], 0, 0), ct};
  std::sort(s.by_centre.begin(), s.by_centre.end());

  // Upper bounds R_q + D(cq,ct) + D(ct,t), each valid for every query
  // within R_q of cq and one target row t (a distinct target gives one per
  // row); the bounds_needed_-th smallest bounds the k-th distance of every
  // such query (after exclusions). Nearest clusters and, within a cluster,
  // the members nearest the centre come first, so both loops stop as soon
  // as no smaller bound can follow (the paper's footnote 1).
  std::vector<double> &heap = s.bounds;
  heap.clear();
  const size_t needed = static_cast<size_t>(bounds_needed_);
  for (const auto &[dcc, ct] : s.by_centre) {
    const double base = rq + dcc;
    if (heap.size() == needed && base + margin_(base) >= heap.front()) break;
    for (int64_t j = tc_.begin[ct + 1] - 1; j >= tc_.begin[ct]; j--) {
      const double sum = base + tc_.member_distance[j];
      const double bound = sum + margin_(sum);
      if (heap.size() == needed && !(bound < heap.front())) break;
      for (int64_t r = std::min<int64_t>(td_.size(tc_.member_row[j]), needed); r > 0; r--) {
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

bool TiFilters::level2(int64_t first, int64_t last, double ub, TiScratch &s) const {
  if (in_.metric == KNN_METRIC_L2) return level2_with<SquaredDifference>(first, last, ub, s);
  return level2_with<AbsoluteDifference>(first, last, ub, s);
}

// Level 2 with the row length fixed at compile time where it is short,
// or in batches where it is long.
template <class Term>
bool TiFilters::level2_with(int64_t first, int64_t last, double ub, TiScratch &s) const {
  switch (blocks_) {
    case 1: return level2_isa<Term, 1>(first, last, ub, s);
    case 2: return level2_isa<Term, 2>(first, last, ub, s);
    case 3: return level2_isa<Term, 3>(first, last, ub, s);
    case 4: return level2_isa<Term, 4>(first, last, ub, s);
    default: return level2_isa<Term, 0>(first, last, ub, s);
  }
}

// The level 2 loop built for the baseline x86-64 target and for AVX2
// (the same float operations, lane by lane, on wider registers; no FMA:
// contraction is off and FMA is never enabled).
template <class Term, int kBlocks>
bool TiFilters::level2_isa(int64_t first, int64_t last, double ub, TiScratch &s) const {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return level2_avx2<Term, kBlocks>(first, last, ub, s);
#endif
  return level2_for<Term, kBlocks>(first, last, ub, s);
}

#if defined(__x86_64__) && defined(__GNUC__)
template <class Term, int kBlocks>
__attribute__((target("avx2"))) bool TiFilters::level2_avx2(int64_t first, int64_t last,
                                                            double ub, TiScratch &s) const {
  return level2_for<Term, kBlocks>(first, last, ub, s);
}
#endif

// Each query visits the candidate clusters' members and computes only
// those that the 1-landmark bound |D(q,ct) - D(t,ct)| cannot rule out. The
// loop runs target cluster by target cluster over all the slice's queries,
// so a cluster's rows are read from cache by every query after the first.
template <class Term, int kBlocks>
__attribute__((always_inline)) inline bool TiFilters::level2_for(int64_t first, int64_t last,
                                                                 double ub, TiScratch &s) const {
  const int64_t n = last - first;
  for (int64_t i = 0; i < n; i++) {
    s.queries[i].best.clear();
    s.queries[i].theta = ub;
    s.queries[i].worst = kInfinity;
  }
  s.sums.resize(n);
  s.poll = kCancelPollInterval;
  for (const int64_t ct : s.candidates) {
    if (in_.cancelled()) return false;
    // D(q, ct) for every query at once (each term is symmetric, so
    // centre-against-queries gives the same bits as query-against-centre).
    lane_sums_strided(in_.metric, tc_.centre(ct), qc_.member(first), n, in_.dim, qc_.stride,
                      s.sums.data());
    s.landmark_distances += n;
    const double rt = tc_.radius[ct];
    for (int64_t i = 0; i < n; i++) {
      const double dqc = distance_from_sum(in_.metric, s.sums[i], 0, 0);
      const double theta = s.queries[i].theta;
      // One slack for the whole cluster: D(t,ct) <= R_t and theta only
      // shrinks, so it is at least the margin of every member's bound, and
      // a wider margin only prunes less.
      const double slack = margin_(dqc + rt + theta);
      if (dqc - rt - slack > theta) continue;
      if (!scan<Term, kBlocks>(first + i, ct, dqc, slack, s.queries[i], s)) return false;
    }
  }
  for (int64_t i = 0; i < n; i++) write_rows(qc_.member_row[first + i], s.queries[i].best, s);
  return true;
}

// Offers the members of target cluster ct to the query in slot j, whose
// distance to the centre is dqc; slack widens every bound.
template <class Term, int kBlocks>
__attribute__((always_inline)) inline bool TiFilters::scan(int64_t j, int64_t ct, double dqc,
                                                           double slack, TiQueryState &state,
                                                           TiScratch &s) const {
  const int64_t q = qd_.first_row(qc_.member_row[j]);
  const float *q_row = qc_.member(j);
  const double *dist = tc_.member_distance.data();
  const int64_t begin = tc_.begin[ct], end = tc_.begin[ct + 1];
  // Members are sorted by descending D(t,ct). They are visited outward
  // from D(t,ct) = D(q,ct), in increasing order of the bound
  // |D(q,ct) - D(t,ct)| - slack, so that near targets come first and
  // tighten theta early; a side ends at its first member beyond theta.
  int64_t down = std::partition_point(dist + begin, dist + end,
                                      [dqc](double d) { return d > dqc; }) - dist;
  int64_t up = down - 1;
  double reach = state.theta + slack;
  int64_t batch[kMaxBatch];
  int count = 0;
  for (;;) {
    // (theta may be infinite: fewer targets than needed)
    if (down == end && up < begin) break;
    const double gap_down = down < end ? dqc - dist[down] : kInfinity;
    const double gap_up = up >= begin ? dist[up] - dqc : kInfinity;
    int64_t m;
    if (down < end && gap_down <= gap_up) {
      if (gap_down > reach) break;
      m = down++;
      if (state.worst == 0 && member_first_row_[m] > pair_row_of(state.best.bar())) {
        // The list is full of distance 0: even a tie would lose on the
        // row number, and so would the rest of this run of equal D(t,ct)
        // (downwards: larger rows). Jump past the run (without merged
        // duplicates, such runs can be as long as the data set).
        down = std::upper_bound(dist + m, dist + end, dist[m], std::greater<double>()) - dist;
        continue;
      }
    } else {
      if (gap_up > reach) break;
      m = up--;
    }
    if (--s.poll == 0) {
      s.poll = kCancelPollInterval;
      if (in_.cancelled()) return false;
    }
    if constexpr (kBlocks > 0) {
      const float sum = padded_sum<Term, kBlocks>(q_row, tc_.member(m));
      s.distances++;
      if (pack_pair(sum, member_first_row_[m]) < state.best.bar() &&
          offer_rows(q, m, sum, state))
        reach = state.theta + slack;
    } else {
      // Meanwhile the filters use the theta from before the batch, which
      // is larger, so they stay safe.
      batch[count++] = m;
      if (count == kMaxBatch) {
        offer_batch(q_row, q, batch, count, state, s);
        count = 0;
        reach = state.theta + slack;
      }
    }
  }
  if (count > 0) offer_batch(q_row, q, batch, count, state, s);
  return true;
}

void TiFilters::offer_batch(const float *q_row, int64_t q, const int64_t *members, int count,
                            TiQueryState &state, TiScratch &s) const {
  const float *rows[kMaxBatch] = {};
  float sums[kMaxBatch];
  for (int b = 0; b < count; b++) rows[b] = tc_.member(members[b]);
  lane_sums_scattered(in_.metric, q_row, rows, count, in_.dim, sums);
  s.distances += count;
  for (int b = 0; b < count; b++)
    if (pack_pair(sums[b], member_first_row_[members[b]]) < state.best.bar())
      offer_rows(q, members[b], sums[b], state);
}

// Offers the rows of target member m's distinct point, ascending, all at
// lane sum `sum`, to query row q (the first row of its group). Once one is
// refused every later one would be too (same sum, larger row). Returns
// true when theta shrank.
bool TiFilters::offer_rows(int64_t q, int64_t m, float sum, TiQueryState &state) const {
  const int64_t u = tc_.member_row[m];
  bool kept = false;
  for (int64_t r = td_.begin[u]; r < td_.begin[u + 1]; r++) {
    const int64_t t = td_.rows[r];
    if (exclude_in_scan_ && in_.excluded(q, t)) continue;
    if (!state.best.offer(pack_pair(sum, t))) break;
    kept = true;
  }
  if (!kept || !state.best.full()) return false;
  state.worst = distance_from_sum(in_.metric, pair_sum_of(state.best.bar()), 0, 0);
  if (!(state.worst < state.theta)) return false;
  state.theta = state.worst;
  return true;
}

// The results of every row of distinct query g, from its list.
void TiFilters::write_rows(int64_t g, TiTopK &best, TiScratch &s) const {
  const uint64_t *list = best.sorted();
  const int64_t listed = static_cast<int64_t>(best.size());
  s.list_distances.resize(listed);
  s.list_keys.resize(listed);
  for (int64_t e = 0; e < listed; e++) {
    s.list_distances[e] = distance_from_sum(in_.metric, pair_sum_of(list[e]), 0, 0);
    if (filter_at_output_) s.list_keys[e] = in_.target_keys[pair_row_of(list[e])];
  }
  const int64_t k = in_.k;
  for (int64_t r = qd_.begin[g]; r < qd_.begin[g + 1]; r++) {
    const int64_t q = qd_.rows[r];
    int64_t *neighbors = out_.neighbors + q * k;
    double *distances = out_.distances + q * k;
    int64_t written = 0;
    const int64_t key = filter_at_output_ ? in_.query_keys[q] : 0;
    for (int64_t e = 0; e < listed && written < k; e++) {
      if (filter_at_output_ && s.list_keys[e] == key) continue;
      neighbors[written] = pair_row_of(list[e]);
      distances[written++] = s.list_distances[e];
    }
    fill_empty_slots(k - written, neighbors + written, distances + written);
  }
}

}  // namespace cpu
}  // namespace knn
