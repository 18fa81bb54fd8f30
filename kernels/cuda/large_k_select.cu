// large_k_select.cu -- the k best of a block (query chunk x target chunk)
// for k beyond the streaming selection's lists (k + 16 > kMaxSelectCap, up
// to kLargeKMax), filtered by the fp16 tensor-core GEMM (half_bound.cuh).
//
//  1. Guess. The fp16 GEMM of the queries against a strided sample of the
//     targets (every step-th, up to kSample of them); each value becomes
//     its proven lower bound L (TileValue, the same as select_tiles.cu
//     uses), and per query U = about the rank-th smallest of them, rank =
//     the share of k that the sample should hold plus 3.5 standard
//     deviations (a radix select over float images of the bounds). U is
//     only a guess: nothing below depends on how it was found.
//  2. Collection. Every target tile's fp16 GEMM; each eligible target
//     (self matches excluded) whose bound has key(L) <= key(U) (the order
//     of select_keys.cuh) is appended to the query's buffer of `capacity`
//     slots through a per-query counter, which counts on past the capacity
//     (overflow) while nothing is written past it.
//  3. Rerank. The collected rows are sorted (CUB segmented sort), their
//     exact values computed with exact_pair.cuh (knn_distance.h), then
//     stably sorted by exact key: equal values stay in row order, the
//     result order. The k best are written.
//  4. Certification. For every eligible target t, key(X_t) >= key(L_t),
//     X_t its exact value: L is a lower bound (half_bound.cuh); a NaN
//     bound (cosine, a zero row) has a NaN exact value; a NaN exact value
//     has the largest key of any value (kNanKey). Let S be the collected
//     set; without overflow S = {t eligible : key(L_t) <= U}.
//      - U = kNanKey: no bound's key exceeds it, so S holds every eligible
//        target and its sorted k best (or all of it) are the answer.
//      - else, when |S| >= k and the k-th of S has exact key x_k <= U:
//        every eligible t outside S has key(X_t) >= key(L_t) > U >= x_k,
//        strictly, so it comes after the k-th entry whatever its row, and
//        the k best of S are the k best of all.
//     Any other query (overflow, fewer than k of S at or below U) is
//     marked uncertified; the caller redoes it with the full sort.
#include <cub/device/device_segmented_sort.cuh>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_check.cuh"
#include "exact_pair.cuh"
#include "grid.cuh"
#include "large_k_select.cuh"

