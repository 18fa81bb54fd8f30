// ti_filter_level1.cu -- step 2 of the TI join (section III-B): choose the
// candidate target clusters of every query cluster.
//
//  1. Centre-to-centre distances of every (query cluster, target cluster).
//  2. Upper bound UB of each query cluster (one warp per query cluster):
//     with R_q the query cluster's radius, every member t of target cluster
//     ct gives the two-landmark bound R_q + D(cq, ct) + D(ct, t) on the
//     distance from any query of the cluster to t (and to each of t's
//     duplicate rows, so it counts mult(t) times). The k'-th smallest bound
//     over all target clusters, widened by the rounding margin, is no smaller
//     than the k'-th neighbour distance of any query in the cluster. Members
//     are visited from the centre outwards and a cluster is left as soon as
//     its bound reaches the current k'-th (footnote 1's early exit); the
//     nearest target cluster goes first so the k'-th is tight early.
//     Given a carried bound C (lists from earlier target parts), UB is
//     min(C, the widened k'-th); bounds at or past C are not inserted:
//     where the k'-th is below C they cannot be among its k' smallest,
//     elsewhere UB is C whatever they were.
//  3. Group filter, one thread per (query cluster, target cluster): the
//     target cluster is a candidate unless D(cq, ct) - R_q - R_t exceeds UB
//     by more than the rounding margin. Candidates are compacted in cluster
//     order (no atomics, so the result is deterministic) and each list is
//     sorted by centre distance (ties by cluster).
//
// A range of query clusters may be filtered instead of all of them (a
// split's share divided by clusters filters its own): each query cluster's
// bound and candidates depend on that cluster and the targets only, so
// they are the same bits as in the whole filter.
#include <cub/cub.cuh>

#include <algorithm>

#include "ti_common.cuh"
#include "ti_distance.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

__device__ __forceinline__ float widen(Margin m, float magnitude) {
  return m.rel * magnitude + m.abs;
}

__global__ void center_distance_kernel(KnnMetric metric, const float *qc, int mq,
                                       const float *tc, int mt, int stride, float *dcc) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= (int64_t)mq * mt) return;
  int64_t a = i / mt, b = i % mt;
  dcc[i] = ti_distance_rt(metric, row_value_rt(metric, qc + a * stride, tc + b * stride, stride));
}

struct UpperBoundArgs {
  int first, mq, mt, kprime;  // query clusters [first, first + mq)
  const float *dcc;
  float *scratch_value;   // mq x (kprime + 1)
  int32_t *scratch_count; // mq x (kprime + 1)
  Margin margin;
  float *upper_bound;
  const float *carried;   // mq or nullptr
};

// Inserts `count` copies of bound b into the ascending multiset list
// (value[i], count[i]), keeping only the shortest prefix that holds k'
// copies; returns the k'-th smallest bound (+inf while fewer are known).
__device__ float insert_bound(float *value, int32_t *count, int &len, int kprime, float b,
                              int32_t copies) {
  int j = len;
  while (j > 0 && value[j - 1] > b) {
    value[j] = value[j - 1];
    count[j] = count[j - 1];
    j--;
  }
  value[j] = b;
  count[j] = copies;
  len++;
  int64_t total = 0;
  for (int i = 0; i < len; i++) {
    total += count[i];
    if (total >= kprime) {
      len = i + 1;
      return value[i];
    }
  }
  return __int_as_float(0x7f800000);
}

// One warp per query cluster. The lanes find the nearest non-empty target
// cluster together and test 32 target clusters at a time against the
// current k'-th; lane 0 walks those that passed, in cluster order, testing
// each again with the k'-th it has by then: the same walk, and the same
// bound, as one thread's over all clusters, without its serial scan.
constexpr int kUpperBoundWarps = 4;

