// tile_value.cuh -- what the k-selection compares for one pair, computed
// from the value (float, or double for DGEMM tiles) a distance tile holds.
//
// Two kinds of tiles feed the selection:
//  * exact tiles (exact_tiles.cu) hold the canonical lane sum of
//    knn_distance.h (squared L2, L1 sum or dot product), bit for bit what
//    the CPU computes; the selection value is then an exact, strictly
//    monotone image of the operator's float8 result;
//  * GEMM tiles (cuBLAS SGEMM; DGEMM for L2 on GPUs with fast FP64; fp16
//    tensor cores on scaled rows, bound in half_bound.cuh) hold
//    dot products that are NOT exact; the
//    selection value is then a proven LOWER BOUND of the exact value, and
//    the candidates are re-ranked exactly and certified (rerank.cu).
//
// Selection values per metric ("value domain", shared with rerank.cu):
//   L2: squared distance (float lane sum, as double), L1: the sum,
//   IP: -dot, cosine: the operator's result 1 - dot / sqrt(|q|^2 |t|^2).
//
// ---- Error bounds of the GEMM path (u = 2^-24, gamma_n = n u / (1 - n u)) ----
// A float sum of n products (or squares of differences) computed in ANY
// order, with or without fused multiply-add, is off from the real sum by at
// most gamma_m * sum |terms|, m = the largest number of roundings one term
// goes through (products: 1, squared difference: 3, plus the depth of the
// summation tree, <= d). This covers knn_distance.h (8 lanes + fold) and
// any FP32 cuBLAS kernel (blocked, split-K with FP32 partials, FMA): FP32
// math with no TF32 and no emulation (the handle is set to pedantic math).
// Let qn = knn_dot(q,q), tn = knn_dot(t,t) (computed), g = the GEMM dot,
// c = knn_dot(q,t), X = the exact canonical value, D = |q - t|^2 (real).
//  * L2: A = qn + tn - 2g. |qn - |q|^2| <= gamma_{d} |q|^2 (same for t),
//    |g - q.t| <= gamma_{d} |q||t| <= gamma_{d} (|q|^2 + |t|^2) / 2, so
//    |A - D| <= 2 gamma_{d} (|q|^2 + |t|^2). X = knn_l2_squared has
//    |X - D| <= gamma_{d+3} D <= 2 gamma_{d+3} (|q|^2 + |t|^2). Hence
//    |A - X| <= 4 gamma_{d+3} (|q|^2+|t|^2) <= 4.6 (d+3) u (qn + tn) for
//    d < 2^20 (|q|^2 <= qn / (1 - gamma_d)). We use E = 8 (d+3) u (qn+tn).
//  * IP: X = -c, A = -g, |A - X| <= 2 gamma_{d} |q||t|
//    <= 2.2 d u sqrt(qn tn); we use E = 4 (d+2) u sqrt(qn tn).
//  * cosine: both use the same computed norms, so
//    |g/sqrt(qn tn) - c/sqrt(qn tn)| <= 2 gamma_d |q||t| / sqrt(qn tn)
//    <= 2.2 d u; clamping to [-1, 1] does not increase a difference; we use
//    E = 4 (d+2) u + 2^-45 (the double quotient's own rounding).
//  * Gradual underflow: each float operation may add an absolute error of
//    2^-150; the absolute terms below count every operation of both values,
//    doubled. Overflow: a non-finite A gives the bound -inf (always a
//    candidate; certification then falls back to the exact pass).
//  * IP and cosine use |q| <= sqrt(qn) above, which fails where the squares
//    underflow (components below 2^-63: qn may be 0 for a row that is not):
//    qn >= (1 - gamma_{d+1}) |q|^2 - d 2^-150, so they use
//    sqrt((qn + F)(tn + F)) with F = (d + 16) 2^-149 for sqrt(qn tn) in E.
//  * IP and cosine also assume c (and g) finite: an overflowing c makes
//    X = -inf (IP) while the bound stays finite, and the pair could be
//    dropped against a k-th value of -inf (a tie decided by row), or, on
//    the fp16 filter (whose row numbers are doubles), against any value.
//    A pair with qn or tn above kDotNormLimit = 2^124 (or NaN) gets the
//    bound -inf; below it |c|, |g| <= |q||t| (1 + gamma) < 2^126 (as
//    cpu/gemm_bound.h section 6).
// The double arithmetic of A - E itself adds about 2^-52 (qn + tn), far
// inside the factor-of-1.7 slack of the constants above.
//  * L2 from a DGEMM (the float inputs are exact in double): with qd, td
//    the double sums of squares and g the double dot, A = qd + td - 2g has
//    |A - D| <= 2 gamma53_{d} (|q|^2 + |t|^2) + 3 rounding steps
//    <= (2d + 8) 2^-53 (qd + td); we use E_A = (4d + 16) 2^-53 (qd + td),
//    so D >= A - E_A. The exact float X has X >= D (1 - gamma_{d+3}) - U
//    with gamma_{d+3} <= 1.07 (d+3) u; we use L = (A - E_A)(1 - 2(d+3)u) - U
//    when A - E_A > 0, else A - E_A - U (X >= 0 anyway). The margin is now
//    relative to the distance itself, not to the norms: far tighter when
//    the data sit far from the origin.
// Cosine with a zero vector (every component 0): the exact value is NaN
// for every partner (0/0), known exactly, so the "bound" is NaN, which the
// selection orders after every number, exactly as the final result does.
#pragma once

