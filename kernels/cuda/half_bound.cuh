// half_bound.cuh -- the proven error bound of the tensor-core (fp16) filter:
// from a GEMM of rows rounded to fp16 to lower bounds of the exact values
// that knn_distance.h computes (the selection value domain of
// tile_value.cuh). half_rows.cu prepares the rows and the per-row numbers
// used here.
//
// ---- Rows ----
// A float row x (dim d) with m = max |x_i| > 0 is scaled by a = 2^-e, with
// e = the exponent for which m a lies in [1/2, 1): x' = a x, exact in
// double (a power of two; no double under- or overflow for float inputs).
// h = fp16(x') (round to nearest; |x'_i| < 1, so no overflow); r = x' - h,
// exact in double (both are multiples of a common small power of two and
// differ by at most an fp16 ulp). A zero row has a = 1, h = r = 0. Per row
// we keep, in UNSCALED units (divided by a, exact):
//   hn >= ||h|| / a, rn >= (||r|| + ||s||) / a, xn >= (||x'|| + ||r||) / a,
//   sq = the double sum of x_i^2 (|sq - ||x||^2| <= d 2^-53 ||x||^2),
//   inv = 1 / a,
// where s = the fp16-subnormal entries of h (|h_i| < 2^-14); so xn >= ||x||
// and xn >= hn, and rn covers both the rounding and the subnormals.
// The norms are square roots of double sums of exact squares (h has 11
// significant bits, r and x' at most 24): relative error <= d 2^-53 + 2^-53,
// made an upper bound by the factor (1 + 2^-30) (d <= 2^16).
//
// ---- The GEMM ----
// G = the tensor-core dot of h_q and h_t with fp32 accumulation (cuBLAS
// GemmEx, fp16 inputs, CUBLAS_COMPUTE_32F). Every product h_q,i h_t,i is
// exact in fp32 (11 + 11 significant bits; magnitudes in [2^-48, 1]).
// Should the tensor cores flush subnormal fp16 inputs to zero (NVIDIA
// documents neither way for mma), they would compute with h - s instead of
// h; (h_q - s_q).(h_t - s_t) - h_q.h_t = -s_q.(h_t - s_t) - h_q.s_t, at
// most ||s_q|| ||h_t|| + ||h_q|| ||s_t|| (zeroing entries does not grow a
// norm), which E below covers through rn; the accumulation bound holds for
// h - s as well (its norms are at most ||h||).
// ASSUMPTION (NVIDIA does not document the accumulation's rounding): the
// fp32 accumulation, in whatever order, blocking, alignment and truncation
// the hardware and cuBLAS use (split-K included), is no worse than n
// additions each of relative error <= 2^-22 of the running sum of |terms|
// (4x the fp32 unit roundoff; truncating alignment as measured on
// V100/A100/H100 tensor cores errs by at most 2^-23), plus an absolute
// 2^-126 per addition for results near the fp32 underflow threshold. With
// n = half_row_stride(d) >= d the GEMM's length (zero padding counted):
//   |G - h_q.h_t| <= c S + (n + 2) 2^-126,  c = n 2^-22 (1 + 2^-10),
// where S = sum |h_q,i h_t,i| <= ||h_q|| ||h_t|| (Cauchy-Schwarz); the
// factor (1 + 2^-10) covers the second-order terms (n 2^-22 <= 2^-6).
//
// ---- fp16 output tiles ----
// The GEMM may also write G rounded to fp16 (cuBLAS GemmEx, output
// CUDA_R_16F, fp32 compute): g = fp16(G), in half the memory traffic of an
// fp32 tile. NVIDIA documents neither the conversion's rounding nor its
// direction, so only a faithful rounding is assumed (the result is one of
// the two fp16 neighbours of G): |g - G| <= ulp(G) <= 2^-10 |G| for normal
// results and <= 2^-24 (the subnormal spacing) otherwise, so
//   |g - G| <= o_r |g| + o_a,  o_r = 2^-10 / (1 - 2^-10),  o_a = 2^-24.
// No overflow: |h_i| < 1 makes |G| < (1 + c) n, below fp16's 65504 for
// n <= kHalfTileMaxStride. The bound below then uses g for G and adds
// (o_r |g| + o_a) inv_q inv_t to E (o_r = o_a = 0 for fp32 tiles).
//
// ---- The dot product ----
// With p = G inv_q inv_t (double; a product of powers of two: exact) and
// q . t = (x'_q . x'_t) inv_q inv_t,
//   x'_q . x'_t - h_q . h_t = h_q . r_t + r_q . x'_t, so, with flushed
//   subnormals or not (||s|| terms, see above; ||h_t|| <= xn_t),
//   |q . t - p| <= E := hn_q rn_t + rn_q xn_t + c hn_q hn_t
//                        + ((n + 2) 2^-126 + o_r |g| + o_a) inv_q inv_t,
// computed in double and multiplied by (1 + 2^-30) (its own rounding).
// The canonical float dot c_f = knn_dot(q, t) (IP, cosine) has
// |c_f - q . t| <= gamma_{d+1} sum |q_i t_i| + (2d + 4) 2^-150
//              <= G1 xn_q xn_t + U,  G1 = 2 (d + 2) 2^-24.
//
// ---- Lower bounds of the exact selection values ----
//  * L2: D = ||q - t||^2 = ||q||^2 + ||t||^2 - 2 q.t >= A - 2E - 2^-34 S2
//    - 2^-50 |p|, with A = sq_q + sq_t - 2p and S2 = sq_q + sq_t (the norms'
//    error and the double rounding of A, generously). The exact float
//    X = knn_l2_squared >= D (1 - gamma_{d+3}) - U (tile_value.cuh, the
//    DGEMM bound): L = lower (1 - 2 (d + 3) 2^-24) - U when lower > 0,
//    else lower - U.
//  * IP: X = -c_f >= -p - (E + G1 xn_q xn_t)(1 + 2^-30) - 2^-50 |p| - U.
//  * cosine: X = 1 - clamp(c_f / sqrt(qn tn)) with qn, tn the canonical
//    float norms; c_f <= C = p + (E + G1 xn_q xn_t)(1 + 2^-30) + U, and the
//    double quotient errs by < 2^-50 relative, so with s = C / sqrt(qn tn),
//    X >= 1 - clamp(s + 2^-48 |s| + 2^-45). Zero rows: NaN (exact, see
//    tile_value.cuh). qn tn not positive (underflow): -inf (always kept).
// A non-finite bound becomes -inf (always a candidate; certification then
// fails and the query is redone exactly). The IP and cosine bounds assume
// c_f finite, which these double row numbers do not ensure: TileValue
// gives -inf where a canonical float norm exceeds 2^124 (tile_value.cuh).
// (L2 needs no such test: an overflowing X is +inf, above any bound.)
//
// ---- The float prefilter (TileValue::may_beat) ----
// The selection first tests approx(v s) in float, s = the product of the
// rows' float inverse scales, against the threshold widened by a margin
// that must be >= approx - L. With rounding to nearest, |r_i| <= 2^-11
// |x'_i| + 2^-25, so ||r|| <= rho ||x'||, rho = 2^-11 + 2^-24 sqrt(d)
// (||x'|| >= 1/2); half_rows.cu checks ||s|| <= sigma ||x'||, sigma =
// 2^-12; so rn <= (rho + sigma) ||x||, hn, xn <= (1 + rho) ||x||, and
// inv <= 2 m <= 2 ||x||. Hence
//   E <= K ||q|| ||t||, K = (2 (rho + sigma)(1 + rho) + c (1 + rho)^2
//                          + 4 (n + 2) 2^-126)(1 + 2^-28),
// and ||q|| ||t|| <= (qn + tn) / 2 up to gamma_d. fp16 output tiles add
// to K the output term: |g| inv_q inv_t <= (1 + 2^-10)((1 + c)(1 + rho)^2
// ||q|| ||t|| + 2^-24 inv_q inv_t) and inv_q inv_t <= 4 ||q|| ||t||, so
//   K_out = 1.02 o_r (1 + rho)^2 + 2^-21
// (1.02 >= (1 + 2^-9)(1 + 2^-10)(1 + c) for c <= 2^-7, i.e. n <= 2^15). (A zero row has inv = 1
// and E = (n + 2) 2^-126 inv_t <= 4 (n + 2) 2^-126 ||t||, which is below
// max(1e-30, margin) for every ||t||.) The float test itself errs by a few
// ulps of qn + tn (and the canonical norms qn, tn differ from the squared
// norms by gamma_d), which the (6d + 16) 2^-24 and 2^-20 terms absorb.
// half_rows.cu checks the rounding inequality for every element and
// ||s|| <= sigma ||x'||, and marks a row that fails either check (or whose
// inverse scale leaves [2^-60, 2^60], where the float product s could
// leave the normal range) by a NaN scale: its pairs always go to the exact
// bound. The margins (set_half_bound_constants) are:
//   L2: (1.01 K + (6d + 16) 2^-24 + 2^-20)(qn + tn) + 1e-30
//   IP: (1.01 (K + G1) + 2^-20)(qn + tn) / 2 + 1e-30
//   cosine: 1.02 (K + G1) + 1e-4 (approx's float rounding, as tile_value.cuh)
#pragma once

