// result_padding.h -- the empty result slot of knn_engine.h (row -1,
// distance NaN), written by both engines for slots no target fills.
#pragma once

#include <cstdint>
#include <limits>

namespace knn {

constexpr int64_t kNoNeighbor = -1;

// Marks `count` consecutive slots empty (the tail of one query's k).
inline void fill_empty_slots(int64_t count, int64_t *neighbors, double *distances) noexcept {
  for (int64_t i = 0; i < count; i++) {
    neighbors[i] = kNoNeighbor;
    distances[i] = std::numeric_limits<double>::quiet_NaN();
  }
}

// Marks all n_queries * k slots empty.
inline void fill_padding(int64_t n_queries, int32_t k, int64_t *neighbors,
                         double *distances) noexcept {
  fill_empty_slots(n_queries * k, neighbors, distances);
}

}  // namespace knn
