// capped_range.cpp -- capped range joins by the top-k join (capped_range.h).
#include "capped_range.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/bit_join.h"
#include "cpu/parallel_for.h"
#include "cpu/row_distance.h"
#include "entry_guard.h"
#include "knn_distance.h"
#include "problem_check.h"
#include "stats_sum.h"
#include "stopwatch.h"

namespace knn {

namespace {

// The sample: queries, and distances computed (about kSampleValues element
// operations in all, within [kSampleMinPairs, kSampleMaxPairs] pairs): a
// few milliseconds, against the tens at least of either join it chooses.
constexpr int64_t kSampleQueries = 32;
constexpr int64_t kSampleValues = int64_t{1} << 24;
constexpr int64_t kSampleMinPairs = int64_t{1} << 12;
constexpr int64_t kSampleMaxPairs = int64_t{1} << 18;

// The cost rule, for joins the count rule leaves to the range join: where
// the range join's bounds would keep at least kRangeShareForTopK of the
// eligible pairs, it is a brute force in all but name (about 12 ns a pair
// on 2 cores, scattered rows), and the top-k join (at worst a brute force
// by SGEMM or the GPU's GEMM, a few times cheaper a pair) answers first:
// 2000 x 20000 64-d rows, about 1 pair a query within the radius, cap 10:
// the range join kept 98% of pairs, 0.56 s; the top-k join 0.11 s. Below
// kCostRuleMinPairs both take milliseconds; past kCostRuleMaxK the top-k
// join's lists cost more than it saves (cap 1000 there: 1.3 s against the
// range join's 1.0 s).
constexpr double kCostRuleMinPairs = 1e6;
constexpr int64_t kCostRuleMaxK = 128;
constexpr double kRangeShareForTopK = 0.25;
// The range join's bounds are emulated on the sample with this many of its
// targets as landmarks (cpu/clustering.h's landmarks, fewer: coarser
// clusters, so the estimate errs towards the top-k join, which the
// threshold allows for).
constexpr int64_t kEmulatedLandmarks = 128;

bool cancelled(const int32_t *cancel) { return __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0; }

// `count` rows of n (count <= n), one drawn from each of count equal
// strata: spread over all rows, yet not in step with a period of the rows
// (rows made in a repeating pattern would make an even stride's sample
// all alike). A fixed seed: the same problem, the same choice.
std::vector<int64_t> sample_rows(int64_t count, int64_t n, std::mt19937_64 &rng) {
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; i++) {
    const int64_t begin = static_cast<int64_t>(static_cast<__int128>(i) * n / count);
    const int64_t end = static_cast<int64_t>(static_cast<__int128>(i + 1) * n / count);
    rows[i] = begin + static_cast<int64_t>(rng() % static_cast<uint64_t>(end - begin));
  }
  return rows;
}

int64_t row_bytes(const KnnProblem &p) {
  return p.element == KNN_ELEMENT_BIT ? (static_cast<int64_t>(p.dim) + 7) / 8
                                      : static_cast<int64_t>(p.dim) * 4;
}

// The operator's value of one pair (an estimate's: bits past dim are
// ignored, as the engines ignore them).
double pair_value(const KnnProblem &p, int64_t q, int64_t t) {
  const int64_t bytes = row_bytes(p);
  if (p.element == KNN_ELEMENT_BIT) {
    const auto *a = static_cast<const unsigned char *>(p.queries) + q * bytes;
    const auto *b = static_cast<const unsigned char *>(p.targets) + t * bytes;
    const unsigned char last = p.dim % 8 == 0 ? 0xFF : static_cast<unsigned char>(0xFF << (8 - p.dim % 8));
    uint64_t both = 0, differ = 0, ones_a = 0, ones_b = 0;
    for (int64_t i = 0; i < bytes; i++) {
      const unsigned mask = i == bytes - 1 ? last : 0xFF;
      const unsigned x = a[i] & mask, y = b[i] & mask;
      both += __builtin_popcount(x & y);
      differ += __builtin_popcount(x ^ y);
      ones_a += __builtin_popcount(x);
      ones_b += __builtin_popcount(y);
    }
    return p.metric == KNN_METRIC_JACCARD ? cpu::jaccard_from_counts(both, ones_a, ones_b)
                                          : cpu::hamming_from_count(differ);
  }
  const float *a = float_rows(p.queries) + q * p.dim;
  const float *b = float_rows(p.targets) + t * p.dim;
  const float sum = cpu::pair_sum(p.metric, a, b, p.dim);
  if (p.metric != KNN_METRIC_COSINE) return cpu::distance_from_sum(p.metric, sum, 0.0f, 0.0f);
  return cpu::distance_from_sum(p.metric, sum, knn_dot(a, a, p.dim), knn_dot(b, b, p.dim));
}

bool eligible(const KnnProblem &p, int64_t q, int64_t t) {
  if (p.query_keys != nullptr && p.query_keys[q] == p.target_keys[t]) return false;
  if (p.query_groups != nullptr && p.query_groups[q] != p.target_groups[t]) return false;
  return true;
}

// The share of the eligible pairs of the sampled queries and targets whose
// distance the range join would compute: its point bound (range_join.h),
// |D(q,c) - D(t,c)| <= r around each target's nearest landmark c, emulated
// with landmarks drawn from the sampled targets; 1 where the range join is
// a brute force (not L2 or L1, a radius that is not finite, method brute).
// Costs about as much as the sample itself. -1 when cancelled.
double range_join_share(const KnnProblem &p, const std::vector<int64_t> &query_rows,
                        const std::vector<int64_t> &target_rows, int64_t budget,
                        const int32_t *cancel) {
  const bool bounded = p.element != KNN_ELEMENT_BIT && std::isfinite(p.max_distance) &&
                       (p.metric == KNN_METRIC_L2 || p.metric == KNN_METRIC_L1) &&
                       p.method != KNN_METHOD_BRUTE;
  if (!bounded) return 1.0;
  const int64_t sampled = static_cast<int64_t>(target_rows.size());
  const int64_t landmarks = std::min(kEmulatedLandmarks, sampled);
  const int64_t targets = std::min(sampled, std::max(landmarks, budget / landmarks));
  const float *q_rows = float_rows(p.queries), *t_rows = float_rows(p.targets);
  auto target = [&](int64_t i) { return t_rows + target_rows[i] * p.dim; };
  auto landmark = [&](int64_t c) { return target(c * sampled / landmarks); };
  // each emulated target's nearest landmark and its distance to it
  std::vector<int64_t> centre(static_cast<size_t>(targets));
  std::vector<double> to_centre(static_cast<size_t>(targets));
  const int threads = cpu::resolve_threads(p.n_threads);
  cpu::parallel_for(targets, threads, cancel, [&](int64_t i, int) {
    const int64_t t = i * sampled / targets;
    double best = HUGE_VAL;
    for (int64_t c = 0; c < landmarks; c++) {
      const double d = cpu::pair_distance(p.metric, target(t), landmark(c), p.dim);
      if (c == 0 || d < best) {
        best = d;
        centre[i] = c;
      }
    }
    to_centre[i] = best;
  });
  const int64_t queries = static_cast<int64_t>(query_rows.size());
  std::vector<int64_t> kept(static_cast<size_t>(queries), 0), eligible_pairs(kept);
  cpu::parallel_for(queries, threads, cancel, [&](int64_t j, int) {
    const int64_t q = query_rows[j];
    std::vector<double> to_landmark(static_cast<size_t>(landmarks));
    for (int64_t c = 0; c < landmarks; c++)
      to_landmark[c] = cpu::pair_distance(p.metric, q_rows + q * p.dim, landmark(c), p.dim);
    for (int64_t i = 0; i < targets; i++) {
      if (!eligible(p, q, target_rows[i * sampled / targets])) continue;
      eligible_pairs[j]++;
      if (std::fabs(to_landmark[centre[i]] - to_centre[i]) <= p.max_distance) kept[j]++;
    }
  });
  if (cancelled(cancel)) return -1;
  int64_t kept_sum = 0, eligible_sum = 0;
  for (int64_t j = 0; j < queries; j++) kept_sum += kept[j], eligible_sum += eligible_pairs[j];
  return eligible_sum > 0 ? static_cast<double>(kept_sum) / static_cast<double>(eligible_sum)
                          : 0.0;
}

}  // namespace

