// cost_model.cpp -- the measured brute-force costs (cost_model.h).
#include "cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

#include "blas_library.h"
#include "gemm_join.h"
#include "lane_sums.h"

namespace knn {
namespace cpu {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds per (pair x dimension) of each inner loop on one thread, plus
// what each pair costs besides (selection, the filter of both tile views).
struct Calibration {
  double lane_sum = 1e-9;
  double gemm = std::numeric_limits<double>::infinity();
};
// Measured (2 threads, k = 20): keggD_std (21-d) spends ~20 ns a pair in
// the AVX2 loop besides its lane sums, ~5 ns in the SGEMM one.
constexpr double kAvx2PerPair = 1e-8;   // key, top-k test
constexpr double kBlasPerPair = 5e-9;   // bounds of both views, candidate lists
constexpr int64_t kBlasMinRows = 256;

template <class F>
double best_of_three(F &&f) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 3; i++) {
    const Clock::time_point t = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t).count());
  }
  return best;
}

Calibration measure() {
  constexpr int kDim = 256, kRows = 256, kQueries = 16;
  std::vector<float> x(static_cast<size_t>(kRows) * kDim), g(kRows * kRows), sums(kRows);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float &v : x) v = u(rng);
  Calibration c;
  const double lanes = best_of_three([&] {
    for (int q = 0; q < kQueries; q++)
      lane_sums(KNN_METRIC_L2, x.data() + q * kDim, x.data(), kRows, kDim, sums.data());
  });
  c.lane_sum = lanes / (double(kQueries) * kRows * kDim);
  if (blas_library().usable()) {
    const double gemm = best_of_three(
        [&] { gemm_abt(x.data(), kRows, x.data(), kRows, kDim, g.data(), kRows); });
    c.gemm = gemm / (double(kRows) * kRows * kDim);
  }
  return c;
}

const Calibration &calibration() {
  static Calibration c;
  static std::once_flag once;
  std::call_once(once, [] { c = measure(); });
  return c;
}

}  // namespace

BruteForceCosts predict_brute_force(const JoinInput &input, bool symmetric) {
  const Calibration &c = calibration();
  const double pairs = static_cast<double>(input.n_queries) * input.n_targets;
  const double threads = std::max(1, input.n_threads);
  BruteForceCosts costs;
  costs.avx2_seconds = pairs * (c.lane_sum * input.dim + kAvx2PerPair) / threads;
  // Fewer rows than a tile side on either side leave the SGEMM a thin,
  // matrix-vector-like product that the calibration's square one does not
  // predict (arcene, 100 x 10000: 11 ms against 4 ms for the AVX2 loop).
  if (input.metric == KNN_METRIC_L1 || !blas_library().usable() ||
      std::min(input.n_queries, input.n_targets) < kBlasMinRows) {
    costs.blas_seconds = std::numeric_limits<double>::infinity();
  } else {
    // A small tile side wastes the SGEMM's packing: below 64 dimensions
    // the measured rate is not reached.
    const double dim_penalty = input.dim >= 64 ? 1.0 : 64.0 / input.dim;
    const double gemm_share = symmetric ? 0.5 : 1.0;
    // Threads share tiles (block pairs of a self-join, query blocks
    // otherwise): a join of fewer tiles than threads leaves threads idle.
    const double blocks =
        std::ceil(static_cast<double>(input.n_queries) / gemm_block_rows(input.dim));
    const double tiles = symmetric ? blocks * (blocks + 1) / 2 : blocks;
    costs.blas_seconds = pairs *
                         (c.gemm * input.dim * dim_penalty * gemm_share + kBlasPerPair) /
                         std::min(threads, tiles);
  }
  return costs;
}

}  // namespace cpu
}  // namespace knn
