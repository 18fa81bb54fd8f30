// brute_force.h -- exact join by evaluating every query-target pair.
// Internal to kernels/cpu/.
#pragma once

#include "join_input.h"

namespace knn {
namespace cpu {

// Every metric. Queries are taken in blocks and targets in tiles that stay
// in cache; each pair's distance is the canonical one (lane_sums.h +
// row_distance.h). Returns false when cancelled (the output is then
// incomplete); throws std::bad_alloc when memory runs out.
bool brute_force_join(const JoinInput &input, const JoinOutput &output,
                      JoinReport *report);

}  // namespace cpu
}  // namespace knn