namespace knn {
namespace cuda {
namespace {

// The sample: at most this many targets per query (64 KiB of 32-bit keys
// in shared memory for the select).
constexpr int kSample = 16384;
constexpr int kGuessThreads = 256;
constexpr int kWarps = 4;            // collection: warps per block
constexpr int kCollectWarpsWanted = 8192;
constexpr int kMinSegmentColumns = 512;
constexpr int kThreads = 256;
// The rerank takes queries in batches of about this many candidate slots.
constexpr int64_t kRerankSlots = int64_t(1) << 25;

// 32-bit images of floats whose unsigned order is the float order, NaN
// after every number (kNan32), then kExcluded32 (an excluded pair).
constexpr uint32_t kExcluded32 = 0xffffffffu;
constexpr uint32_t kNan32 = 0xfffffffeu;

__device__ __forceinline__ uint32_t float_key(float v) {
  if (v != v) return kNan32;
  if (v == 0.0f) v = 0.0f;
  const uint32_t bits = __float_as_uint(v);
  return (bits >> 31) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float key_float(uint32_t key) {
  return __uint_as_float((key >> 31) ? (key & 0x7fffffffu) : ~key);
}

struct GuessArgs {
  const void *tile = nullptr;  // rows x sample, leading dimension ldc
  int ldc = 0;
  int sample = 0;
  int64_t step = 1;
  int rank = 1;
  int64_t query_base = 0;  // chunk row of tile row 0
  TileValue value;
  const int64_t *query_keys = nullptr;
  const int64_t *target_keys = nullptr;
  uint64_t *guess = nullptr;  // per chunk query
};

// One block per query: the sample's bounds as 32-bit keys in shared
// memory, then a radix select (8 bits a pass) of the rank-th smallest.
template <typename T, int KIND>
__global__ void __launch_bounds__(kGuessThreads) guess_kernel(GuessArgs a) {
  constexpr TileValueKind kKind = static_cast<TileValueKind>(KIND);
  extern __shared__ uint32_t s_key[];
  __shared__ unsigned s_hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_want;
  const int64_t q = a.query_base + blockIdx.x;
  const T *row = static_cast<const T *>(a.tile) + static_cast<int64_t>(blockIdx.x) * a.ldc;
  const bool exclude = a.query_keys != nullptr;
  const int64_t qkey = exclude ? a.query_keys[q] : 0;
  for (int j = threadIdx.x; j < a.sample; j += blockDim.x) {
    const int64_t t = j * a.step;
    uint32_t key = kExcluded32;
    if (!(exclude && a.target_keys[t] == qkey))
      key = float_key(static_cast<float>(a.value.at(kKind, static_cast<float>(row[j]), q, t)));
    s_key[j] = key;
  }
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_want = a.rank - 1;
  }
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) s_hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int j = threadIdx.x; j < a.sample; j += blockDim.x) {
      const uint32_t key = s_key[j];
      if ((key & mask) == prefix) atomicAdd(&s_hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int want = s_want;
      int digit = 255;
      for (int b = 0; b < 256; b++) {
        if (want < static_cast<int>(s_hist[b])) {
          digit = b;
          break;
        }
        want -= static_cast<int>(s_hist[b]);
      }
      s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
      s_want = want;
    }
    mask |= 255u << shift;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const uint32_t key = s_prefix;
    a.guess[q] = key >= kNan32 ? kNanKey : order_key(static_cast<double>(key_float(key)));
  }
}

__global__ void fill_kernel(uint64_t *x, int64_t n, uint64_t v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = v;
}

struct CollectArgs {
  const void *tile = nullptr;
  int64_t ld = 0;
  int nq = 0, nt = 0;
  int segments = 1;
  int64_t query_base = 0, target_base = 0;
  TileValue value;
  const int64_t *query_keys = nullptr;
  const int64_t *target_keys = nullptr;
  const uint64_t *guess = nullptr;
  uint32_t *count = nullptr;
  uint32_t *rows = nullptr;  // query i: slots i * capacity ...
  int capacity = 0;
};

// One warp per (tile row, segment of its columns): the float prefilter of
// TileValue::may_beat_as against U (as select_tiles.cu does against its
// threshold), then the bound itself; survivors are appended (one atomic per
// warp and step).
template <typename T, int KIND>
__global__ void __launch_bounds__(kWarps * 32) collect_kernel(CollectArgs a) {
  constexpr TileValueKind kKind = static_cast<TileValueKind>(KIND);
  constexpr int kUnroll = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tile_row = blockIdx.x * kWarps + warp;
  if (tile_row >= a.nq) return;  // the whole warp leaves
  const int64_t q = a.query_base + tile_row;
  const uint64_t u = a.guess[q];
  // U rounded up to float and widened for the prefilter (see
  // TileValue::may_beat); +inf when every target is wanted.
  const float thr_up = u < kNanKey ? TileValue::prefilter_threshold(key_value(u)) : INFINITY;
  const int seg_len = ((a.nt + a.segments - 1) / a.segments + 31) & ~31;
  const int c_begin = blockIdx.y * seg_len;
  const int c_end = min(a.nt, c_begin + seg_len);
  const T *values = static_cast<const T *>(a.tile) + tile_row * a.ld;
  const bool exclude = a.query_keys != nullptr;
  const int64_t qkey = exclude ? a.query_keys[q] : 0;
  const TileValue::HalfTerms terms = a.value.half_terms(q, a.target_base);
  const float qn = terms.query_norm, qs = terms.query_scale;
  const float *tnorm = terms.target_norm, *tscale = terms.target_scale;
  const unsigned lower_lanes = (1u << lane) - 1;
  uint32_t *rows = a.rows + q * static_cast<int64_t>(a.capacity);

  for (int c0 = c_begin; c0 < c_end; c0 += 32 * kUnroll) {
    T v[kUnroll];
    float tn[kUnroll], ts[kUnroll];
#pragma unroll
    for (int u2 = 0; u2 < kUnroll; u2++) {
      const int c = c0 + u2 * 32 + lane;
      v[u2] = c < c_end ? values[c] : T(0);
      tn[u2] = c < c_end ? tnorm[c] : 0.0f;
      ts[u2] = c < c_end ? tscale[c] : 1.0f;
    }
#pragma unroll
    for (int u2 = 0; u2 < kUnroll; u2++) {
      const int c = c0 + u2 * 32 + lane;
      const float vf = static_cast<float>(v[u2]);
      bool take = c < c_end && a.value.may_beat_as(kKind, vf * (qs * ts[u2]), qn, tn[u2], thr_up);
      if (take) {
        const int64_t t = a.target_base + c;
        take = !(exclude && a.target_keys[t] == qkey) &&
               order_key(a.value.at(kKind, vf, q, t)) <= u;
      }
      const unsigned mask = __ballot_sync(0xffffffffu, take);
      if (mask == 0) continue;
      uint32_t base = 0;
      if (lane == 0) base = atomicAdd(a.count + q, static_cast<uint32_t>(__popc(mask)));
      base = __shfl_sync(0xffffffffu, base, 0);
      const uint32_t pos = base + __popc(mask & lower_lanes);
      if (take && pos < static_cast<uint32_t>(a.capacity))
        rows[pos] = static_cast<uint32_t>(a.target_base + c);
    }
  }
}

// Segment i: slots [i * capacity, i * capacity + min(count_i, capacity)).
__global__ void offsets_kernel(const uint32_t *count, int64_t nq, int capacity, int64_t *begin,
                               int64_t *end) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nq;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    begin[i] = i * capacity;
    end[i] = i * capacity + min(count[i], static_cast<uint32_t>(capacity));
  }
}