#include <cmath>
#include <cstdint>

#include "../knn_distance.h"
#include "../knn_engine.h"
#include "half_bound.cuh"

namespace knn {
namespace cuda {

enum class TileValueKind : int {
  kExactSum = 0,      // exact tile: L2 squared or L1 sum, value = sum
  kExactNegDot = 1,   // exact tile of dots: value = -dot (IP)
  kExactCosine = 2,   // exact tile of dots: value = cosine distance
  kBoundL2 = 3,       // GEMM tile of dots: lower bound of the squared L2
  kBoundIp = 4,       // GEMM tile of dots: lower bound of -dot
  kBoundCosine = 5,   // GEMM tile of dots: lower bound of the cosine distance
  kBoundL2Double = 6,  // DGEMM tile of double dots: lower bound of the squared L2
  // fp16 tensor-core tiles of scaled dots (half_bound.cuh): lower bounds
  kBoundL2Half = 7,
  kBoundIpHalf = 8,
  kBoundCosineHalf = 9
};

__host__ __device__ constexpr bool is_half_kind(TileValueKind k) {
  return k == TileValueKind::kBoundL2Half || k == TileValueKind::kBoundIpHalf ||
         k == TileValueKind::kBoundCosineHalf;
}

// Everything a tile value needs besides the float itself. Norms and zero
// flags are indexed by the row within the query / target chunk.
struct TileValue {
  TileValueKind kind = TileValueKind::kExactSum;
  const float *query_norm = nullptr;     // knn_dot(q, q)
  const float *target_norm = nullptr;
  const uint8_t *query_zero = nullptr;   // 1 when every component is 0
  const uint8_t *target_zero = nullptr;
  const double *query_norm_d = nullptr;  // sum of squares in double (kBoundL2Double)
  const double *target_norm_d = nullptr;
  double rel = 0;  // relative error factor E of the bound kinds
  double abs = 0;  // absolute (underflow) term
  double rel_d = 0;  // kBoundL2Double: the DGEMM side's relative error factor
  double norm_floor = 0;  // F of the SGEMM IP and cosine bounds (underflowed squares)
  // The fp16 kinds: per-row numbers, float inverse scales (NaN: the row is
  // never prefiltered), the bound's constants.
  const HalfRowStats *query_half = nullptr;
  const HalfRowStats *target_half = nullptr;
  const float *query_scale = nullptr;
  const float *target_scale = nullptr;
  HalfBound half;
  // The prefilter's relative margin of the bound kinds (may_beat): rel for
  // the SGEMM kinds, the derived margin of half_bound.cuh for the fp16 ones.
  float pre = 0.0f;

