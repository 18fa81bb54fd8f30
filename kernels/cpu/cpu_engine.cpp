// cpu_engine.cpp -- knn::cpu_run: checks the problem, picks TI, the SGEMM
// brute force or the AVX2 one (from a measured cost model and TI's own
// sample), runs it and fills KnnStats. No exception leaves this file.
#include "cpu_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "blas_library.h"
#include "brute_force.h"
#include "cost_model.h"
#include "cpu_tuning.h"
#include "gemm_join.h"
#include "join_input.h"
#include "parallel_for.h"
#include "ti_join.h"
#include "../entry_guard.h"
#include "../problem_check.h"
#include "../result_padding.h"

namespace knn {
namespace {

using Clock = std::chrono::steady_clock;

// Below this many pairs AUTO uses brute force: clustering would cost more
// than it saves. Above it AUTO tries TI, which samples its own pruning and
// hands over to brute force when that is faster (ti_join.h).
constexpr double kAutoTiMinPairs = 1e6;

cpu::JoinInput join_input(const KnnProblem &p, const int32_t *cancel) {
  cpu::JoinInput input;
  input.queries = float_rows(p.queries);
  input.n_queries = p.n_queries;
  input.targets = float_rows(p.targets);
  input.n_targets = p.n_targets;
  input.dim = p.dim;
  input.k = p.k;
  input.metric = p.metric;
  input.query_keys = p.query_keys;
  input.target_keys = p.target_keys;
  input.n_threads = cpu::resolve_threads(p.n_threads);
  input.cancel = cancel;
  return input;
}

// AUTO skips TI's sample (and its clustering) only where TI is hopeless
// against the SGEMM brute force: very many dimensions (TI's bounds lose
// their grip; fashion-mnist, 784-d: TI 9.6 s, SGEMM 1.8 s) and an SGEMM
// predicted this many times faster than the AVX2 loop, the brute force
// TI's own break-even share (ti_join.cpp) is measured against. Below that
// dimension TI samples and decides (blog, 281-d: TI 1.1 s, SGEMM 15 s).
constexpr double kBlasSkipsTi = 2.5;
constexpr int kBlasSkipsTiMinDim = 512;

bool choose_ti(const KnnProblem &p, const cpu::JoinInput &input, const CpuTuning &tuning,
               const cpu::BruteForceCosts &costs) {
  if (tuning.variant == CpuTuning::Variant::kTi) return cpu::ti_join_supports(input);
  if (tuning.variant != CpuTuning::Variant::kAuto) return false;
  if (p.method == KNN_METHOD_BRUTE) return false;
  if (p.method != KNN_METHOD_TI) {
    const double pairs = static_cast<double>(p.n_queries) * static_cast<double>(p.n_targets);
    if (pairs < kAutoTiMinPairs) return false;
    if (input.dim >= kBlasSkipsTiMinDim && costs.blas_seconds * kBlasSkipsTi <= costs.avx2_seconds)
      return false;
  }
  // Last: it reads every value, which the cheap tests above may spare.
  return cpu::ti_join_supports(input);  // cosine, IP, huge values
}

bool choose_blas(const CpuTuning &tuning, const cpu::BruteForceCosts &costs) {
  if (tuning.variant == CpuTuning::Variant::kBlas) return true;
  if (tuning.variant != CpuTuning::Variant::kAuto) return false;
  return costs.blas_seconds < costs.avx2_seconds;
}

// Runs the chosen method; returns false when cancelled. *used_ti says
// whether TI produced the result (it may hand over to brute force).
bool join(const KnnProblem &p, const CpuTuning &tuning, const cpu::JoinInput &input,
          const cpu::JoinOutput &output, cpu::JoinReport *report, bool *used_ti) {
  *used_ti = false;
  if (p.n_queries == 0 || p.n_targets == 0) {
    fill_padding(p.n_queries, p.k, output.neighbors, output.distances);
    report->variant = "empty";
    return true;
  }
  const bool symmetric = tuning.symmetric && input.same_rows();
  const cpu::BruteForceCosts costs = tuning.variant == CpuTuning::Variant::kAuto
                                         ? cpu::predict_brute_force(input, symmetric)
                                         : cpu::BruteForceCosts{};
  if (choose_ti(p, input, tuning, costs)) {
    const bool may_decline =
        p.method == KNN_METHOD_AUTO && tuning.variant == CpuTuning::Variant::kAuto;
    const cpu::TiOutcome outcome =
        cpu::ti_join(input, output, cpu::ClusteringOptions(), may_decline, report);
    if (outcome != cpu::TiOutcome::kBruteForceIsFaster) {
      *used_ti = true;
      return outcome == cpu::TiOutcome::kDone;
    }
    // The brute force's pairs are what count; the clustering time stays.
    report->query_clusters = report->target_clusters = 0;
    report->distance_computations = 0;
  }
  if (choose_blas(tuning, costs)) {
    cpu::GemmOptions options;
    options.symmetric = tuning.symmetric;
    options.block_rows = tuning.block_rows;
    const cpu::GemmOutcome outcome = cpu::gemm_join(input, output, options, report);
    if (outcome != cpu::GemmOutcome::kUnsupported) return outcome == cpu::GemmOutcome::kDone;
  }
  return cpu::brute_force_join(input, output, report);
}

void fill_stats(const KnnProblem &p, const cpu::JoinInput &input, const cpu::JoinReport &report,
                bool used_ti, Clock::time_point start, KnnStats *stats) {
  std::memset(stats, 0, sizeof(*stats));
  stats->device = KNN_DEVICE_CPU;
  stats->method = used_ti ? KNN_METHOD_TI : KNN_METHOD_BRUTE;
  const int threads = report.threads_used > 0 ? report.threads_used : input.n_threads;
  std::snprintf(stats->device_name, sizeof(stats->device_name), "cpu (%d thread%s)", threads,
                threads == 1 ? "" : "s");
  if (!used_ti && report.ti_sample_share >= 0)
    std::snprintf(stats->variant, sizeof(stats->variant), "%s (ti sample: %.0f%% of pairs)",
                  report.variant, 100.0 * report.ti_sample_share);
  else
    std::snprintf(stats->variant, sizeof(stats->variant), "%s", report.variant);
  stats->query_clusters = report.query_clusters;
  stats->target_clusters = report.target_clusters;
  stats->distance_computations = report.distance_computations;
  stats->pairs = p.n_queries * p.n_targets;
  stats->threads_per_query = 1;
  stats->seconds_cluster = report.seconds_cluster;
  stats->seconds_filter = report.seconds_filter;
  stats->seconds_select = report.seconds_select;
  stats->seconds_total = std::chrono::duration<double>(Clock::now() - start).count();
}

KnnStatus run(const KnnProblem &p, const CpuTuning &tuning, int64_t *neighbors,
              double *distances, KnnStats *stats, const int32_t *cancel, char *errbuf,
              size_t errlen) {
  const Clock::time_point start = Clock::now();
  if (const char *why = float_problem_invalid_reason(p, neighbors, distances)) {
    copy_message(errbuf, errlen, why);
    return KNN_INVALID_ARGUMENT;
  }
  const cpu::JoinInput input = join_input(p, cancel);
  cpu::JoinReport report;
  bool used_ti = false;
  const bool completed =
      join(p, tuning, input, cpu::JoinOutput{neighbors, distances}, &report, &used_ti);
  if (stats != nullptr) fill_stats(p, input, report, used_ti, start, stats);
  if (!completed || input.cancelled()) {
    copy_message(errbuf, errlen, "cancelled");
    return KNN_CANCELLED;
  }
  return KNN_OK;
}

}  // namespace

KnnStatus cpu_run(const KnnProblem &problem, int64_t *neighbors, double *distances,
                  KnnStats *stats, const int32_t *cancel, char *errbuf, size_t errlen) noexcept {
  return cpu_run_tuned(problem, CpuTuning(), neighbors, distances, stats, cancel, errbuf, errlen);
}

KnnStatus cpu_run_tuned(const KnnProblem &problem, const CpuTuning &tuning, int64_t *neighbors,
                        double *distances, KnnStats *stats, const int32_t *cancel, char *errbuf,
                        size_t errlen) noexcept {
  return guarded("CPU engine", errbuf, errlen, [&] {
    return run(problem, tuning, neighbors, distances, stats, cancel, errbuf, errlen);
  });
}

const char *cpu_blas_description() noexcept { return cpu::blas_library().description; }

}  // namespace knn
