// clustering.h -- landmarks and the clusters around them (step 1 of the TI
// join, Sweet KNN section II-C). Internal to kernels/cpu/.
//
// The landmarks are rows of the set itself: of 10 random candidate sets the
// one whose landmarks are most spread out (largest sum of pairwise
// distances) is kept. Every row then joins its nearest landmark. Which
// landmark a row joins only affects speed, never results: the join's
// bounds use the distance each member actually has to its own centre.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "../knn_engine.h"

namespace knn {
namespace cpu {

struct Clustering {
  int dim = 0;
  // Centres and members are stored `stride` floats apart, zero-padded to
  // whole blocks of 8 lanes (ti_padded_sum.h).
  int stride = 0;
  int64_t n_clusters = 0;
  std::vector<float> centres;          // n_clusters x stride (landmark rows)
  std::vector<double> radius;          // largest member-to-centre distance
  std::vector<int64_t> begin;          // n_clusters + 1 offsets into members
  // Members grouped by cluster. Within a cluster: descending distance to
  // the centre, equal distances by ascending row.
  std::vector<int64_t> member_row;
  std::vector<double> member_distance;  // to the member's centre
  // Member rows copied in this order. Not a vector: a vector would zero
  // it first, a long single-threaded pass that cannot be cancelled.
  std::unique_ptr<float[]> member_data;

  const float *centre(int64_t c) const { return centres.data() + c * stride; }
  const float *member(int64_t j) const { return member_data.get() + j * stride; }
  int64_t size(int64_t c) const { return begin[c + 1] - begin[c]; }
};

struct ClusteringOptions {
  double landmarks_per_sqrt_n = 3.0;  // landmarks = this * sqrt(n) ...
  int64_t max_landmarks = 4096;       // ... but at most this many
  int candidate_sets = 10;            // random landmark sets tried
  uint64_t seed = 0x5eed5eedULL;      // fixed: the same input, the same clusters
};

// Clusters the n rows (n >= 1) for L2 or L1. Returns false when cancelled.
// *landmark_distances counts the distances evaluated. Empty clusters (a
// landmark that duplicates another) are dropped.
bool build_clustering(const float *rows, int64_t n, int dim, KnnMetric metric,
                      const ClusteringOptions &options, int n_threads,
                      const int32_t *cancel, Clustering *out,
                      int64_t *landmark_distances);

}  // namespace cpu
}  // namespace knn
