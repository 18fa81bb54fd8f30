// ti_join.h -- exact join with triangle-inequality filtering (Sweet KNN,
// sections II-C and III): merge identical rows (ti_distinct.h), cluster
// both sets of distinct points around landmarks, drop target clusters too
// far from a query cluster (level 1), then skip single targets whose bound
// already exceeds the query's current k-th distance (level 2,
// ti_filters.h). Internal to kernels/cpu/.
#pragma once

#include "clustering.h"
#include "join_input.h"

namespace knn {
namespace cpu {

// True when the TI join may run: a true metric (L2 or L1) and values small
// enough that no computed distance overflows (the bounds need finite
// distances). Otherwise the caller uses brute force.
bool ti_join_supports(const JoinInput &input);

enum class TiOutcome {
  kDone,                // output complete: exactly the brute-force results
  kCancelled,           // output incomplete
  kBruteForceIsFaster,  // declined after sampling; output incomplete
};

// Throws std::bad_alloc. With may_decline, TI first joins a small sample of
// queries and declines when they needed so large a share of all pairs that
// brute force would be faster (report->ti_sample_share says how large).
TiOutcome ti_join(const JoinInput &input, const JoinOutput &output,
                  const ClusteringOptions &options, bool may_decline,
                  JoinReport *report);

}  // namespace cpu
}  // namespace knn