struct ExactArgs {
  KnnMetric metric = KNN_METRIC_L2;
  int dim = 0;
  Rows q, t;
  int64_t nq = 0;
  int capacity = 0;
  const uint32_t *count = nullptr;
  const uint32_t *rows = nullptr;  // sorted per query
  uint64_t *keys = nullptr;
  double *dist = nullptr;
  uint32_t *pos = nullptr;  // the slot within the query (row order)
};

// One thread per collected candidate: its exact value (knn_distance.h).
__global__ void exact_kernel(ExactArgs a) {
  const int64_t total = a.nq * a.capacity;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t q = i / a.capacity;
    const uint32_t j = static_cast<uint32_t>(i % a.capacity);
    if (j >= a.count[q]) continue;
    const uint32_t t = a.rows[i];
    const bool cosine = a.metric == KNN_METRIC_COSINE;
    double value, dist;
    exact_pair(a.metric, a.q.x + q * a.dim, a.t.x + static_cast<int64_t>(t) * a.dim, a.dim,
               cosine ? a.q.norm[q] : 0.0f, cosine ? a.t.norm[t] : 0.0f, &value, &dist);
    a.keys[i] = order_key(value);
    a.dist[i] = dist;
    a.pos[i] = j;
  }
}

struct FinishArgs {
  int k = 1;
  int64_t nq = 0;
  int capacity = 0;
  int64_t target_offset = 0;
  const uint32_t *count = nullptr;
  const uint64_t *guess = nullptr;
  const uint64_t *keys = nullptr;   // sorted by (exact key, slot)
  const uint32_t *pos = nullptr;    // their slots
  const uint32_t *rows = nullptr;   // by slot
  const double *dist = nullptr;     // by slot
  ResultArrays out;
  uint8_t *certified = nullptr;
};

// The k best of each query, and its certification (see the header).
__global__ void finish_kernel(FinishArgs a) {
  const int64_t total = a.nq * a.k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t q = i / a.k;
    const int j = static_cast<int>(i % a.k);
    const uint32_t count = a.count[q];
    const int len = static_cast<int>(min(count, static_cast<uint32_t>(a.capacity)));
    const int64_t base = q * a.capacity;
    if (j < len) {
      const uint32_t p = a.pos[base + j];
      a.out.key[i] = a.keys[base + j];
      a.out.row[i] = a.target_offset + a.rows[base + p];
      a.out.dist[i] = a.dist[base + p];
    } else {
      a.out.key[i] = kEmptyKey;
      a.out.row[i] = -1;
      a.out.dist[i] = NAN;
    }
    if (j == 0) {
      const uint64_t u = a.guess[q];
      const bool overflow = count > static_cast<uint32_t>(a.capacity);
      const bool proven =
          !overflow && (u == kNanKey || (len >= a.k && a.keys[base + a.k - 1] <= u));
      a.certified[q] = proven ? 1 : 0;
    }
  }
}

