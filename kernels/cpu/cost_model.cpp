// cost_model.cpp -- the measured brute-force costs (cost_model.h).
#include "cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

#include "blas_buffers.h"
#include "blas_library.h"
#include "gemm_join.h"
#include "lane_sums.h"

namespace knn {
namespace cpu {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds per (pair x dimension) of each inner loop on one thread, at the
// calibration's shape (kCalibrationRows square tiles of kCalibrationDim).
struct Calibration {
  double lane_sum = 1e-9;
  double gemm = std::numeric_limits<double>::infinity();
};
constexpr int kCalibrationDim = 256, kCalibrationRows = 256;

// What the calibration does not see, measured on 2 threads, k = 20 (a
// 2-core Xeon with OpenBLAS 0.3.21; only tiny joins are sensitive to them):
// the AVX2 loop's key and top-k test per pair (keggD_std, 21-d: ~20 ns a
// pair besides its lane sums);
constexpr double kAvx2PerPair = 1e-8;
// the SGEMM's packing and edges: per multiply-add it costs about
// 1 + kGemmPackingRows / (tile side) + kGemmEdgeDims / dim times its
// asymptotic rate (32 x 32 tiles: 2.3x; 3 dimensions: 4.7x);
constexpr double kGemmPackingRows = 36.0;
constexpr double kGemmEdgeDims = 11.0;
// the filter of both tile views, per pair;
constexpr double kBlasPerPair = 5e-9;
// a candidate list's first fill and compactions (keep, nth_element) and
// its re-rank bookkeeping, per list entry (2k + 32 of them a query);
constexpr double kBlasPerListEntry = 1e-7;
// the re-rank's scattered rows against the calibration's contiguous ones
// (arcene, 10000-d);
constexpr double kScatteredRowsFactor = 1.6;
// and the passes over the input (norms, the subnormal scan, the SGEMM's
// first, cold reads of each row), per value.
constexpr double kBlasPerInputValue = 5e-10;

template <class F>
double best_of_five(F &&f) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 5; i++) {
    const Clock::time_point t = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t).count());
  }
  return best;
}

// The calibration's matrix: kCalibrationRows x kCalibrationDim values.
std::vector<float> calibration_rows() {
  std::vector<float> x(static_cast<size_t>(kCalibrationRows) * kCalibrationDim);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float &v : x) v = u(rng);
  return x;
}

double measure_lane_sum(const std::vector<float> &x) {
  constexpr int kDim = kCalibrationDim, kRows = kCalibrationRows, kQueries = 16;
  std::vector<float> sums(kRows);
  const double lanes = best_of_five([&] {
    for (int q = 0; q < kQueries; q++)
      lane_sums(KNN_METRIC_L2, x.data() + q * kDim, x.data(), kRows, kDim, sums.data());
  });
  return lanes / (double(kQueries) * kRows * kDim);
}

// Requires a BlasBufferLease that grants one SGEMM.
double measure_gemm(const std::vector<float> &x) {
  constexpr int kDim = kCalibrationDim, kRows = kCalibrationRows;
  std::vector<float> g(kRows * kRows);
  const double gemm = best_of_five(
      [&] { gemm_abt(x.data(), kRows, x.data(), kRows, kDim, g.data(), kRows); });
  return gemm / (double(kRows) * kRows * kDim);
}

// Measured once per process; the SGEMM's part waits for a join that finds
// room for OpenBLAS's buffer (blas_buffers.h): until then its cost is
// infinite and the AVX2 loop is chosen.
Calibration calibration() {
  static std::mutex mutex;
  static Calibration c;
  static bool lane_sum_measured = false, gemm_measured = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!lane_sum_measured) {
    c.lane_sum = measure_lane_sum(calibration_rows());
    lane_sum_measured = true;
  }
  if (!gemm_measured && blas_library().usable()) {
    const BlasBufferLease lease(1);
    if (lease.granted() > 0) {
      c.gemm = measure_gemm(calibration_rows());
      gemm_measured = true;
    }
  }
  return c;
}

double ceil_div(double a, double b) { return std::ceil(a / b); }

// Seconds of `items` equal work items of `item_seconds` each on `threads`
// threads that take them one at a time: the busiest thread's share.
double spread(double items, double item_seconds, double threads) {
  return ceil_div(items, threads) * item_seconds;
}

// One SGEMM multiply-add at tile side `rows` and depth `dim`.
double gemm_seconds_per_mac(const Calibration &c, double rows, int dim) {
  auto shape = [](double r, double d) { return 1.0 + kGemmPackingRows / r + kGemmEdgeDims / d; };
  return c.gemm / shape(kCalibrationRows, kCalibrationDim) * shape(rows, dim);
}

double predict_avx2(const Calibration &c, const JoinInput &input, double threads) {
  const double per_pair = c.lane_sum * input.dim + kAvx2PerPair;
  const double block = std::min<double>(
      static_cast<double>(brute_force_query_block(input.k, input.n_targets)),
      static_cast<double>(input.n_queries));
  const double blocks = ceil_div(static_cast<double>(input.n_queries), block);
  return spread(blocks, block * static_cast<double>(input.n_targets) * per_pair, threads);
}

double predict_blas(const Calibration &c, const JoinInput &input, bool symmetric,
                    double threads) {
  const double nq = static_cast<double>(input.n_queries);
  const double nt = static_cast<double>(input.n_targets);
  const double d = input.dim;
  const double block = static_cast<double>(gemm_block_rows(input.dim));
  // Threads share tiles: block pairs of a self-join (a diagonal one is a
  // whole square), query blocks otherwise; the busiest thread has at
  // least the largest tile.
  const double side = std::min(block, nq);
  const double q_blocks = ceil_div(nq, block);
  double macs, tiles;
  if (symmetric) {
    macs = d * (nq * nq + nq * side) / 2;
    tiles = q_blocks * (q_blocks + 1) / 2;
  } else {
    macs = d * nq * nt;
    tiles = q_blocks;
  }
  const double per_mac = gemm_seconds_per_mac(c, std::min(side, nt), input.dim);
  const double largest_tile = symmetric ? side * side * d : side * nt * d;
  const double list_entries = nq * (2.0 * input.k + 32);
  const double tile_work =
      macs * per_mac + nq * nt * kBlasPerPair + list_entries * kBlasPerListEntry;
  const double tile_seconds =
      std::max(tile_work / std::min(threads, tiles), largest_tile * per_mac);
  // The re-rank: about k + 2 candidates a query, in items of 64 queries.
  const double rerank_per_query =
      (input.k + 2.0) * c.lane_sum * d * kScatteredRowsFactor;
  const double rerank_block = std::min(64.0, nq);
  const double rerank =
      spread(ceil_div(nq, rerank_block), rerank_block * rerank_per_query, threads);
  const double values = (input.same_rows() ? nq : nq + nt) * d;
  return tile_seconds + rerank + values * kBlasPerInputValue;
}

}  // namespace

BruteForceCosts predict_brute_force(const JoinInput &input, bool symmetric) {
  const Calibration c = calibration();
  const double threads = std::max(1, input.n_threads);
  BruteForceCosts costs;
  costs.avx2_seconds = predict_avx2(c, input, threads);
  if (input.metric == KNN_METRIC_L1 || !blas_library().usable() || !std::isfinite(c.gemm))
    costs.blas_seconds = std::numeric_limits<double>::infinity();
  else
    costs.blas_seconds = predict_blas(c, input, symmetric, threads);
  return costs;
}

}  // namespace cpu
}  // namespace knn