bool capped_range_prefers_top_k(const KnnProblem &p, const int32_t *cancel) {
  if (p.k < 1 || p.n_queries < 1 || p.k >= p.n_targets) return false;
  const int64_t values_per_pair =
      p.element == KNN_ELEMENT_BIT ? (static_cast<int64_t>(p.dim) + 63) / 64 : p.dim;
  const int64_t budget =
      std::min(kSampleMaxPairs, std::max(kSampleMinPairs, kSampleValues / values_per_pair));
  const int64_t queries = std::min(p.n_queries, kSampleQueries);
  const int64_t targets = std::max<int64_t>(1, std::min(p.n_targets, budget / queries));
  const bool inclusive = p.range == KNN_RANGE_AT_MOST;
  std::mt19937_64 rng(1);
  const std::vector<int64_t> query_rows = sample_rows(queries, p.n_queries, rng);
  const std::vector<int64_t> target_rows = sample_rows(targets, p.n_targets, rng);
  std::vector<int64_t> within(static_cast<size_t>(queries), 0);
  cpu::parallel_for(queries, cpu::resolve_threads(p.n_threads), cancel, [&](int64_t i, int) {
    const int64_t q = query_rows[i];
    for (int64_t t : target_rows)
      if (eligible(p, q, t) && knn_within_radius(pair_value(p, q, t), p.max_distance, inclusive))
        within[i]++;
  });
  if (cancelled(cancel)) return false;
  int64_t hits = 0;
  for (int64_t w : within) hits += w;
  // pairs within the radius per query, on average, over every target
  const double per_query = static_cast<double>(hits) / static_cast<double>(queries) *
                           static_cast<double>(p.n_targets) / static_cast<double>(targets);
  if (per_query >= p.k) return true;  // the count rule
  const double pairs = static_cast<double>(p.n_queries) * static_cast<double>(p.n_targets);
  if (pairs < kCostRuleMinPairs || p.k > kCostRuleMaxK) return false;
  return range_join_share(p, query_rows, target_rows, budget, cancel) >= kRangeShareForTopK;
}