  // v is the tile's value: a float (exact tiles, SGEMM) or a double (DGEMM).
  __device__ __forceinline__ double operator()(double v, int64_t q, int64_t t) const {
    return at(kind, v, q, t);
  }

  // The same with the kind given: the selection kernels pass a constant, so
  // that only its case is compiled into their loops (a small loop body: the
  // full switch, inlined many times, misses the instruction cache).
  __device__ __forceinline__ double at(TileValueKind k, double v, int64_t q, int64_t t) const {
    switch (k) {
      case TileValueKind::kExactSum:
        return v;
      case TileValueKind::kExactNegDot:
        return knn_ip_from_dot(static_cast<float>(v));
      case TileValueKind::kExactCosine:
        return knn_cosine_from_dot(static_cast<float>(v), query_norm[q], target_norm[t]);
      case TileValueKind::kBoundL2Double:
        return bound_l2_double(v, query_norm_d[q], target_norm_d[t]);
      case TileValueKind::kBoundL2: {
        const double sum = static_cast<double>(query_norm[q]) + target_norm[t];
        const double bound = (sum - 2.0 * static_cast<double>(v)) - (rel * sum + abs);
        return isfinite(bound) ? bound : -INFINITY;
      }
      case TileValueKind::kBoundIp: {
        const float qn = query_norm[q], tn = target_norm[t];
        if (!dot_stays_finite(qn, tn)) return -INFINITY;
        const double bound = -static_cast<double>(v) - (rel * norm_product(qn, tn) + abs);
        return isfinite(bound) ? bound : -INFINITY;
      }
      case TileValueKind::kBoundCosine: {
        if (query_zero[q] || target_zero[t]) return NAN;
        const float qn = query_norm[q], tn = target_norm[t];
        if (!dot_stays_finite(qn, tn)) return -INFINITY;
        const double scale = sqrt(static_cast<double>(qn) * tn);
        double s = static_cast<double>(v) / scale;
        if (!isfinite(s)) return -INFINITY;
        s = fmin(1.0, fmax(-1.0, s));
        const double bound = (1.0 - s) - (rel * norm_product(qn, tn) + abs) / scale;
        return isfinite(bound) ? bound : -INFINITY;
      }
      case TileValueKind::kBoundL2Half:
        return half.l2(static_cast<float>(v), query_half[q], target_half[t]);
      case TileValueKind::kBoundIpHalf:
        // The fp16 bound holds for any finite row, but an overflowing
        // canonical dot does not (see above).
        if (!dot_stays_finite(query_norm[q], target_norm[t])) return -INFINITY;
        return half.ip(static_cast<float>(v), query_half[q], target_half[t]);
      case TileValueKind::kBoundCosineHalf: {
        if (query_zero[q] || target_zero[t]) return NAN;
        const float qn = query_norm[q], tn = target_norm[t];
        if (!dot_stays_finite(qn, tn)) return -INFINITY;
        return half.cosine(static_cast<float>(v), query_half[q], target_half[t], qn, tn);
      }
    }
    return -INFINITY;
  }

  // Canonical norms at or below this keep every dot product of the pair
  // (canonical or GEMM) finite; NaN fails too.
  static constexpr float kDotNormLimit = 0x1p124f;
  __device__ static __forceinline__ bool dot_stays_finite(float qn, float tn) {
    return (qn <= kDotNormLimit) & (tn <= kDotNormLimit);
  }

  // sqrt((qn + F)(tn + F)) >= (1 - gamma_{d+1}) |q||t|, also where the
  // squares underflow (F = norm_floor, see above).
  __device__ __forceinline__ double norm_product(float qn, float tn) const {
    return sqrt((static_cast<double>(qn) + norm_floor) * (static_cast<double>(tn) + norm_floor));
  }

