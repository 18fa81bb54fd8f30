// rounding_margin.h -- (CPU and CUDA engines) how far a triangle-inequality bound built from
// *computed* distances may be off, so that pruning never drops a true
// neighbour or a tie.
//
// Let D(x, y) be a distance as knn_distance.h computes it and d(x, y) the
// exact real one. The triangle inequality holds for d, not for D, so every
// bound below is evaluated on D and then widened by margin().
//
// Error of one computed distance (u = 2^-24, float rounding unit):
//  * L1: each term |a-b| has one rounding; each of the 8 lanes adds at most
//    ceil(dim/8) non-negative terms and the fold adds 3 levels, so the sum
//    has relative error <= (ceil(dim/8) + 4) u (plus second-order terms).
//  * L2: each term (a-b)^2 has three roundings, so the squared sum is off by
//    <= (ceil(dim/8) + 6) u relative; sqrt halves that and adds 2^-53.
//  Both are below  e = (dim/8 + 8) u.  Gradual underflow adds an absolute
//  error of at most 2^-150 per operation: A = (dim + 16) 2^-149 for L1 and
//  sqrt of that for L2 (|sqrt x - sqrt y| <= sqrt |x - y|).
//  So D = d (1 + r) + a with |r| <= e and |a| <= A.
//
// Bounds used by the TI join, with S the sum of the computed distances that
// appear in the bound (the threshold included where one is compared):
//  * 1 landmark c:   D(q,t) >= |D(q,c) - D(t,c)| - (3 e S + 4 A)
//  * 2 landmarks:    D(q,t) >= D(cq,ct) - R_q - R_t - (3 e S + 4 A)
//                    D(q,t) <= R_q + D(cq,ct) + D(ct,t) + (4 e S + 4 A)
//  (each follows from the exact inequality on d by substituting
//  d = (D - a) / (1 + r) and dropping O(e^2) terms; the double arithmetic of
//  the bound itself adds about 2^-52 S.) margin() is 8 e S + 8 A, twice
//  what is needed, and the callers prune only when a bound is *strictly*
//  beyond the threshold, so equal distances (ties broken by row) are always
//  computed. The cost is nil: e is about 1e-6 even for 784 dimensions.
#pragma once

#include <cmath>

#include "knn_engine.h"

namespace knn {

class RoundingMargin {
 public:
  RoundingMargin(KnnMetric metric, int dim) {
    const double u = std::ldexp(1.0, -24);
    const double e = (dim / 8.0 + 8.0) * u;
    const double underflow_l1 = (dim + 16.0) * std::ldexp(1.0, -149);
    const double underflow =
        metric == KNN_METRIC_L2 ? std::sqrt(underflow_l1) : underflow_l1;
    relative_ = 8.0 * e;
    absolute_ = 8.0 * underflow;
  }

  // Widening for a bound whose computed distances sum to `magnitude`.
  double operator()(double magnitude) const {
    return relative_ * magnitude + absolute_;
  }

  double relative() const { return relative_; }

 private:
  double relative_;
  double absolute_;
};

}  // namespace knn
