// exclusion_runs.h -- how many targets self-match exclusion can take from
// one query: the largest number of targets that share one key. Methods
// that keep k' candidates per query keep k + this many, so that k remain
// after exclusion.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "signal_free_thread.h"

namespace knn {

// Whether keys[0 .. n) strictly increase. Millions of keys are read on
// several threads (a single thread reads them at a few GB/s: milliseconds
// that every GPU engine of a split would pay before its join); the
// threads run with every signal blocked, and where one cannot be started
// its range is read on the calling thread.
inline bool keys_increase(const int64_t *keys, int64_t n) {
  constexpr int64_t kKeysPerThread = int64_t{1} << 20;
  constexpr int kMaxThreads = 8;
  std::atomic<bool> increasing{true};
  auto check = [&](int64_t begin, int64_t end) {  // keys[begin - 1 .. end)
    for (int64_t i = std::max<int64_t>(begin, 1); i < end; i++) {
      if (keys[i] <= keys[i - 1]) {
        increasing.store(false, std::memory_order_relaxed);
        return;
      }
      if ((i & 0xFFFF) == 0 && !increasing.load(std::memory_order_relaxed)) return;
    }
  };
  const unsigned cores = std::thread::hardware_concurrency();
  const int threads = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({n / kKeysPerThread, kMaxThreads, cores > 0 ? cores : 1})));
  auto begin_of = [&](int t) { return n * t / threads; };
  std::thread helpers[kMaxThreads];
  int started = 1;
  for (; started < threads; started++) {
    try {
      const int64_t begin = begin_of(started), end = begin_of(started + 1);
      helpers[started] = start_signal_free_thread([&check, begin, end] { check(begin, end); });
    } catch (...) {  // std::system_error, std::bad_alloc: the caller reads the rest
      break;
    }
  }
  check(0, begin_of(1));
  for (int t = started; t < threads; t++) check(begin_of(t), begin_of(t + 1));
  for (std::thread &h : helpers)
    if (h.joinable()) h.join();
  return increasing.load();
}

// 0 for no keys; 1 when keys are strictly increasing (the usual case of
// distinct ids sorted by the caller), found without a copy.
inline int64_t max_rows_per_key(const int64_t *keys, int64_t n) {
  if (keys == nullptr || n == 0) return 0;
  if (keys_increase(keys, n)) return 1;
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