template <typename T, int KIND>
KnnStatus launch_guess(DeviceContext &ctx, const GuessArgs &g, int rows) {
  const size_t smem = static_cast<size_t>(g.sample) * sizeof(uint32_t);
  CUDA_CHECK(ctx, cudaFuncSetAttribute(guess_kernel<T, KIND>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  guess_kernel<T, KIND><<<rows, kGuessThreads, smem, ctx.stream>>>(g);
  CUDA_CHECK_LAUNCH(ctx, "guess_kernel");
  return KNN_OK;
}

template <typename T>
KnnStatus launch_guess_kind(DeviceContext &ctx, const GuessArgs &g, int rows) {
  switch (g.value.kind) {
    case TileValueKind::kBoundL2Half: return launch_guess<T, 7>(ctx, g, rows);
    case TileValueKind::kBoundIpHalf: return launch_guess<T, 8>(ctx, g, rows);
    case TileValueKind::kBoundCosineHalf: return launch_guess<T, 9>(ctx, g, rows);
    default: break;
  }
  ctx.error = "large k: not an fp16 bound";
  return KNN_INTERNAL_ERROR;
}

template <typename T>
KnnStatus launch_collect_kind(DeviceContext &ctx, const CollectArgs &c) {
  const dim3 grid(static_cast<unsigned>(ceil_div(c.nq, kWarps)), c.segments);
  switch (c.value.kind) {
    case TileValueKind::kBoundL2Half:
      collect_kernel<T, 7><<<grid, kWarps * 32, 0, ctx.stream>>>(c);
      break;
    case TileValueKind::kBoundIpHalf:
      collect_kernel<T, 8><<<grid, kWarps * 32, 0, ctx.stream>>>(c);
      break;
    case TileValueKind::kBoundCosineHalf:
      collect_kernel<T, 9><<<grid, kWarps * 32, 0, ctx.stream>>>(c);
      break;
    default:
      ctx.error = "large k: not an fp16 bound";
      return KNN_INTERNAL_ERROR;
  }
  CUDA_CHECK_LAUNCH(ctx, "collect_kernel");
  return KNN_OK;
}

size_t sort_temp_bytes(int64_t q_rows, int capacity) {
  const int64_t items = q_rows * capacity;
  cub::DoubleBuffer<uint32_t> rows(nullptr, nullptr);
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  size_t a = 0, b = 0;
  cub::DeviceSegmentedSort::SortKeys(nullptr, a, rows, items, q_rows,
                                     static_cast<const int64_t *>(nullptr),
                                     static_cast<const int64_t *>(nullptr));
  cub::DeviceSegmentedSort::StableSortPairs(nullptr, b, keys, rows, items, q_rows,
                                            static_cast<const int64_t *>(nullptr),
                                            static_cast<const int64_t *>(nullptr));
  return std::max<size_t>({a, b, 1});
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

LargeKShape large_k_shape(int k, int64_t nt, int64_t tile_elements) {
  LargeKShape s;
  // The sample's GEMM rows have a stride of a multiple of 8 (tensor-core
  // friendly) within one tile.
  const int64_t most = std::max<int64_t>(8, std::min<int64_t>(kSample, tile_elements & ~int64_t(7)));
  s.step = std::max<int64_t>(1, ceil_div(nt, most));
  s.sample = static_cast<int>(std::max<int64_t>(1, ceil_div(nt, s.step)));
  // Each sampled target stands for `per` targets; the sample should hold
  // rk of the k best, and the rank-th of its bounds is taken.
  const double per = static_cast<double>(nt) / s.sample;
  const double rk = k / per;
  const double rank = std::ceil(rk + 3.5 * std::sqrt(rk) + 4.0);
  s.take_all = rank >= s.sample;
  s.rank = static_cast<int>(std::min<double>(rank, s.sample));
  // The collected count is about rank * per, give or take sqrt(rank) * per.
  const int64_t want =
      s.take_all ? nt
                 : static_cast<int64_t>(std::ceil((rank + 5.0 * std::sqrt(rank) + 8.0) * per));
  s.capacity = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(nt, round_up(std::max<int64_t>(want, k), 32))));
  return s;
}

size_t large_k_bytes(int64_t q_rows, int capacity) {
  const size_t slots = static_cast<size_t>(q_rows) * capacity;
  return slots * (3 * 4 + 2 * 8 + 8) + static_cast<size_t>(q_rows) * (8 + 4 + 16) +
         sort_temp_bytes(q_rows, capacity) + 4096;
}

KnnStatus LargeKSelect::allocate(DeviceContext &ctx, int64_t q_rows, int capacity) {
  const size_t slots = static_cast<size_t>(q_rows) * capacity;
  for (int b = 0; b < 2; b++) {
    KNN_TRY(rows_[b].allocate(ctx, slots, "large-k candidates"));
    KNN_TRY(keys_[b].allocate(ctx, slots, "large-k candidates"));
  }
  KNN_TRY(pos_.allocate(ctx, slots, "large-k candidates"));
  KNN_TRY(dist_.allocate(ctx, slots, "large-k candidates"));
  KNN_TRY(guess_.allocate(ctx, q_rows, "large-k guesses"));
  KNN_TRY(count_.allocate(ctx, q_rows, "large-k counts"));
  KNN_TRY(begin_.allocate(ctx, q_rows, "large-k offsets"));
  KNN_TRY(end_.allocate(ctx, q_rows, "large-k offsets"));
  KNN_TRY(temp_.allocate(ctx, sort_temp_bytes(q_rows, capacity), "large-k sort"));
  capacity_ = capacity;
  q_rows_ = q_rows;
  return KNN_OK;
}

KnnStatus LargeKSelect::run(DeviceContext &ctx, const LargeKArgs &a, int64_t *exact_pairs) {
  const int64_t nq = a.q.n, nt = a.t.n;
  if (nq <= 0) return KNN_OK;
  if (nq > q_rows_ || !is_half_kind(a.value.kind) || a.tile == nullptr) {
    ctx.error = "large k: block beyond its buffers";
    return KNN_INTERNAL_ERROR;
  }
  if (nt <= 0) {
    KNN_TRY(launch_clear_results(ctx, a.out, nq, a.k));
    CUDA_CHECK(ctx, cudaMemsetAsync(a.certified, 1, nq, ctx.stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    return KNN_OK;
  }
  const int64_t tile_elements = static_cast<int64_t>(a.tile_rows) * a.tile_cols;
  const LargeKShape s = large_k_shape(a.k, nt, tile_elements);
  const int cap = std::min(s.capacity, capacity_);

  // 1. The guesses.
  if (s.take_all) {
    fill_kernel<<<grid_stride_blocks(nq, kThreads), kThreads, 0, ctx.stream>>>(guess_.get(), nq,
                                                                               kNanKey);
    CUDA_CHECK_LAUNCH(ctx, "fill_kernel");
  } else {
    GuessArgs g;
    g.tile = a.tile;
    g.ldc = static_cast<int>(round_up(s.sample, 8));
    g.sample = s.sample;
    g.step = s.step;
    g.rank = s.rank;
    g.value = a.value;
    g.query_keys = a.q.keys;
    g.target_keys = a.t.keys;
    g.guess = guess_.get();
    const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(tile_elements / g.ldc, 65535));
    for (int64_t q0 = 0; q0 < nq; q0 += batch) {
      const int rows = static_cast<int>(std::min(batch, nq - q0));
      KNN_TRY(a.gemm(q0, rows, 0, s.step, s.sample, a.tile, g.ldc));
      g.query_base = q0;
      KNN_TRY(a.half_tiles ? launch_guess_kind<__half>(ctx, g, rows)
                           : launch_guess_kind<float>(ctx, g, rows));
      // A cancel is noticed within one batch (its GEMM grows with dim).
      CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
      KNN_TRY(ctx.cancel_point());
    }
  }

  // 2. The collection, one row of tiles at a time (a cancel is noticed
  // within one row).
  CUDA_CHECK(ctx, cudaMemsetAsync(count_.get(), 0, nq * sizeof(uint32_t), ctx.stream));
  CollectArgs c;
  c.tile = a.tile;
  c.ld = a.tile_cols;
  c.value = a.value;
  c.query_keys = a.q.keys;
  c.target_keys = a.t.keys;
  c.guess = guess_.get();
  c.count = count_.get();
  c.rows = rows_[0].get();
  c.capacity = cap;
  for (int64_t q0 = 0; q0 < nq; q0 += a.tile_rows) {
    c.nq = static_cast<int>(std::min<int64_t>(a.tile_rows, nq - q0));
    c.query_base = q0;
    for (int64_t t0 = 0; t0 < nt; t0 += a.tile_cols) {
      c.nt = static_cast<int>(std::min<int64_t>(a.tile_cols, nt - t0));
      c.target_base = t0;
      const int64_t want = ceil_div(kCollectWarpsWanted, c.nq);
      c.segments = static_cast<int>(
          std::max<int64_t>(1, std::min<int64_t>(want, c.nt / kMinSegmentColumns)));
      KNN_TRY(a.gemm(q0, c.nq, t0, 1, c.nt, a.tile, a.tile_cols));
      KNN_TRY(a.half_tiles ? launch_collect_kind<__half>(ctx, c) : launch_collect_kind<float>(ctx, c));
    }
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    KNN_TRY(ctx.cancel_point());
  }

  // 3. Per batch of queries (a cancel is noticed between batches): the
  // rows sorted, their exact values, a stable sort by exact key, the k best.
  // Fewer slots a batch for long rows: each candidate's exact value reads
  // its whole row, so a batch takes about the same time at any dim.
  const int64_t slots = kRerankSlots / std::max(1, a.dim / 1024);
  const int64_t batch = std::max<int64_t>(1, slots / cap);
  for (int64_t b0 = 0; b0 < nq; b0 += batch) {
    const int64_t nb = std::min(batch, nq - b0);
    const int64_t items = nb * cap;
    const size_t at = static_cast<size_t>(b0) * cap;
    offsets_kernel<<<grid_stride_blocks(nb, kThreads), kThreads, 0, ctx.stream>>>(
        count_.get() + b0, nb, cap, begin_.get(), end_.get());
    CUDA_CHECK_LAUNCH(ctx, "offsets_kernel");
    cub::DoubleBuffer<uint32_t> rows(rows_[0].get() + at, rows_[1].get() + at);
    size_t bytes = temp_.bytes();
    CUDA_CHECK(ctx, cub::DeviceSegmentedSort::SortKeys(temp_.get(), bytes, rows, items, nb,
                                                       begin_.get(), end_.get(), ctx.stream));
    const uint32_t *sorted_rows = rows.Current();
    uint32_t *free_rows = rows.Alternate();
    ExactArgs e;
    e.metric = a.metric;
    e.dim = a.dim;
    e.q = a.q.slice(b0, nb, a.dim);
    e.t = a.t;
    e.nq = nb;
    e.capacity = cap;
    e.count = count_.get() + b0;
    e.rows = sorted_rows;
    e.keys = keys_[0].get() + at;
    e.dist = dist_.get() + at;
    e.pos = free_rows;
    exact_kernel<<<grid_stride_blocks(items, kThreads), kThreads, 0, ctx.stream>>>(e);
    CUDA_CHECK_LAUNCH(ctx, "exact_kernel");
    cub::DoubleBuffer<uint64_t> keys(keys_[0].get() + at, keys_[1].get() + at);
    cub::DoubleBuffer<uint32_t> pos(free_rows, pos_.get() + at);
    bytes = temp_.bytes();
    CUDA_CHECK(ctx, cub::DeviceSegmentedSort::StableSortPairs(temp_.get(), bytes, keys, pos,
                                                              items, nb, begin_.get(),
                                                              end_.get(), ctx.stream));
    FinishArgs f;
    f.k = a.k;
    f.nq = nb;
    f.capacity = cap;
    f.target_offset = a.t.offset;
    f.count = count_.get() + b0;
    f.guess = guess_.get() + b0;
    f.keys = keys.Current();
    f.pos = pos.Current();
    f.rows = sorted_rows;
    f.dist = dist_.get() + at;
    const int64_t o = b0 * a.k;
    f.out = ResultArrays{a.out.key + o, a.out.row + o, a.out.dist + o};
    f.certified = a.certified + b0;
    finish_kernel<<<grid_stride_blocks(nb * a.k, kThreads), kThreads, 0, ctx.stream>>>(f);
    CUDA_CHECK_LAUNCH(ctx, "finish_kernel");
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    KNN_TRY(ctx.cancel_point());
  }

  std::vector<uint32_t> counts(nq);
  CUDA_CHECK(ctx, cudaMemcpyAsync(counts.data(), count_.get(), nq * sizeof(uint32_t),
                                  cudaMemcpyDeviceToHost, ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  if (exact_pairs != nullptr)
    for (uint32_t n : counts) *exact_pairs += std::min<uint32_t>(n, cap);
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
