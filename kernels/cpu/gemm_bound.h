// gemm_bound.h -- which targets an SGEMM dot product cannot rule out, with
// the proof that no true neighbour (nor a tie) is ever ruled out.
//
// Notation: u = 2^-24, gamma_n = n u / (1 - n u), d = dim. q, t are rows
// (float vectors), |q| their real Euclidean norms. qn = knn_dot(q, q) and
// tn = knn_dot(t, t) (computed floats), g = the BLAS's float dot of q and
// t, c = knn_dot(q, t). X = the exact canonical value the results are
// ordered by (row_distance.h's ordering_key: knn_l2_squared for L2, -c for
// IP, knn_cosine_from_dot(c, qn, tn) for cosine). L1 has no GEMM form.
//
// 1. A float sum of n products, in ANY order and blocking, with or without
//    fused multiply-add, is within gamma_n sum|terms| of the real sum: every
//    term goes through at most 1 multiplication and n-1 additions (adding
//    0, as beta = 0 and the lanes' start do, is exact). So
//      |g - q.t|, |c - q.t| <= gamma_d |q||t| <= gamma_d (|q|^2+|t|^2)/2,
//      |qn - |q|^2| <= gamma_d |q|^2,  hence |q|^2 <= qn / (1 - gamma_d).
//    knn_l2_squared: each term (a-b)^2 has 3 roundings and <= d-1 additions:
//      |X - D| <= gamma_{d+2} D, D = |q-t|^2 <= 2 (|q|^2 + |t|^2).
// 2. L2. With A = qn + tn - 2g (real arithmetic) and S = |q|^2 + |t|^2:
//      |A - D| <= gamma_d S + gamma_d S = 2 gamma_d S,
//      |A - X| <= 2 gamma_d S + 2 gamma_{d+2} S <= 4 gamma_{d+2} S
//             <= 4 gamma_{d+2} / (1 - gamma_d) (qn + tn) <= 4.02 (d+2) u (qn+tn)
//    for d <= 16000 (d u < 1e-3). We use rel = 5 (d+3) u:
//      L = (1 - rel)(qn + tn) - 2g - abs <= X <= (1 + rel)(qn + tn) - 2g + abs = U.
// 3. IP. X = -c, A = -g: |A - X| <= 2 gamma_d |q||t| <= gamma_d S
//    <= 1.01 d u (qn + tn). We use rel = 2 (d+3) u:
//      L = -g - rel (qn + tn) - abs <= X <= -g + rel (qn + tn) + abs = U.
// 4. Cosine. X = 1 - clamp(c / sqrt(qn tn)), A = 1 - clamp(g / sqrt(qn tn))
//    (the same computed norms in both; clamping to [-1, 1] never widens a
//    difference): |A - X| <= |g - c| / sqrt(qn tn) <= 2 gamma_d |q||t| /
//    sqrt(qn tn) <= 2.01 d u. knn_cosine_from_dot's double arithmetic adds
//    < 2^-50. We use rel = 3 (d+3) u + 2^-40:  L = A - rel <= X <= A + rel = U.
//    Since 1 - clamp(s) >= 1 - s, the test below uses the unclamped
//    1 - g / sqrt(qn tn) - rel, which is <= L: it keeps at least as much.
// 5. Underflow: each float operation may add an absolute 2^-126 even where
//    a BLAS flushes tiny results to zero (2^-150 with gradual underflow);
//    the dots and norms of one pair take < 8d + 16 operations, so abs =
//    (32 d + 64) 2^-126 covers them (doubled). Inputs that are subnormal
//    (which a BLAS running with denormals-are-zero would read as 0) make
//    the path decline (gemm_join.cpp). For cosine the rows must have qn, tn
//    >= 2^-60, so abs / sqrt(qn tn) < (32 d + 64) 2^-66 < 2^-40 is inside rel.
// 6. Overflow: the path is used only when every qn, tn is finite and below
//    2^124 (gemm_supported): then every float above stays finite (D, |g|,
//    |c| < 2^126 (1 + gamma)), and the bounds hold. Otherwise the exact
//    brute force runs.
// 7. The tests are evaluated in double from float inputs. Each double
//    operation errs by <= 2^-53 of its magnitude; a comparison L <= tau can
//    only be decided wrongly when L and tau agree to a few 2^-52 of
//    (qn + tn + |tau|), where |tau| is then about |L| <= 3 (qn + tn). The
//    constants above exceed what 2-4 prove by at least (d+2) u (qn + tn)
//    (L2, IP) or 2^-24 (cosine), far more than these few 2^-50.
//
// Selection (gemm_join.cpp): per query, tau = the k-th smallest U among the
// eligible targets seen (+inf before k). The k targets with the smallest U
// have X <= U <= tau, so the k-th smallest X, X_k, is <= tau at every
// moment. A target of the true result has X <= X_k <= tau, so L <= tau:
// every target with L <= tau (<=, never <) is kept, and the exact re-rank
// of the kept ones in the (X, row) order returns exactly the k best (ties
// by row included, since every target with X <= X_k is kept).
//
// Form of the test, for speed: L <= tau  <=>  a[t] + m[t] g <= thr(q, tau):
//   L2:     a = (1 - rel) tn,  m = -2,            thr = tau + abs - (1 - rel) qn
//   IP:     a = -rel tn,       m = -1,            thr = tau + abs + rel qn
//   cosine: a = 0,             m = -1/sqrt(tn),   thr = (tau + rel - 1) sqrt(qn)
// (a rearrangement whose double rounding is covered by 7).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "../knn_engine.h"

