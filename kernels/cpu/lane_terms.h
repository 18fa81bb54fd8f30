// lane_terms.h -- the term each metric sums over 8 float lanes at once,
// with the arithmetic of knn_distance.h (shared by lane_sums.cpp and
// ti_padded_sum.h). Internal to kernels/cpu/.
#pragma once

#include <cmath>
#include <cstdint>

#include "../knn_distance.h"

namespace knn {
namespace cpu {

// Eight float lanes as one GCC vector value: +, - and * act lane by lane
// with ordinary IEEE float rounding, exactly like the scalar code.
typedef float Lanes __attribute__((vector_size(KNN_LANES * sizeof(float))));
typedef uint32_t LaneBits __attribute__((vector_size(KNN_LANES * sizeof(float))));

// (Vectors are passed by reference: by value, their ABI differs with and
// without AVX.)
__attribute__((always_inline)) inline void load_lanes(Lanes &v, const float *p) {
  __builtin_memcpy(&v, p, sizeof(v));
}

// The term each metric sums, written as in knn_distance.h (term() for the
// tail, add() for whole groups of 8 dimensions).
struct SquaredDifference {  // L2
  static float term(float a, float b) {
    float d = a - b;
    return d * d;
  }
  __attribute__((always_inline)) static void add(Lanes &sum, const Lanes &a,
                                                 const Lanes &b) {
    Lanes d = a - b;
    sum = sum + d * d;
  }
};
struct Product {  // cosine, inner product
  static float term(float a, float b) { return a * b; }
  __attribute__((always_inline)) static void add(Lanes &sum, const Lanes &a,
                                                 const Lanes &b) {
    sum = sum + a * b;
  }
};
struct AbsoluteDifference {  // L1
  static float term(float a, float b) { return std::fabs(a - b); }
  __attribute__((always_inline)) static void add(Lanes &sum, const Lanes &a,
                                                 const Lanes &b) {
    // fabsf clears the sign bit; so does this mask, lane by lane.
    LaneBits bits = reinterpret_cast<LaneBits>(a - b) & 0x7fffffffu;
    sum = sum + reinterpret_cast<Lanes>(bits);
  }
};

}  // namespace cpu
}  // namespace knn
