// capped_range.cpp -- capped range joins by the top-k join (capped_range.h).
#include "capped_range.h"

#include <algorithm>
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
  return per_query >= p.k;
}

KnnStatus capped_range_by_top_k(const KnnProblem &p, const SubProblemRunner &run,
                                const cpu::PairSink &sink, KnnStats *stats,
                                const int32_t *cancel, char *message, size_t message_len,
                                int64_t slice_slots) {
  const Clock::time_point start = Clock::now();
  const int32_t k = static_cast<int32_t>(std::min<int64_t>(p.k, p.n_targets));
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
