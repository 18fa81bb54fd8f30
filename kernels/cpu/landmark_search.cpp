// landmark_search.cpp -- nearest landmark by triangle-inequality pruning
// (landmark_search.h).
#include "landmark_search.h"

#include <algorithm>
#include <cmath>

#include "lane_sums.h"
#include "parallel_for.h"
#include "row_distance.h"

namespace knn {
namespace cpu {
namespace {

// Landmarks measured together (lane_sums_scattered's pass width).
constexpr int kBatch = 8;

}  // namespace

LandmarkSearch::LandmarkSearch(const float *landmarks, int64_t m, int dim,
                               KnnMetric metric, int n_threads,
                               const int32_t *cancel)
    : landmarks_(landmarks), m_(m), dim_(dim), metric_(metric) {
  pilots_ = std::min<int64_t>(
      m, static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(m)))));
  lists_.resize(static_cast<size_t>(pilots_ * m));

  // Only pilots start a search, so only they need neighbour lists.
  parallel_for(pilots_, n_threads, cancel, [&](int64_t p, int) {
    std::vector<float> sums(m);
    lane_sums(metric, landmarks + p * dim, landmarks, m, dim, sums.data());
    std::vector<Neighbour> all(m);
    for (int64_t c = 0; c < m; c++)
      all[c] = {static_cast<float>(distance_from_sum(metric, sums[c], 0, 0)),
                static_cast<int32_t>(c)};
    auto closer = [](const Neighbour &a, const Neighbour &b) {
      return a.distance != b.distance ? a.distance < b.distance : a.landmark < b.landmark;
    };
    std::sort(all.begin(), all.end(), closer);
    std::copy(all.begin(), all.end(), lists_.begin() + p * m);
  });
}

int64_t LandmarkSearch::nearest(const float *row, float *scratch,
                                int64_t *evaluated) const {
  // Nearest pilot.
  lane_sums(metric_, row, landmarks_, pilots_, dim_, scratch);
  int64_t best = 0;
  for (int64_t c = 1; c < pilots_; c++)
    if (scratch[c] < scratch[best]) best = c;
  const double d0 = distance_from_sum(metric_, scratch[best], 0, 0);
  double best_distance = d0;
  *evaluated += pilots_;

  // Landmarks near that pilot, nearest first, while they can still win;
  // measured in small batches (the bound then lags a little, which only
  // costs a few extra distances).
  const Neighbour *list = lists_.data() + best * m_;
  const float *batch_rows[kBatch];
  int64_t batch_landmarks[kBatch];
  float batch_sums[kBatch];
  int count = 0;
  auto flush = [&] {
    lane_sums_scattered(metric_, row, batch_rows, count, dim_, batch_sums);
    *evaluated += count;
    for (int b = 0; b < count; b++) {
      const double d = distance_from_sum(metric_, batch_sums[b], 0, 0);
      if (d < best_distance) {
        best_distance = d;
        best = batch_landmarks[b];
      }
    }
    count = 0;
  };
  for (int64_t i = 0; i < m_; i++) {
    if (list[i].distance > d0 + best_distance) break;
    const int64_t c = list[i].landmark;
    if (c < pilots_) continue;  // measured already
    batch_rows[count] = landmarks_ + c * dim_;
    batch_landmarks[count] = c;
    if (++count == kBatch) flush();
  }
  if (count > 0) flush();
  return best;
}

}  // namespace cpu
}  // namespace knn
