// parallel_for.h -- run numbered work items on a few threads (started
// with all signals blocked: ../signal_free_thread.h).
//
// Items are handed out one at a time through an atomic counter, so threads
// that draw cheap items simply take more of them (work stealing without
// queues). The caller's thread works too, as worker 0. No item is started
// after the cancel flag is seen or after an item threw; every thread is
// joined before parallel_for returns, and the first exception is rethrown
// on the caller's thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "../knn_engine.h"
#include "../signal_free_thread.h"

namespace knn {
namespace cpu {

// The threads a problem asks for (KnnProblem::n_threads): 0 = every core,
// at most KNN_MAX_THREADS.
inline int resolve_threads(int32_t requested) {
  int n = requested;
  if (n == 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, std::min(n, KNN_MAX_THREADS));
}

// body(item, worker) for every item in [0, n_items); worker is in
// [0, threads used) and indexes per-thread scratch space.
template <class Body>
void parallel_for(int64_t n_items, int n_threads, const int32_t *cancel,
                  Body &&body) {
  if (n_items <= 0) return;
  const int workers =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n_threads, n_items)));

  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;

  auto work = [&](int worker) {
    try {
      for (;;) {
        if (failed.load(std::memory_order_relaxed)) return;
        if (cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED))
          return;
        const int64_t item = next.fetch_add(1, std::memory_order_relaxed);
        if (item >= n_items) return;
        body(item, worker);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
      failed.store(true);
    }
  };

  std::vector<std::thread> threads;
  try {
    threads.reserve(workers - 1);
    for (int w = 1; w < workers; w++)
      threads.push_back(start_signal_free_thread([&work, w] { work(w); }));
  } catch (...) {
    // Could not start every thread: the ones running (and this one) still
    // finish all items, only slower.
  }
  work(0);
  for (std::thread &t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

// Number of workers parallel_for will use, for sizing per-thread scratch.
inline int parallel_workers(int64_t n_items, int n_threads) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(n_threads, n_items)));
}

}  // namespace cpu
}  // namespace knn
