// output_prefault.h -- the pages of a join's result arrays made present
// while the GPU works, so that the engine's writes into them do not fault.
//
// The caller's result arrays are fresh memory in a backend (palloc'd per
// join): every 4 kB page faults on its first write. A join split across
// GPUs (multi_device.cuh) writes |Q| x k x 16 bytes from several GPUs' host
// threads at once, and those faults then take longer than the GPUs' own
// work; one GPU writes slowly enough for them not to matter. OutputPrefault
// asks the kernel to populate the pages (madvise MADV_POPULATE_WRITE, Linux
// 5.14 and later) on a few threads of its own while the engines start.
// Populating never changes a byte, so it needs no ordering with the
// engine's writes: a page the engine reaches first is simply present
// already. Where the kernel lacks the call,
// nothing happens. The threads start with every signal blocked and are
// joined by the destructor (each stops within one 2 MB step once asked).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace knn {

class OutputPrefault {
 public:
  // Below this many bytes in all the faults cost less than the threads.
  static constexpr size_t kMinBytes = size_t{64} << 20;

  // Starts populating [a, a + a_bytes) and [b, b + b_bytes) on up to
  // `threads` threads (none below kMinBytes in all, or where none can start).
  OutputPrefault(void *a, size_t a_bytes, void *b, size_t b_bytes, int threads) noexcept;
  ~OutputPrefault();
  OutputPrefault(const OutputPrefault &) = delete;
  OutputPrefault &operator=(const OutputPrefault &) = delete;

  // Threads started (0: nothing is being populated).
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  struct Range {
    uintptr_t begin, end;  // page-aligned
  };
  void start(void *a, size_t a_bytes, void *b, size_t b_bytes, int threads);
  void populate(std::vector<Range> ranges) noexcept;

  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace knn
