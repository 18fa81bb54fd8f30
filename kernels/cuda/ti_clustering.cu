// ti_clustering.cu -- step 1 of the TI join (section III-A): landmarks,
// assignment of every distinct point to its nearest landmark, and the
// cluster arrays the filters read.
//
//  * Landmarks: `candidate_sets` random sets of m distinct points; the set
//    with the largest sum of pairwise distances wins (spread-out centres).
//  * Assignment: the nearest centre is searched with fast float arithmetic
//    (FMA allowed) or, for wide L2 rows, with a cuBLAS GEMM. Either is only a
//    choice of centre: any choice is correct, because the distance recorded
//    for the point is then computed exactly (knn_distance.h) to the centre it
//    was given, and every bound uses only such recorded distances.
//  * Cluster arrays, with the two kernels of the paper: kernel 1 (the
//    assignment) takes a local id in its cluster with atomicAdd on the
//    cluster size, a prefix sum turns sizes into offsets, kernel 2 scatters
//    each point to offset + local id (no atomic appends). A segmented sort
//    then orders each cluster by descending distance to its centre (ties by
//    point, so the layout is deterministic).
#include <cub/cub.cuh>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "peer_rows.cuh"
#include "ti_common.cuh"
#include "ti_distance.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

// ---- landmarks ----

struct AffineSample {
  int64_t a;  // coprime with n, so i -> (a i + b) mod n hits m distinct points
  int64_t b;
};

__device__ __forceinline__ int64_t sample_index(AffineSample s, int64_t i, int64_t n) {
  // a, b < n < 2^31 and i < n, so the product fits in 64 bits.
  return (int64_t)(((uint64_t)s.a * (uint64_t)i + (uint64_t)s.b) % (uint64_t)n);
}

struct SampleSets {
  AffineSample set[32];
};

// index[s * m + i] = the i-th point of candidate set s (a 64-bit modulo
// each: computed once here, not once a pair below).
__global__ void landmark_index_kernel(int64_t n, int m, int sets, SampleSets samples,
                                      int32_t *index) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= (int64_t)m * sets) return;
  index[i] = (int32_t)sample_index(samples.set[i / m], i % m, n);
}

// Sum of pairwise ti distances of each candidate set (block (i, set)).
__global__ void landmark_spread_kernel(const float *x, int stride, KnnMetric metric, int m,
                                       const int32_t *index, double *score) {
  const int i = blockIdx.x;
  const int s = blockIdx.y;
  const int32_t *set = index + (int64_t)s * m;
  const float *xi = x + (int64_t)set[i] * stride;
  double sum = 0;
  for (int j = i + 1 + threadIdx.x; j < m; j += blockDim.x) {
    const float *xj = x + (int64_t)set[j] * stride;
    sum += ti_distance_rt(metric, row_value_rt(metric, xi, xj, stride));
  }
  typedef cub::BlockReduce<double, 128> Reduce;
  __shared__ typename Reduce::TempStorage temp;
  double total = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) atomicAdd(&score[s], total);
}

__global__ void gather_centers_kernel(const float *x, int64_t n, int stride, int m,
                                      AffineSample s, float *centers) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t c = i / (stride / 4);
  int part = (int)(i % (stride / 4));
  if (c >= m) return;
  int64_t p = sample_index(s, c, n);
  reinterpret_cast<float4 *>(centers + c * stride)[part] =
      reinterpret_cast<const float4 *>(x + p * stride)[part];
}

