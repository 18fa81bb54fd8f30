// ti_gathered_targets.cu -- GatheredTargets (ti_gathered_targets.cuh): the
// clusters a query part still needs, chosen across every cached target part
// and copied into one target part.
//
// Choosing: one thread per (query cluster, cluster) computes the centre
// distance d as level 1 does and keeps the cluster unless
// d - R_q - R_t > C + margin(d + R_q + R_t + C), C the query cluster's
// carried bound (the largest carried k'-th entry of its queries, widened;
// +inf while a list is not full). That is level 1's group filter with C as
// the upper bound (ti_filter_level1.cu says why it is exact: every member of
// a dropped cluster is farther than every query's k'-th entry, which only
// decreases), so no target a query could still take is left out; level 1
// and level 2 then filter the gathered part as they filter any.
//
// Copying: one block per chosen cluster reads the cluster's arrays where
// they lie (the part's pinned block, mapped) and writes them at the
// cluster's place in the gathered part; its rows (a distinct point's
// duplicate rows) go after the rows of the clusters before it, so each
// point's rows_begin is renumbered by a scan of the multiplicities.
#include <cub/cub.cuh>

#include <algorithm>

#include "ti_distance.cuh"
#include "ti_gathered_targets.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

__global__ void select_clusters_kernel(KnnMetric metric, ClusterView q, int32_t mq,
                                       const float *carried, const float *tc, const float *tr,
                                       const int32_t *tsize, int32_t mt, int stride,
                                       Margin margin, uint8_t *needed) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= (int64_t)mq * mt) return;
  const int32_t cq = (int32_t)(i / mt), g = (int32_t)(i % mt);
  if (tsize[g] == 0 || q.begin[cq + 1] == q.begin[cq] || needed[g] != 0) return;
  const float d = ti_distance_rt(
      metric, row_value_rt(metric, q.centers + (int64_t)cq * stride, tc + (int64_t)g * stride,
                           stride));
  const float rq = q.radius[cq], rt = tr[g], ub = carried[cq];
  const float lower = d - rq - rt;
  if (!(lower > ub + (margin.rel * (d + rq + rt + ub) + margin.abs))) needed[g] = 1;
}

// Where a chosen cluster comes from and goes: its part and cluster there,
// its first position and first row in the gathered part.
struct GatherItem {
  int32_t part, cluster, position, row;
};

// The gathered part's arrays (device).
struct GatheredArrays {
  float *centers, *radius, *nearest, *dist, *x;
  int32_t *begin, *member, *first_row, *mult, *rows_begin, *rows;
};

constexpr int kGatherBlock = 128;
// A point's rows are copied by its own thread up to this many; more (a
// large duplicate group) by the whole block, as each read crosses the bus,
// and from kCopiedRows on by a copy of their own (host: DMA at the bus's
// speed, where the block would wait for each read).
constexpr int kOwnRows = 8;
constexpr int kCopiedRows = 4096;

__global__ void gather_clusters_kernel(const TargetParts::CachedArrays *parts,
                                       const GatherItem *items, int32_t m, int stride,
                                       GatheredArrays out) {
  typedef cub::BlockScan<int, kGatherBlock> Scan;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int32_t large_from[kGatherBlock], large_at[kGatherBlock], large_count[kGatherBlock];
  __shared__ int n_large;
  const int32_t j = blockIdx.x;
  const GatherItem item = items[j];
  const TargetParts::CachedArrays &p = parts[item.part];
  const int32_t c = item.cluster;
  const int32_t b = p.begin[c], n = p.begin[c + 1] - b;
  for (int i = threadIdx.x; i < stride; i += blockDim.x)
    out.centers[(int64_t)j * stride + i] = p.centers[(int64_t)c * stride + i];
  if (threadIdx.x == 0) {
    out.radius[j] = p.radius[c];
    out.nearest[j] = p.nearest[c];
    out.begin[j] = item.position;
    if (j == m - 1) out.begin[m] = item.position + n;
  }
  const int64_t values = (int64_t)n * stride;
  for (int64_t i = threadIdx.x; i < values; i += blockDim.x)
    out.x[(int64_t)item.position * stride + i] = p.x[(int64_t)b * stride + i];
  int done_rows = 0;
  for (int32_t base = 0; base < n; base += kGatherBlock) {
    const int32_t k = base + threadIdx.x;
    const int32_t from = b + k, to = item.position + k;
    int mult = 0;
    if (k < n) {
      mult = p.mult[from];
      out.dist[to] = p.dist[from];
      out.first_row[to] = p.first_row[from];
      out.mult[to] = mult;
      out.member[to] = to;
    }
    if (threadIdx.x == 0) n_large = 0;
    __syncthreads();
    int offset, total;
    Scan(scan).ExclusiveSum(mult, offset, total);
    if (k < n) {
      const int32_t at = item.row + done_rows + offset;
      const int32_t src = p.rows_begin[from];
      out.rows_begin[to] = at;
      if (mult <= kOwnRows) {
        for (int r = 0; r < mult; r++) out.rows[at + r] = p.rows[src + r];
      } else if (mult < kCopiedRows) {
        const int slot = atomicAdd(&n_large, 1);
        large_from[slot] = src;
        large_at[slot] = at;
        large_count[slot] = mult;
      }
    }
    __syncthreads();
    for (int e = 0; e < n_large; e++)
      for (int r = threadIdx.x; r < large_count[e]; r += blockDim.x)
        out.rows[large_at[e] + r] = p.rows[large_from[e] + r];
    done_rows += total;
    __syncthreads();  // the scan's storage and the list are reused
  }
}

