// bit_rows.cuh -- bit rows on the GPU, shared by the bit join (bit_join.cu)
// and the range join (range_join.cu): packing into 64-bit words as the CPU
// engine packs them, and the distance of one pair by popcount, bit for bit
// the CPU bit engine's (kernels/cpu/bit_join.h): counts are integers and
// the Jaccard quotient is the same IEEE double division.
#pragma once

#include <cstdint>
#include <vector>

namespace knn {
namespace cuda {

// 64-bit words per row of dim bits.
inline int64_t bit_row_words(int dim) { return ((static_cast<int64_t>(dim) + 7) / 8 + 7) / 8; }

// Rows as 64-bit words, the bits past dim cleared (a caller's stray
// padding bits must not count); word-major (word w of every row, then word
// w + 1) when `transpose`, the targets' layout: 32 lanes reading 32
// neighbouring rows then read 32 neighbouring words.
std::vector<uint64_t> pack_bit_rows(const void *rows, int64_t n, int dim, int64_t words,
                                    bool transpose);

// The distance between query q (row-major words, q_ones set bits) and
// target t of word-major `targets` (nt rows).
template <bool kJaccard>
__device__ __forceinline__ double bit_pair_distance(const uint64_t *q, const uint64_t *targets,
                                                    int64_t nt, int64_t t, int words,
                                                    unsigned long long q_ones) {
  unsigned long long n = 0, t_ones = 0;
  for (int w = 0; w < words; w++) {
    const uint64_t b = targets[static_cast<int64_t>(w) * nt + t];
    const uint64_t x = q[w];
    if (kJaccard) {
      n += __popcll(x & b);
      t_ones += __popcll(b);
    } else {
      n += __popcll(x ^ b);
    }
  }
  if (!kJaccard) return static_cast<double>(n);
  if (n == 0) return 1;
  return 1 - (static_cast<double>(n) / static_cast<double>(q_ones + t_ones - n));
}

}  // namespace cuda
}  // namespace knn
