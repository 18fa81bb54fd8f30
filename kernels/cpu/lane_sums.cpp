// lane_sums.cpp -- the blocked lane sums and their CPU dispatch
// (lane_sums.h).
#include "lane_sums.h"

#include "lane_terms.h"
#include "../knn_distance.h"

namespace knn {
namespace cpu {
namespace {

constexpr int kTargetsPerPass = 8;

// sums[n] = the lane sum of (query, rows[n]) for n < N.
template <class Term, int N>
__attribute__((always_inline)) inline void lane_sums_pass(
    const float *query, const float *const *rows, int dim, float *sums) {
  Lanes lanes[N];
  for (int n = 0; n < N; n++) lanes[n] = Lanes{};
  int i = 0;
  for (; i + KNN_LANES <= dim; i += KNN_LANES) {
    Lanes q, t;
    load_lanes(q, query + i);
    for (int n = 0; n < N; n++) {
      load_lanes(t, rows[n] + i);
      Term::add(lanes[n], q, t);
    }
  }
  for (int n = 0; n < N; n++) {
    float l[KNN_LANES];
    __builtin_memcpy(l, &lanes[n], sizeof(l));
    for (int ii = i, j = 0; ii < dim; ii++, j++)
      l[j] = l[j] + Term::term(query[ii], rows[n][ii]);
    sums[n] = knn_fold_lanes(l);
  }
}

// Fewer than 8 rows: passes of 4, 2 and 1 (one row alone is a chain of
// dependent adds; several in a pass overlap).
template <class Term>
__attribute__((always_inline)) inline void sum_remainder(
    const float *query, const float *const *rows, int64_t count, int dim,
    float *sums) {
  int64_t r = 0;
  if (count - r >= 4) {
    lane_sums_pass<Term, 4>(query, rows + r, dim, sums + r);
    r += 4;
  }
  if (count - r >= 2) {
    lane_sums_pass<Term, 2>(query, rows + r, dim, sums + r);
    r += 2;
  }
  if (count - r >= 1) lane_sums_pass<Term, 1>(query, rows + r, dim, sums + r);
}

// Rows stored one after the other, `stride` floats apart.
template <class Term>
__attribute__((always_inline)) inline void sum_stored_rows(
    const float *query, const float *targets, int64_t count, int dim,
    int64_t stride, float *sums) {
  const float *rows[kTargetsPerPass];
  int64_t r = 0;
  for (; r + kTargetsPerPass <= count; r += kTargetsPerPass) {
    for (int n = 0; n < kTargetsPerPass; n++) rows[n] = targets + (r + n) * stride;
    lane_sums_pass<Term, kTargetsPerPass>(query, rows, dim, sums + r);
  }
  for (int64_t n = 0; r + n < count; n++) rows[n] = targets + (r + n) * stride;
  sum_remainder<Term>(query, rows, count - r, dim, sums + r);
}

// Rows anywhere.
template <class Term>
__attribute__((always_inline)) inline void sum_scattered_rows(
    const float *query, const float *const *rows, int64_t count, int dim,
    float *sums) {
  int64_t r = 0;
  for (; r + kTargetsPerPass <= count; r += kTargetsPerPass)
    lane_sums_pass<Term, kTargetsPerPass>(query, rows + r, dim, sums + r);
  sum_remainder<Term>(query, rows + r, count - r, dim, sums + r);
}

// Each kernel is built twice: for the baseline x86-64 target and for AVX2.
// Both compile the same source with -ffp-contract=off, so every lane sees
// the same sequence of correctly rounded float adds and multiplies.
template <class Term>
void rows_generic(const float *query, const float *targets, int64_t count,
                  int dim, int64_t stride, float *sums) {
  sum_stored_rows<Term>(query, targets, count, dim, stride, sums);
}
template <class Term>
void scattered_generic(const float *query, const float *const *rows,
                       int64_t count, int dim, float *sums) {
  sum_scattered_rows<Term>(query, rows, count, dim, sums);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KNN_HAVE_AVX2_PATH 1
template <class Term>
__attribute__((target("avx2"))) void rows_avx2(const float *query,
                                               const float *targets,
                                               int64_t count, int dim,
                                               int64_t stride, float *sums) {
  sum_stored_rows<Term>(query, targets, count, dim, stride, sums);
}
template <class Term>
__attribute__((target("avx2"))) void scattered_avx2(const float *query,
                                                    const float *const *rows,
                                                    int64_t count, int dim,
                                                    float *sums) {
  sum_scattered_rows<Term>(query, rows, count, dim, sums);
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

template <class Term>
void rows_dispatch(const float *query, const float *targets, int64_t count,
                   int dim, int64_t stride, float *sums) {
#ifdef KNN_HAVE_AVX2_PATH
  if (cpu_has_avx2()) return rows_avx2<Term>(query, targets, count, dim, stride, sums);
#endif
  rows_generic<Term>(query, targets, count, dim, stride, sums);
}

template <class Term>
void scattered_dispatch(const float *query, const float *const *rows,
                        int64_t count, int dim, float *sums) {
#ifdef KNN_HAVE_AVX2_PATH
  if (cpu_has_avx2()) return scattered_avx2<Term>(query, rows, count, dim, sums);
#endif
  scattered_generic<Term>(query, rows, count, dim, sums);
}

}  // namespace

void lane_sums(KnnMetric metric, const float *query, const float *targets,
               int64_t count, int dim, float *sums) {
  lane_sums_strided(metric, query, targets, count, dim, dim, sums);
}

void lane_sums_strided(KnnMetric metric, const float *query, const float *targets,
                       int64_t count, int dim, int64_t stride, float *sums) {
  switch (metric) {
    case KNN_METRIC_L2:
      return rows_dispatch<SquaredDifference>(query, targets, count, dim, stride, sums);
    case KNN_METRIC_COSINE:
    case KNN_METRIC_IP:
      return rows_dispatch<Product>(query, targets, count, dim, stride, sums);
    case KNN_METRIC_L1:
      return rows_dispatch<AbsoluteDifference>(query, targets, count, dim, stride, sums);
    default:  // the bit metrics never reach the float engines (problem_check.h)
      return;
  }
}

void lane_sums_scattered(KnnMetric metric, const float *query,
                         const float *const *rows, int64_t count, int dim,
                         float *sums) {
  switch (metric) {
    case KNN_METRIC_L2:
      return scattered_dispatch<SquaredDifference>(query, rows, count, dim, sums);
    case KNN_METRIC_COSINE:
    case KNN_METRIC_IP:
      return scattered_dispatch<Product>(query, rows, count, dim, sums);
    case KNN_METRIC_L1:
      return scattered_dispatch<AbsoluteDifference>(query, rows, count, dim, sums);
    default:  // the bit metrics never reach the float engines (problem_check.h)
      return;
  }
}

const char *lane_sums_isa() {
#ifdef KNN_HAVE_AVX2_PATH
  if (cpu_has_avx2()) return "avx2";
#endif
  return "generic";
}

}  // namespace cpu
}  // namespace knn
