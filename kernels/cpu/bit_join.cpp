// bit_join.cpp -- exact Hamming / Jaccard joins of bit rows (bit_join.h).
//
// Rows are first copied into zero-padded 64-bit words (the bits past dim
// masked to zero, so that a caller's stray padding bits cannot count), then
// every (query, target) pair is counted with popcounts: distances are small
// integers or one double quotient of them, computed exactly as pgvector
// does, so there is nothing to certify.
#include "bit_join.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "parallel_for.h"
#include "top_k.h"
#include "../entry_guard.h"
#include "../problem_check.h"
#include "../result_padding.h"

namespace knn {
namespace cpu {
namespace {

using Clock = std::chrono::steady_clock;

// Targets between two looks at the cancel flag, per query.
constexpr int64_t kTargetTile = 4096;
constexpr int64_t kQueryBlock = 16;

struct BitRows {
  std::vector<uint64_t> words;
  int64_t words_per_row = 0;
  const uint64_t *row(int64_t i) const { return words.data() + i * words_per_row; }
};

// The rows as words; bits past dim cleared. Byte order within a word does
// not matter: only popcounts of and/xor of equal positions are taken.

BitRows pack(const void *rows, int64_t n, int dim, int n_threads, const int32_t *cancel) {
  BitRows packed;
  const int64_t row_bytes = (static_cast<int64_t>(dim) + 7) / 8;
  packed.words_per_row = (row_bytes + 7) / 8;
  packed.words.assign(static_cast<size_t>(n * packed.words_per_row), 0);
  const unsigned char last_mask =
      dim % 8 == 0 ? 0xFF : static_cast<unsigned char>(0xFF << (8 - dim % 8));
  const auto *bytes = static_cast<const unsigned char *>(rows);
  constexpr int64_t kRowsPerItem = 4096;
  parallel_for((n + kRowsPerItem - 1) / kRowsPerItem, n_threads, cancel, [&](int64_t item, int) {
    const int64_t end = std::min(n, (item + 1) * kRowsPerItem);
    for (int64_t i = item * kRowsPerItem; i < end; i++) {
      auto *out = reinterpret_cast<unsigned char *>(packed.words.data() + i * packed.words_per_row);
      std::memcpy(out, bytes + i * row_bytes, static_cast<size_t>(row_bytes));
      out[row_bytes - 1] &= last_mask;
    }
  });
  return packed;
}

// The distances of one query row to `count` consecutive target rows.
// Inlined into the two entry points below: one compiled for the POPCNT
// instruction (chosen at run time where the CPU has it), one portable.
template <bool kJaccard>
inline void row_distances(const uint64_t *a, const uint64_t *targets, int64_t words,
                          int64_t count, uint64_t a_ones, const uint64_t *target_ones,
                          double *out) {
  for (int64_t t = 0; t < count; t++) {
    const uint64_t *b = targets + t * words;
    uint64_t n = 0;
    if (kJaccard) {
      for (int64_t w = 0; w < words; w++) n += static_cast<uint64_t>(__builtin_popcountll(a[w] & b[w]));
      out[t] = jaccard_from_counts(n, a_ones, target_ones[t]);
    } else {
      for (int64_t w = 0; w < words; w++) n += static_cast<uint64_t>(__builtin_popcountll(a[w] ^ b[w]));
      out[t] = hamming_from_count(n);
    }
  }
}

using RowDistancesFn = void (*)(const uint64_t *, const uint64_t *, int64_t, int64_t, uint64_t,
                                const uint64_t *, double *, bool);

void row_distances_portable(const uint64_t *a, const uint64_t *targets, int64_t words,
                            int64_t count, uint64_t a_ones, const uint64_t *target_ones,
                            double *out, bool jaccard) {
  if (jaccard)
    row_distances<true>(a, targets, words, count, a_ones, target_ones, out);
  else
    row_distances<false>(a, targets, words, count, a_ones, target_ones, out);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("popcnt"))) void row_distances_popcnt(
    const uint64_t *a, const uint64_t *targets, int64_t words, int64_t count, uint64_t a_ones,
    const uint64_t *target_ones, double *out, bool jaccard) {
  if (jaccard)
    row_distances<true>(a, targets, words, count, a_ones, target_ones, out);
  else
    row_distances<false>(a, targets, words, count, a_ones, target_ones, out);
}

RowDistancesFn pick_row_distances() {
  return __builtin_cpu_supports("popcnt") ? row_distances_popcnt : row_distances_portable;
}
#else
RowDistancesFn pick_row_distances() { return row_distances_portable; }
#endif

inline uint64_t popcount(uint64_t x) { return static_cast<uint64_t>(__builtin_popcountll(x)); }

std::vector<uint64_t> row_counts(const BitRows &rows, int64_t n) {
  std::vector<uint64_t> counts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    uint64_t c = 0;
    for (int64_t w = 0; w < rows.words_per_row; w++) c += popcount(rows.row(i)[w]);
    counts[i] = c;
  }
  return counts;
}

bool cancelled(const int32_t *cancel) {
  return cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0;
}

// The join itself; false when cancelled.
bool join(const KnnProblem &p, int n_threads, const int32_t *cancel, int64_t *neighbors,
          double *distances) {
  const int64_t k = p.k;
  if (p.n_queries == 0) return true;
  if (p.n_targets == 0) {
    fill_padding(p.n_queries, p.k, neighbors, distances);
    return true;
  }
  const BitRows queries = pack(p.queries, p.n_queries, p.dim, n_threads, cancel);
  const bool shared = p.queries == p.targets && p.n_queries == p.n_targets;
  BitRows target_copy;
  if (!shared) target_copy = pack(p.targets, p.n_targets, p.dim, n_threads, cancel);
  const BitRows &targets = shared ? queries : target_copy;
  if (cancelled(cancel)) return false;
  const bool jaccard = p.metric == KNN_METRIC_JACCARD;
  std::vector<uint64_t> query_ones, target_ones;
  if (jaccard) {
    query_ones = row_counts(queries, p.n_queries);
    target_ones = shared ? query_ones : row_counts(targets, p.n_targets);
  }
  const int64_t words = queries.words_per_row;
  const int64_t capacity = std::min<int64_t>(k, p.n_targets);
  const int64_t n_blocks = (p.n_queries + kQueryBlock - 1) / kQueryBlock;
  const int workers = parallel_workers(n_blocks, n_threads);
  std::vector<std::vector<TopK>> best(workers);
  for (auto &b : best) b.assign(kQueryBlock, TopK(capacity));

  const RowDistancesFn distances_of = pick_row_distances();
  std::vector<std::vector<double>> scratch(workers, std::vector<double>(kTargetTile));

  parallel_for(n_blocks, n_threads, cancel, [&](int64_t block, int worker) {
    std::vector<TopK> &lists = best[worker];
    double *d = scratch[worker].data();
    const int64_t q_begin = block * kQueryBlock;
    const int64_t q_end = std::min(q_begin + kQueryBlock, p.n_queries);
    for (int64_t q = q_begin; q < q_end; q++) lists[q - q_begin].clear();
    for (int64_t t_begin = 0; t_begin < p.n_targets; t_begin += kTargetTile) {
      if (cancelled(cancel)) return;
      const int64_t count = std::min(kTargetTile, p.n_targets - t_begin);
      for (int64_t q = q_begin; q < q_end; q++) {
        TopK &list = lists[q - q_begin];
        distances_of(queries.row(q), targets.row(t_begin), words, count,
                     jaccard ? query_ones[q] : 0, jaccard ? target_ones.data() + t_begin : nullptr,
                     d, jaccard);
        for (int64_t r = 0; r < count; r++) {
          const int64_t t = t_begin + r;
          if (list.accepts(d[r], t) &&
              !(p.query_keys != nullptr && p.query_keys[q] == p.target_keys[t]))
            list.offer(d[r], t);
        }
      }
    }
    for (int64_t q = q_begin; q < q_end; q++)
      lists[q - q_begin].write_sorted(k, neighbors + q * k, distances + q * k,
                                      [](double key) { return key; });
  });
  return !cancelled(cancel);
}

KnnStatus run(const KnnProblem &p, int64_t *neighbors, double *distances, KnnStats *stats,
              const int32_t *cancel, char *errbuf, size_t errlen) {
  const Clock::time_point start = Clock::now();
  if (const char *why = problem_invalid_reason(p, neighbors, distances)) {
    copy_message(errbuf, errlen, why);
    return KNN_INVALID_ARGUMENT;
  }
  if (p.element != KNN_ELEMENT_BIT) {
    copy_message(errbuf, errlen, "the bit engine takes bit rows only");
    return KNN_INVALID_ARGUMENT;
  }
  const int n_threads = resolve_threads(p.n_threads);
  const bool completed = join(p, n_threads, cancel, neighbors, distances);
  if (stats != nullptr) {
    std::memset(stats, 0, sizeof(*stats));
    stats->device = KNN_DEVICE_CPU;
    stats->method = KNN_METHOD_BRUTE;
    std::snprintf(stats->device_name, sizeof(stats->device_name), "cpu (%d thread%s)", n_threads,
                  n_threads == 1 ? "" : "s");
    std::snprintf(stats->variant, sizeof(stats->variant), "bit popcount");
    stats->pairs = p.n_queries * p.n_targets;
    stats->distance_computations = stats->pairs;
    stats->threads_per_query = 1;
    stats->seconds_total = std::chrono::duration<double>(Clock::now() - start).count();
    stats->seconds_filter = stats->seconds_total;
  }
  if (!completed) {
    copy_message(errbuf, errlen, "cancelled");
    return KNN_CANCELLED;
  }
  return KNN_OK;
}

}  // namespace

KnnStatus bit_run(const KnnProblem &problem, int64_t *neighbors, double *distances,
                  KnnStats *stats, const int32_t *cancel, char *errbuf, size_t errlen) noexcept {
  return guarded("CPU bit engine", errbuf, errlen, [&] {
    return run(problem, neighbors, distances, stats, cancel, errbuf, errlen);
  });
}

}  // namespace cpu
}  // namespace knn