namespace knn {
namespace cpu {

class GemmBound {
 public:
  // The constants below are proven for d u < 1e-3 (sections 2-4).
  static constexpr int kMaxDim = 16000;

  GemmBound(KnnMetric metric, int dim) : metric_(metric) {
    const double u = std::ldexp(1.0, -24), d = dim;
    abs_ = (32.0 * d + 64.0) * std::ldexp(1.0, -126);
    switch (metric) {
      case KNN_METRIC_L2: rel_ = 5.0 * (d + 3.0) * u; break;
      case KNN_METRIC_IP: rel_ = 2.0 * (d + 3.0) * u; break;
      default: rel_ = 3.0 * (d + 3.0) * u + std::ldexp(1.0, -40); break;
    }
  }

  // Norms (knn_dot(x, x)) the path accepts (section 6; 5 for cosine).
  bool norm_ok(float n) const {
    if (!(n < 0x1p124f)) return false;  // also false for NaN
    return metric_ != KNN_METRIC_COSINE || n >= 0x1p-60f;
  }

  // The per-target terms of the test.
  double a(float tn) const {
    switch (metric_) {
      case KNN_METRIC_L2: return (1.0 - rel_) * tn;
      case KNN_METRIC_IP: return -rel_ * tn;
      default: return 0.0;
    }
  }
  double m(float tn) const {
    switch (metric_) {
      case KNN_METRIC_L2: return -2.0;
      case KNN_METRIC_IP: return -1.0;
      default: return -1.0 / std::sqrt(static_cast<double>(tn));
    }
  }

  // The query's threshold for a + m g, given tau (+inf: keep everything).
  double threshold(float qn, double tau) const {
    if (!(tau < std::numeric_limits<double>::infinity()))
      return std::numeric_limits<double>::infinity();
    switch (metric_) {
      case KNN_METRIC_L2: return tau + abs_ - (1.0 - rel_) * qn;
      case KNN_METRIC_IP: return tau + abs_ + rel_ * qn;
      default: return (tau + rel_ - 1.0) * std::sqrt(static_cast<double>(qn));
    }
  }

  // U: an upper bound of the pair's exact ordering key.
  double upper(float qn, float tn, float g) const {
    switch (metric_) {
      case KNN_METRIC_L2:
        return (1.0 + rel_) * (static_cast<double>(qn) + tn) - 2.0 * g + abs_;
      case KNN_METRIC_IP:
        return -static_cast<double>(g) + rel_ * (static_cast<double>(qn) + tn) + abs_;
      default: {
        double s = g / std::sqrt(static_cast<double>(qn) * tn);
        s = std::fmin(1.0, std::fmax(-1.0, s));
        return 1.0 - s + rel_;
      }
    }
  }

 private:
  KnnMetric metric_;
  double rel_ = 0;
  double abs_ = 0;
};

}  // namespace cpu
}  // namespace knn
