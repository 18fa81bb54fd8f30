// grid.cuh -- how many blocks a launch gets.
#pragma once

#include <algorithm>
#include <cstdint>

namespace knn {
namespace cuda {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Kernels with grid-stride loops: blocks of `threads` for n items, at least
// one and at most 2^20 (beyond that each thread takes several items).
inline int grid_stride_blocks(int64_t n, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(n, threads), 1 << 20)));
}

// Kernels with one thread per item: every item covered (at least one block).
inline unsigned grid_for(int64_t threads, int block) {
  const int64_t g = ceil_div(threads, block);
  return static_cast<unsigned>(g < 1 ? 1 : (g > 2147483647 ? 2147483647 : g));
}

}  // namespace cuda
}  // namespace knn
