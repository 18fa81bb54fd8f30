// gpu_cold_start.cpp -- the CPU engine's predicted time (gpu_cold_start.h).
#include "gpu_cold_start.h"

#include <algorithm>
#include <limits>

#include "cpu/cost_model.h"
#include "cpu/join_input.h"
#include "cpu/parallel_for.h"

namespace knn {
namespace {

// Seconds per (pair x 64-bit word) of the bit join's popcount loop on one
// thread: a few instructions a word (measured order of magnitude; the
// decision only needs it within a factor of two).
constexpr double kBitSecondsPerWordPair = 1e-9;

}  // namespace

double predict_cpu_seconds(const KnnProblem &p) {
  const int threads = cpu::resolve_threads(p.n_threads);
  const double pairs = static_cast<double>(p.n_queries) * static_cast<double>(p.n_targets);
  if (p.element == KNN_ELEMENT_BIT) {
    const double words = (static_cast<double>(p.dim) + 63) / 64;
    return pairs * words * kBitSecondsPerWordPair / threads;
  }
  // The model reads only the shape (and, for a self-join, whether the two
  // sides are one array); no row is touched.
  cpu::JoinInput input;
  input.queries = static_cast<const float *>(p.queries);
  input.n_queries = p.n_queries;
  input.targets = static_cast<const float *>(p.targets);
  input.n_targets = p.n_targets;
  input.dim = p.dim;
  input.k = p.k;
  input.metric = p.metric;
  input.n_threads = threads;
  const cpu::BruteForceCosts costs =
      cpu::predict_brute_force(input, input.same_rows());
  const double seconds = std::min(costs.avx2_seconds, costs.blas_seconds);
  return seconds >= 0 ? seconds : std::numeric_limits<double>::infinity();
}

}  // namespace knn
