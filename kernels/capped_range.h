// capped_range.h -- a range join capped at k pairs per query (KnnProblem's
// range with k > 0) answered by the top-k join (C++, internal to kernels/).
//
// A query's pairs within the radius come first in (distance, target row)
// order, before every pair beyond it, so its capped range answer is the
// prefix of its k nearest (the top-k join's list, ties by row) that lies
// within the radius. The range engines find every pair within the radius
// before each query keeps its first k: work that grows with the radius. A
// top-k join does work that grows with k instead, and its distances are
// the range engines' bit for bit (every engine computes them through
// knn_distance.h), cut by the same knn_within_radius. So where the radius
// is expected to hold more pairs than the cap, the job (knn_job.cpp) runs
// the top-k join through the ordinary k-NN path (either engine, groups and
// keys included) and hands over each query's prefix within the radius.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/range_join.h"
#include "group_split.h"
#include "knn_engine.h"

namespace knn {

// Whether the top-k join answers the capped range problem p (float32 or
// bit rows, checked by range_problem_invalid_reason): a sample of pairs
// (up to 32 queries and 8192 targets, each drawn from one of equal strata
// of the rows) estimates how many eligible pairs a query has within the
// radius on average; the top-k join answers when that is at least the
// cap (the count rule). Otherwise, in a join of at least 10^6 pairs with a
// cap of at most 128, the cost rule: the top-k join answers where the
// range join would compute at least a quarter of the eligible pairs (its
// bounds emulated on the sample; every pair where it is a brute force),
// i.e. where its bounds barely prune (many dimensions). False without a
// cap, with a cap of every target or more (the cap never binds), and when
// cancelled.
bool capped_range_prefers_top_k(const KnnProblem &p, const int32_t *cancel);

// Query x k slots of one top-k run, at least: as many pairs as a block of
// the CPU range engine holds at most (64 MB of rows and distances).
constexpr int64_t kTopKSliceSlots = int64_t{1} << 22;

// Query x k slots of one top-k run of p: kTopKSliceSlots, or more where
// p's rows (queries and targets, once where they are one matrix) take more
// memory: the slots' 16 bytes each are then at most the rows' bytes, so
// the job's memory at most doubles. Every slice prepares the targets anew
// (the CPU engine's clustering, the GPU's upload), so the fewer slices the
// better: one wherever the results fit beside the rows.
int64_t top_k_slice_slots(const KnnProblem &p);

// Runs p as top-k joins (k = the cap, at most every target) of slices of
// its queries (at most slice_slots query x k slots each, so memory stays
// bounded; 0: top_k_slice_slots(p); tests pass fewer) through `run`, a plain k-NN problem with p's
// keys and groups; hands each query's pairs within the radius to sink,
// queries in row order. stats: the runs' summed (the engine, method and name of the
// first), the variant "range/top-k, N pairs within radius; <the runs'
// variant>". message: the job's buffer that `run` writes; on success it
// holds the first notice a run gave.
KnnStatus capped_range_by_top_k(const KnnProblem &p, const SubProblemRunner &run,
                                const cpu::PairSink &sink, KnnStats *stats,
                                const int32_t *cancel, char *message, size_t message_len,
                                int64_t slice_slots = 0);

}  // namespace knn
