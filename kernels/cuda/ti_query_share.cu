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
//
// A range of rows of shuffled data touches every cluster, though: each GPU
// would filter about half of every cluster (half-empty warp groups). So the
// engines first try to divide the work by whole clusters instead
// (share_vote.cuh): each takes a contiguous run of clusters holding its
// fraction of the points, filters those alone and writes their rows,
// scattered, into the caller's arrays (scatter_download.cuh). No two
// engines write one row: the clusters (and so the runs) are the same on
// every engine, which the vote checks with a fingerprint of them.
#include <cub/cub.cuh>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "scatter_download.cuh"
#include "share_vote.cuh"
#include "ti_cluster_share.cuh"
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

// What a restricted query set keeps of every cluster (centres, extents)
// and its size; begin is allocated for the caller to fill.
KnnStatus copy_cluster_frame(const ClusterSet &all, int64_t kept, ClusterSet &out,
                             MemoryBudget &mem, DeviceContext &ctx) {
  const int m = all.m, stride = all.stride;
  out.m = m;
  out.n = kept;
  out.stride = stride;
  KNN_TRY(copy_array(ctx, mem, out.centers, all.centers, (size_t)m * stride, "query share"));
  KNN_TRY(copy_array(ctx, mem, out.radius, all.radius, m, "query share"));
  KNN_TRY(copy_array(ctx, mem, out.nearest, all.nearest, m, "query share"));
  return mem.allocate(ctx, out.begin, m + 1, "query share");
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

  KNN_TRY(copy_cluster_frame(all, kept, out, mem, ctx));
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

namespace {

// A 64-bit mix (splitmix64's finaliser).
__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// sum over positions of mix(position, point) (mod 2^64: the same whatever
// the order of the atomic adds).
__global__ void member_hash_kernel(int64_t n, const int32_t *member, unsigned long long *out) {
  unsigned long long local = 0;
  for (int64_t pos = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; pos < n;
       pos += (int64_t)gridDim.x * blockDim.x)
    local += mix64(((uint64_t)pos << 32) ^ (uint32_t)member[pos]);
  for (int off = kWarp / 2; off > 0; off /= 2) local += __shfl_down_sync(kFullMask, local, off);
  if (threadIdx.x % kWarp == 0) atomicAdd(out, local);
}

// begin'[c] = begin[c] clamped to [lo, hi], less lo.
__global__ void slice_begin_kernel(int m, const int32_t *begin, int32_t lo, int32_t hi,
                                   int32_t *out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c <= m) out[c] = min(max(begin[c], lo), hi) - lo;
}

// The rows of each position at its offset: list[offset[p] + j] = the j-th
// row of the point at p.
__global__ void list_rows_kernel(int64_t n, const int32_t *offset, const int32_t *mult,
                                 const int32_t *rows_begin, const int32_t *rows, int32_t *list) {
  const int64_t pos = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (pos >= n) return;
  const int32_t at = offset[pos], from = rows_begin[pos];
  for (int32_t j = 0; j < mult[pos]; j++) list[at + j] = rows[from + j];
}

template <class T>
KnnStatus copy_range(DeviceContext &ctx, MemoryBudget &mem, DeviceBuffer<T> &to,
                     const DeviceBuffer<T> &from, size_t first, size_t count, const char *what) {
  KNN_TRY(mem.allocate(ctx, to, std::max<size_t>(count, 1), what));
  CUDA_CHECK(ctx, cudaMemcpyAsync(to.get(), from.get() + first, count * sizeof(T),
                                  cudaMemcpyDeviceToDevice, ctx.stream));
  return KNN_OK;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

namespace {

int share_batches();  // below

// An upper bound of the device memory the share still needs once the
// engines agreed (after that an engine cannot hand its share to another
// method): its clusters' arrays, the lists of every distinct query, level
// 2's lists (inside-query lists of up to 8 warps a query, and one more
// copy for the batches' cuts), and, with global lists (k' > 32), each
// batch's warp-group slots, up to 32 a cluster of the set with their
// inside-query lists, all batches at once (they run side by side); and
// the output's row lists and smallest chunk. Too much to fit: the engines
// answer their row ranges instead.
size_t cluster_share_bytes(const ClusterSet &all, int64_t n_rows, int k, int kprime) {
  const double n = (double)all.n, m = (double)all.m, row = 4.0 * all.stride;
  const double arrays = n * (row + 5 * 4) + m * (row + 4 * 4);
  const double lists = n * kprime * 8.0 * (1 + 8 + 1);
  const double slots =
      kprime > 32 ? share_batches() * kWarp * (m + 1) * kprime * 8.0 * (1 + 8) : 0.0;
  const double output = n_rows * 16.0 + std::min<double>(n_rows, 1024) * k * 16.0 + (1 << 20);
  return (size_t)std::min<double>(arrays + lists + slots + output, 1e18);
}

}  // namespace

KnnStatus plan_cluster_share(const ClusterSet &all, int64_t n_rows, int64_t first_row,
                              int64_t count, ClusterShare *out, DeviceContext &ctx) {
  *out = ClusterShare{};
  const int m = all.m;
  const int64_t n = all.n;
  std::vector<int32_t> begin(m + 1);
  CUDA_CHECK(ctx, cudaMemcpyAsync(begin.data(), all.begin.get(), (m + 1) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  // The cut at row r: the first cluster starting at or past the same
  // fraction of the positions. Neighbouring engines compute their common
  // cut alike, so the runs partition every non-empty cluster.
  auto cut = [&](int64_t r) {
    const int64_t pos = n_rows > 0 ? r * n / n_rows : 0;
    return (int32_t)(std::lower_bound(begin.begin(), begin.end(), pos) - begin.begin());
  };
  out->first_cluster = std::min(cut(first_row), m);
  out->end_cluster = std::min(cut(first_row + count), m);
  if (first_row + count >= n_rows) out->end_cluster = m;
  if (first_row == 0) out->first_cluster = 0;
  out->begin = std::move(begin);
  return KNN_OK;
}

bool cluster_share_declines(const ClusterSet &all, int64_t n_rows, int k, int kprime,
                            size_t room) {
  return cluster_share_bytes(all, n_rows, k, kprime) > room || env_flag("KNN_TI_SPLIT_ROWS");
}

KnnStatus agree_on_cluster_share(const ClusterSet &all, int64_t n_rows, int k, int kprime,
                                 size_t room, ClusterShare *share, MemoryBudget &mem,
                                 DeviceContext &ctx) {
  share->agreed = false;
  if (ctx.share_vote == nullptr) return KNN_OK;
  // (KNN_TI_SPLIT_ROWS=1 in the environment: decline, each engine answers
  // its rows, for comparing the two ways.)
  if (cluster_share_declines(all, n_rows, k, kprime, room)) {
    ctx.share_vote->decline(ctx.share_voter);
    return KNN_OK;
  }
  const int m = all.m;
  const int64_t n = all.n;
  DeviceBuffer<unsigned long long> hash;
  KNN_TRY(mem.allocate(ctx, hash, 1, "cluster fingerprint"));
  CUDA_CHECK(ctx, cudaMemsetAsync(hash.get(), 0, sizeof(unsigned long long), ctx.stream));
  member_hash_kernel<<<std::min<unsigned>(grid_for(n, 256), 1024), 256, 0, ctx.stream>>>(
      n, all.member.get(), hash.get());
  CUDA_CHECK_LAUNCH(ctx, "member_hash_kernel");
  unsigned long long fingerprint = 0;
  CUDA_CHECK(ctx, cudaMemcpyAsync(&fingerprint, hash.get(), sizeof fingerprint,
                                  cudaMemcpyDeviceToHost, ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  mem.release(hash);
  uint64_t fp = mix64(fingerprint ^ mix64((uint64_t)m << 32 ^ (uint64_t)n));
  for (int c = 0; c <= m; c++) fp = mix64(fp ^ (uint32_t)share->begin[c]);
  KNN_TRY(ctx.share_vote->agree(ctx, ctx.share_voter, fp, &share->agreed));
  return KNN_OK;
}

bool env_flag(const char *name) {
  const char *v = std::getenv(name);
  return v != nullptr && v[0] == '1';
}

bool batched_writes_pay(int64_t n_rows, int k) {
  const char *v = std::getenv("KNN_TI_BATCHED_WRITES");
  if (v != nullptr && (v[0] == '0' || v[0] == '1')) return v[0] == '1';
  return (double)n_rows * k >= kBatchedWritesMinSlots;
}

KnnStatus whole_cluster_share(const ClusterSet &all, int64_t n_rows, int k, int kprime,
                              size_t room, ClusterShare *out, DeviceContext &ctx) {
  *out = ClusterShare{};
  if (!batched_writes_pay(n_rows, k) || cluster_share_bytes(all, n_rows, k, kprime) > room)
    return KNN_OK;
  out->begin.resize(all.m + 1);
  CUDA_CHECK(ctx, cudaMemcpyAsync(out->begin.data(), all.begin.get(),
                                  (all.m + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                  ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  out->agreed = true;
  out->first_cluster = 0;
  out->end_cluster = all.m;
  return KNN_OK;
}

KnnStatus slice_query_clusters(const ClusterSet &all, const std::vector<int32_t> &begin,
                               int32_t first_cluster, int32_t end_cluster, ClusterSet &out,
                               MemoryBudget &mem, DeviceContext &ctx) {
  const int m = all.m, stride = all.stride;
  const int32_t lo = begin[first_cluster], hi = begin[end_cluster];
  const size_t kept = hi - lo;
  KNN_TRY(copy_cluster_frame(all, kept, out, mem, ctx));
  slice_begin_kernel<<<grid_for(m + 1, 128), 128, 0, ctx.stream>>>(m, all.begin.get(), lo, hi,
                                                                   out.begin.get());
  CUDA_CHECK_LAUNCH(ctx, "slice_begin_kernel");
  KNN_TRY(copy_range(ctx, mem, out.member, all.member, lo, kept, "query share"));
  KNN_TRY(copy_range(ctx, mem, out.dist, all.dist, lo, kept, "query share"));
  KNN_TRY(copy_range(ctx, mem, out.first_row, all.first_row, lo, kept, "query share"));
  KNN_TRY(copy_range(ctx, mem, out.mult, all.mult, lo, kept, "query share"));
  KNN_TRY(copy_range(ctx, mem, out.rows_begin, all.rows_begin, lo, kept, "query share"));
  KNN_TRY(copy_range(ctx, mem, out.x, all.x, (size_t)lo * stride, kept * stride, "query share"));
  return KNN_OK;
}

namespace {

// Expands the lists of the share's points (level 2's results) to their
// rows and writes them, scattered, into their places of the caller's
// arrays, in chunks that fit what `budget` has left. The places (the
// share's rows, sorted) depend on the clusters alone: they are found
// first, while level 2 may still run; the expansion waits for `filtered`.
KnnStatus write_cluster_share_rows(const DistinctSet &set, const ClusterSet &share,
                                   KnnMetric metric, int k, int kprime,
                                   const float *result_value, const int32_t *result_row,
                                   const int64_t *query_keys, const int64_t *target_keys,
                                   size_t budget, cudaEvent_t filtered, int64_t *neighbors,
                                   double *distances, double *select_seconds,
                                   double *download_seconds, MemoryBudget &mem,
                                   DeviceContext &ctx) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = share.n;
  // The share's rows, ascending (the host writes then sweep its arrays once).
  DeviceBuffer<int32_t> offset, list, sorted;
  DeviceBuffer<unsigned char> temp;
  KNN_TRY(mem.allocate(ctx, offset, n + 1, "share rows"));
  CUDA_CHECK(ctx, cudaMemsetAsync(offset.get(), 0, sizeof(int32_t), ctx.stream));
  if (n > 0)
    KNN_TRY(run_cub(ctx, mem, temp, "share rows", [&](void *t, size_t &bytes) {
      return cub::DeviceScan::InclusiveSum(t, bytes, share.mult.get(), offset.get() + 1, n,
                                           ctx.stream);
    }));
  int32_t total = 0;
  CUDA_CHECK(ctx, cudaMemcpyAsync(&total, offset.get() + n, sizeof total, cudaMemcpyDeviceToHost,
                                  ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  mem.release(temp);
  if (total == 0) {
    CUDA_CHECK(ctx, cudaStreamWaitEvent(ctx.stream, filtered, 0));
    return KNN_OK;
  }
  KNN_TRY(mem.allocate(ctx, list, total, "share rows"));
  KNN_TRY(mem.allocate(ctx, sorted, total, "share rows"));
  list_rows_kernel<<<grid_for(n, 256), 256, 0, ctx.stream>>>(
      n, offset.get(), share.mult.get(), share.rows_begin.get(), set.rows.get(), list.get());
  CUDA_CHECK_LAUNCH(ctx, "list_rows_kernel");
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < set.n_rows) bits++;
  KNN_TRY(run_cub(ctx, mem, temp, "share rows", [&](void *t, size_t &bytes) {
    return cub::DeviceRadixSort::SortKeys(t, bytes, list.get(), sorted.get(), total, 0, bits,
                                          ctx.stream);
  }));
  std::vector<int32_t> places(total);
  CUDA_CHECK(ctx, cudaMemcpyAsync(places.data(), sorted.get(), total * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  mem.release(temp);
  mem.release(list);
  mem.release(offset);
  CUDA_CHECK(ctx, cudaStreamWaitEvent(ctx.stream, filtered, 0));

  // Expanded and copied in chunks that fit what is left of the budget.
  const int64_t chunk = output_chunk_rows(budget, mem.used(), total, k);
  DeviceBuffer<int64_t> rows;
  DeviceBuffer<double> dist;
  KNN_TRY(mem.allocate(ctx, rows, (size_t)chunk * k, "results"));
  KNN_TRY(mem.allocate(ctx, dist, (size_t)chunk * k, "results"));
  *select_seconds += seconds_since(t0);
  for (int64_t done = 0; done < total; done += chunk) {
    KNN_TRY(ctx.cancel_point());
    const int64_t count = std::min(chunk, total - done);
    const auto t1 = std::chrono::steady_clock::now();
    KNN_TRY(expand_listed_results(set, metric, sorted.get() + done, count, k, kprime,
                                  result_value, result_row, query_keys, target_keys, rows.get(),
                                  dist.get(), ctx));
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    const auto t2 = std::chrono::steady_clock::now();
    KNN_TRY(download_scattered_rows(ctx, rows.get(), dist.get(), places.data() + done, count, k,
                                    neighbors, distances));
    *select_seconds += std::chrono::duration<double>(t2 - t1).count();
    *download_seconds += seconds_since(t2);
  }
  return KNN_OK;
}

// Batches of the share's clusters, of decreasing size (weights B + B/2,
// ..., 1 + B/2 of the share's positions: 9, 8, ..., 4 for B = 6): the rows
// of each batch are written while the GPU filters the later ones, so only
// the last, smallest batch's rows are written after level 2 has ended. The
// writes take nearly as long as level 2 (H200, 5000000 x 8 on one GPU:
// 0.25 s against 0.31 s), so they must not start late either: a model of
// the two (batch b's writes start when its level 2 and the writes before
// have ended) puts these weights 0.005-0.008 s ahead of B, ..., 1 on one
// share of two GPUs (not measured). The batches must end in order
// for that, which only distinct stream priorities ensure (below): B is at
// most the device's number of priorities (6 on H100 and H200). Measured
// on an H200 (KNN_TI_BATCHED_WRITES=1, 5000000 x 8 clustered): 6 batches
// side by side, level 2 0.31 s and level 2 + writes 0.355 s; 12 batches,
// 8 of them at one priority, ended together: level 2 + writes 0.47-0.52 s.
// KNN_TI_SHARE_BATCHES (1 to kMaxShareBatches) sets B, for measuring.
constexpr int kShareBatches = 6, kMaxShareBatches = 16;

int share_batches() {
  const char *v = std::getenv("KNN_TI_SHARE_BATCHES");
  const int b = v != nullptr ? std::atoi(v) : 0;
  return b >= 1 && b <= kMaxShareBatches ? b : kShareBatches;
}

// A stream at a priority (cudaDeviceGetStreamPriorityRange: lower numbers
// are scheduled first).
class PriorityStream : public OwnedHandle<cudaStream_t, cudaStreamDestroy> {
 public:
  KnnStatus create(DeviceContext &ctx, int priority) {
    CUDA_CHECK(ctx, cudaStreamCreateWithPriority(&h_, cudaStreamNonBlocking, priority));
    return KNN_OK;
  }
};

}  // namespace

KnnStatus filter_and_write_cluster_share(const ClusterShareJoin &join, const ClusterShare &share,
                                         int64_t *neighbors, double *distances,
                                         Level2Config *used, double *select_seconds,
                                         double *download_seconds, MemoryBudget &mem,
                                         DeviceContext &ctx) {
  // The batches' cuts (clusters), at the weights' shares of the positions.
  const std::vector<int32_t> &begin = share.begin;
  const int64_t lo = begin[share.first_cluster], hi = begin[share.end_cluster];
  // Priorities: greatest (numerically least) first. The urgent stream of
  // the writes shares the first batch's: it has work only once that batch
  // has ended.
  int least = 0, greatest = 0;
  CUDA_CHECK(ctx, cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int levels = least - greatest + 1;
  const int most = levels > 1 ? std::min(share_batches(), levels) : share_batches();
  const int64_t total_weight = most * (most + 1) / 2 + most * (most / 2);
  std::vector<int32_t> cuts{share.first_cluster};
  int64_t weight = 0;
  for (int b = 0; b + 1 < most; b++) {
    weight += most - b + most / 2;
    const int64_t pos = lo + (hi - lo) * weight / total_weight;
    const int32_t c = (int32_t)(std::lower_bound(begin.begin() + share.first_cluster,
                                                 begin.begin() + share.end_cluster, pos) -
                                begin.begin());
    if (c > cuts.back()) cuts.push_back(c);
  }
  if (share.end_cluster > cuts.back()) cuts.push_back(share.end_cluster);
  const int batches = (int)cuts.size() - 1;

  // Each batch's level 2 runs on a stream of its own, all queued at once:
  // on one stream each launch's tail (its slowest blocks, on few
  // multiprocessors) idled the rest of the GPU until the next launch
  // began (H200, level 2 of all clusters: 0.305 s in one launch, 0.38 s
  // in 6 batches on one stream, 0.31 s side by side). Queued side by side,
  // the next batch's blocks fill the tail; each batch has a lower priority
  // than the one before, so the GPU still finishes them in order. A
  // batch's rows are expanded and written on the urgent stream (the
  // highest priority), between the blocks of the later batches, as soon
  // as its level 2 ends.
  PriorityStream side, lanes[kMaxShareBatches];
  Event ready, sliced[kMaxShareBatches], filtered[kMaxShareBatches];
  KNN_TRY(side.create(ctx, greatest));
  KNN_TRY(ready.create(ctx));
  // KNN_TI_BATCH_STREAMS=1: the batches one after another on one stream
  // (the older way, for measuring).
  const bool one_lane = env_flag("KNN_TI_BATCH_STREAMS");
  for (int b = 0; b < batches; b++) {
    if (b == 0 || !one_lane) KNN_TRY(lanes[b].create(ctx, std::min(least, greatest + b)));
    KNN_TRY(sliced[b].create(ctx));
    KNN_TRY(filtered[b].create(ctx));
  }
  // (Declared after the streams: freed on theirs, before they go.)
  ClusterSet slices[kMaxShareBatches];
  DeviceContext writer = ctx;
  writer.stream = side.get();
  // On every path: nothing of the batches is in flight when the slices go.
  struct Drain {
    cudaStream_t main, side;
    const PriorityStream *lanes;
    int n;
    ~Drain() {
      for (int b = 0; b < n; b++)
        if (lanes[b].get() != nullptr) (void)cudaStreamSynchronize(lanes[b].get());
      (void)cudaStreamSynchronize(side);
      (void)cudaStreamSynchronize(main);
    }
  } drain{ctx.stream, side.get(), lanes, batches};

  // KNN_TI_PHASES=1: level 2's own time on the GPU (the writes overlap it).
  const char *phases = std::getenv("KNN_TI_PHASES");
  struct Span {
    cudaEvent_t e[2] = {nullptr, nullptr};
    ~Span() {
      for (cudaEvent_t x : e)
        if (x != nullptr) (void)cudaEventDestroy(x);
    }
  } span;
  cudaEvent_t *level2_span = span.e;
  if (phases != nullptr && phases[0] == '1' && cudaEventCreate(&level2_span[0]) == cudaSuccess &&
      cudaEventCreate(&level2_span[1]) == cudaSuccess)
    (void)cudaEventRecord(level2_span[0], ctx.stream);
  // Everything the batches read (clusters, level 1, the result arrays, the
  // counter) was made on ctx.stream.
  CUDA_CHECK(ctx, cudaEventRecord(ready.get(), ctx.stream));
  // One configuration for the whole share, as one launch over it would
  // have (the batches run side by side, not one after another).
  const Level2Config config = join.config(hi - lo);
  for (int b = 0; b < batches; b++) {
    KNN_TRY(ctx.cancel_point());
    DeviceContext lane = ctx;
    lane.stream = lanes[one_lane ? 0 : b].get();
    CUDA_CHECK(ctx, cudaStreamWaitEvent(lane.stream, ready.get(), 0));
    KnnStatus st = slice_query_clusters(*join.queries, begin, cuts[b], cuts[b + 1], slices[b],
                                         mem, lane);
    if (st == KNN_OK) {
      const cudaError_t err = cudaEventRecord(sliced[b].get(), lane.stream);
      if (err != cudaSuccess) st = record_failure(lane, err, "cudaEventRecord", __FILE__, __LINE__);
    }
    if (st == KNN_OK)
      st = level2_filter(slices[b], *join.targets, *join.target_set, *join.level1, join.metric,
                         config, join.margin, join.result_value, join.result_row, join.counter,
                         used, mem, lane);
    if (st != KNN_OK) {
      ctx.error = lane.error;
      return st;
    }
    CUDA_CHECK(ctx, cudaEventRecord(filtered[b].get(), lane.stream));
  }
  // ctx.stream goes on (the counter, the frees) once every batch is done.
  for (int b = 0; b < batches; b++)
    CUDA_CHECK(ctx, cudaStreamWaitEvent(ctx.stream, filtered[b].get(), 0));
  if (level2_span[1] != nullptr) (void)cudaEventRecord(level2_span[1], ctx.stream);
  // Each batch's rows are written on the urgent stream once its level 2
  // has ended, while the GPU filters the later batches; their places once
  // its slice of the clusters is made.
  for (int b = 0; b < batches; b++) {
    CUDA_CHECK(ctx, cudaStreamWaitEvent(side.get(), sliced[b].get(), 0));
    const KnnStatus st = write_cluster_share_rows(
        *join.query_set, slices[b], join.metric, join.k, join.kprime, join.result_value,
        join.result_row, join.query_keys, join.target_keys, join.budget, filtered[b].get(),
        neighbors, distances, select_seconds, download_seconds, mem, writer);
    if (st != KNN_OK) {
      ctx.error = writer.error;
      return st;
    }
  }
  if (level2_span[1] != nullptr) {
    float ms = 0;
    if (cudaEventSynchronize(level2_span[1]) == cudaSuccess &&
        cudaEventElapsedTime(&ms, level2_span[0], level2_span[1]) == cudaSuccess)
      std::fprintf(stderr, "ti cluster share (GPU %d): %d batches, level 2 %.4f s on the GPU\n",
                   ctx.device, batches, ms / 1000.0);
    (void)cudaGetLastError();
  }
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
