// brute_force.cpp -- exact join over every pair (see brute_force.h).
#include "brute_force.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "../knn_distance.h"
#include "cost_model.h"
#include "lane_sums.h"
#include "parallel_for.h"
#include "row_distance.h"
#include "top_k.h"

namespace knn {
namespace cpu {
namespace {

// A tile of target rows is read once per query of a block, so it should
// stay in the L1 cache; the block of queries (in L2) shares each tile.
constexpr int64_t kTargetTileBytes = 24 * 1024;
constexpr int64_t kQueryBlock = 32;

// Fewer queries per block when k is large, to bound the top-k lists held.
int64_t query_block(int64_t capacity) {
  return std::max<int64_t>(1, std::min<int64_t>(kQueryBlock, (int64_t{1} << 20) / capacity));
}

// A multiple of the 8 rows lane_sums() takes per pass.
int64_t target_tile_rows(int dim) {
  const int64_t rows = kTargetTileBytes / (static_cast<int64_t>(dim) * 4);
  return std::max<int64_t>(8, rows / 8 * 8);
}

}  // namespace

int64_t brute_force_query_block(int k, int64_t n_targets) {
  return query_block(std::min<int64_t>(k, std::max<int64_t>(1, n_targets)));
}

std::vector<float> squared_norms(const float *rows, int64_t n, int dim,
                                 const JoinInput &input) {
  std::vector<float> norms(static_cast<size_t>(n));
  constexpr int64_t kRowsPerItem = 1024;
  parallel_for((n + kRowsPerItem - 1) / kRowsPerItem, input.n_threads, input.cancel,
               [&](int64_t item, int) {
                 const int64_t end = std::min(n, (item + 1) * kRowsPerItem);
                 for (int64_t i = item * kRowsPerItem; i < end; i++)
                   norms[i] = knn_dot(rows + i * dim, rows + i * dim, dim);
               });
  return norms;
}


bool brute_force_join(const JoinInput &input, const JoinOutput &output,
                      JoinReport *report) {
  return brute_force_queries(input, output, nullptr, input.n_queries, report);
}

bool brute_force_queries(const JoinInput &input, const JoinOutput &output,
                         const int64_t *query_rows, int64_t n_rows, JoinReport *report) {
  const auto start = std::chrono::steady_clock::now();
  const int dim = input.dim;
  const int64_t k = input.k;
  const bool cosine = input.metric == KNN_METRIC_COSINE;
  std::vector<float> query_norms, target_norms;
  if (cosine) {
    query_norms = squared_norms(input.queries, input.n_queries, dim, input);
    target_norms = input.same_rows()
                       ? query_norms
                       : squared_norms(input.targets, input.n_targets, dim, input);
  }

  const int64_t tile_rows = target_tile_rows(dim);
  const int64_t capacity = std::min<int64_t>(k, std::max<int64_t>(1, input.n_targets));
  const int64_t block_size = brute_force_query_block(input.k, input.n_targets);
  const int64_t n_blocks = (n_rows + block_size - 1) / block_size;
  auto query_of = [&](int64_t i) { return query_rows != nullptr ? query_rows[i] : i; };
  const int workers = parallel_workers(n_blocks, input.n_threads);

  // Per worker: one TopK per query of its block and a row of sums.
  struct Scratch {
    std::vector<TopK> best;
    std::vector<float> sums;
  };
  std::vector<Scratch> scratch(workers);
  for (Scratch &s : scratch) {
    s.best.assign(block_size, TopK(capacity));
    s.sums.resize(tile_rows);
  }

  parallel_for(n_blocks, input.n_threads, input.cancel, [&](int64_t block, int worker) {
    Scratch &s = scratch[worker];
    const int64_t q_begin = block * block_size;
    const int64_t q_end = std::min(q_begin + block_size, n_rows);
    for (int64_t i = q_begin; i < q_end; i++) s.best[i - q_begin].clear();

    for (int64_t t_begin = 0; t_begin < input.n_targets; t_begin += tile_rows) {
      if (input.cancelled()) return;
      const int64_t count = std::min(tile_rows, input.n_targets - t_begin);
      for (int64_t i = q_begin; i < q_end; i++) {
        const int64_t q = query_of(i);
        TopK &best = s.best[i - q_begin];
        lane_sums(input.metric, input.query_row(q), input.target_row(t_begin),
                  count, dim, s.sums.data());
        const float q_norm = cosine ? query_norms[q] : 0.0f;
        for (int64_t r = 0; r < count; r++) {
          const int64_t t = t_begin + r;
          const double key = ordering_key(input.metric, s.sums[r], q_norm,
                                          cosine ? target_norms[t] : 0.0f);
          if (best.accepts(key, t) && !input.excluded(q, t)) best.offer(key, t);
        }
      }
    }
    for (int64_t i = q_begin; i < q_end; i++) {
      const int64_t q = query_of(i);
      s.best[i - q_begin].write_sorted(
          k, output.neighbors + q * k, output.distances + q * k,
          [&](double key) { return distance_from_key(input.metric, key); });
    }
  });

  report->distance_computations += n_rows * input.n_targets;
  // Distances and selection run together, pair by pair.
  report->seconds_select =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report->variant = std::string(lane_sums_isa()) == "avx2" ? "blocked/avx2" : "blocked/generic";
  return !input.cancelled();
}

}  // namespace cpu
}  // namespace knn
