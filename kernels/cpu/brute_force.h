// brute_force.h -- exact join by evaluating every query-target pair.
// Internal to kernels/cpu/.
#pragma once

#include <cstdint>
#include <vector>

#include "join_input.h"

namespace knn {
namespace cpu {

// Every metric. Queries are taken in blocks and targets in tiles that stay
// in cache; each pair's distance is the canonical one (lane_sums.h +
// row_distance.h). Returns false when cancelled (the output is then
// incomplete); throws std::bad_alloc when memory runs out.
bool brute_force_join(const JoinInput &input, const JoinOutput &output,
                      JoinReport *report);

// knn_dot(x, x) of each of n rows (in parallel; incomplete when cancelled).
std::vector<float> squared_norms(const float *rows, int64_t n, int dim,
                                 const JoinInput &input);

// The same for the queries query_rows[0 .. n_rows) only (their slots of
// the output); adds their pairs to report->distance_computations.
bool brute_force_queries(const JoinInput &input, const JoinOutput &output,
                         const int64_t *query_rows, int64_t n_rows, JoinReport *report);

}  // namespace cpu
}  // namespace knn
