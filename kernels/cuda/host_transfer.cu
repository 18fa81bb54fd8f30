// host_transfer.cu -- staged host <-> device copies (see host_transfer.cuh).
#include <algorithm>
#include <cstring>
#include <thread>

#include "device_thread.cuh"
#include "host_transfer.cuh"

namespace knn {
namespace cuda {

KnnStatus PinnedStaging::reserve(DeviceContext &ctx, int workers) {
  for (int i = 0; i < 2 * workers; i++) {
    if (slices_[i].get() == nullptr) KNN_TRY(slices_[i].allocate(ctx, kSliceBytes));
    if (events_[i].get() == nullptr) KNN_TRY(events_[i].create(ctx));
  }
  if (stream_.get() == nullptr) KNN_TRY(stream_.create(ctx));
  return KNN_OK;
}

namespace {

// One thread per MiB of the transfer, at most kMaxWorkers and the host's
// cores: below a MiB a thread costs more than it saves.
int workers_for(size_t bytes) {
  int cap = PinnedStaging::kMaxWorkers;
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0) cap = std::min<int>(cap, static_cast<int>(cores));
  const size_t per_mib = bytes >> 20;
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(per_mib, cap)));
}

// Worker w's share of an upload, through its slices 2w and 2w+1: a slice is
// refilled once the copy that last read it has completed.
KnnStatus upload_part(DeviceContext &ctx, PinnedStaging &st, int w, unsigned char *dst,
                      const unsigned char *src, size_t bytes) {
  const size_t slice = PinnedStaging::kSliceBytes;
  bool used[2] = {false, false};
  int b = 0;
  for (size_t off = 0; off < bytes; off += slice, b ^= 1) {
    const size_t n = std::min(slice, bytes - off);
    const int s = 2 * w + b;
    if (used[b]) CUDA_CHECK(ctx, cudaEventSynchronize(st.event(s)));
    std::memcpy(st.slice(s), src + off, n);
    CUDA_CHECK(ctx, cudaMemcpyAsync(dst + off, st.slice(s), n, cudaMemcpyHostToDevice,
                                    st.upload_stream()));
    CUDA_CHECK(ctx, cudaEventRecord(st.event(s), st.upload_stream()));
    used[b] = true;
  }
  return KNN_OK;
}

// Worker w's share of a download on `stream`: two pieces are in flight
// while the thread copies the oldest one out of its slice.
KnnStatus download_part(DeviceContext &ctx, PinnedStaging &st, int w, cudaStream_t stream,
                        unsigned char *dst, const unsigned char *src, size_t bytes) {
  const size_t slice = PinnedStaging::kSliceBytes;
  const size_t pieces = (bytes + slice - 1) / slice;
  auto piece_bytes = [&](size_t i) { return std::min(slice, bytes - i * slice); };
  auto enqueue = [&](size_t i) -> KnnStatus {
    const int s = 2 * w + static_cast<int>(i % 2);
    CUDA_CHECK(ctx, cudaMemcpyAsync(st.slice(s), src + i * slice, piece_bytes(i),
                                    cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(ctx, cudaEventRecord(st.event(s), stream));
    return KNN_OK;
  };
  for (size_t i = 0; i < pieces && i < 2; i++) KNN_TRY(enqueue(i));
  for (size_t i = 0; i < pieces; i++) {
    const int s = 2 * w + static_cast<int>(i % 2);
    CUDA_CHECK(ctx, cudaEventSynchronize(st.event(s)));
    std::memcpy(dst + i * slice, st.slice(s), piece_bytes(i));
    if (i + 2 < pieces) KNN_TRY(enqueue(i + 2));
  }
  return KNN_OK;
}

// Runs part(ctx_of_worker, w, begin, bytes) for `workers` contiguous parts of
// [0, total): part 0 on the calling thread, the others on helper threads
// (or on the calling thread too, if a thread cannot be started). Returns
// the first failure, its message in ctx.error.
template <class Part>
KnnStatus run_parts(DeviceContext &ctx, size_t total, int workers, Part part) {
  const size_t share = ((total + workers - 1) / workers + 4095) & ~size_t(4095);
  auto begin_of = [&](int w) { return std::min(total, static_cast<size_t>(w) * share); };
  auto bytes_of = [&](int w) { return std::min(total, begin_of(w) + share) - begin_of(w); };

  bool on_caller[PinnedStaging::kMaxWorkers] = {};
  DeviceThread helpers[PinnedStaging::kMaxWorkers];  // joined before the lambdas go
  for (int w = 1; w < workers; w++) {
    if (bytes_of(w) == 0) continue;
    on_caller[w] = !helpers[w].start(ctx, [&, w](DeviceContext &local) {
      return part(local, w, begin_of(w), bytes_of(w));
    });
  }
  KnnStatus status = part(ctx, 0, begin_of(0), bytes_of(0));
  for (int w = 1; w < workers; w++)
    if (on_caller[w] && status == KNN_OK) status = part(ctx, w, begin_of(w), bytes_of(w));
  for (int w = 1; w < workers; w++) {
    const KnnStatus helper = helpers[w].finish(ctx);
    if (status == KNN_OK) status = helper;
  }
  return status;
}

// A copy through the staging slices: part(ctx, staging, worker, begin, n)
// moves bytes [begin, begin + n) on the upload stream or on ctx.stream.
// Every copy issued is waited for, also after a failure: the slices are
// reused by the next transfer.
template <class Part>
KnnStatus staged_copy(DeviceContext &ctx, size_t bytes, bool on_upload_stream, Part part) {
  PinnedStaging &st = *ctx.staging;
  const int workers = workers_for(bytes);
  KNN_TRY(st.reserve(ctx, workers));
  const KnnStatus status =
      run_parts(ctx, bytes, workers, [&](DeviceContext &c, int w, size_t begin, size_t n) {
        return part(c, st, w, begin, n);
      });
  const cudaError_t err = cudaStreamSynchronize(on_upload_stream ? st.upload_stream() : ctx.stream);
  if (status != KNN_OK) return status;
  CUDA_CHECK(ctx, err);
  return KNN_OK;
}

}  // namespace

KnnStatus upload_to_device(DeviceContext &ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return KNN_OK;
  if (ctx.staging == nullptr) {
    CUDA_CHECK(ctx, cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return KNN_OK;
  }
  unsigned char *to = static_cast<unsigned char *>(dst);
  const unsigned char *from = static_cast<const unsigned char *>(src);
  return staged_copy(ctx, bytes, true,
                     [&](DeviceContext &c, PinnedStaging &st, int w, size_t begin, size_t n) {
                       return upload_part(c, st, w, to + begin, from + begin, n);
                     });
}

KnnStatus download_to_host(DeviceContext &ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return KNN_OK;
  if (ctx.staging == nullptr) {
    CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx.stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    return KNN_OK;
  }
  unsigned char *to = static_cast<unsigned char *>(dst);
  const unsigned char *from = static_cast<const unsigned char *>(src);
  const cudaStream_t stream = ctx.stream;
  return staged_copy(ctx, bytes, false,
                     [&](DeviceContext &c, PinnedStaging &st, int w, size_t begin, size_t n) {
                       return download_part(c, st, w, stream, to + begin, from + begin, n);
                     });
}

}  // namespace cuda
}  // namespace knn
