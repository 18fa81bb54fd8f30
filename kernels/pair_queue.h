// pair_queue.h -- the bounded hand-over of a range job's pairs from the
// engine thread to the caller (knn_job_take_pairs). A range join's output
// can be far larger than its input, so the engine never runs more than
// `capacity` pairs ahead of the caller: put() waits while the queue is
// full, looking at the cancel flag every few milliseconds. Internal to
// kernels/ (C++).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace knn {

class PairQueue {
 public:
  explicit PairQueue(int64_t capacity)
      : query_(capacity), target_(capacity), distance_(capacity) {}

  // Engine side: appends n pairs of one query, waiting for room. Returns
  // false (nothing more is appended) once *cancel is set.
  bool put(int64_t query_row, const int64_t *target_rows, const double *distances, int64_t n,
           const int32_t *cancel) {
    const int64_t cap = static_cast<int64_t>(query_.size());
    std::unique_lock<std::mutex> lock(mutex_);
    while (n > 0) {
      while (count_ == cap) {
        if (__atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) return false;
        room_.wait_for(lock, std::chrono::milliseconds(5));
      }
      const int64_t chunk = std::min(n, cap - count_);
      for (int64_t i = 0; i < chunk; i++) {
        const int64_t slot = (head_ + count_ + i) % cap;
        query_[slot] = query_row;
        target_[slot] = target_rows[i];
        distance_[slot] = distances[i];
      }
      count_ += chunk;
      target_rows += chunk;
      distances += chunk;
      n -= chunk;
      ready_.notify_all();
    }
    return __atomic_load_n(cancel, __ATOMIC_RELAXED) == 0;
  }

  // Engine side: no more pairs will come (on every way out of the job).
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    ready_.notify_all();
  }

  // Caller side: takes up to `capacity` pairs, waiting up to timeout_ms
  // for one; -1 when closed and empty.
  int64_t take(int64_t *query_rows, int64_t *target_rows, double *distances, int64_t capacity,
               int timeout_ms) {
    const int64_t cap = static_cast<int64_t>(query_.size());
    std::unique_lock<std::mutex> lock(mutex_);
    if (count_ == 0 && !closed_)
      ready_.wait_for(lock, std::chrono::milliseconds(std::max(0, timeout_ms)),
                      [this] { return count_ > 0 || closed_; });
    if (count_ == 0) return closed_ ? -1 : 0;
    const int64_t n = std::min(count_, std::max<int64_t>(0, capacity));
    for (int64_t i = 0; i < n; i++) {
      const int64_t slot = (head_ + i) % cap;
      query_rows[i] = query_[slot];
      target_rows[i] = target_[slot];
      distances[i] = distance_[slot];
    }
    head_ = (head_ + n) % cap;
    count_ -= n;
    room_.notify_all();
    return n;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;  // pairs to take, or closed
  std::condition_variable room_;   // room to put
  std::vector<int64_t> query_, target_;
  std::vector<double> distance_;
  int64_t head_ = 0, count_ = 0;
  bool closed_ = false;
};

}  // namespace knn
