// group_subproblem.h -- one group of a per-group join as an ordinary
// (group-free) problem: the group's rows gathered into buffers of their
// own, and its results written back into the whole problem's slots. Used
// by the job layer's split (group_split.cpp) and by the GPU module for the
// groups it runs alone (cuda/group_join.cu); header-only, as the module
// links nothing of knn_gpu.so (C++, internal to kernels/).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "knn_engine.h"
#include "result_padding.h"

namespace knn {

// Bytes of one row of the problem's element type.
inline size_t group_row_bytes(const KnnProblem &p) {
  switch (p.element) {
    case KNN_ELEMENT_FLOAT16:
      return 2 * static_cast<size_t>(p.dim);
    case KNN_ELEMENT_BIT:
      return (static_cast<size_t>(p.dim) + 7) / 8;
    default:
      return 4 * static_cast<size_t>(p.dim);
  }
}

struct GroupSubProblem {
  std::vector<unsigned char> queries, targets;  // targets empty when shared
  std::vector<int64_t> query_keys, target_keys;
  KnnProblem problem{};
};

// Group rows qrows[0..nq) and trows[0..nt) of p as an ordinary problem in
// *out (k at most nt: more slots stay empty). One table on both sides with
// one grouping makes the group a self-join too, which the engines share
// work for. Looks at *cancel every 65536 rows; false when it was set.
inline bool make_group_subproblem(const KnnProblem &p, const int64_t *qrows, int64_t nq,
                                  const int64_t *trows, int64_t nt, const int32_t *cancel,
                                  GroupSubProblem *out) {
  const size_t bytes = group_row_bytes(p);
  auto gather = [&](const void *rows, const int64_t *list, int64_t n,
                    std::vector<unsigned char> *to) {
    to->resize(static_cast<size_t>(n) * bytes);
    const auto *from = static_cast<const unsigned char *>(rows);
    for (int64_t i = 0; i < n; i++) {
      if ((i & 0xFFFF) == 0 && cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0)
        return false;
      std::memcpy(to->data() + static_cast<size_t>(i) * bytes,
                  from + static_cast<size_t>(list[i]) * bytes, bytes);
    }
    return true;
  };
  auto gather_keys = [](const int64_t *keys, const int64_t *list, int64_t n,
                        std::vector<int64_t> *to) {
    to->resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) (*to)[i] = keys[list[i]];
  };
  const bool shared = p.queries == p.targets && nq == nt && std::equal(qrows, qrows + nq, trows);
  if (!gather(p.queries, qrows, nq, &out->queries)) return false;
  out->targets.clear();
  if (!shared && !gather(p.targets, trows, nt, &out->targets)) return false;
  KnnProblem &sub = out->problem;
  sub = p;
  sub.query_groups = nullptr;
  sub.target_groups = nullptr;
  sub.queries = out->queries.data();
  sub.n_queries = nq;
  sub.targets = shared ? out->queries.data() : out->targets.data();
  sub.n_targets = nt;
  sub.k = static_cast<int32_t>(std::min<int64_t>(p.k, nt));
  if (p.query_keys != nullptr && p.target_keys != nullptr) {
    gather_keys(p.query_keys, qrows, nq, &out->query_keys);
    gather_keys(p.target_keys, trows, nt, &out->target_keys);
    sub.query_keys = out->query_keys.data();
    sub.target_keys = out->target_keys.data();
  }
  return true;
}

// The sub-problem's results (nq x sub_k slots, target rows of the group)
// into the whole problem's slots (k a row) of the group's query rows, as
// rows of the whole problem; slots past sub_k are left as they are.
inline void scatter_group_results(const int64_t *qrows, int64_t nq, const int64_t *trows,
                                  int32_t sub_k, int32_t k, const int64_t *sub_neighbors,
                                  const double *sub_distances, int64_t *neighbors,
                                  double *distances) {
  for (int64_t i = 0; i < nq; i++)
    for (int32_t r = 0; r < sub_k; r++) {
      const int64_t t = sub_neighbors[i * sub_k + r];
      neighbors[qrows[i] * k + r] = t < 0 ? kNoNeighbor : trows[t];
      distances[qrows[i] * k + r] = sub_distances[i * sub_k + r];
    }
}

}  // namespace knn
