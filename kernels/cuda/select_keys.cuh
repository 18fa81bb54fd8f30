// select_keys.cuh -- the sort keys of the GPU k-selection.
//
// Every candidate is an entry (key, row). The key is a double mapped to a
// uint64 whose unsigned order is the order of the doubles (NaN after every
// number, -0 and +0 equal), so comparing (key, row) lexicographically is
// exactly knn_result_before() on (value, row). Two sentinels sit above all
// values: kNanKey (a NaN value, still a real result) and kEmptyKey (no
// entry: an unused slot or an excluded pair).
#pragma once

#include <cstdint>

namespace knn {
namespace cuda {

constexpr uint64_t kEmptyKey = ~0ull;
constexpr uint64_t kNanKey = ~0ull - 1;
constexpr uint32_t kEmptyRow = ~0u;

__host__ __device__ __forceinline__ uint64_t order_key(double v) {
  if (v != v) return kNanKey;
  if (v == 0.0) v = 0.0;  // -0 and +0 compare equal, so they share a key
  uint64_t bits;
#if defined(__CUDA_ARCH__)
  bits = static_cast<uint64_t>(__double_as_longlong(v));
#else
  __builtin_memcpy(&bits, &v, sizeof bits);
#endif
  // Negative numbers: flip all bits (larger magnitude = smaller); positive:
  // set the sign bit so they sort above every negative.
  return (bits >> 63) ? ~bits : (bits | (1ull << 63));
}

// The inverse of order_key for keys of numbers (not the sentinels).
__host__ __device__ __forceinline__ double key_value(uint64_t key) {
  uint64_t bits = (key >> 63) ? (key & ~(1ull << 63)) : ~key;
  double v;
#if defined(__CUDA_ARCH__)
  v = __longlong_as_double(static_cast<long long>(bits));
#else
  __builtin_memcpy(&v, &bits, sizeof v);
#endif
  return v;
}

// (key_a, row_a) comes before (key_b, row_b).
__host__ __device__ __forceinline__ bool entry_before(uint64_t key_a, uint32_t row_a,
                                                     uint64_t key_b, uint32_t row_b) {
  return key_a < key_b || (key_a == key_b && row_a < row_b);
}

}  // namespace cuda
}  // namespace knn