__global__ void upper_bound_kernel(UpperBoundArgs a, ClusterView q, ClusterView t) {
  const int lane = threadIdx.x % kWarp;
  const int local = blockIdx.x * kUpperBoundWarps + threadIdx.x / kWarp;
  if (local >= a.mq) return;  // the whole warp
  const int cq = a.first + local;
  const float inf = __int_as_float(0x7f800000);
  if (q.begin[cq + 1] == q.begin[cq]) {
    if (lane == 0) a.upper_bound[cq] = 0.0f;  // no queries: never read
    return;
  }
  const float rq = q.radius[cq];
  const float *dcc = a.dcc + (int64_t)local * a.mt;
  float *value = a.scratch_value + (int64_t)local * (a.kprime + 1);
  int32_t *count = a.scratch_count + (int64_t)local * (a.kprime + 1);
  int len = 0;
  float kth = inf;
  const float carried = a.carried != nullptr ? a.carried[cq] : inf;

  // The nearest non-empty target cluster (the first of equals).
  int first = -1;
  float first_d = inf;
  for (int ct = lane; ct < a.mt; ct += kWarp) {
    if (t.begin[ct + 1] > t.begin[ct] && (first < 0 || dcc[ct] < first_d)) {
      first = ct;
      first_d = dcc[ct];
    }
  }
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const int other = __shfl_xor_sync(kFullMask, first, off);
    const float other_d = __shfl_xor_sync(kFullMask, first_d, off);
    if (other >= 0 &&
        (first < 0 || other_d < first_d || (other_d == first_d && other < first))) {
      first = other;
      first_d = other_d;
    }
  }
  if (first < 0) {
    if (lane == 0) a.upper_bound[cq] = carried;
    return;
  }
  // Lane 0's walk of one target cluster's members, centre outwards.
  auto walk = [&](int ct) {
    const int b = t.begin[ct], e = t.begin[ct + 1];
    const float base = rq + dcc[ct];
    if (e == b || !(base + t.nearest[ct] < fminf(kth, carried))) return;
    for (int pos = e - 1; pos >= b; pos--) {
      const float bound = base + t.dist[pos];
      if (!(bound < fminf(kth, carried))) break;
      kth = insert_bound(value, count, len, a.kprime, bound, t.mult[pos]);
    }
  };
  if (lane == 0) walk(first);
  kth = __shfl_sync(kFullMask, kth, 0);
  for (int c0 = 0; c0 < a.mt; c0 += kWarp) {
    const int ct = c0 + lane;
    const bool pass = ct < a.mt && ct != first && t.begin[ct + 1] > t.begin[ct] &&
                      rq + dcc[ct] + t.nearest[ct] < fminf(kth, carried);
    unsigned mask = __ballot_sync(kFullMask, pass);
    if (lane == 0) {
      while (mask != 0) {
        const int bit = __ffs(mask) - 1;
        mask &= mask - 1;
        walk(c0 + bit);
      }
    }
    kth = __shfl_sync(kFullMask, kth, 0);
  }
  if (lane == 0) a.upper_bound[cq] = fminf(carried, kth == inf ? inf : kth + widen(a.margin, kth));
}

struct GroupFilterArgs {
  int first, mq, mt;  // query clusters [first, first + mq)
  const float *dcc;
  const float *upper_bound;
  Margin margin;
  uint64_t *keys;         // mq x mt
  int32_t *count;         // every query cluster's (indexed by cq)
  int64_t *segment_begin; // mq
  int64_t *segment_end;   // mq
};

constexpr int kFilterBlock = 256;

__global__ void group_filter_kernel(GroupFilterArgs a, ClusterView q, ClusterView t) {
  typedef cub::BlockScan<int, kFilterBlock> Scan;
  __shared__ typename Scan::TempStorage temp;
  const int cq = a.first + blockIdx.x;
  const bool has_queries = q.begin[cq + 1] > q.begin[cq];
  const float rq = q.radius[cq];
  const float ub = a.upper_bound[cq];
  const int64_t row = (int64_t)blockIdx.x * a.mt;
  int written = 0;
  for (int c0 = 0; c0 < a.mt; c0 += kFilterBlock) {
    int ct = c0 + threadIdx.x;
    int keep = 0;
    float d = 0.0f;
    if (has_queries && ct < a.mt && t.begin[ct + 1] > t.begin[ct]) {
      d = a.dcc[row + ct];
      float rt = t.radius[ct];
      float lower = d - rq - rt;
      keep = (lower > ub + widen(a.margin, d + rq + rt + ub)) ? 0 : 1;
    }
    int index, total;
    Scan(temp).ExclusiveSum(keep, index, total);
    if (keep) a.keys[row + written + index] = ((uint64_t)__float_as_uint(d) << 32) | (uint32_t)ct;
    written += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.count[cq] = written;
    a.segment_begin[blockIdx.x] = row;
    a.segment_end[blockIdx.x] = row + written;
  }
}

}  // namespace

size_t level1_filter_bytes(int64_t rows, int64_t mt, int kprime) {
  // Centre distances (4), keys (8), candidates (8) and the sort's
  // workspace (about the keys again) a pair; lists, bounds and segments a
  // query cluster; 1 MiB of slack.
  const double pairs = (double)rows * (double)mt;
  return (size_t)std::min(32.0 * pairs + rows * (8.0 * (kprime + 1) + 32.0) + (1 << 20), 1e18);
}