// Device bytes of a part's arrays (gather's allocations): per cluster its
// centre, offset, radius and nearest member distance; per distinct point
// its row and five 4-byte fields; 4 per row.
size_t part_bytes(int stride, int64_t clusters, int64_t points, int64_t rows) {
  return (size_t)clusters * (stride * sizeof(float) + 3 * sizeof(float)) +
         (size_t)points * (stride * sizeof(float) + 5 * sizeof(int32_t)) +
         (size_t)rows * sizeof(int32_t);
}

}  // namespace

size_t GatheredTargets::bytes(int32_t g) const {
  return part_bytes(stride_, 1, size_[g], rows_[g]);
}

KnnStatus GatheredTargets::build(const TargetParts &parts, int n_parts, int stride, size_t room,
                                 MemoryBudget &mem, DeviceContext &ctx, bool *usable) {
  *usable = false;
  stride_ = stride;
  // The parts' blocks are read on the host below.
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  parts_.assign(n_parts, TargetParts::CachedArrays());
  first_.assign(1, 0);
  for (int i = 0; i < n_parts; i++) {
    if (!parts.cached_arrays(i, &parts_[i])) return KNN_OK;
    first_.push_back(first_.back() + parts_[i].m);
  }
  const int32_t mt = first_.back();
  const size_t bytes = (size_t)mt * (stride * sizeof(float) + sizeof(float) + sizeof(int32_t) +
                                     sizeof(uint8_t)) +
                       (size_t)n_parts * sizeof(TargetParts::CachedArrays);
  if (mt == 0 || bytes > room) return KNN_OK;
  part_of_.resize(mt);
  size_.resize(mt);
  rows_.resize(mt);
  max_clusters_ = 0;
  max_bytes_ = 0;
  for (int i = 0; i < n_parts; i++) {
    const TargetParts::CachedArrays &p = parts_[i];
    max_clusters_ = std::max(max_clusters_, p.m);
    max_bytes_ = std::max(max_bytes_, part_bytes(stride, p.m, p.n_distinct, p.n_rows));
    for (int32_t c = 0; c < p.m; c++) {
      const int32_t g = first_[i] + c;
      const int32_t b = p.host_begin[c], e = p.host_begin[c + 1];
      part_of_[g] = i;
      size_[g] = e - b;
      int64_t rows = e - b;
      if (p.n_rows != p.n_distinct) {
        rows = 0;
        for (int32_t pos = b; pos < e; pos++) rows += p.host_mult[pos];
      }
      rows_[g] = rows;
    }
  }
  KNN_TRY(mem.allocate(ctx, centers_, (size_t)mt * stride, "gathered clusters"));
  KNN_TRY(mem.allocate(ctx, radius_, (size_t)mt, "gathered clusters"));
  KNN_TRY(mem.allocate(ctx, device_size_, (size_t)mt, "gathered clusters"));
  KNN_TRY(mem.allocate(ctx, needed_, (size_t)mt, "gathered clusters"));
  KNN_TRY(mem.allocate(ctx, table_, (size_t)n_parts, "gathered clusters"));
  for (int i = 0; i < n_parts; i++) {
    const TargetParts::CachedArrays &p = parts_[i];
    if (p.m == 0) continue;
    CUDA_CHECK(ctx, cudaMemcpyAsync(centers_.get() + (size_t)first_[i] * stride, p.host_centers,
                                    (size_t)p.m * stride * sizeof(float),
                                    cudaMemcpyHostToDevice, ctx.stream));
    CUDA_CHECK(ctx, cudaMemcpyAsync(radius_.get() + first_[i], p.host_radius,
                                    p.m * sizeof(float), cudaMemcpyHostToDevice, ctx.stream));
  }
  // (Pageable sources: taken by the time the calls return.)
  CUDA_CHECK(ctx, cudaMemcpyAsync(device_size_.get(), size_.data(), mt * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, ctx.stream));
  CUDA_CHECK(ctx, cudaMemcpyAsync(table_.get(), parts_.data(),
                                  n_parts * sizeof(TargetParts::CachedArrays),
                                  cudaMemcpyHostToDevice, ctx.stream));
  *usable = true;
  return KNN_OK;
}

