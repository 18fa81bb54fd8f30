// bitonic.cuh -- in-place bitonic sort of (key, row[, payload]) entries in
// shared memory by a group of threads (a warp or a block), ascending in
// the (key, row) order of select_keys.cuh. The order is total, so the
// result does not depend on the input order.
#pragma once

#include <cstdint>

#include "select_keys.cuh"

namespace knn {
namespace cuda {

// The smallest power of two >= x: the sizes the sort (and the candidate
// lists it merges) come in.
inline int next_pow2(int64_t x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

struct WarpSync {
  __device__ __forceinline__ void operator()() const { __syncwarp(); }
};
struct BlockSync {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// n must be a power of two. Every thread of the group calls this with the
// same n; thread `tid` of `nthreads` handles pairs tid, tid + nthreads, ...
// payload may be null.
template <class Sync>
__device__ __forceinline__ void bitonic_sort(uint64_t *key, uint32_t *row, double *payload,
                                             int n, int tid, int nthreads, Sync sync) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < n / 2; i += nthreads) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool ascending = (lo & size) == 0;
        const uint64_t ka = key[lo], kb = key[hi];
        const uint32_t ra = row[lo], rb = row[hi];
        const bool swap = ascending ? entry_before(kb, rb, ka, ra) : entry_before(ka, ra, kb, rb);
        if (swap) {
          key[lo] = kb;
          key[hi] = ka;
          row[lo] = rb;
          row[hi] = ra;
          if (payload != nullptr) {
            const double p = payload[lo];
            payload[lo] = payload[hi];
            payload[hi] = p;
          }
        }
      }
      sync();
    }
  }
}

}  // namespace cuda
}  // namespace knn
