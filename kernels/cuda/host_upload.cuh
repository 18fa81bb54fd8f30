// host_upload.cuh -- copies from ordinary (pageable) host arrays to the
// device through two pinned staging buffers: while the DMA engine moves
// one piece, the host fills the other. Runs on its own stream, so an
// upload can overlap kernels of the join's stream (brute_force.cu uploads
// the next target chunk on a helper thread while the current one is
// processed).
#pragma once

#include <algorithm>
#include <cstring>

#include "cuda_check.cuh"
#include "device_buffer.cuh"

namespace knn {
namespace cuda {

class HostUpload {
 public:
  // stage_bytes: size of each of the two staging buffers.
  KnnStatus init(DeviceContext &ctx, size_t stage_bytes) {
    stage_bytes_ = std::max<size_t>(stage_bytes, 4096);
    for (int b = 0; b < 2; b++) {
      KNN_TRY(stage_[b].allocate(ctx, stage_bytes_));
      KNN_TRY(done_[b].create(ctx));
    }
    return stream_.create(ctx);
  }

  // Copies `bytes` from host `src` to device `dst` and waits for the copy.
  KnnStatus copy(DeviceContext &ctx, void *dst, const void *src, size_t bytes) {
    const unsigned char *from = static_cast<const unsigned char *>(src);
    unsigned char *to = static_cast<unsigned char *>(dst);
    int b = 0;
    bool used[2] = {false, false};
    for (size_t off = 0; off < bytes; off += stage_bytes_, b ^= 1) {
      const size_t n = std::min(stage_bytes_, bytes - off);
      // The staging buffer is free once its previous copy has completed.
      if (used[b]) CUDA_CHECK(ctx, cudaEventSynchronize(done_[b].get()));
      std::memcpy(stage_[b].get(), from + off, n);
      CUDA_CHECK(ctx, cudaMemcpyAsync(to + off, stage_[b].get(), n, cudaMemcpyHostToDevice,
                                      stream_.get()));
      CUDA_CHECK(ctx, cudaEventRecord(done_[b].get(), stream_.get()));
      used[b] = true;
    }
    CUDA_CHECK(ctx, cudaStreamSynchronize(stream_.get()));
    return KNN_OK;
  }

 private:
  size_t stage_bytes_ = 0;
  PinnedBuffer<unsigned char> stage_[2];
  Event done_[2];
  Stream stream_;
};

}  // namespace cuda
}  // namespace knn
