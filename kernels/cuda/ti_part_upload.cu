// ti_part_upload.cu -- one part of an ordered side on the device
// (gather_ordered_part and send_ordered_part of ti_parts.cuh).
//
// The order (ti_spatial_order.cu) has already found the duplicate groups
// on the host: each distinct point is a run of positions whose rows are
// bitwise equal and ascending. So a part sends one padded row per distinct
// point (padded, and its largest |value| found, on the host while it is
// gathered), the run offsets and the original rows:
// the DistinctSet that ti_dedup.cu would have built from all the rows,
// with original row numbers, without the rows' copies on the device.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../cpu/parallel_for.h"
#include "ti_parts.cuh"

namespace knn {
namespace cuda {
namespace ti {

void gather_ordered_part(const SpatialOrder &order, const float *rows, int64_t first,
                         int64_t count, int stride, PartStaging &staging,
                         const int32_t *cancel) {
  staging.first = -1;  // gathered only once every slice is
  const int dim = order.dim;
  const int64_t at = order.distinct_begin[first];
  const int64_t n_rows = order.distinct_begin[first + count] - at;
  float *x = staging.pinned_x;
  int32_t *begin = staging.pinned_begin, *part_rows = staging.pinned_rows;
  if (x == nullptr || begin == nullptr || part_rows == nullptr) {
    staging.pinned_x = nullptr;
    staging.pinned_begin = staging.pinned_rows = nullptr;
    staging.x.resize((size_t)count * stride);
    staging.begin.resize((size_t)count + 1);
    staging.rows.resize((size_t)n_rows);
    x = staging.x.data();
    begin = staging.begin.data();
    part_rows = staging.rows.data();
  }
  // Slices of at most about 4 MB of rows, and at least four per thread:
  // the rows are gathered from all over the side (a cache miss a row), so
  // a part of narrow rows needs every core, not the two or three slices
  // that 4 MB make of it. A small part is copied without threads.
  const int64_t slice = std::max<int64_t>(
      1024, std::min<int64_t>((4 << 20) / ((int64_t)stride * sizeof(float)),
                              count / (4 * (int64_t)std::max(1, order.n_threads)) + 1));
  const int64_t slices = (count + slice - 1) / slice;
  // The largest |value| as bits (non-negative floats order as their bits,
  // NaN above +inf), per slice.
  std::vector<uint32_t> largest((size_t)slices, 0);
  cpu::parallel_for(slices, order.n_threads, cancel, [&](int64_t s, int) {
    const int64_t end = std::min(count, (s + 1) * slice);
    uint32_t top = 0;
    for (int64_t d = s * slice; d < end; d++) {
      const int64_t p = order.distinct_begin[first + d];
      float *to = x + d * stride;
      std::memcpy(to, rows + (int64_t)order.perm[p] * dim, dim * sizeof(float));
      for (int c = 0; c < dim; c++) {
        uint32_t bits;
        std::memcpy(&bits, to + c, sizeof bits);
        top = std::max(top, bits & 0x7fffffffu);
      }
      std::fill(to + dim, to + stride, 0.0f);
      begin[d] = (int32_t)(p - at);
      const int64_t q_end = order.distinct_begin[first + d + 1];
      for (int64_t q = p; q < q_end; q++) part_rows[q - at] = order.perm[q];
    }
    largest[s] = top;
  });
  // A cancel stops the slices not yet started: the staging stays marked
  // ungathered (first = -1), and the join ends at its next cancel point.
  if (cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED)) return;
  uint32_t top = 0;
  for (uint32_t b : largest) top = std::max(top, b);
  std::memcpy(&staging.max_abs, &top, sizeof top);
  begin[count] = (int32_t)n_rows;
  staging.first = first;
  staging.count = count;
  staging.n_rows = n_rows;
}

KnnStatus send_ordered_part(const PartStaging &staging, int stride, DistinctSet &out,
                            float *max_abs, MemoryBudget &mem, DeviceContext &ctx) {
  const int64_t count = staging.count, n_rows = staging.n_rows;
  *max_abs = staging.max_abs;
  out.n_rows = n_rows;
  out.n_distinct = count;
  out.stride = stride;
  KNN_TRY(mem.allocate(ctx, out.x, (size_t)count * stride, "distinct points"));
  KNN_TRY(mem.allocate(ctx, out.group_begin, (size_t)count + 1, "duplicate groups"));
  KNN_TRY(mem.allocate(ctx, out.rows, (size_t)n_rows, "duplicate groups"));
  // Pageable sources: each copy has taken its bytes when the call returns.
  // (Through the pinned staging of host_transfer.cuh, which wants the
  // stream waited for first, the 5M x 8 set's query parts went up in 0.12 s
  // instead of 0.04 s on an H100.) Pinned ones (staging.pinned_*): the
  // copies are only queued; the caller keeps them untouched meanwhile.
  CUDA_CHECK(ctx, cudaMemcpyAsync(out.x.get(), staging.x_data(),
                                  (size_t)count * stride * sizeof(float), cudaMemcpyHostToDevice,
                                  ctx.stream));
  CUDA_CHECK(ctx, cudaMemcpyAsync(out.group_begin.get(), staging.begin_data(),
                                  ((size_t)count + 1) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  ctx.stream));
  if (n_rows > 0)
    CUDA_CHECK(ctx, cudaMemcpyAsync(out.rows.get(), staging.rows_data(),
                                    (size_t)n_rows * sizeof(int32_t), cudaMemcpyHostToDevice,
                                    ctx.stream));
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
