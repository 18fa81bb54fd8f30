// phase_timer.cuh -- an optional device-time breakdown of a brute-force
// join, for measuring where its time goes: with KNN_BRUTE_PHASES=1 in the
// environment, events recorded between the stages on one stream are summed
// per phase and printed to stderr when the join ends. Off (the default),
// every call returns at once. Diagnostics only: a failing event call just
// turns the timer off.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace knn {
namespace cuda {

class PhaseTimer {
 public:
  enum Phase { kRows, kGemm, kSelect, kRerank, kOther, kPhases };

  PhaseTimer() {
    const char *env = std::getenv("KNN_BRUTE_PHASES");
    on_ = env != nullptr && env[0] == '1';
  }
  ~PhaseTimer() {
    for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
  }
  PhaseTimer(const PhaseTimer &) = delete;
  PhaseTimer &operator=(const PhaseTimer &) = delete;

  bool on() const { return on_; }

  // The work queued on s since the previous mark belongs to phase p (the
  // first mark only starts the clock).
  void mark(cudaStream_t s, Phase p) {
    if (!on_) return;
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      if (cudaEventCreate(&e) != cudaSuccess) {
        on_ = false;
        return;
      }
      pool_.push_back(e);
    }
    if (cudaEventRecord(pool_[used_], s) != cudaSuccess) {
      on_ = false;
      return;
    }
    tags_.resize(used_ + 1);
    tags_[used_++] = p;
  }

  // Once the stream has completed every marked interval: adds them up and
  // keeps the last event as the start of the next one.
  void flush() {
    if (!on_ || used_ == 0) return;
    for (size_t i = 1; i < used_; i++) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, pool_[i - 1], pool_[i]) != cudaSuccess) {
        on_ = false;
        return;
      }
      seconds_[tags_[i]] += ms * 1e-3;
    }
    std::swap(pool_[0], pool_[used_ - 1]);
    used_ = 1;
  }

  // Bytes of tiles the selection read (for its bandwidth).
  void add_tile_bytes(double bytes) {
    tile_bytes_ += bytes;
    tiles_++;
  }

  void report(double transfer, double total) {
    if (!on_) return;
    const double sel = seconds_[kSelect];
    std::fprintf(stderr,
                 "brute phases (device s): rows %.4f gemm %.4f select %.4f (%ld tiles, %.1f GB, "
                 "%.0f GB/s) rerank %.4f other %.4f | host: transfer %.4f total %.4f\n",
                 seconds_[kRows], seconds_[kGemm], sel, tiles_, tile_bytes_ * 1e-9,
                 sel > 0 ? tile_bytes_ * 1e-9 / sel : 0.0, seconds_[kRerank], seconds_[kOther],
                 transfer, total);
  }

 private:
  bool on_ = false;
  std::vector<cudaEvent_t> pool_;
  std::vector<int> tags_;
  size_t used_ = 0;
  double seconds_[kPhases] = {};
  double tile_bytes_ = 0;
  long tiles_ = 0;
};

}  // namespace cuda
}  // namespace knn
