// ti_distinct.h -- the bitwise-identical rows of a set, grouped, so that
// the TI join runs once per distinct point (as the GPU engine does,
// kernels/cuda/ti_dedup.cu). Internal to kernels/cpu/.
//
// Identical rows have identical distances to everything (knn_distance.h is
// a function of the bits), so a distinct target stands for all its rows and
// a distinct query's neighbour list serves all its rows. The benchmark sets
// are full of copies (skin: 51444 distinct rows of 245057, kegg_std: 18575
// of 63608).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace knn {
namespace cpu {

struct DistinctRows {
  int dim = 0;
  int64_t n_distinct = 0;
  // Groups are numbered in the order of their first (smallest) row, so
  // comparing groups compares their first rows; a group's rows ascend.
  std::vector<int64_t> begin;  // n_distinct + 1 offsets into rows
  std::vector<int64_t> rows;
  // One copy of each group's values (n_distinct x dim): either owned or,
  // when every row is distinct, the input matrix itself.
  std::unique_ptr<float[]> owned;
  const float *values = nullptr;

  const float *value(int64_t g) const { return values + g * dim; }
  int64_t size(int64_t g) const { return begin[g + 1] - begin[g]; }
  int64_t first_row(int64_t g) const { return rows[begin[g]]; }
};

// Groups the n rows of `matrix` (n x dim). Returns false when cancelled.
bool find_distinct_rows(const float *matrix, int64_t n, int dim,
                        const int32_t *cancel, DistinctRows *out);

// Every row its own group (no search): for callers that must not merge.
void every_row_distinct(const float *matrix, int64_t n, int dim,
                        DistinctRows *out);

}  // namespace cpu
}  // namespace knn