#include <cmath>

namespace knn {
namespace cuda {

// Per-row numbers of the fp16 filter (unscaled units, see above).
struct HalfRowStats {
  double inv = 1.0;  // 1 / a, a power of two
  double hn = 0.0;   // >= ||h|| / a
  double rn = 0.0;   // >= (||r|| + ||s||) / a
  double xn = 0.0;   // >= (||x'|| + ||r||) / a: >= ||x|| and >= hn
  double sq = 0.0;   // double sum of x_i^2
};

// sigma of the row check (see above).
// (2^-12: a row may hold hundreds of fp16-subnormal entries before it
// fails; 2^-16 failed on many unit-norm embedding rows, and a failed row's
// pairs all take the slow exact test.)
constexpr double kHalfSubnormalShare = 0x1p-12;

// fp16 rows are stored with this many columns (zero padding): tensor-core
// GEMMs want rows of a multiple of 8 halves.
inline int half_row_stride(int dim) { return (dim + 7) & ~7; }

// fp16 output tiles only up to this GEMM length (no overflow, see above).
constexpr int kHalfTileMaxStride = 1 << 15;

struct HalfBound {
  double c = 0;      // accumulation factor c
  double acc = 0;    // (d + 2) 2^-126, scaled units
  double g1 = 0;     // G1
  double rel = 0;    // 2 (d + 3) 2^-24 (L2)
  double under = 0;  // U = (8d + 16) 2^-150
  double out_rel = 0;  // o_r: fp16 output tiles, else 0
  double out_abs = 0;  // o_a: fp16 output tiles, else 0

