// ti_query_share.cu -- one GPU's share of a TI self-join split across GPUs
// (multi_device.cuh): the query clusters restricted to the distinct points
// that have a row in the share's row range (see ti_common.cuh).
//
// Each GPU clusters the whole set once, as the join on one GPU does (a
// share joined as a problem of its own would cluster its queries and the
// targets apart: half again the clustering), then filters only its own
// queries. The restricted set keeps every cluster, its centre and extents:
// the level-1 bounds, computed from the whole clusters, hold for any subset
// of their members, so the level-2 filter stays exact.
#include <cub/cub.cuh>

#include <algorithm>
#include <cstdint>

#include "ti_common.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

// active[pos] = 1 when the distinct point at pos has a row in [first, end)
// (its group's rows are ascending: the first one >= first decides).
__global__ void active_positions_kernel(int64_t n, const int32_t *member,
                                        const int32_t *group_begin, const int32_t *rows,
                                        int64_t first, int64_t end, int32_t *active) {
  const int64_t pos = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (pos > n) return;
  if (pos == n) {  // the scan's last entry: the total
    active[n] = 0;
    return;
  }
  const int32_t d = member[pos];
  int64_t lo = group_begin[d], hi = group_begin[d + 1];
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (rows[mid] < first) lo = mid + 1;
    else hi = mid;
  }
  active[pos] = lo < group_begin[d + 1] && rows[lo] < end ? 1 : 0;
}

// The kept positions, in order, at their compacted places.
__global__ void gather_positions_kernel(int64_t n, int stride, const int32_t *active,
                                        const int32_t *place, ClusterView all, int32_t *member,
                                        float *dist, int32_t *first_row, int32_t *mult,
                                        int32_t *rows_begin, float *x) {
  const int64_t pos = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (pos >= n || !active[pos]) return;
  const int64_t j = place[pos];
  member[j] = all.member[pos];
  dist[j] = all.dist[pos];
  first_row[j] = all.first_row[pos];
  mult[j] = all.mult[pos];
  rows_begin[j] = all.rows_begin[pos];
  const float4 *from = reinterpret_cast<const float4 *>(all.x + pos * stride);
  float4 *to = reinterpret_cast<float4 *>(x + j * stride);
  for (int c = 0; c < stride / 4; c++) to[c] = from[c];
}

// begin'[c] = the compacted place of the cluster's first position.
__global__ void shared_begin_kernel(int m, const int32_t *begin, const int32_t *place,
                                    int32_t *out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c <= m) out[c] = place[begin[c]];
}

template <class T>
KnnStatus copy_array(DeviceContext &ctx, MemoryBudget &mem, DeviceBuffer<T> &to,
                     const DeviceBuffer<T> &from, size_t count, const char *what) {
  KNN_TRY(mem.allocate(ctx, to, std::max<size_t>(count, 1), what));
  CUDA_CHECK(ctx, cudaMemcpyAsync(to.get(), from.get(), count * sizeof(T),
                                  cudaMemcpyDeviceToDevice, ctx.stream));
  return KNN_OK;
}

}  // namespace

KnnStatus share_query_clusters(const ClusterSet &all, const DistinctSet &set, int64_t first,
                               int64_t count, ClusterSet &out, MemoryBudget &mem,
                               DeviceContext &ctx) {
  const int64_t n = all.n;
  const int m = all.m, stride = all.stride;
  DeviceBuffer<int32_t> active, place;
  KNN_TRY(mem.allocate(ctx, active, n + 1, "query share"));
  KNN_TRY(mem.allocate(ctx, place, n + 1, "query share"));
  active_positions_kernel<<<grid_for(n + 1, 256), 256, 0, ctx.stream>>>(
      n, all.member.get(), set.group_begin.get(), set.rows.get(), first, first + count,
      active.get());
  CUDA_CHECK_LAUNCH(ctx, "active_positions_kernel");
  DeviceBuffer<unsigned char> temp;
  KNN_TRY(run_cub(ctx, mem, temp, "query share", [&](void *t, size_t &bytes) {
    return cub::DeviceScan::ExclusiveSum(t, bytes, active.get(), place.get(), n + 1,
                                         ctx.stream);
  }));
  int32_t kept = 0;
  CUDA_CHECK(ctx, cudaMemcpyAsync(&kept, place.get() + n, sizeof kept, cudaMemcpyDeviceToHost,
                                  ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));

  out.m = m;
  out.n = kept;
  out.stride = stride;
  KNN_TRY(copy_array(ctx, mem, out.centers, all.centers, (size_t)m * stride, "query share"));
  KNN_TRY(copy_array(ctx, mem, out.radius, all.radius, m, "query share"));
  KNN_TRY(copy_array(ctx, mem, out.nearest, all.nearest, m, "query share"));
  KNN_TRY(mem.allocate(ctx, out.begin, m + 1, "query share"));
  shared_begin_kernel<<<grid_for(m + 1, 128), 128, 0, ctx.stream>>>(m, all.begin.get(),
                                                                    place.get(), out.begin.get());
  CUDA_CHECK_LAUNCH(ctx, "shared_begin_kernel");
  const size_t rows = std::max<int64_t>(kept, 1);
  KNN_TRY(mem.allocate(ctx, out.member, rows, "query share"));
  KNN_TRY(mem.allocate(ctx, out.dist, rows, "query share"));
  KNN_TRY(mem.allocate(ctx, out.first_row, rows, "query share"));
  KNN_TRY(mem.allocate(ctx, out.mult, rows, "query share"));
  KNN_TRY(mem.allocate(ctx, out.rows_begin, rows, "query share"));
  KNN_TRY(mem.allocate(ctx, out.x, rows * stride, "query share"));
  gather_positions_kernel<<<grid_for(n, 256), 256, 0, ctx.stream>>>(
      n, stride, active.get(), place.get(), all.view(), out.member.get(), out.dist.get(),
      out.first_row.get(), out.mult.get(), out.rows_begin.get(), out.x.get());
  CUDA_CHECK_LAUNCH(ctx, "gather_positions_kernel");
  mem.release(active);
  mem.release(place);
  mem.release(temp);
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
