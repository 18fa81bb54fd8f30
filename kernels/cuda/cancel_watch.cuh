// cancel_watch.cuh -- a caller's cancel made visible to kernels already
// queued (internal to kernels/cuda/).
//
// A cancel (DeviceContext::cancel) is a word in host memory that the host
// thread reads between launches; the launches it has queued by then run to
// their end. Where a join queues much work at once (the out-of-core join: a
// whole pair of parts' level 2, up to a second on large sets), a cancel
// would wait for it. A CancelWatch is a thread that, once the cancel is set,
// sets a word in device memory (its owner's, from the stream-ordered pool:
// cudaFree would wait for every stream of the device, other sessions' joins
// under the GPU service too) with a one-thread kernel on a stream of the
// highest priority (it runs as soon as any block of the running kernels
// ends); the kernels that read the word (Level2Config::stop) then end
// their blocks at once. (Kernels reading a word of mapped host memory
// instead cost an out-of-core join 2.5 times its time: every block's read
// crossed the bus.)
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace knn {
namespace cuda {

class CancelWatch {
 public:
  CancelWatch() = default;
  ~CancelWatch();
  CancelWatch(const CancelWatch &) = delete;
  CancelWatch &operator=(const CancelWatch &) = delete;

  // Watches *cancel (null: nothing to watch) until stop(); once it is set,
  // sets `word` (an int32 in device memory of `device`, the current device,
  // 0 by the time this is called and alive until stop() has returned).
  // Without a stream or a thread, kernels simply run whole, as they did.
  void start(int device, const int32_t *cancel, int32_t *word);

  // Ends the watch and joins its thread: the word is set no more.
  void stop();

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace cuda
}  // namespace knn