  __device__ __forceinline__ double dot_error(float g, const HalfRowStats &q,
                                              const HalfRowStats &t) const {
    const double scaled = acc + out_rel * fabs(static_cast<double>(g)) + out_abs;
    const double e = q.hn * t.rn + q.rn * t.xn + c * q.hn * t.hn + scaled * q.inv * t.inv;
    return e * (1.0 + 0x1p-30);
  }

  __device__ __forceinline__ double l2(float g, const HalfRowStats &q,
                                       const HalfRowStats &t) const {
    const double p = static_cast<double>(g) * q.inv * t.inv;
    const double s2 = q.sq + t.sq;
    const double lower = (s2 - 2.0 * p) - 2.0 * dot_error(g, q, t) - 0x1p-34 * s2 - 0x1p-50 * fabs(p);
    const double bound = lower > 0.0 ? lower * (1.0 - rel) - under : lower - under;
    return isfinite(bound) ? bound : -INFINITY;
  }

  __device__ __forceinline__ double ip(float g, const HalfRowStats &q,
                                       const HalfRowStats &t) const {
    const double p = static_cast<double>(g) * q.inv * t.inv;
    const double e = (dot_error(g, q, t) + g1 * q.xn * t.xn) * (1.0 + 0x1p-30);
    const double bound = -p - e - 0x1p-50 * fabs(p) - under;
    return isfinite(bound) ? bound : -INFINITY;
  }

  // qn, tn: the canonical float norms; zero rows are handled by the caller.
  __device__ __forceinline__ double cosine(float g, const HalfRowStats &q, const HalfRowStats &t,
                                           float qn, float tn) const {
    const double p = static_cast<double>(g) * q.inv * t.inv;
    const double up = p + (dot_error(g, q, t) + g1 * q.xn * t.xn) * (1.0 + 0x1p-30) + under;
    const double scale = sqrt(static_cast<double>(qn) * static_cast<double>(tn));
    if (!(scale > 0.0)) return -INFINITY;
    double s = up / scale;
    if (!isfinite(s)) return -INFINITY;
    s = s + 0x1p-48 * fabs(s) + 0x1p-45;
    s = fmin(1.0, fmax(-1.0, s));
    return 1.0 - s;
  }
};

// The constants of the bound for dim (half_tiles: the GEMM writes fp16),
// and the prefilter's relative margin for the metric (see above; 0 for L1,
// which has no GEMM form).
inline HalfBound make_half_bound(int dim, bool half_tiles) {
  const double d = dim;
  const double n = half_row_stride(dim);  // the GEMM's additions (zero padding included)
  HalfBound b;
  b.c = n * std::ldexp(1.0, -22) * (1.0 + std::ldexp(1.0, -10));
  b.acc = (n + 2.0) * std::ldexp(1.0, -126);
  b.g1 = 2.0 * (d + 2.0) * std::ldexp(1.0, -24);
  b.rel = 2.0 * (d + 3.0) * std::ldexp(1.0, -24);
  b.under = (8.0 * d + 16.0) * std::ldexp(1.0, -150);
  if (half_tiles) {
    b.out_rel = std::ldexp(1.0, -10) / (1.0 - std::ldexp(1.0, -10));
    b.out_abs = std::ldexp(1.0, -24);
  }
  return b;
}

// The row check of half_rows.cu and the prefilter margins use rho.
inline double half_rho(int dim) {
  return std::ldexp(1.0, -11) + std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(dim));
}

inline double half_prefilter_k(int dim, bool half_tiles) {
  const HalfBound b = make_half_bound(dim, half_tiles);
  const double rho = half_rho(dim);
  const double out =
      half_tiles ? 1.02 * b.out_rel * (1.0 + rho) * (1.0 + rho) + std::ldexp(1.0, -21) : 0.0;
  return (2.0 * (rho + kHalfSubnormalShare) * (1.0 + rho) + b.c * (1.0 + rho) * (1.0 + rho) +
          4.0 * b.acc + out) *
         (1.0 + std::ldexp(1.0, -28));
}

}  // namespace cuda
}  // namespace knn
