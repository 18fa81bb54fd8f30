// reference_rows.h -- test rows in every element type and the reference
// distance the engine tests compare with (GoogleTest, no PostgreSQL):
// float32, float16 and bit rows as the engine takes them, with float32
// copies, and each distance through kernels/knn_distance.h or a naive bit
// count, written independently of the engines.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "half_float.h"
#include "knn_distance.h"
#include "knn_engine.h"

namespace reference {

// Rows as the engine takes them, plus float32 copies for the reference.
struct Rows {
  KnnElement element = KNN_ELEMENT_FLOAT32;
  int dim = 0;
  int64_t n = 0;
  std::vector<float> f32;     // FLOAT32 rows, or FLOAT16 rows widened
  std::vector<uint16_t> f16;  // FLOAT16 rows
  std::vector<uint8_t> bits;  // BIT rows
  const void *data() const {
    if (element == KNN_ELEMENT_FLOAT16) return f16.data();
    if (element == KNN_ELEMENT_BIT) return bits.data();
    return f32.data();
  }
};

// Small integers (exact ties and duplicate rows everywhere), or, with
// spread, clustered real values that let the triangle inequality prune.
inline Rows make_rows(KnnElement element, int64_t n, int dim, std::mt19937_64 &rng,
                      bool spread = false) {
  Rows r;
  r.element = element;
  r.dim = dim;
  r.n = n;
  if (element == KNN_ELEMENT_BIT) {
    const int64_t bytes = (dim + 7) / 8;
    r.bits.assign(n * bytes, 0);
    for (int64_t i = 0; i < n; i++)
      for (int b = 0; b < dim; b++)
        if (rng() % 3 == 0) r.bits[i * bytes + b / 8] |= static_cast<uint8_t>(0x80 >> (b % 8));
    return r;
  }
  r.f32.resize(n * dim);
  if (spread) {
    std::normal_distribution<float> noise(0.0f, 0.05f);
    for (int64_t i = 0; i < n; i++) {
      const float centre = static_cast<float>(rng() % 16);
      for (int j = 0; j < dim; j++) r.f32[i * dim + j] = centre + noise(rng);
    }
  } else {
    for (auto &v : r.f32) {
      v = static_cast<float>(static_cast<int>(rng() % 7) - 3);
      if (rng() % 4 == 0) v += 0.25f;  // exactly representable in binary16 too
    }
  }
  if (element == KNN_ELEMENT_FLOAT16) {
    r.f16.resize(r.f32.size());
    for (size_t i = 0; i < r.f32.size(); i++) r.f16[i] = knn_float_to_half(r.f32[i]);
    for (size_t i = 0; i < r.f32.size(); i++) r.f32[i] = knn_half_to_float(r.f16[i]);
  }
  return r;
}

inline bool bit_at(const Rows &r, int64_t row, int i) {
  const int64_t bytes = (r.dim + 7) / 8;
  return (r.bits[row * bytes + i / 8] >> (7 - i % 8)) & 1;
}

// The operator's value between query row i and target row j.
inline double distance(KnnMetric metric, const Rows &q, int64_t i, const Rows &t, int64_t j) {
  if (q.element == KNN_ELEMENT_BIT) {
    uint64_t differ = 0, both = 0, ones_a = 0, ones_b = 0;
    for (int b = 0; b < q.dim; b++) {
      const bool x = bit_at(q, i, b), y = bit_at(t, j, b);
      differ += x != y;
      both += x && y;
      ones_a += x;
      ones_b += y;
    }
    if (metric == KNN_METRIC_HAMMING) return static_cast<double>(differ);
    return both == 0 ? 1.0 : 1.0 - static_cast<double>(both) / (ones_a + ones_b - both);
  }
  const float *a = q.f32.data() + i * q.dim;
  const float *b = t.f32.data() + j * t.dim;
  switch (metric) {
    case KNN_METRIC_L2: return knn_l2_from_squared(knn_l2_squared(a, b, q.dim));
    case KNN_METRIC_COSINE:
      return knn_cosine_from_dot(knn_dot(a, b, q.dim), knn_dot(a, a, q.dim), knn_dot(b, b, q.dim));
    case KNN_METRIC_IP: return knn_ip_from_dot(knn_dot(a, b, q.dim));
    default: return knn_l1_from_sum(knn_l1_sum(a, b, q.dim));
  }
}

}  // namespace reference
