// host_transfer.cuh -- copies between ordinary (pageable) host arrays and the
// device through pinned staging memory.
//
// The DMA engine only reads and writes page-locked memory, so every copy of
// a pageable array goes through a pinned buffer; the host memcpy into or out
// of it is the slow half (one thread moves some 10 GB/s, the PCIe link
// several times that). So a transfer is split among up to kMaxWorkers host
// threads (one per MiB), and each thread pipelines its part through two
// pinned slices: while the DMA engine moves one slice, the thread fills or
// empties the other.
//
// Page-locking memory costs about a millisecond per few megabytes, so the
// slices are not made per join: cuda_module.cu keeps one PinnedStaging per
// device for the life of the process (at most 2 * kMaxWorkers slices of
// kSliceBytes: 64 MiB of pinned host memory, allocated as transfers first
// need them). Joins on a device run one at a time and a join runs one
// transfer at a time, so the slices are never shared by two transfers.
#pragma once

#include <cstddef>

#include "cuda_check.cuh"
#include "device_buffer.cuh"

namespace knn {
namespace cuda {

class PinnedStaging {
 public:
  static constexpr int kMaxWorkers = 8;
  static constexpr size_t kSliceBytes = size_t(4) << 20;

  // Makes sure the slices and events of `workers` threads and the upload
  // stream exist (the device of ctx must be current).
  KnnStatus reserve(DeviceContext &ctx, int workers);

  unsigned char *slice(int i) const { return slices_[i].get(); }
  cudaEvent_t event(int i) const { return events_[i].get(); }
  cudaStream_t upload_stream() const { return stream_.get(); }

 private:
  PinnedBuffer<unsigned char> slices_[2 * kMaxWorkers];
  Event events_[2 * kMaxWorkers];
  Stream stream_;
};

// Copies `bytes` from host `src` to device `dst` on the upload stream of
// ctx.staging (so that it may overlap kernels of ctx.stream) and waits for
// the copy. `dst` must be usable from any stream (its allocating stream
// synchronized). Without ctx.staging: a plain cudaMemcpy.
KnnStatus upload_to_device(DeviceContext &ctx, void *dst, const void *src, size_t bytes);

// Copies `bytes` from device `src` to host `dst`, after the work queued on
// ctx.stream so far, and waits for the copy.
KnnStatus download_to_host(DeviceContext &ctx, void *dst, const void *src, size_t bytes);

}  // namespace cuda
}  // namespace knn
