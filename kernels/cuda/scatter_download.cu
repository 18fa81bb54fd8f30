// scatter_download.cu -- see scatter_download.cuh.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "device_thread.cuh"
#include "host_transfer.cuh"
#include "scatter_download.cuh"

namespace knn {
namespace cuda {
namespace {

// Rows ahead whose places scatter_piece prefetches, and the cache lines of
// each row's start it prefetches (the hardware follows a longer row). The
// places are ascending but far apart (a batch's rows are spread over the
// whole output), so each row's write would otherwise wait for its lines
// (a page walk and a read for ownership) one row at a time.
// KNN_SCATTER_PREFETCH=0 turns it off, for A/B benchmarks.
constexpr int64_t kPrefetchRows = 8;
constexpr int kPrefetchLines = 4;

bool scatter_prefetch() {
  static const bool on = [] {
    const char *v = std::getenv("KNN_SCATTER_PREFETCH");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// Rows n of one piece in `from` (n * k neighbours, then n * k distances)
// to their places.
void scatter_piece(const unsigned char *from, const int32_t *places, int64_t n, int k,
                   int64_t *neighbors, double *distances) {
  const size_t bytes = sizeof(int64_t) * k;
  const unsigned char *dist = from + n * bytes;
  const int lines = static_cast<int>(std::min<size_t>(kPrefetchLines, (bytes + 63) / 64 + 1));
  const int64_t ahead = scatter_prefetch() ? kPrefetchRows : 0;
  for (int64_t c = 0; c < n; c++) {
    if (c + ahead < n && ahead > 0) {
      const int64_t next = static_cast<int64_t>(places[c + ahead]) * k;
      const char *a = reinterpret_cast<const char *>(neighbors + next);
      const char *b = reinterpret_cast<const char *>(distances + next);
      for (int line = 0; line < lines; line++) {
        __builtin_prefetch(a + 64 * line, 1);
        __builtin_prefetch(b + 64 * line, 1);
      }
    }
    const int64_t at = static_cast<int64_t>(places[c]) * k;
    std::memcpy(neighbors + at, from + c * bytes, bytes);
    std::memcpy(distances + at, dist + c * bytes, bytes);
  }
}

struct Transfer {
  const int64_t *rows;
  const double *dist;
  const int32_t *places;
  int k;
  int64_t *neighbors;
  double *distances;
  cudaStream_t stream;
  int64_t piece;  // rows per pinned slice
};

// Rows [begin, begin + n) through worker w's two slices: two pieces in
// flight while the thread scatters the older one.
KnnStatus worker_rows(DeviceContext &ctx, PinnedStaging &st, int w, const Transfer &t,
                      int64_t begin, int64_t n) {
  const int64_t pieces = (n + t.piece - 1) / t.piece;
  auto rows_of = [&](int64_t i) { return std::min(t.piece, n - i * t.piece); };
  auto enqueue = [&](int64_t i) -> KnnStatus {
    const int s = 2 * w + static_cast<int>(i % 2);
    const int64_t first = begin + i * t.piece, len = rows_of(i);
    const size_t bytes = sizeof(int64_t) * t.k * len;
    CUDA_CHECK(ctx, cudaMemcpyAsync(st.slice(s), t.rows + first * t.k, bytes,
                                    cudaMemcpyDeviceToHost, t.stream));
    CUDA_CHECK(ctx, cudaMemcpyAsync(st.slice(s) + bytes, t.dist + first * t.k, bytes,
                                    cudaMemcpyDeviceToHost, t.stream));
    CUDA_CHECK(ctx, cudaEventRecord(st.event(s), t.stream));
    return KNN_OK;
  };
  for (int64_t i = 0; i < pieces && i < 2; i++) KNN_TRY(enqueue(i));
  for (int64_t i = 0; i < pieces; i++) {
    const int s = 2 * w + static_cast<int>(i % 2);
    CUDA_CHECK(ctx, cudaEventSynchronize(st.event(s)));
    scatter_piece(st.slice(s), t.places + begin + i * t.piece, rows_of(i), t.k, t.neighbors,
                  t.distances);
    if (i + 2 < pieces) KNN_TRY(enqueue(i + 2));
  }
  return KNN_OK;
}

// Without pinned staging: piece by piece through a pageable buffer.
KnnStatus unstaged_rows(DeviceContext &ctx, const Transfer &t, int64_t count) {
  std::vector<unsigned char> buffer(2 * sizeof(int64_t) * t.k * t.piece);
  for (int64_t first = 0; first < count; first += t.piece) {
    const int64_t len = std::min(t.piece, count - first);
    const size_t bytes = sizeof(int64_t) * t.k * len;
    CUDA_CHECK(ctx, cudaMemcpyAsync(buffer.data(), t.rows + first * t.k, bytes,
                                    cudaMemcpyDeviceToHost, t.stream));
    CUDA_CHECK(ctx, cudaMemcpyAsync(buffer.data() + bytes, t.dist + first * t.k, bytes,
                                    cudaMemcpyDeviceToHost, t.stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(t.stream));
    scatter_piece(buffer.data(), t.places + first, len, t.k, t.neighbors, t.distances);
  }
  return KNN_OK;
}

}  // namespace

KnnStatus download_scattered_rows(DeviceContext &ctx, const int64_t *rows, const double *dist,
                                  const int32_t *places, int64_t count, int k,
                                  int64_t *neighbors, double *distances) {
  if (count <= 0) return KNN_OK;
  const size_t row_bytes = 2 * sizeof(int64_t) * static_cast<size_t>(k);
  Transfer t{rows, dist, places, k, neighbors, distances, ctx.stream, 1};
  t.piece = std::max<int64_t>(1, static_cast<int64_t>(PinnedStaging::kSliceBytes / row_bytes));
  if (ctx.staging == nullptr || row_bytes > PinnedStaging::kSliceBytes)
    return unstaged_rows(ctx, t, count);

  int workers = PinnedStaging::kMaxWorkers;
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0) workers = std::min<int>(workers, static_cast<int>(cores));
  workers = static_cast<int>(std::min<int64_t>(workers, (count + t.piece - 1) / t.piece));
  PinnedStaging &st = *ctx.staging;
  KNN_TRY(st.reserve(ctx, workers));
  // Worker w's rows: whole pieces, contiguous.
  const int64_t pieces = (count + t.piece - 1) / t.piece;
  auto begin_of = [&](int w) { return std::min(count, (pieces * w / workers) * t.piece); };

  DeviceThread helpers[PinnedStaging::kMaxWorkers];  // joined before the lambdas go
  bool on_caller[PinnedStaging::kMaxWorkers] = {};
  for (int w = 1; w < workers; w++)
    on_caller[w] = !helpers[w].start(ctx, [&, w](DeviceContext &local) {
      return worker_rows(local, st, w, t, begin_of(w), begin_of(w + 1) - begin_of(w));
    });
  KnnStatus status = worker_rows(ctx, st, 0, t, 0, begin_of(1));
  for (int w = 1; w < workers; w++)
    if (on_caller[w] && status == KNN_OK)
      status = worker_rows(ctx, st, w, t, begin_of(w), begin_of(w + 1) - begin_of(w));
  for (int w = 1; w < workers; w++) {
    const KnnStatus helper = helpers[w].finish(ctx);
    if (status == KNN_OK) status = helper;
  }
  // Every copy issued is waited for, also after a failure: the slices are
  // the next transfer's.
  const cudaError_t err = cudaStreamSynchronize(ctx.stream);
  if (status != KNN_OK) return status;
  CUDA_CHECK(ctx, err);
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
