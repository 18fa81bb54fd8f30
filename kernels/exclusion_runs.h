// exclusion_runs.h -- how many targets self-match exclusion can take from
// one query: the largest number of targets that share one key. Methods
// that keep k' candidates per query keep k + this many, so that k remain
// after exclusion.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace knn {

// 0 for no keys; 1 when keys are strictly increasing (the usual case of
// distinct ids sorted by the caller), found without a copy.
inline int64_t max_rows_per_key(const int64_t *keys, int64_t n) {
  if (keys == nullptr || n == 0) return 0;
  bool increasing = true;
  for (int64_t i = 1; i < n && increasing; i++) increasing = keys[i] > keys[i - 1];
  if (increasing) return 1;
  std::vector<int64_t> sorted(keys, keys + n);
  std::sort(sorted.begin(), sorted.end());
  int64_t longest = 1, run = 1;
  for (int64_t i = 1; i < n; i++) {
    run = sorted[i] == sorted[i - 1] ? run + 1 : 1;
    longest = std::max(longest, run);
  }
  return longest;
}

}  // namespace knn
