// gpu_context_permit.h -- a process's permit to hold GPU contexts
// (knn_gpu.max_gpu_contexts).
//
// Every process that creates a GPU runtime keeps a CUDA context (hundreds
// of MB of GPU memory) until it releases the runtime. To bound how many
// the server's processes hold, a process first takes one of max_contexts
// permits: an exclusive flock(2) on one of the files
// <dir>/knn_gpu_context.<i>, i < max_contexts, kept while its runtimes
// exist. The kernel drops the lock when the descriptor is closed, so a
// process that dies gives its permit back; the descriptor is O_CLOEXEC,
// so a program the process starts does not inherit it. One permit covers
// all the runtimes of a process, on every GPU it uses.
//
// Plain POSIX: runs on engine threads, never calls PostgreSQL.
#pragma once

#include <cstddef>
#include <cstdint>

namespace knn {

class GpuContextPermit {
 public:
  enum class Outcome {
    kTaken,      // this object holds a permit (or held one already)
    kNotNeeded,  // max_contexts <= 0: no limit, nothing held
    kNoneFree,   // every permit is held by another holder
    kFailed,     // a permit file could not be opened or locked: why says so
  };

  GpuContextPermit() = default;
  ~GpuContextPermit() { give_back(); }
  GpuContextPermit(const GpuContextPermit &) = delete;
  GpuContextPermit &operator=(const GpuContextPermit &) = delete;

  // One pass over the permits 0 .. max_contexts - 1 of dir (an existing
  // directory). Never blocks.
  Outcome try_take(const char *dir, int32_t max_contexts, char *why, size_t why_len) noexcept;

  // Closes the permit's descriptor (no-op without one).
  void give_back() noexcept;

  bool held() const { return fd_ >= 0; }
  int index() const { return index_; }  // the permit held, or -1

 private:
  int fd_ = -1;
  int index_ = -1;
};

}  // namespace knn
