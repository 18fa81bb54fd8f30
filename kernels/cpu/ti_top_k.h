// ti_top_k.h -- the k best (distance, target row) pairs of one query in
// the TI join, each packed into one 64-bit integer so that the result
// order is plain integer order. Internal to kernels/cpu/.
//
// The TI join runs only for L2 and L1 on finite values, where every lane
// sum is a finite float >= +0 (a sum of squares or of absolute values), and
// the distance (sqrt of the sum in double, or the sum) grows strictly with
// the sum. The bits of such a float, read as an unsigned integer, grow with
// its value, so (sum bits << 32 | row) orders pairs exactly as
// knn_result_before orders (distance, row), ties by row included. Rows
// must fit in 32 bits (ti_join_supports checks it).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace knn {
namespace cpu {

// A sum and a row as one pair; the row is the low half.
inline uint64_t pack_pair(float sum, int64_t row) {
  uint32_t bits;
  std::memcpy(&bits, &sum, sizeof(bits));
  return static_cast<uint64_t>(bits) << 32 | static_cast<uint64_t>(row);
}
inline float pair_sum_of(uint64_t pair) {
  const uint32_t bits = static_cast<uint32_t>(pair >> 32);
  float sum;
  std::memcpy(&sum, &bits, sizeof(sum));
  return sum;
}
inline int64_t pair_row_of(uint64_t pair) { return static_cast<int64_t>(pair & 0xffffffffu); }

// The pairs kept, ascending; the last is the worst.
class TiTopK {
 public:
  explicit TiTopK(int64_t capacity = 1)
      : list_(static_cast<size_t>(capacity < 1 ? 1 : capacity)) {}

  void clear() { size_ = 0; }
  bool full() const { return size_ == list_.size(); }
  size_t size() const { return size_; }
  // The worst pair kept, or ~0 (beyond every pair) while not full: a pair
  // enters exactly when it is smaller.
  uint64_t bar() const { return full() ? list_[size_ - 1] : ~uint64_t{0}; }

  // Keeps `pair` when it is smaller than bar(). Returns whether it was kept.
  bool offer(uint64_t pair) {
    size_t i;
    if (!full()) {
      i = size_++;
    } else {
      if (pair >= list_[size_ - 1]) return false;
      i = size_ - 1;
    }
    while (i > 0 && list_[i - 1] > pair) {
      list_[i] = list_[i - 1];
      i--;
    }
    list_[i] = pair;
    return true;
  }

  const uint64_t *sorted() const { return list_.data(); }

 private:
  std::vector<uint64_t> list_;
  size_t size_ = 0;
};

}  // namespace cpu
}  // namespace knn
