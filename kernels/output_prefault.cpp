// output_prefault.cpp -- see output_prefault.h.

#include "output_prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "signal_free_thread.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name
#endif

namespace knn {

namespace {

// Each call populates at most this much, so that a stop is seen at once
// (the engine waits for it when it has written everything).
constexpr uintptr_t kStepBytes = uintptr_t{2} << 20;

uintptr_t page_bytes() {
  const long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<uintptr_t>(p) : 4096;
}

}  // namespace

OutputPrefault::OutputPrefault(void *a, size_t a_bytes, void *b, size_t b_bytes,
                               int threads) noexcept {
  if (a_bytes + b_bytes < kMinBytes || threads < 1) return;
  try {
    start(a, a_bytes, b, b_bytes, threads);
  } catch (...) {
    // no memory or no thread for all of it: the engine's writes fault the rest
  }
}

void OutputPrefault::start(void *a, size_t a_bytes, void *b, size_t b_bytes, int threads) {
  // Whole pages that lie inside the arrays only: the page before or after
  // an array may belong to another mapping's edge (nothing to populate there).
  const uintptr_t page = page_bytes();
  std::vector<Range> ranges;
  for (const auto &[base, bytes] : {std::make_pair(a, a_bytes), std::make_pair(b, b_bytes)}) {
    if (base == nullptr || bytes == 0) continue;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(base) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(base) + bytes) / page * page;
    if (end > begin) ranges.push_back({begin, end});
  }
  uintptr_t total = 0;
  for (const Range &r : ranges) total += r.end - r.begin;
  if (total == 0) return;
  // Each thread takes an equal, contiguous share of the ranges' pages.
  const uintptr_t share = (total / page + threads - 1) / threads * page;
  std::vector<std::vector<Range>> shares(threads);
  size_t t = 0;
  uintptr_t room = share;
  for (const Range &r : ranges) {
    for (uintptr_t at = r.begin; at < r.end;) {
      const uintptr_t to = std::min(r.end, at + room);
      shares[t].push_back({at, to});
      room -= to - at;
      at = to;
      if (room == 0) {  // this thread's share is full: the next one's (the last takes the rest)
        if (t + 1 < shares.size()) t++;
        room = share;
      }
    }
  }
  threads_.reserve(shares.size());
  for (auto &s : shares)
    if (!s.empty()) threads_.push_back(start_signal_free_thread([this, s] { populate(s); }));
}

OutputPrefault::~OutputPrefault() {
  stop_.store(true);
  for (std::thread &t : threads_) t.join();
}

void OutputPrefault::populate(std::vector<Range> ranges) noexcept {
  for (const Range &r : ranges)
    for (uintptr_t at = r.begin; at < r.end; at += kStepBytes) {
      if (stop_.load(std::memory_order_relaxed)) return;
      const uintptr_t bytes = std::min(kStepBytes, r.end - at);
      // EINVAL (an older kernel) or ENOMEM: the engine's writes fault instead.
      if (madvise(reinterpret_cast<void *>(at), bytes, MADV_POPULATE_WRITE) != 0) return;
    }
}

}  // namespace knn
