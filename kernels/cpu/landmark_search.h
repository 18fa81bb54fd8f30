// landmark_search.h -- which landmark is nearest to a row, without
// measuring the distance to every landmark. Internal to kernels/cpu/.
//
// A few "pilot" landmarks (the first ceil(sqrt(m))) are measured first; the
// nearest pilot p is at distance d0. Any landmark c with
// D(p, c) > d0 + best can be no nearer than the best found so far (triangle
// inequality), and each landmark keeps its neighbour landmarks sorted by
// distance, so the search walks p's list only until that point. Cluster
// membership affects only speed, never the join's results, so this search
// needs no rounding care; it returns the nearest landmark up to rounding.
#pragma once

#include <cstdint>
#include <vector>

#include "../knn_engine.h"

namespace knn {
namespace cpu {

class LandmarkSearch {
 public:
  // landmarks: m x dim, row-major (kept by pointer). Metric L2 or L1.
  LandmarkSearch(const float *landmarks, int64_t m, int dim, KnnMetric metric,
                 int n_threads, const int32_t *cancel);

  // The landmark nearest to row, and in *evaluated the number of landmark
  // distances it took. scratch must hold m floats.
  int64_t nearest(const float *row, float *scratch, int64_t *evaluated) const;

 private:
  struct Neighbour {
    float distance;
    int32_t landmark;
  };

  const float *landmarks_;
  int64_t m_;
  int dim_;
  KnnMetric metric_;
  int64_t pilots_;
  std::vector<Neighbour> lists_;  // pilots_ x m: every landmark, nearest first
};

}  // namespace cpu
}  // namespace knn
