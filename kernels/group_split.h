// group_split.h -- per-group joins (KnnProblem's query_groups and
// target_groups) in the job layer: the rows are partitioned by group id
// once; then either the GPU module takes the whole partitioned problem in
// one call (knn_cuda_run_groups, kernels/cuda/group_join.cuh), or each
// group's sub-problem runs through the ordinary engine path here, its row
// indices mapped back (C++, internal to kernels/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "knn_engine.h"

namespace knn {

// The rows of every group that has both queries and targets, in group
// order of first appearance among the targets. Rows keep their ascending
// order inside a group, so "smaller row" still means "smaller id".
struct GroupPartition {
  std::vector<int64_t> query_rows;    // grouped: rows of group g at [query_begin[g], query_begin[g+1])
  std::vector<int64_t> target_rows;
  std::vector<int64_t> query_begin;   // n_groups + 1 offsets
  std::vector<int64_t> target_begin;
  int64_t groups() const { return static_cast<int64_t>(query_begin.size()) - 1; }
};

// Partitions in linear time, looking at *cancel between slices; returns
// false when cancelled.
bool partition_groups(const KnnProblem &p, const int32_t *cancel, GroupPartition *out);

// Runs one plain (group-free) problem through the engines; writes a
// failure or a notice into the job's message buffer.
using SubProblemRunner =
    std::function<KnnStatus(const KnnProblem &sub, int64_t *neighbors, double *distances,
                            KnnStats *stats)>;

// Runs a grouped problem (both group arrays set, already checked with
// problem_invalid_reason, partitioned by partition_groups into `part`)
// group by group through `run`: a query meets only the targets of its
// group; queries whose group has no target (or fewer than k eligible) get
// -1/NaN slots. stats are summed over the groups
// (the device, method and name of the first group that ran). `message`
// is the job's buffer that `run` writes: on success it ends holding the
// first notice any group gave.
KnnStatus run_grouped(const KnnProblem &p, const GroupPartition &part, int64_t *neighbors,
                      double *distances, KnnStats *stats, const int32_t *cancel, char *message,
                      size_t message_len, const SubProblemRunner &run);

}  // namespace knn
