// stats_sum.h -- (C++, internal to kernels/; CPU and CUDA host code) the
// statistics of one join made of several engine runs (per-group joins):
// counts and seconds add up, threads per query is the widest run's.
#pragma once

#include <algorithm>

#include "knn_engine.h"

namespace knn {

inline void add_run_stats(const KnnStats &run, KnnStats *sum) {
  sum->query_clusters += run.query_clusters;
  sum->target_clusters += run.target_clusters;
  sum->distance_computations += run.distance_computations;
  sum->threads_per_query = std::max(sum->threads_per_query, run.threads_per_query);
  sum->seconds_transfer += run.seconds_transfer;
  sum->seconds_cluster += run.seconds_cluster;
  sum->seconds_filter += run.seconds_filter;
  sum->seconds_select += run.seconds_select;
}

}  // namespace knn