KnnStatus level1_filter(const ClusterSet &queries, const ClusterSet &targets, KnnMetric metric,
                        int kprime, Margin margin, Level1Result &out, MemoryBudget &mem,
                        DeviceContext &ctx, const float *carried_bound, int32_t first_cluster,
                        int32_t end_cluster) {
  const int all = queries.m, mt = targets.m;
  const int first = std::max(0, std::min(first_cluster, all));
  const int mq = std::max(0, (end_cluster < 0 ? all : std::min(end_cluster, all)) - first);
  const int64_t pairs = (int64_t)mq * mt;
  cudaStream_t stream = ctx.stream;
  out.cand_stride = mt;
  out.cand_first = first;

  // Bounds and counts of every query cluster (level 2 indexes them by
  // cluster); those outside the range have no candidates and bound 0.
  KNN_TRY(mem.allocate(ctx, out.upper_bound, all, "upper bounds"));
  KNN_TRY(mem.allocate(ctx, out.cand_count, all, "candidate clusters"));
  if (mq < all) {
    CUDA_CHECK(ctx, cudaMemsetAsync(out.upper_bound.get(), 0, all * sizeof(float), stream));
    CUDA_CHECK(ctx, cudaMemsetAsync(out.cand_count.get(), 0, all * sizeof(int32_t), stream));
  }
  KNN_TRY(mem.allocate(ctx, out.candidates, std::max<int64_t>(pairs, 1), "candidate clusters"));
  if (mq == 0) return KNN_OK;

  DeviceBuffer<float> dcc;
  KNN_TRY(mem.allocate(ctx, dcc, pairs, "centre distances"));
  center_distance_kernel<<<grid_for(pairs, 256), 256, 0, stream>>>(
      metric, queries.centers.get() + (int64_t)first * queries.stride, mq,
      targets.centers.get(), mt, queries.stride, dcc.get());
  CUDA_CHECK_LAUNCH(ctx, "center_distance_kernel");

  DeviceBuffer<float> scratch_value;
  DeviceBuffer<int32_t> scratch_count;
  KNN_TRY(mem.allocate(ctx, scratch_value, (size_t)mq * (kprime + 1), "upper-bound lists"));
  KNN_TRY(mem.allocate(ctx, scratch_count, (size_t)mq * (kprime + 1), "upper-bound lists"));
  UpperBoundArgs ua;
  ua.first = first;
  ua.mq = mq;
  ua.mt = mt;
  ua.kprime = kprime;
  ua.dcc = dcc.get();
  ua.scratch_value = scratch_value.get();
  ua.scratch_count = scratch_count.get();
  ua.margin = margin;
  ua.upper_bound = out.upper_bound.get();
  ua.carried = carried_bound;
  upper_bound_kernel<<<grid_for(mq, kUpperBoundWarps), kUpperBoundWarps * kWarp, 0, stream>>>(
      ua, queries.view(), targets.view());
  CUDA_CHECK_LAUNCH(ctx, "upper_bound_kernel");
  KNN_TRY(ctx.cancel_point());

  DeviceBuffer<uint64_t> keys;
  DeviceBuffer<int64_t> seg_begin, seg_end;
  KNN_TRY(mem.allocate(ctx, keys, pairs, "candidate clusters"));
  KNN_TRY(mem.allocate(ctx, seg_begin, mq, "candidate clusters"));
  KNN_TRY(mem.allocate(ctx, seg_end, mq, "candidate clusters"));
  GroupFilterArgs ga;
  ga.first = first;
  ga.mq = mq;
  ga.mt = mt;
  ga.dcc = dcc.get();
  ga.upper_bound = out.upper_bound.get();
  ga.margin = margin;
  ga.keys = keys.get();
  ga.count = out.cand_count.get();
  ga.segment_begin = seg_begin.get();
  ga.segment_end = seg_end.get();
  group_filter_kernel<<<mq, kFilterBlock, 0, stream>>>(ga, queries.view(), targets.view());
  CUDA_CHECK_LAUNCH(ctx, "group_filter_kernel");

  DeviceBuffer<unsigned char> temp;
  KNN_TRY(run_cub(ctx, mem, temp, "candidate sort workspace", [&](void *t, size_t &bytes) {
    return cub::DeviceSegmentedSort::SortKeys(t, bytes, keys.get(), out.candidates.get(), pairs,
                                              mq, seg_begin.get(), seg_end.get(), stream);
  }));
  mem.release(temp);
  mem.release(keys);
  mem.release(seg_begin);
  mem.release(seg_end);
  mem.release(scratch_value);
  mem.release(scratch_count);
  mem.release(dcc);
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
