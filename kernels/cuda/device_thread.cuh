// device_thread.cuh -- a helper thread of a join that runs one step on the
// join's device (an upload overlapping the kernels, a share of a host
// copy), or one engine of a join split across GPUs on its own device
// (multi_device.cu). It starts with every signal blocked (../signal_free_thread.h,
// shared with the job layer and the CPU engine), owns what the step
// reports, and is joined by its owner's destructor on every path, so it
// never outlives what it was given.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <new>
#include <system_error>
#include <thread>

#include "../signal_free_thread.h"
#include "../entry_guard.h"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

class DeviceThread {
 public:
  DeviceThread() = default;
  ~DeviceThread() { wait(); }
  DeviceThread(const DeviceThread &) = delete;
  DeviceThread &operator=(const DeviceThread &) = delete;

  // Runs step(DeviceContext &) -> KnnStatus on a new thread, with a context
  // of its own on parent's device (same budget and staging memory, no
  // stream). Returns false when no thread could be started (then nothing
  // runs and the caller does the step itself).
  template <class Step>
  bool start(const DeviceContext &parent, Step step) {
    return launch(parent.device, parent.memory_budget, parent.staging, step);
  }

  // The same with a fresh context on `device` (no budget, staging or
  // stream: the step borrows a runtime of its own): one engine of a join
  // split across GPUs (multi_device.cuh).
  template <class Step>
  bool start_on(int device, Step step) {
    return launch(device, 0, nullptr, step);
  }

  bool running() const { return thread_.joinable(); }

  // True once the step has returned (or thrown); status() is then its own.
  bool done() const { return done_.load(std::memory_order_acquire); }
  KnnStatus status() const { return status_; }

  // Waits for the thread (if one was started).
  void wait() {
    if (thread_.joinable()) thread_.join();
  }

  // Waits, then returns the step's status; a failure's message goes to
  // ctx.error (unless that already holds one).
  KnnStatus finish(DeviceContext &ctx) {
    wait();
    if (status_ != KNN_OK && ctx.error.empty())
      ctx.error = error_[0] != '\0' ? error_ : "an engine thread failed";
    return status_;
  }

 private:
  template <class Step>
  bool launch(int device, size_t budget, PinnedStaging *staging, Step step) {
    wait();  // a second start waits for the first thread
    done_.store(false);
    status_ = KNN_OK;
    error_[0] = '\0';
    try {
      thread_ = start_signal_free_thread([this, device, budget, staging, step]() {
        status_ = guarded("GPU engine thread", error_, sizeof error_, [&]() -> KnnStatus {
          DeviceContext ctx;
          ctx.device = device;
          ctx.memory_budget = budget;
          ctx.staging = staging;
          const KnnStatus st = [&]() -> KnnStatus {
            CUDA_CHECK(ctx, cudaSetDevice(device));
            return step(ctx);
          }();
          if (st != KNN_OK) copy_message(error_, sizeof error_, ctx.error.c_str());
          return st;
        });
        done_.store(true, std::memory_order_release);
      });
    } catch (const std::system_error &) {
      return false;
    } catch (const std::bad_alloc &) {
      return false;
    }
    return true;
  }

  std::thread thread_;
  std::atomic<bool> done_{false};
  KnnStatus status_ = KNN_OK;
  char error_[512] = "";
};

// Runs part(DeviceContext &, int w) -> KnnStatus for w = 0 .. workers - 1
// (at most kMaxWorkers): share 0 on the calling thread with ctx, the others
// on helper threads (on the calling thread too where one cannot be
// started), every helper joined before this returns. Returns the first
// failure (its message in ctx.error), or KNN_OK.
template <int kMaxWorkers, class Part>
KnnStatus run_shares(DeviceContext &ctx, int workers, Part &part) {
  bool here[kMaxWorkers] = {};
  DeviceThread helpers[kMaxWorkers];  // joined before `part` goes
  for (int w = 1; w < workers; w++)
    here[w] = !helpers[w].start(ctx, [&part, w](DeviceContext &c) { return part(c, w); });
  KnnStatus status = part(ctx, 0);
  for (int w = 1; w < workers; w++)
    if (here[w] && status == KNN_OK) status = part(ctx, w);
  for (int w = 1; w < workers; w++) {
    const KnnStatus helper = helpers[w].finish(ctx);
    if (status == KNN_OK) status = helper;
  }
  return status;
}

}  // namespace cuda
}  // namespace knn
