// cancel_watch.cu -- see cancel_watch.cuh.
#include <chrono>
#include <system_error>

#include "../signal_free_thread.h"
#include "cancel_watch.cuh"

namespace knn {
namespace cuda {
namespace {

// How often the watch looks at the cancel.
constexpr std::chrono::milliseconds kLook{1};

__global__ void set_word_kernel(int32_t *word) {
  *reinterpret_cast<volatile int32_t *>(word) = 1;
  __threadfence();
}

}  // namespace

CancelWatch::~CancelWatch() {
  stop();
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  (void)cudaGetLastError();
}

void CancelWatch::start(int device, const int32_t *cancel, int32_t *word) {
  stop();
  if (cancel == nullptr || word == nullptr) return;
  if (stream_ == nullptr) {
    int least = 0, greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess ||
        cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest) != cudaSuccess) {
      (void)cudaGetLastError();
      stream_ = nullptr;
      return;
    }
  }
  stopping_ = false;
  cudaStream_t stream = stream_;
  try {
    thread_ = start_signal_free_thread([this, device, cancel, word, stream] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stopping_) {
        if (__atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) {
          lock.unlock();
          // Errors are dropped: the kernels then run whole, and the join's
          // own status says what went wrong.
          if (cudaSetDevice(device) == cudaSuccess) {
            set_word_kernel<<<1, 1, 0, stream>>>(word);
            (void)cudaStreamSynchronize(stream);
          }
          (void)cudaGetLastError();
          return;
        }
        wake_.wait_for(lock, kLook);
      }
    });
  } catch (const std::system_error &) {
  }
}

void CancelWatch::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace cuda
}  // namespace knn
