// cpu_engine.cpp -- knn::cpu_run: checks the problem, picks TI or brute
// force, runs it and fills KnnStats. No exception leaves this file.
#include "cpu_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <thread>

#include "brute_force.h"
#include "join_input.h"
#include "ti_join.h"
#include "../problem_check.h"

namespace knn {
namespace {

using Clock = std::chrono::steady_clock;

// More threads than this only add overhead on any machine we target.
constexpr int kMaxThreads = 256;

// Below this many pairs AUTO uses brute force: clustering would cost more
// than it saves. Above it AUTO tries TI, which samples its own pruning and
// hands over to brute force when that is faster (ti_join.h).
constexpr double kAutoTiMinPairs = 1e6;

void set_error(std::string *error, const char *message,
               const char *detail = "") noexcept {
  if (error == nullptr) return;
  try {
    *error = message;
    *error += detail;
  } catch (...) {
  }
}

int resolve_threads(int32_t requested) {
  int n = requested;
  if (n == 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, std::min(n, kMaxThreads));
}

bool choose_ti(const KnnProblem &p, const cpu::JoinInput &input) {
  if (p.method == KNN_METHOD_BRUTE) return false;
  if (!cpu::ti_join_supports(input)) return false;  // cosine, IP, huge values
  if (p.method == KNN_METHOD_TI) return true;
  const double pairs = static_cast<double>(p.n_queries) * static_cast<double>(p.n_targets);
  return pairs >= kAutoTiMinPairs;
}

void fill_padding(const KnnProblem &p, int64_t *neighbors, double *distances) {
  const int64_t n = p.n_queries * p.k;
  for (int64_t i = 0; i < n; i++) {
    neighbors[i] = -1;
    distances[i] = std::numeric_limits<double>::quiet_NaN();
  }
}

KnnStatus run(const KnnProblem &p, int64_t *neighbors, double *distances,
              KnnStats *stats, const int32_t *cancel, std::string *error) {
  const Clock::time_point start = Clock::now();
  if (const char *why = problem_invalid_reason(p, neighbors, distances)) {
    set_error(error, why);
    return KNN_INVALID_ARGUMENT;
  }

  cpu::JoinInput input;
  input.queries = p.queries;
  input.n_queries = p.n_queries;
  input.targets = p.targets;
  input.n_targets = p.n_targets;
  input.dim = p.dim;
  input.k = p.k;
  input.metric = p.metric;
  input.query_keys = p.query_keys;
  input.target_keys = p.target_keys;
  input.n_threads = resolve_threads(p.n_threads);
  input.cancel = cancel;

  bool use_ti = false;
  cpu::JoinOutput output{neighbors, distances};
  cpu::JoinReport report;
  bool completed = true;
  if (p.n_queries == 0) {
    report.variant = "empty";
  } else if (p.n_targets == 0) {
    fill_padding(p, neighbors, distances);
    report.variant = "empty";
  } else {
    use_ti = choose_ti(p, input);
    if (use_ti) {
      const cpu::TiOutcome outcome = cpu::ti_join(
          input, output, cpu::ClusteringOptions(), p.method == KNN_METHOD_AUTO, &report);
      completed = outcome == cpu::TiOutcome::kDone;
      if (outcome == cpu::TiOutcome::kBruteForceIsFaster) {
        use_ti = false;  // the clustering time stays in seconds_cluster
        report.query_clusters = report.target_clusters = 0;
      }
    }
    if (!use_ti) completed = cpu::brute_force_join(input, output, &report);
  }

  if (stats != nullptr) {
    std::memset(stats, 0, sizeof(*stats));
    std::snprintf(stats->device, sizeof(stats->device), "cpu (%d thread%s)",
                  input.n_threads, input.n_threads == 1 ? "" : "s");
    std::snprintf(stats->method, sizeof(stats->method), "%s", use_ti ? "ti" : "brute");
    if (!use_ti && report.ti_sample_share >= 0)
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
  if (!completed || (cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED))) {
    set_error(error, "cancelled");
    return KNN_CANCELLED;
  }
  return KNN_OK;
}

}  // namespace

KnnStatus cpu_run(const KnnProblem &problem, int64_t *neighbors,
                  double *distances, KnnStats *stats, const int32_t *cancel,
                  std::string *error) {
  try {
    return run(problem, neighbors, distances, stats, cancel, error);
  } catch (const std::bad_alloc &) {
    set_error(error, "out of memory in the CPU engine");
    return KNN_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    set_error(error, "CPU engine: ", e.what());
    return KNN_INTERNAL_ERROR;
  } catch (...) {
    set_error(error, "CPU engine: unknown error");
    return KNN_INTERNAL_ERROR;
  }
}

}  // namespace knn
