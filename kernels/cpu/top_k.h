// top_k.h -- the k best (distance, target row) pairs of one query, in the
// result order of knn_distance.h (knn_result_before: smaller distance,
// NaN last, then smaller row).
//
// A binary max-heap whose root is the worst pair kept, so "does this pair
// enter?" is one comparison with the root. That order is total, so the
// kept set does not depend on the order in which pairs are offered.
//
// Pairs are kept by a key that orders exactly like the distance (the
// distance itself, or row_distance.h's ordering_key); write_sorted()
// converts keys to distances.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../knn_distance.h"
#include "../result_padding.h"

namespace knn {
namespace cpu {

class TopK {
 public:
  struct Entry {
    double key;
    int64_t row;
  };

  // capacity = k, possibly capped at the number of targets (the slots past
  // it are padding anyway).
  explicit TopK(int64_t capacity = 1)
      : capacity_(std::max<int64_t>(1, capacity)) {
    heap_.reserve(static_cast<size_t>(capacity));
  }

  void clear() { heap_.clear(); }
  bool full() const { return static_cast<int64_t>(heap_.size()) == capacity_; }
  int64_t size() const { return static_cast<int64_t>(heap_.size()); }

  // The worst pair kept; only meaningful when full().
  double worst_key() const { return heap_.front().key; }
  int64_t worst_row() const { return heap_.front().row; }

  // Would (key, row) be kept?
  bool accepts(double key, int64_t row) const {
    return !full() ||
           knn_result_before(key, row, heap_.front().key, heap_.front().row);
  }

  // Keeps (key, row) if it is among the best seen. Returns true when it
  // was kept.
  bool offer(double key, int64_t row) {
    if (!full()) {
      heap_.push_back({key, row});
      sift_up(heap_.size() - 1);
      return true;
    }
    if (!knn_result_before(key, row, heap_.front().key, heap_.front().row))
      return false;
    heap_.front() = {key, row};
    sift_down(0);
    return true;
  }

  // Writes the kept pairs best first into k slots, the distance as
  // to_distance(key); slots past size() get row -1 and distance NaN.
  // Leaves the heap empty.
  template <class ToDistance>
  void write_sorted(int64_t k, int64_t *neighbors, double *distances,
                    ToDistance to_distance) {
    std::sort(heap_.begin(), heap_.end(), [](const Entry &a, const Entry &b) {
      return knn_result_before(a.key, a.row, b.key, b.row);
    });
    const int64_t n = size();
    for (int64_t r = 0; r < n; r++) {
      neighbors[r] = heap_[r].row;
      distances[r] = to_distance(heap_[r].key);
    }
    if (n < k) fill_empty_slots(k - n, neighbors + n, distances + n);
    heap_.clear();
  }

 private:
  // "a is worse than b": a comes after b in the result order.
  static bool worse(const Entry &a, const Entry &b) {
    return knn_result_before(b.key, b.row, a.key, a.row);
  }

  void sift_up(size_t i) {
    const Entry e = heap_[i];
    while (i > 0) {
      const size_t parent = (i - 1) / 2;
      if (!worse(e, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }

  void sift_down(size_t i) {
    const size_t n = heap_.size();
    const Entry e = heap_[i];
    for (;;) {
      size_t child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && worse(heap_[child + 1], heap_[child])) child++;
      if (!worse(heap_[child], e)) break;
      heap_[i] = heap_[child];
      i = child;
    }
    heap_[i] = e;
  }

  int64_t capacity_;
  std::vector<Entry> heap_;
};

}  // namespace cpu
}  // namespace knn