  // kBoundL2Double from the DGEMM dot v and the two double norms (the
  // selection kernel loads the norms together with the tile values).
  __device__ __forceinline__ double bound_l2_double(double v, double qn_d, double tn_d) const {
    const double sum = qn_d + tn_d;
    const double lower = (sum - 2.0 * v) - rel_d * sum;  // <= the real |q - t|^2
    const double bound = lower > 0.0 ? lower * (1.0 - rel) - abs : lower - abs;
    return isfinite(bound) ? bound : -INFINITY;
  }

  // True when the kind needs the target's norm in may_beat().
  __device__ __forceinline__ bool prefilter_reads_norms() const {
    return kind == TileValueKind::kExactCosine || kind >= TileValueKind::kBoundL2;
  }

  // True for the fp16 kinds (the prefilter also reads the rows' scales).
  __device__ __forceinline__ bool prefilter_reads_scales() const {
    return is_half_kind(kind);
  }

  // A cheap float test that never rejects a pair which the exact test
  // (operator() then the (key, row) order) could keep against a threshold
  // of value thr: it returns false only when the pair's value is certainly
  // above thr. thr_up must be >= thr + 2^-18 |thr| (prefilter_threshold), which
  // absorbs the rounding of the float sum thr_up + margin. The margins
  // cover the float rounding of the approximation (a few ulps of its
  // terms: below 3e-7 of qn + tn, far under the 1e-5 used) plus, for the
  // bounds, the subtracted error term E (rel * scale, the underflow term
  // being below 1e-30). Non-finite approximations always go to the exact
  // test. For the fp16 kinds v is the tile value times both rows' float
  // inverse scales (half_bound.cuh derives `pre`).
  // thr_up for a threshold of value thr (finite or +inf): thr rounded up
  // to float and widened by 2^-18 of itself, as may_beat requires.
  __device__ static __forceinline__ float prefilter_threshold(double thr) {
    const float up = __double2float_ru(thr);
    return up + fabsf(up) * 0x1p-18f;
  }

  // The fp16 kinds' per-row terms that the prefilter reads: query q's norm
  // and inverse scale, the targets' arrays from row target_base on.
  struct HalfTerms {
    float query_norm, query_scale;
    const float *target_norm, *target_scale;
  };
  __device__ __forceinline__ HalfTerms half_terms(int64_t q, int64_t target_base) const {
    return HalfTerms{query_norm[q], query_scale[q], target_norm + target_base,
                     target_scale + target_base};
  }

