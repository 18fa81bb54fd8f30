// gpu_cold_start.cpp -- the CPU engine's predicted time (gpu_cold_start.h).
#include "gpu_cold_start.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <thread>

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

double cpu_contention_from_loadavg(const char *loadavg, unsigned cores) {
  double one = 0, five = 0, fifteen = 0;
  long running = 0, total = 0;
  if (loadavg == nullptr || cores == 0 ||
      std::sscanf(loadavg, "%lf %lf %lf %ld/%ld", &one, &five, &fifteen, &running, &total) != 5 ||
      running < 1)
    return 1.0;
  return std::max(1.0, static_cast<double>(running) / cores);
}

double cpu_contention() {
  char text[128] = "";
  if (FILE *f = std::fopen("/proc/loadavg", "r")) {
    if (std::fgets(text, sizeof text, f) == nullptr) text[0] = '\0';
    std::fclose(f);
  }
  return cpu_contention_from_loadavg(text, std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace knn