uint64_t splitmix64(uint64_t &state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t gcd64(int64_t a, int64_t b) {
  while (b != 0) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// ---- assignment ----

// Squared L2 or L1 sum with fused multiply-adds: only used to pick a centre.
template <int METRIC, int DPAD>
__device__ __forceinline__ float fast_value(const QueryRow<DPAD> &q, const float *c, int) {
  const float4 *c4 = reinterpret_cast<const float4 *>(c);
  float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
  for (int i = 0; i < DPAD / 4; i++) {
    float4 f = __ldg(c4 + i);
    float d0 = q.v[4 * i] - f.x, d1 = q.v[4 * i + 1] - f.y;
    float d2 = q.v[4 * i + 2] - f.z, d3 = q.v[4 * i + 3] - f.w;
    if (METRIC == KNN_METRIC_L1) {
      acc0 += fabsf(d0) + fabsf(d2);
      acc1 += fabsf(d1) + fabsf(d3);
    } else {
      acc0 = __fmaf_rn(d0, d0, acc0);
      acc1 = __fmaf_rn(d1, d1, acc1);
      acc0 = __fmaf_rn(d2, d2, acc0);
      acc1 = __fmaf_rn(d3, d3, acc1);
    }
  }
  return acc0 + acc1;
}

template <int METRIC, int DPAD>
__device__ __forceinline__ float fast_value_generic(const float *q, const float *c, int stride) {
  float acc0 = 0.0f, acc1 = 0.0f;
  for (int i = 0; i < stride; i += 2) {
    float d0 = q[i] - __ldg(c + i), d1 = q[i + 1] - __ldg(c + i + 1);
    if (METRIC == KNN_METRIC_L1) {
      acc0 += fabsf(d0);
      acc1 += fabsf(d1);
    } else {
      acc0 = __fmaf_rn(d0, d0, acc0);
      acc1 = __fmaf_rn(d1, d1, acc1);
    }
  }
  return acc0 + acc1;
}

// Records the exact distance to the chosen centre and takes a local id
// (kernel 1 of the paper's two-kernel cluster build).
template <int METRIC, int DPAD>
__device__ __forceinline__ void record_assignment(const QueryRow<DPAD> &q, int64_t p,
                                                  const float *centers, int stride, int c,
                                                  int32_t *cluster, float *dist,
                                                  int32_t *local, int32_t *size) {
  float v = q.template value_to<METRIC>(centers + (int64_t)c * stride);
  dist[p] = MetricOps<METRIC>::ti(v);
  cluster[p] = c;
  local[p] = atomicAdd(&size[c], 1);
}

// Points [first, end). choice (optional): the picked centre goes there
// instead (a split's share of the assignment, recorded later by
// record_choices_kernel).
template <int METRIC, int DPAD>
__global__ void assign_direct_kernel(const float *x, int64_t first, int64_t end, int stride,
                                     const float *centers, int m, int32_t *choice,
                                     int32_t *cluster, float *dist, int32_t *local,
                                     int32_t *size) {
  int64_t p = first + blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (p >= end) return;
  QueryRow<DPAD> q;
  q.load(x + p * stride, stride);
  float best = __int_as_float(0x7f800000);
  int best_c = 0;
  for (int c = 0; c < m; c++) {
    float s;
    if constexpr (DPAD > 0)
      s = fast_value<METRIC, DPAD>(q, centers + (int64_t)c * stride, stride);
    else
      s = fast_value_generic<METRIC, 0>(x + p * stride, centers + (int64_t)c * stride, stride);
    if (s < best) {
      best = s;
      best_c = c;
    }
  }
  if (choice != nullptr)
    choice[p] = best_c;
  else
    record_assignment<METRIC, DPAD>(q, p, centers, stride, best_c, cluster, dist, local, size);
}

// A split's shared assignment: every point's picked centre (choice, from
// the engines' slices) recorded as assign_direct_kernel records its own,
// the exact distance computed here from this engine's rows. A pick out of
// range (a slice that never came; cannot happen in a completed exchange)
// takes centre 0: any centre is correct.
template <int METRIC, int DPAD>
__global__ void record_choices_kernel(const float *x, int64_t n, int stride,
                                      const float *centers, int m, const int32_t *choice,
                                      int32_t *cluster, float *dist, int32_t *local,
                                      int32_t *size) {
  int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (p >= n) return;
  QueryRow<DPAD> q;
  q.load(x + p * stride, stride);
  int c = choice[p];
  if (c < 0 || c >= m) c = 0;
  record_assignment<METRIC, DPAD>(q, p, centers, stride, c, cluster, dist, local, size);
}

// GEMM path (L2, wide rows). Rows are first translated by centre 0, so that
// |x|^2 + |c|^2 - 2 x.c does not cancel catastrophically for data far from
// the origin; the result still only picks a centre.
__global__ void translate_rows_kernel(const float *x, int64_t rows, int stride,
                                      const float *origin, float *out) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= rows * stride) return;
  out[i] = x[i] - origin[i % stride];
}

__global__ void row_norms_kernel(const float *x, int64_t rows, int stride, float *norm) {
  int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float acc = 0.0f;
  for (int i = 0; i < stride; i++) acc = __fmaf_rn(x[r * stride + i], x[r * stride + i], acc);
  norm[r] = acc;
}

// Narrow rows (DPAD 4..16): each thread takes several points and the block
// reads the centres through shared memory, tile by tile, so that each
// centre read serves them all. The sums are fast_value's, term for term, so
// the choice is assign_direct_kernel's.
constexpr int kAssignThreads = 128;
constexpr int kAssignTile = 256;  // centres per shared tile

template <int DPAD>
__host__ __device__ constexpr int assign_points_per_thread() {
  return DPAD <= 8 ? 4 : 2;
}