  __device__ __forceinline__ bool may_beat(float v, float qn, float tn, float thr_up) const {
    return may_beat_as(kind, v, qn, tn, thr_up);
  }
  // Written without early returns or short-circuit operators: the
  // selection kernels evaluate it for every tile value, and branch-free
  // code (predicates combined with bitwise operators) is several
  // instructions shorter per value.
  __device__ __forceinline__ bool may_beat_as(TileValueKind k, float v, float qn, float tn,
                                              float thr_up) const {
    bool always = !isfinite(v);  // also a NaN scale (fmaxf would drop the NaN)
    float approx, margin;
    switch (k) {
      case TileValueKind::kExactSum:
        approx = v;
        margin = 0.0f;
        break;
      case TileValueKind::kExactNegDot:
        approx = -v;
        margin = 0.0f;
        break;
      case TileValueKind::kBoundL2:
      case TileValueKind::kBoundL2Half: {
        const float sum = qn + tn;
        approx = sum - 2.0f * v;
        margin = (pre + 1e-5f) * sum + 1e-30f;
        break;
      }
      case TileValueKind::kBoundIp:
      case TileValueKind::kBoundIpHalf:
        approx = -v;
        // >= E (the norm floor adds below 1e-35); norms past the dot's
        // limit have the bound -inf, which this must not reject.
        margin = (pre + 1e-5f) * 0.5f * (qn + tn) + 1e-30f;
        always = always | !dot_stays_finite(qn, tn);
        break;
      default: {  // cosine, exact or bound
        const float prod = qn * tn;
        // Tiny, zero, NaN or overflowing norms or product (a norm below
        // 1e-30 may be a subnormal float, off by much of itself), or norms
        // past the dot's limit (the bound kinds give -inf): exact test.
        always = always | !(prod > 1e-30f) | isinf(prod) | !(qn > 1e-30f) | !(tn > 1e-30f) |
                 !dot_stays_finite(qn, tn);
        const float sim = fminf(1.0f, fmaxf(-1.0f, v * rsqrtf(prod)));
        approx = 1.0f - sim;
        margin = pre + 1e-4f;
        break;
      }
    }
    return always | !(approx > thr_up + margin) | !isfinite(approx);
  }
};

// The error constants of the bound kinds for `dim` (see the derivation above).
inline void set_bound_constants(TileValue *tv, KnnMetric metric, int dim) {
  const double u = std::ldexp(1.0, -24);
  const double tiny = std::ldexp(1.0, -150);
  const double d = dim;
  tv->norm_floor = (d + 16.0) * std::ldexp(1.0, -149);
  switch (metric) {
    case KNN_METRIC_L2:
      tv->kind = TileValueKind::kBoundL2;
      tv->rel = 8.0 * (d + 3.0) * u;
      tv->abs = (32.0 * d + 64.0) * tiny;
      break;
    case KNN_METRIC_IP:
      tv->kind = TileValueKind::kBoundIp;
      tv->rel = 4.0 * (d + 2.0) * u;
      tv->abs = (8.0 * d + 16.0) * tiny;
      break;
    case KNN_METRIC_COSINE:
      tv->kind = TileValueKind::kBoundCosine;
      tv->rel = 4.0 * (d + 2.0) * u + std::ldexp(1.0, -45);
      tv->abs = (8.0 * d + 16.0) * tiny;
      break;
    case KNN_METRIC_L1:
      break;  // no GEMM form: L1 always uses exact tiles
  }
  tv->pre = static_cast<float>(tv->rel);
}

// The fp16 tensor-core filter (half_bound.cuh); half_tiles: its GEMM
// writes fp16 tiles.
inline void set_half_bound_constants(TileValue *tv, KnnMetric metric, int dim, bool half_tiles) {
  const double u = std::ldexp(1.0, -24);
  const double d = dim;
  tv->half = make_half_bound(dim, half_tiles);
  const double k = half_prefilter_k(dim, half_tiles);
  switch (metric) {
    case KNN_METRIC_L2:
      tv->kind = TileValueKind::kBoundL2Half;
      tv->pre = static_cast<float>(1.01 * k + (6.0 * d + 16.0) * u + std::ldexp(1.0, -20));
      break;
    case KNN_METRIC_IP:
      tv->kind = TileValueKind::kBoundIpHalf;
      tv->pre = static_cast<float>(1.01 * (k + tv->half.g1) + std::ldexp(1.0, -20));
      break;
    case KNN_METRIC_COSINE:
      tv->kind = TileValueKind::kBoundCosineHalf;
      tv->pre = static_cast<float>(1.02 * (k + tv->half.g1));
      break;
    case KNN_METRIC_L1:
      break;  // no GEMM form
  }
}

// L2 filtered by a DGEMM (see the derivation above).
inline void set_double_bound_constants(TileValue *tv, int dim) {
  const double d = dim;
  tv->kind = TileValueKind::kBoundL2Double;
  tv->rel_d = (4.0 * d + 16.0) * std::ldexp(1.0, -53);
  tv->rel = 2.0 * (d + 3.0) * std::ldexp(1.0, -24);
  tv->abs = (8.0 * d + 16.0) * std::ldexp(1.0, -150);
}

// The exact kind for a metric (exact tiles hold the metric's lane sum).
inline TileValueKind exact_kind(KnnMetric metric) {
  switch (metric) {
    case KNN_METRIC_IP: return TileValueKind::kExactNegDot;
    case KNN_METRIC_COSINE: return TileValueKind::kExactCosine;
    default: return TileValueKind::kExactSum;
  }
}

}  // namespace cuda
}  // namespace knn