KnnStatus GatheredTargets::select(const ClusterSet &queries, const float *carried,
                                  KnnMetric metric, Margin margin, std::vector<uint8_t> *needed,
                                  DeviceContext &ctx) {
  const int32_t mt = clusters();
  needed->assign(mt, 0);
  if (mt == 0 || queries.m == 0) return KNN_OK;
  CUDA_CHECK(ctx, cudaMemsetAsync(needed_.get(), 0, mt, ctx.stream));
  select_clusters_kernel<<<grid_for((int64_t)queries.m * mt, 256), 256, 0, ctx.stream>>>(
      metric, queries.view(), queries.m, carried, centers_.get(), radius_.get(),
      device_size_.get(), mt, stride_, margin, needed_.get());
  CUDA_CHECK_LAUNCH(ctx, "select_clusters_kernel");
  CUDA_CHECK(ctx, cudaMemcpyAsync(needed->data(), needed_.get(), mt, cudaMemcpyDeviceToHost,
                                  ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  return KNN_OK;
}

KnnStatus GatheredTargets::gather(const std::vector<int32_t> &chosen, TargetPart &out,
                                  MemoryBudget &mem, DeviceContext &ctx) {
  const int32_t m = (int32_t)chosen.size();
  std::vector<GatherItem> items(m);
  int64_t n = 0, n_rows = 0;
  float max_abs = 0;
  for (int32_t j = 0; j < m; j++) {
    const int32_t g = chosen[j];
    const int part = part_of_[g];
    items[j] = GatherItem{part, g - first_[part], (int32_t)n, (int32_t)n_rows};
    n += size_[g];
    n_rows += rows_[g];
    max_abs = std::max(max_abs, parts_[part].max_abs);
  }
  ClusterSet &c = out.clusters;
  c.m = m;
  c.n = n;
  c.stride = stride_;
  out.set.n_rows = n_rows;
  out.set.n_distinct = n;
  out.set.stride = stride_;
  out.first = 0;
  out.max_abs = max_abs;
  KNN_TRY(mem.allocate(ctx, c.centers, (size_t)m * stride_, "cluster centres"));
  KNN_TRY(mem.allocate(ctx, c.begin, (size_t)m + 1, "cluster offsets"));
  KNN_TRY(mem.allocate(ctx, c.radius, (size_t)m, "cluster extents"));
  KNN_TRY(mem.allocate(ctx, c.nearest, (size_t)m, "cluster extents"));
  KNN_TRY(mem.allocate(ctx, c.member, (size_t)n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, c.dist, (size_t)n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, c.x, (size_t)n * stride_, "clustered points"));
  KNN_TRY(mem.allocate(ctx, c.first_row, (size_t)n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, c.mult, (size_t)n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, c.rows_begin, (size_t)n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, out.set.rows, (size_t)n_rows, "duplicate groups"));
  DeviceBuffer<GatherItem> device_items;
  KNN_TRY(mem.allocate(ctx, device_items, (size_t)m, "gathered clusters"));
  // (Pageable source: taken by the time the call returns.)
  CUDA_CHECK(ctx, cudaMemcpyAsync(device_items.get(), items.data(), m * sizeof(GatherItem),
                                  cudaMemcpyHostToDevice, ctx.stream));
  const GatheredArrays arrays{c.centers.get(),  c.radius.get(),    c.nearest.get(),
                              c.dist.get(),     c.x.get(),         c.begin.get(),
                              c.member.get(),   c.first_row.get(), c.mult.get(),
                              c.rows_begin.get(), out.set.rows.get()};
  gather_clusters_kernel<<<m, kGatherBlock, 0, ctx.stream>>>(table_.get(), device_items.get(), m,
                                                             stride_, arrays);
  CUDA_CHECK_LAUNCH(ctx, "gather_clusters_kernel");
  // The duplicate groups the kernel leaves (kCopiedRows rows or more), from
  // the parts' pinned blocks: their places are the scan the kernel makes.
  for (int32_t j = 0; j < m; j++) {
    const int32_t g = chosen[j];
    if (rows_[g] == size_[g]) continue;  // one row per point
    const TargetParts::CachedArrays &p = parts_[items[j].part];
    int64_t at = items[j].row;
    for (int32_t pos = p.host_begin[items[j].cluster]; pos < p.host_begin[items[j].cluster + 1];
         pos++) {
      const int32_t mult = p.host_mult[pos];
      if (mult >= kCopiedRows) {
        CUDA_CHECK(ctx, cudaMemcpyAsync(out.set.rows.get() + at, p.host_rows + p.host_rows_begin[pos],
                                        (size_t)mult * sizeof(int32_t), cudaMemcpyHostToDevice,
                                        ctx.stream));
        rows_copied_ += mult;
      } else if (mult > kOwnRows) {
        rows_by_block_ += mult;
      }
      at += mult;
    }
  }
  mem.release(device_items);  // (freed in stream order, after the kernel)
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
