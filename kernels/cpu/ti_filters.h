// ti_filters.h -- the two filters of the TI join (Sweet KNN, section III)
// over distinct points (ti_distinct.h) and their clusters: level 1 drops
// target clusters too far from a slice of a query cluster, level 2 skips
// single targets whose bound already exceeds the query's current k-th
// distance. Internal to kernels/cpu/.
//
// Notation: q a query, t a target, cq / ct their cluster centres, R_q / R_t
// the radii of their clusters, D(.,.) a computed distance. All pruning
// compares a bound widened by RoundingMargin with a threshold and prunes
// only when the bound is strictly beyond it (rounding_margin.h explains
// why this never loses a neighbour or a tie).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "clustering.h"
#include "join_input.h"
#include "ti_distinct.h"
#include "ti_top_k.h"
#include "../rounding_margin.h"

namespace knn {
namespace cpu {

// The two sides of the join (for a self-join both point to one of each).
struct TiSides {
  const DistinctRows *queries = nullptr;
  const DistinctRows *targets = nullptr;
  const Clustering *query_clusters = nullptr;   // of queries->values
  const Clustering *target_clusters = nullptr;  // of targets->values
  // > 0: the rows of a distinct query share one list of k + this many
  // pairs, from which each row drops its own excluded targets as it is
  // written. 0: no keys, or exclusion applied while scanning (then every
  // query row is its own group).
  int64_t excluded_at_output = 0;
};

// Level 2 state of one distinct query.
struct TiQueryState {
  TiTopK best;
  double theta = 0;  // no neighbour of the query is farther than this
  double worst = 0;  // distance of best's worst pair, when best is full
};

// Per-thread working space, reused across slices (on cache lines of its
// own: level 2 updates the counters all the time).
struct alignas(64) TiScratch {
  std::vector<float> sums;                             // lane sums to centres
  std::vector<std::pair<double, int64_t>> by_centre;  // (D(cq,ct), ct)
  std::vector<double> bounds;                          // max-heap of upper bounds
  std::vector<int64_t> candidates;                     // target clusters kept
  std::vector<TiQueryState> queries;                   // one per query of a slice
  std::vector<double> list_distances;                  // of one query's list
  std::vector<int64_t> list_keys;                      // its targets' keys
  int poll = 0;                                        // visits to the next cancel check
  int64_t distances = 0;
  int64_t landmark_distances = 0;
  double seconds_level1 = 0;
  double seconds_level2 = 0;
};

class TiFilters {
 public:
  TiFilters(const JoinInput &input, const JoinOutput &output, const TiSides &sides);

  // Pairs kept per distinct query.
  int64_t capacity() const { return capacity_; }

  // Working space for slices of at most `slice` distinct queries.
  void prepare_scratch(int64_t slice, TiScratch *s) const;

  // Level 1 for the distinct queries of cluster cq that all lie within rq
  // of its centre: the upper bound of every such query's k-th distance,
  // and in s.candidates the target clusters that may hold a neighbour
  // (nearest centre first). Returns the bound.
  double level1(int64_t cq, double rq, TiScratch &s) const;

  // Level 2 for the distinct queries in member slots [first, last) of one
  // query cluster (after level1 for them), and the results of all their
  // rows. Returns false when cancelled.
  bool level2(int64_t first, int64_t last, double ub, TiScratch &s) const;

 private:
  template <class Term>
  bool level2_with(int64_t first, int64_t last, double ub, TiScratch &s) const;
  template <class Term, int kBlocks>
  bool level2_isa(int64_t first, int64_t last, double ub, TiScratch &s) const;
  template <class Term, int kBlocks>
  bool level2_avx2(int64_t first, int64_t last, double ub, TiScratch &s) const;
  // kBlocks: lane blocks per row (1 to 4), or 0 for longer rows, which
  // are computed in batches.
  template <class Term, int kBlocks>
  bool level2_for(int64_t first, int64_t last, double ub, TiScratch &s) const;
  template <class Term, int kBlocks>
  bool scan(int64_t j, int64_t ct, double dqc, double slack, TiQueryState &state,
            TiScratch &s) const;
  void offer_batch(const float *q_row, int64_t q, const int64_t *members, int count,
                   TiQueryState &state, TiScratch &s) const;
  bool offer_rows(int64_t q, int64_t m, float sum, TiQueryState &state) const;
  void write_rows(int64_t g, TiTopK &best, TiScratch &s) const;

  const JoinInput &in_;
  const JoinOutput &out_;
  const DistinctRows &qd_;
  const DistinctRows &td_;
  const Clustering &qc_;
  const Clustering &tc_;
  const RoundingMargin margin_;
  const bool filter_at_output_;
  const bool exclude_in_scan_;
  const int64_t capacity_;
  const int64_t bounds_needed_;
  const int blocks_;  // lane blocks per padded row
  // Per target member slot: the first row of its distinct point (member
  // order, so that level 2 reads it in sequence).
  std::vector<int64_t> member_first_row_;
};

}  // namespace cpu
}  // namespace knn
