// stopwatch.h -- (CPU engine and CUDA host code) the seconds an engine phase
// took, for KnnStats.
#pragma once

#include <chrono>

namespace knn {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace knn
