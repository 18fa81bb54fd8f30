// device_buffer.cuh -- owners of device memory, pinned host memory, streams
// and events. Each frees what it holds when it goes out of scope, so every
// return path of the engine (errors and cancellation included) releases
// the device memory of the join.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <utility>

#include "cuda_check.cuh"
#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

cudaMemPool_t shared_rows_pool(int device, bool create);  // device_runtime.cuh

// A typed device array from the stream-ordered allocator: cudaMallocAsync
// on ctx.stream, from the device's memory pool (set_pool_hold gives the
// pool a release threshold, so that memory freed by one join is reused by
// the next without going back to the driver), and cudaFreeAsync on the same
// stream when it goes out of scope. A buffer may be used on another stream
// only after its allocating stream has been synchronized (brute_force.cu
// does so once, after its allocations). Every join ends with a
// synchronization of ctx.stream, so no buffer outlives its join.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  // Frees what was held and allocates `count` elements. `what` names the
  // buffer in the out-of-memory message. pool: another pool than the
  // device's default one (device_runtime.cuh: shared_rows_pool), or null.
  KnnStatus allocate(DeviceContext &ctx, size_t count, const char *what,
                     cudaMemPool_t pool_from = nullptr) {
    release();
    if (count == 0) return KNN_OK;
    void *p = nullptr;
    auto malloc_async = [&]() {
      return pool_from != nullptr
                 ? cudaMallocFromPoolAsync(&p, count * sizeof(T), pool_from, ctx.stream)
                 : cudaMallocAsync(&p, count * sizeof(T), ctx.stream);
    };
    cudaError_t err = malloc_async();
    if (err == cudaErrorMemoryAllocation) {
      // Memory the pools keep from earlier joins may be in pieces that do
      // not fit: hand it back to the driver and try once more.
      (void)cudaGetLastError();
      cudaMemPool_t pool;
      if (cudaStreamSynchronize(ctx.stream) == cudaSuccess) {
        if (cudaDeviceGetMemPool(&pool, ctx.device) == cudaSuccess)
          (void)cudaMemPoolTrimTo(pool, 0);
        if (cudaMemPool_t shared = shared_rows_pool(ctx.device, false))
          (void)cudaMemPoolTrimTo(shared, 0);
      }
      (void)cudaGetLastError();
      err = malloc_async();
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "device allocation of %.1f MiB for %s failed: %s (join budget %.1f MiB)",
                    count * sizeof(T) / 1048576.0, what, cudaGetErrorString(err),
                    ctx.memory_budget / 1048576.0);
      if (ctx.error.empty()) ctx.error = msg;
      return err == cudaErrorMemoryAllocation ? KNN_OUT_OF_MEMORY : KNN_DEVICE_ERROR;
    }
    ptr_ = static_cast<T *>(p);
    count_ = count;
    stream_ = ctx.stream;
    return KNN_OK;
  }

  void release() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
    ptr_ = nullptr;
    count_ = 0;
  }

  T *get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T *ptr_ = nullptr;
  size_t count_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Page-locked host memory (the staging buffers of asynchronous copies).
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { release(); }
  PinnedBuffer(const PinnedBuffer &) = delete;
  PinnedBuffer &operator=(const PinnedBuffer &) = delete;

  KnnStatus allocate(DeviceContext &ctx, size_t count) {
    release();
    if (count == 0) return KNN_OK;
    void *p = nullptr;
    CUDA_CHECK(ctx, cudaMallocHost(&p, count * sizeof(T)));
    ptr_ = static_cast<T *>(p);
    return KNN_OK;
  }

  void release() {
    if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
    ptr_ = nullptr;
  }

  T *get() const { return ptr_; }

 private:
  T *ptr_ = nullptr;
};

// A CUDA stream or event, destroyed with its owner. Created on first use
// (PinnedStaging::reserve), so create() reports a failure as a status.
template <class Handle, cudaError_t (*Destroy)(Handle)>
class OwnedHandle {
 public:
  OwnedHandle() = default;
  ~OwnedHandle() {
    if (h_ != nullptr) (void)Destroy(h_);
  }
  OwnedHandle(const OwnedHandle &) = delete;
  OwnedHandle &operator=(const OwnedHandle &) = delete;

  Handle get() const { return h_; }

 protected:
  Handle h_ = nullptr;
};

class Stream : public OwnedHandle<cudaStream_t, cudaStreamDestroy> {
 public:
  KnnStatus create(DeviceContext &ctx) {
    CUDA_CHECK(ctx, cudaStreamCreateWithFlags(&h_, cudaStreamNonBlocking));
    return KNN_OK;
  }
};

class Event : public OwnedHandle<cudaEvent_t, cudaEventDestroy> {
 public:
  KnnStatus create(DeviceContext &ctx) {
    CUDA_CHECK(ctx, cudaEventCreateWithFlags(&h_, cudaEventDisableTiming));
    return KNN_OK;
  }
};

}  // namespace cuda
}  // namespace knn