template <int METRIC, int DPAD>
__global__ void __launch_bounds__(kAssignThreads)
    assign_tiled_kernel(const float *x, int64_t begin, int64_t n, int stride,
                        const float *centers, int m, int32_t *choice, int32_t *cluster,
                        float *dist, int32_t *local, int32_t *size) {
  constexpr int P = assign_points_per_thread<DPAD>();
  __shared__ __align__(16) float tile[kAssignTile * DPAD];
  const int64_t first = begin + (int64_t)blockIdx.x * kAssignThreads * P + threadIdx.x;
  QueryRow<DPAD> q[P];
  float best[P];
  int best_c[P];
#pragma unroll
  for (int j = 0; j < P; j++) {
    const int64_t p = first + (int64_t)j * kAssignThreads;
    q[j].load(x + (p < n ? p : 0) * stride, stride);
    best[j] = __int_as_float(0x7f800000);
    best_c[j] = 0;
  }
  for (int c0 = 0; c0 < m; c0 += kAssignTile) {
    const int nt = min(kAssignTile, m - c0);
    __syncthreads();
    for (int i = threadIdx.x; i < nt * (DPAD / 4); i += kAssignThreads)
      reinterpret_cast<float4 *>(tile)[i] =
          __ldg(reinterpret_cast<const float4 *>(centers + (int64_t)c0 * stride) + i);
    __syncthreads();
    for (int c = 0; c < nt; c++) {
      const float4 *cv = reinterpret_cast<const float4 *>(tile + c * DPAD);
      float acc0[P], acc1[P];
#pragma unroll
      for (int j = 0; j < P; j++) acc0[j] = acc1[j] = 0.0f;
#pragma unroll
      for (int i = 0; i < DPAD / 4; i++) {
        const float4 f = cv[i];
#pragma unroll
        for (int j = 0; j < P; j++) {
          const float d0 = q[j].v[4 * i] - f.x, d1 = q[j].v[4 * i + 1] - f.y;
          const float d2 = q[j].v[4 * i + 2] - f.z, d3 = q[j].v[4 * i + 3] - f.w;
          if (METRIC == KNN_METRIC_L1) {
            acc0[j] += fabsf(d0) + fabsf(d2);
            acc1[j] += fabsf(d1) + fabsf(d3);
          } else {
            acc0[j] = __fmaf_rn(d0, d0, acc0[j]);
            acc1[j] = __fmaf_rn(d1, d1, acc1[j]);
            acc0[j] = __fmaf_rn(d2, d2, acc0[j]);
            acc1[j] = __fmaf_rn(d3, d3, acc1[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < P; j++) {
        const float s = acc0[j] + acc1[j];
        if (s < best[j]) {
          best[j] = s;
          best_c[j] = c0 + c;
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < P; j++) {
    const int64_t p = first + (int64_t)j * kAssignThreads;
    if (p >= n) continue;
    if (choice != nullptr)
      choice[p] = best_c[j];
    else
      record_assignment<METRIC, DPAD>(q[j], p, centers, stride, best_c[j], cluster, dist, local,
                                      size);
  }
}

// One warp per point: argmin over centres of |c|^2 - 2 x.c (gram holds x.c,
// m entries per point), then record_assignment with the exact distance.
template <int DPAD>
__global__ void assign_from_gram_kernel(const float *x, int64_t first, int64_t count,
                                        int stride, const float *centers, int m,
                                        const float *center_norm, const float *gram,
                                        int32_t *cluster, float *dist, int32_t *local,
                                        int32_t *size) {
  int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / kWarp;
  int lane = threadIdx.x % kWarp;
  if (w >= count) return;
  const float *g = gram + w * m;
  float best = __int_as_float(0x7f800000);
  int best_c = m;
  for (int c = lane; c < m; c += kWarp) {
    float s = center_norm[c] - 2.0f * g[c];
    if (s < best) {
      best = s;
      best_c = c;
    }
  }
  for (int off = kWarp / 2; off > 0; off /= 2) {
    float ob = __shfl_down_sync(kFullMask, best, off);
    int oc = __shfl_down_sync(kFullMask, best_c, off);
    if (ob < best || (ob == best && oc < best_c)) {
      best = ob;
      best_c = oc;
    }
  }
  if (lane == 0) {
    if (best_c >= m) best_c = 0;  // all NaN cannot happen with finite input
    int64_t p = first + w;
    QueryRow<DPAD> q;
    q.load(x + p * stride, stride);
    record_assignment<KNN_METRIC_L2, DPAD>(q, p, centers, stride, best_c, cluster, dist, local,
                                           size);
  }
}

// ---- cluster arrays ----

// Kernel 2 of the paper: position = offset of the cluster + local id. The
// key orders a cluster by descending distance, then by point.
__global__ void scatter_keys_kernel(int64_t n, const int32_t *cluster, const float *dist,
                                    const int32_t *local, const int32_t *begin,
                                    uint64_t *keys) {
  int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (p >= n) return;
  uint32_t desc = ~__float_as_uint(dist[p]);  // dist >= 0: bit order is value order
  keys[begin[cluster[p]] + local[p]] = ((uint64_t)desc << 32) | (uint32_t)p;
}

__global__ void positions_kernel(int64_t n, const uint64_t *keys, const int32_t *group_begin,
                                 const int32_t *rows, int32_t *member, float *dist,
                                 int32_t *first_row, int32_t *mult, int32_t *rows_begin) {
  int64_t pos = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (pos >= n) return;
  uint64_t key = keys[pos];
  int32_t p = (int32_t)(key & 0xffffffffu);
  member[pos] = p;
  dist[pos] = __uint_as_float(~(uint32_t)(key >> 32));
  int32_t gb = group_begin[p];
  first_row[pos] = rows[gb];
  mult[pos] = group_begin[p + 1] - gb;
  rows_begin[pos] = gb;
}

__global__ void gather_rows_kernel(const float *x, int stride, int64_t n, const int32_t *member,
                                   float *out) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t pos = i / (stride / 4);
  int part = (int)(i % (stride / 4));
  if (pos >= n) return;
  reinterpret_cast<float4 *>(out + pos * stride)[part] =
      reinterpret_cast<const float4 *>(x + (int64_t)member[pos] * stride)[part];
}

__global__ void cluster_extent_kernel(int m, const int32_t *begin, const float *dist,
                                      float *radius, float *nearest) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= m) return;
  int b = begin[c], e = begin[c + 1];
  radius[c] = e > b ? dist[b] : 0.0f;
  nearest[c] = e > b ? dist[e - 1] : __int_as_float(0x7f800000);
}

// KNN_TI_SHARED_ASSIGN=0: a split's engines each assign every point
// (assign_shared declined), for A/B benchmarks and tests.
bool shared_assignment() {
  const char *forced = std::getenv("KNN_TI_SHARED_ASSIGN");
  return forced == nullptr || forced[0] != '0';
}

// KNN_TI_ASSIGN=direct keeps narrow rows on assign_direct_kernel, for A/B
// benchmarks.
bool tiled_assignment() {
  const char *forced = std::getenv("KNN_TI_ASSIGN");
  return forced == nullptr || std::strcmp(forced, "direct") != 0;
}

// Points [first, end) of the set, each to its nearest centre (recorded,
// or its pick into `choice` where given): assign_tiled_kernel for strides
// 4, 8 and 16, else assign_direct_kernel.
template <int METRIC>
KnnStatus assign_nearest_centres(const DistinctSet &set, const ClusterSet &cs, int64_t first,
                                 int64_t end, int32_t *choice, int32_t *cluster, float *dist,
                                 int32_t *local, int32_t *size, DeviceContext &ctx) {
  const int stride = set.stride;
  const int m = cs.m;
  const int64_t count = end - first;
  if (count <= 0) return KNN_OK;
  const int bucket = register_stride(stride);
  if (bucket == stride && stride <= 16 && m > 1 && tiled_assignment()) {
    auto launch = [&](auto d) {
      constexpr int D = decltype(d)::value;
      constexpr int points = kAssignThreads * assign_points_per_thread<D>();
      assign_tiled_kernel<METRIC, D><<<grid_for(count, points), kAssignThreads, 0, ctx.stream>>>(
          set.x.get(), first, end, stride, cs.centers.get(), m, choice, cluster, dist, local,
          size);
    };
    if (stride == 4) launch(std::integral_constant<int, 4>());
    else if (stride == 8) launch(std::integral_constant<int, 8>());
    else launch(std::integral_constant<int, 16>());
    CUDA_CHECK_LAUNCH(ctx, "assign_tiled_kernel");
    return KNN_OK;
  }
  const unsigned grid = grid_for(count, 128);
  with_register_stride(stride, [&](auto d) {
    assign_direct_kernel<METRIC, decltype(d)::value><<<grid, 128, 0, ctx.stream>>>(
        set.x.get(), first, end, stride, cs.centers.get(), m, choice, cluster, dist, local, size);
  });
  CUDA_CHECK_LAUNCH(ctx, "assign_direct_kernel");
  return KNN_OK;
}

KnnStatus assign_with_gemm(const DistinctSet &set, const ClusterSet &cs, int32_t *cluster,
                           float *dist, int32_t *local, int32_t *size, MemoryBudget &mem,
                           DeviceContext &ctx) {
  const int64_t n = set.n_distinct;
  const int stride = set.stride;
  const int m = cs.m;
  int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, (int64_t{16} << 20) / m));
  DeviceBuffer<float> moved_centers, center_norm, moved_rows, gram;
  KNN_TRY(mem.allocate(ctx, moved_centers, (size_t)m * stride, "assignment GEMM"));
  KNN_TRY(mem.allocate(ctx, center_norm, m, "assignment GEMM"));
  KNN_TRY(mem.allocate(ctx, moved_rows, (size_t)chunk * stride, "assignment GEMM"));
  KNN_TRY(mem.allocate(ctx, gram, (size_t)chunk * m, "assignment GEMM"));
  const float *origin = cs.centers.get();
  translate_rows_kernel<<<grid_for((int64_t)m * stride, 256), 256, 0, ctx.stream>>>(
      cs.centers.get(), m, stride, origin, moved_centers.get());
  CUDA_CHECK_LAUNCH(ctx, "translate_rows_kernel");
  row_norms_kernel<<<grid_for(m, 128), 128, 0, ctx.stream>>>(moved_centers.get(), m, stride,
                                                              center_norm.get());
  CUDA_CHECK_LAUNCH(ctx, "row_norms_kernel");
  CUBLAS_CHECK(ctx, cublasSetStream(ctx.cublas, ctx.stream));
  CUBLAS_CHECK(ctx, cublasSetPointerMode(ctx.cublas, CUBLAS_POINTER_MODE_HOST));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t first = 0; first < n; first += chunk) {
    KNN_TRY(ctx.cancel_point());
    int64_t count = std::min(chunk, n - first);
    translate_rows_kernel<<<grid_for(count * stride, 256), 256, 0, ctx.stream>>>(
        set.x.get() + first * stride, count, stride, origin, moved_rows.get());
    CUDA_CHECK_LAUNCH(ctx, "translate_rows_kernel");
    // gram (m x count, column-major) = centers^T (m x stride) * rows (stride x count)
    CUBLAS_CHECK(ctx, cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, (int)count, stride,
                                   &one, moved_centers.get(), CUDA_R_32F, stride,
                                   moved_rows.get(), CUDA_R_32F, stride, &zero, gram.get(),
                                   CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    const unsigned grid = grid_for(count * kWarp, 256);
    with_register_stride(stride, [&](auto d) {
      assign_from_gram_kernel<decltype(d)::value><<<grid, 256, 0, ctx.stream>>>(
          set.x.get(), first, count, stride, cs.centers.get(), m, center_norm.get(), gram.get(),
          cluster, dist, local, size);
    });
    CUDA_CHECK_LAUNCH(ctx, "assign_from_gram_kernel");
  }
  mem.release(moved_centers);
  mem.release(center_norm);
  mem.release(moved_rows);
  mem.release(gram);
  return KNN_OK;
}

// Landmarks: the most spread-out of `candidate_sets` random samples of m
// distinct points, gathered into out.centers.
KnnStatus choose_landmarks(const DistinctSet &set, KnnMetric metric, int m, int candidate_sets,
                           ClusterSet &out, MemoryBudget &mem, DeviceContext &ctx) {
  const int64_t n = set.n_distinct;
  const int stride = set.stride;
  candidate_sets = std::max(1, std::min(candidate_sets, 32));
  SampleSets sets{};
  uint64_t rng = 0x5EED5EEDull ^ (uint64_t)n * 0x9E3779B97F4A7C15ull;
  for (int s = 0; s < candidate_sets; s++) {
    int64_t a = 1;
    if (n > 1) {
      do {
        a = 1 + (int64_t)(splitmix64(rng) % (uint64_t)(n - 1));
      } while (gcd64(a, n) != 1);
    }
    sets.set[s].a = a;
    sets.set[s].b = (int64_t)(splitmix64(rng) % (uint64_t)n);
  }
  int best = 0;
  if (candidate_sets > 1 && m > 1 && m < n) {
    DeviceBuffer<double> score;
    DeviceBuffer<int32_t> index;
    KNN_TRY(mem.allocate(ctx, score, candidate_sets, "landmark scores"));
    KNN_TRY(mem.allocate(ctx, index, (size_t)m * candidate_sets, "landmark scores"));
    CUDA_CHECK(ctx, cudaMemsetAsync(score.get(), 0, candidate_sets * sizeof(double), ctx.stream));
    landmark_index_kernel<<<grid_for((int64_t)m * candidate_sets, 256), 256, 0, ctx.stream>>>(
        n, m, candidate_sets, sets, index.get());
    CUDA_CHECK_LAUNCH(ctx, "landmark_index_kernel");
    dim3 grid(m, candidate_sets);
    landmark_spread_kernel<<<grid, 128, 0, ctx.stream>>>(set.x.get(), stride, metric, m,
                                                         index.get(), score.get());
    CUDA_CHECK_LAUNCH(ctx, "landmark_spread_kernel");
    std::vector<double> host(candidate_sets);
    CUDA_CHECK(ctx, cudaMemcpyAsync(host.data(), score.get(), candidate_sets * sizeof(double),
                                    cudaMemcpyDeviceToHost, ctx.stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    for (int s = 1; s < candidate_sets; s++)
      if (host[s] > host[best]) best = s;
  }
  if (m == n) sets.set[best] = AffineSample{1, 0};  // every point is a centre
  KNN_TRY(mem.allocate(ctx, out.centers, (size_t)m * stride, "cluster centres"));
  gather_centers_kernel<<<grid_for((int64_t)m * (stride / 4), 256), 256, 0, ctx.stream>>>(
      set.x.get(), n, stride, m, sets.set[best], out.centers.get());
  CUDA_CHECK_LAUNCH(ctx, "gather_centers_kernel");
  return KNN_OK;
}

// Kernel 1's output: each distinct point's centre, exact distance to it and
// local id in its cluster, and the cluster sizes (m + 1, the last 0).
struct Assignment {
  DeviceBuffer<int32_t> cluster, local, size;
  DeviceBuffer<float> dist;
};

KnnStatus assign_points(const DistinctSet &set, KnnMetric metric, int gemm_min_stride,
                        const ClusterSet &cs, Assignment &as, MemoryBudget &mem,
                        DeviceContext &ctx) {
  const int64_t n = set.n_distinct;
  const int m = cs.m;
  KNN_TRY(mem.allocate(ctx, as.cluster, n, "cluster assignment"));
  KNN_TRY(mem.allocate(ctx, as.local, n, "cluster assignment"));
  KNN_TRY(mem.allocate(ctx, as.dist, n, "cluster assignment"));
  KNN_TRY(mem.allocate(ctx, as.size, m + 1, "cluster assignment"));
  CUDA_CHECK(ctx, cudaMemsetAsync(as.size.get(), 0, (m + 1) * sizeof(int32_t), ctx.stream));
  int32_t *cluster = as.cluster.get(), *local = as.local.get(), *size = as.size.get();
  float *dist = as.dist.get();
  if (metric == KNN_METRIC_L2 && set.stride >= gemm_min_stride && m > 1)
    return assign_with_gemm(set, cs, cluster, dist, local, size, mem, ctx);
  if (metric == KNN_METRIC_L1)
    return assign_nearest_centres<KNN_METRIC_L1>(set, cs, 0, n, nullptr, cluster, dist, local,
                                                 size, ctx);
  return assign_nearest_centres<KNN_METRIC_L2>(set, cs, 0, n, nullptr, cluster, dist, local,
                                               size, ctx);
}

// A split TI self-join's engines assign the points once between them
// (share: DeviceContext::peer_assign, peer_rows.cuh's all-or-nothing
// protocol): each picks the centres of its slice of the distinct points
// into its own buffer, copies the other slices' picks from the other GPUs
// (cudaMemcpyPeerAsync), and records every point against its pick with
// the exact distance from its own rows (record_choices_kernel), as
// assign_points would. The picks are only choices (any centre is correct),
// so the clusters are exact whatever came. They are good picks where the
// engines' distinct points and centres are the same (both built by the
// same deterministic steps from the same rows); the offer checks only what
// is cheap to compare (the numbers of points and centres, the host rows,
// element and keys). The GEMM path (wide L2 rows) declines. *shared:
// whether `as` was filled.
KnnStatus assign_shared(const DistinctSet &set, KnnMetric metric, int gemm_min_stride,
                        const ClusterSet &cs, const AssignShare &share, Assignment &as,
                        bool *shared, MemoryBudget &mem, DeviceContext &ctx) {
  *shared = false;
  PeerRows &peers = *share.peers;
  const int64_t n = set.n_distinct;
  const int m = cs.m;
  if ((metric == KNN_METRIC_L2 && set.stride >= gemm_min_stride) || m <= 1 || n < 2) {
    peers.decline(share.engine);
    return KNN_OK;
  }
  DeviceBuffer<int32_t> choice;  // read by the other GPUs: from the pool of shared rows
  cudaMemPool_t pool = shared_rows_pool(ctx.device, true);
  KNN_TRY(mem.allocate(ctx, choice, n, "cluster assignment", pool));
  // Filled with -1 (centre 0 where a pick never came), and complete before
  // the other GPUs may read it.
  CUDA_CHECK(ctx, cudaMemsetAsync(choice.get(), 0xFF, n * sizeof(int32_t), ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  // (The offer's "rows" are the picks: n of one word; its "dim" the number
  // of centres, which the engines must agree on too.)
  KNN_TRY(peers.offer(ctx, share.engine, reinterpret_cast<float *>(choice.get()), n, m, share.host,
                      share.element, share.keys, shared, pool));
  if (!*shared) {
    mem.release(choice);
    return KNN_OK;
  }
  PeerRowsTurn turn;  // (declared after `choice`: done with it first, on every path)
  const int me = peers.member(share.engine);
  turn.take(&peers, me, ctx.stream);
  int64_t first, count;
  peers.slice(me, &first, &count);
  KnnStatus own = metric == KNN_METRIC_L1
                      ? assign_nearest_centres<KNN_METRIC_L1>(set, cs, first, first + count,
                                                              choice.get(), nullptr, nullptr,
                                                              nullptr, nullptr, ctx)
                      : assign_nearest_centres<KNN_METRIC_L2>(set, cs, first, first + count,
                                                              choice.get(), nullptr, nullptr,
                                                              nullptr, nullptr, ctx);
  if (own == KNN_OK) {
    const cudaError_t err = cudaStreamSynchronize(ctx.stream);
    if (err != cudaSuccess)
      own = record_failure(ctx, err, "cudaStreamSynchronize (shared assignment)", __FILE__,
                           __LINE__);
  }
  peers.slice_done(me, own == KNN_OK);
  KNN_TRY(own);
  KNN_TRY(copy_other_slices(ctx, peers, me, choice.get(), sizeof(int32_t)));
  turn.finished_reading();
  KNN_TRY(mem.allocate(ctx, as.cluster, n, "cluster assignment"));
  KNN_TRY(mem.allocate(ctx, as.local, n, "cluster assignment"));
  KNN_TRY(mem.allocate(ctx, as.dist, n, "cluster assignment"));
  KNN_TRY(mem.allocate(ctx, as.size, m + 1, "cluster assignment"));
  CUDA_CHECK(ctx, cudaMemsetAsync(as.size.get(), 0, (m + 1) * sizeof(int32_t), ctx.stream));
  with_register_stride(set.stride, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (metric == KNN_METRIC_L1)
      record_choices_kernel<KNN_METRIC_L1, D><<<grid_for(n, 128), 128, 0, ctx.stream>>>(
          set.x.get(), n, set.stride, cs.centers.get(), m, choice.get(), as.cluster.get(),
          as.dist.get(), as.local.get(), as.size.get());
    else
      record_choices_kernel<KNN_METRIC_L2, D><<<grid_for(n, 128), 128, 0, ctx.stream>>>(
          set.x.get(), n, set.stride, cs.centers.get(), m, choice.get(), as.cluster.get(),
          as.dist.get(), as.local.get(), as.size.get());
  });
  CUDA_CHECK_LAUNCH(ctx, "record_choices_kernel");
  turn.release();  // the others read this engine's picks no more: they may go
  mem.release(choice);
  return KNN_OK;
}

// Kernel 2 and the rest: offsets, positions in cluster order (each cluster
// by descending distance to its centre), the members' vectors and rows,
// and the clusters' extents.
KnnStatus build_cluster_arrays(const DistinctSet &set, const Assignment &as, ClusterSet &out,
                               MemoryBudget &mem, DeviceContext &ctx) {
  const int64_t n = set.n_distinct;
  const int stride = set.stride;
  const int m = out.m;
  cudaStream_t stream = ctx.stream;
  // Offsets (size[m] is 0, so begin[m] is the total).
  KNN_TRY(mem.allocate(ctx, out.begin, m + 1, "cluster offsets"));
  size_t scan_bytes = 0, sort_bytes = 0;
  CUDA_CHECK(ctx, cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, as.size.get(),
                                                out.begin.get(), m + 1, stream));
  DeviceBuffer<uint64_t> keys, sorted;
  KNN_TRY(mem.allocate(ctx, keys, n, "cluster sort keys"));
  KNN_TRY(mem.allocate(ctx, sorted, n, "cluster sort keys"));
  CUDA_CHECK(ctx, cub::DeviceSegmentedSort::SortKeys(nullptr, sort_bytes, keys.get(),
                                                      sorted.get(), (int)n, m, out.begin.get(),
                                                      out.begin.get() + 1, stream));
  DeviceBuffer<unsigned char> temp;
  KNN_TRY(mem.allocate(ctx, temp, std::max(scan_bytes, sort_bytes), "cluster sort workspace"));
  CUDA_CHECK(ctx, cub::DeviceScan::ExclusiveSum(temp.get(), scan_bytes, as.size.get(),
                                                out.begin.get(), m + 1, stream));
  // Kernel 2: scatter by local id, then order each cluster.
  scatter_keys_kernel<<<grid_for(n, 256), 256, 0, stream>>>(n, as.cluster.get(), as.dist.get(),
                                                            as.local.get(), out.begin.get(),
                                                            keys.get());
  CUDA_CHECK_LAUNCH(ctx, "scatter_keys_kernel");
  CUDA_CHECK(ctx, cub::DeviceSegmentedSort::SortKeys(temp.get(), sort_bytes, keys.get(),
                                                      sorted.get(), (int)n, m, out.begin.get(),
                                                      out.begin.get() + 1, stream));

  KNN_TRY(mem.allocate(ctx, out.member, n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, out.dist, n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, out.first_row, n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, out.mult, n, "cluster members"));
  KNN_TRY(mem.allocate(ctx, out.rows_begin, n, "cluster members"));
  positions_kernel<<<grid_for(n, 256), 256, 0, stream>>>(
      n, sorted.get(), set.group_begin.get(), set.rows.get(), out.member.get(), out.dist.get(),
      out.first_row.get(), out.mult.get(), out.rows_begin.get());
  CUDA_CHECK_LAUNCH(ctx, "positions_kernel");
  KNN_TRY(mem.allocate(ctx, out.x, (size_t)n * stride, "clustered points"));
  gather_rows_kernel<<<grid_for(n * (stride / 4), 256), 256, 0, stream>>>(
      set.x.get(), stride, n, out.member.get(), out.x.get());
  CUDA_CHECK_LAUNCH(ctx, "gather_rows_kernel");
  KNN_TRY(mem.allocate(ctx, out.radius, m, "cluster extents"));
  KNN_TRY(mem.allocate(ctx, out.nearest, m, "cluster extents"));
  cluster_extent_kernel<<<grid_for(m, 128), 128, 0, stream>>>(m, out.begin.get(), out.dist.get(),
                                                              out.radius.get(),
                                                              out.nearest.get());
  CUDA_CHECK_LAUNCH(ctx, "cluster_extent_kernel");
  mem.release(keys);
  mem.release(sorted);
  mem.release(temp);
  return KNN_OK;
}

}  // namespace

KnnStatus build_clusters(const DistinctSet &set, KnnMetric metric, int32_t clusters,
                         int candidate_sets, int gemm_min_stride, ClusterSet &out,
                         MemoryBudget &mem, DeviceContext &ctx, const AssignShare *share) {
  const int64_t n = set.n_distinct;
  out.m = (int)std::max<int64_t>(1, std::min<int64_t>(clusters, n));
  out.n = n;
  out.stride = set.stride;
  // KNN_TI_PHASES=1: each step's wall time to stderr (a synchronisation
  // after each; for measuring only).
  static const bool phases = std::getenv("KNN_TI_PHASES") != nullptr &&
                             std::getenv("KNN_TI_PHASES")[0] == '1';
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  double seconds[3] = {};
  auto step = [&](int i) {
    if (!phases) return;
    (void)cudaStreamSynchronize(ctx.stream);
    const auto now = std::chrono::steady_clock::now();
    seconds[i] = std::chrono::duration<double>(now - t).count();
    t = now;
  };
  KNN_TRY(choose_landmarks(set, metric, out.m, candidate_sets, out, mem, ctx));
  KNN_TRY(ctx.cancel_point());
  step(0);
  Assignment as;
  bool shared = false;
  if (share != nullptr && share->peers != nullptr) {
    if (shared_assignment())
      KNN_TRY(assign_shared(set, metric, gemm_min_stride, out, *share, as, &shared, mem, ctx));
    else
      share->peers->decline(share->engine);
  }
  if (shared && share->probe != nullptr) __atomic_fetch_or(share->probe, 2, __ATOMIC_RELAXED);
  if (!shared) KNN_TRY(assign_points(set, metric, gemm_min_stride, out, as, mem, ctx));
  KNN_TRY(ctx.cancel_point());
  step(1);
  KNN_TRY(build_cluster_arrays(set, as, out, mem, ctx));
  step(2);
  if (phases)
    std::fprintf(stderr, "ti clusters (GPU %d): %lld points, %d centres: landmarks %.4f assignment%s %.4f arrays %.4f\n",
                 ctx.device, (long long)n, out.m, seconds[0], shared ? " (shared)" : "",
                 seconds[1], seconds[2]);
  mem.release(as.cluster);
  mem.release(as.local);
  mem.release(as.size);
  mem.release(as.dist);
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