int64_t top_k_slice_slots(const KnnProblem &p) {
  const bool shared = p.queries == p.targets && p.n_queries == p.n_targets;
  const int64_t rows = shared ? p.n_targets : p.n_queries + p.n_targets;
  constexpr int64_t kSlotBytes = sizeof(int64_t) + sizeof(double);
  return std::max(kTopKSliceSlots, rows * row_bytes(p) / kSlotBytes);
}

KnnStatus capped_range_by_top_k(const KnnProblem &p, const SubProblemRunner &run,
                                const cpu::PairSink &sink, KnnStats *stats,
                                const int32_t *cancel, char *message, size_t message_len,
                                int64_t slice_slots) {
  const Clock::time_point start = Clock::now();
  const int32_t k = static_cast<int32_t>(std::min<int64_t>(p.k, p.n_targets));
  if (slice_slots <= 0) slice_slots = top_k_slice_slots(p);
  const int64_t per_slice = std::max<int64_t>(1, slice_slots / k);
  const bool inclusive = p.range == KNN_RANGE_AT_MOST;
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
  char notice[512] = "";
  int64_t within_total = 0;
  *stats = KnnStats{};
  for (int64_t first = 0; first < p.n_queries; first += per_slice) {
    if (cancelled(cancel)) {
      copy_message(message, message_len, "cancelled");
      return KNN_CANCELLED;
    }
    const int64_t n = std::min(per_slice, p.n_queries - first);
    KnnProblem slice = p;
    slice.range = KNN_RANGE_NONE;
    slice.max_distance = 0;
    slice.k = k;
    slice.queries = static_cast<const char *>(p.queries) + first * row_bytes(p);
    slice.n_queries = n;
    if (p.query_keys != nullptr) slice.query_keys = p.query_keys + first;
    if (p.query_groups != nullptr) slice.query_groups = p.query_groups + first;
    neighbors.resize(static_cast<size_t>(n * k));
    distances.resize(static_cast<size_t>(n * k));
    KnnStats slice_stats{};
    message[0] = '\0';
    const KnnStatus st = run(slice, neighbors.data(), distances.data(), &slice_stats);
    if (st != KNN_OK) return st;  // message says why
    if (notice[0] == '\0') copy_message(notice, sizeof notice, message);
    if (first == 0) {
      stats->device = slice_stats.device;
      stats->method = slice_stats.method;
      std::memcpy(stats->device_name, slice_stats.device_name, sizeof stats->device_name);
      std::memcpy(stats->variant, slice_stats.variant, sizeof stats->variant);
      stats->n_devices = slice_stats.n_devices;
      std::memcpy(stats->device_work, slice_stats.device_work, sizeof stats->device_work);
    } else {
      // the same GPUs take every slice's queries in the same order
      for (int32_t d = 0; d < std::min(stats->n_devices, slice_stats.n_devices); d++)
        if (stats->device_work[d].device == slice_stats.device_work[d].device) {
          stats->device_work[d].queries += slice_stats.device_work[d].queries;
          stats->device_work[d].seconds += slice_stats.device_work[d].seconds;
        }
    }
    add_run_stats(slice_stats, stats);
    for (int64_t i = 0; i < n; i++) {
      const int64_t *rows = neighbors.data() + i * k;
      const double *values = distances.data() + i * k;
      int64_t within = 0;
      while (within < k && rows[within] >= 0 &&
             knn_within_radius(values[within], p.max_distance, inclusive))
        within++;
      within_total += within;
      if (within > 0 && !sink(first + i, rows, values, within)) {
        copy_message(message, message_len, "cancelled");
        return KNN_CANCELLED;
      }
    }
  }
  const std::string runs = stats->variant;
  const int used = std::snprintf(stats->variant, sizeof stats->variant,
                                 "range/top-k, %lld pairs within radius; ",
                                 static_cast<long long>(within_total));
  if (used > 0 && static_cast<size_t>(used) < sizeof stats->variant)
    copy_message(stats->variant + used, sizeof stats->variant - used, runs.c_str());
  stats->pairs = p.n_queries * p.n_targets;
  stats->seconds_total = seconds_since(start);
  copy_message(message, message_len, notice);
  return KNN_OK;
}

}  // namespace knn
