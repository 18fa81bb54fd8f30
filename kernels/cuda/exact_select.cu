// exact_select.cu -- exact distance tiles and the k-selection in one
// kernel, for L2, L1 and IP with lists of up to kMaxFusedCap entries: the
// distances never go through device memory.
//
// A block owns 32 queries and one segment of the targets, which it walks
// in tiles of 64. Each tile is computed exactly as in exact_tiles.cu
// (canonical lanes, knn_fold_lanes); then each thread tests its 8 pairs
// against its queries' thresholds (the kp-th value kept so far) and appends
// the few that pass to the query's buffer in shared memory. When a buffer
// could overflow on the next tile, a warp sorts list + buffer (bitonic) and
// keeps the kp best. Global loads for the next (tile, chunk) step are
// issued before the current step is computed (register prefetch).
//
// Why a plain value test is exact here: a block walks its segment in
// increasing row order, so a new pair always has a larger row than every
// kept entry; it belongs to the kp best only if its value is strictly
// below the threshold's (ties go to the smaller row, already kept). NaN
// sorts after every number: a NaN never passes a numeric threshold, and
// any number passes a NaN one.
#include "bitonic.cuh"
#include "brute_kernels.cuh"
#include "cuda_check.cuh"
#include "lane_ops.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int TY = 16, TX = 16;     // thread grid: queries x targets
constexpr int MQ = 2, MT = 4;       // pairs per thread
constexpr int BQ = TY * MQ;         // 32 queries per block
constexpr int BT = TX * MT;         // 64 targets per tile
constexpr int kChunk = 32;          // dimensions staged per step
constexpr int kStride = kChunk + 4;
constexpr int kQSlots = BQ * kChunk / kThreads;  // 4 staged query values per thread
constexpr int kTSlots = BT * kChunk / kThreads;  // 8 staged target values per thread

// Entries per query in shared memory: the list (cap) plus a buffer that
// takes at least one tile's survivors (BT) between merges.
template <int CAP>
struct Layout {
  static constexpr int kTotal = CAP <= 32 ? 128 : 256;
  static constexpr int kMergeAbove = kTotal - CAP - BT;  // merge when the buffer holds more
  static constexpr size_t kDynamicBytes = static_cast<size_t>(BQ) * kTotal * 12;
};

enum ThresholdState { kNotFull = 0, kNumeric = 1, kNanThreshold = 2 };

struct Staging {
  float q[kQSlots];
  float t[kTSlots];
  int64_t tkey;
};

template <int OP, int CAP>
__global__ void __launch_bounds__(kThreads, 2) fused_select_kernel(FusedSelectArgs a) {
  using L = Layout<CAP>;
  extern __shared__ __align__(16) unsigned char dyn[];
  uint64_t *skey = reinterpret_cast<uint64_t *>(dyn);                      // [BQ][kTotal]
  uint32_t *srow = reinterpret_cast<uint32_t *>(skey + BQ * L::kTotal);    // [BQ][kTotal]
  __shared__ __align__(16) float sq[BQ * kStride];
  __shared__ __align__(16) float st[BT * kStride];
  __shared__ int64_t s_tkey[BT];
  __shared__ int64_t s_qkey[BQ];
  __shared__ int s_count[BQ];
  __shared__ float s_thr[BQ];
  __shared__ int s_state[BQ];

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int tx = tid % TX, ty = tid / TX;
  const int q0 = blockIdx.y * BQ;  // first query (launch row) of the block
  const int s = blockIdx.x;        // target segment
  const int dim = a.dim;
  const int seg_len = ((a.nt + a.lists.segments - 1) / a.lists.segments + BT - 1) / BT * BT;
  const int t_begin = s * seg_len;
  const int t_end = min(a.nt, t_begin + seg_len);
  const bool exclude = a.query_keys != nullptr;
  const int kp = a.lists.kp;

  // ---- the lists of the block's queries, and their thresholds ----
  for (int i = tid; i < BQ * L::kTotal; i += kThreads) {
    const int qq = i / L::kTotal, j = i % L::kTotal;
    const int q = q0 + qq;
    uint64_t key = kEmptyKey;
    uint32_t row = kEmptyRow;
    if (j < CAP && q < a.nq) {
      const int64_t at = ((a.query_base + q) * a.lists.segments + s) * CAP + j;
      key = a.lists.key[at];
      row = a.lists.row[at];
    }
    skey[i] = key;
    srow[i] = row;
  }
  if (tid < BQ) {
    const int q = q0 + tid;
    s_count[tid] = 0;
    s_qkey[tid] = (exclude && q < a.nq) ? a.query_keys[a.query_base + q] : 0;
  }
  __syncthreads();
  auto update_threshold = [&](int qq) {
    const uint64_t key = skey[qq * L::kTotal + kp - 1];
    s_state[qq] = key == kEmptyKey ? kNotFull : key == kNanKey ? kNanThreshold : kNumeric;
    s_thr[qq] = key < kNanKey ? static_cast<float>(key_value(key)) : 0.0f;
  };
  if (tid < BQ) update_threshold(tid);

  // Sorts list + buffer of query qq (one warp) and keeps the kp best.
  auto merge = [&](int qq) {
    uint64_t *k = skey + qq * L::kTotal;
    uint32_t *r = srow + qq * L::kTotal;
    bitonic_sort(k, r, nullptr, L::kTotal, lane, 32, WarpSync());
    for (int i = kp + lane; i < L::kTotal; i += 32) {
      k[i] = kEmptyKey;
      r[i] = kEmptyRow;
    }
    __syncwarp();
    if (lane == 0) {
      s_count[qq] = 0;
      update_threshold(qq);
    }
    __syncwarp();
  };

  // ---- staging: global -> registers (prefetch) -> shared memory ----
  Staging stage;
  auto load = [&](int t0, int d0) {
    const int cols = min(kChunk, ((dim - d0) + 3) & ~3);
    const float inv = 1.0f / cols;
#pragma unroll
    for (int u = 0; u < kQSlots; u++) {
      const int i = tid + u * kThreads;
      float v = 0.0f;
      if (i < BQ * cols) {
        const int r = static_cast<int>((i + 0.5f) * inv), c = i - r * cols;
        const int q = q0 + r, d = d0 + c;
        if (q < a.nq && d < dim) v = a.queries[(a.query_base + q) * dim + d];
      }
      stage.q[u] = v;
    }
#pragma unroll
    for (int u = 0; u < kTSlots; u++) {
      const int i = tid + u * kThreads;
      float v = 0.0f;
      if (i < BT * cols) {
        const int r = static_cast<int>((i + 0.5f) * inv), c = i - r * cols;
        const int t = t0 + r, d = d0 + c;
        if (t < t_end && d < dim) v = a.targets[static_cast<int64_t>(t) * dim + d];
      }
      stage.t[u] = v;
    }
    stage.tkey = 0;
    if (exclude && d0 == 0 && tid < BT && t0 + tid < t_end) stage.tkey = a.target_keys[t0 + tid];
  };
  auto store = [&](int d0) {
    const int cols = min(kChunk, ((dim - d0) + 3) & ~3);
    const float inv = 1.0f / cols;
#pragma unroll
    for (int u = 0; u < kQSlots; u++) {
      const int i = tid + u * kThreads;
      if (i < BQ * cols) {
        const int r = static_cast<int>((i + 0.5f) * inv), c = i - r * cols;
        sq[r * kStride + c] = stage.q[u];
      }
    }
#pragma unroll
    for (int u = 0; u < kTSlots; u++) {
      const int i = tid + u * kThreads;
      if (i < BT * cols) {
        const int r = static_cast<int>((i + 0.5f) * inv), c = i - r * cols;
        st[r * kStride + c] = stage.t[u];
      }
    }
    if (d0 == 0 && tid < BT) s_tkey[tid] = stage.tkey;
  };

  float acc[MQ][MT][KNN_LANES];
  clear_lanes(acc);

  int t0 = t_begin, d0 = 0;
  if (t0 < t_end) load(t0, d0);
  while (t0 < t_end) {
    __syncthreads();  // the previous step's readers of sq/st are done
    store(d0);
    __syncthreads();
    // Prefetch the next step while this one is computed.
    const int chunk_dims = min(kChunk, dim - d0);
    const bool last_chunk = d0 + kChunk >= dim;
    const int next_t0 = last_chunk ? t0 + BT : t0;
    const int next_d0 = last_chunk ? 0 : d0 + kChunk;
    if (next_t0 < t_end) load(next_t0, next_d0);

    add_staged_chunk<OP, MQ, MT, TX, kChunk, kStride>(acc, sq, st, tx, ty, chunk_dims);

    if (last_chunk) {
      // Filter the tile's pairs against the thresholds.
#pragma unroll
      for (int m = 0; m < MQ; m++) {
        const int qq = ty * MQ + m;
        const bool q_ok = q0 + qq < a.nq;
        const int state = s_state[qq];
        const float thr = s_thr[qq];
        const int64_t qkey = s_qkey[qq];
#pragma unroll
        for (int n = 0; n < MT; n++) {
          const int tl = tx + n * TX;
          const int t = t0 + tl;
          float v = knn_fold_lanes(acc[m][n]);
          if (OP == kProduct) v = -v;  // IP: the value is -dot
          const bool pass = q_ok && t < t_end && !(exclude && s_tkey[tl] == qkey) &&
                            (state == kNotFull || (state == kNumeric ? v < thr : v == v));
          if (pass) {
            const int pos = CAP + atomicAdd(&s_count[qq], 1);
            skey[qq * L::kTotal + pos] = order_key(static_cast<double>(v));
            srow[qq * L::kTotal + pos] = static_cast<uint32_t>(t);
          }
#pragma unroll
          for (int j = 0; j < KNN_LANES; j++) acc[m][n][j] = 0.0f;
        }
      }
      __syncthreads();
      for (int qq = warp; qq < BQ; qq += kThreads / 32)
        if (s_count[qq] > L::kMergeAbove) merge(qq);
    }
    t0 = next_t0;
    d0 = next_d0;
  }
  __syncthreads();
  for (int qq = warp; qq < BQ; qq += kThreads / 32)
    if (s_count[qq] > 0) merge(qq);
  __syncthreads();
  for (int i = tid; i < BQ * CAP; i += kThreads) {
    const int qq = i / CAP, j = i % CAP;
    const int q = q0 + qq;
    if (q >= a.nq) continue;
    const int64_t at = ((a.query_base + q) * a.lists.segments + s) * CAP + j;
    a.lists.key[at] = skey[qq * L::kTotal + j];
    a.lists.row[at] = srow[qq * L::kTotal + j];
  }
}

template <int OP, int CAP>
KnnStatus launch_typed(DeviceContext &ctx, const FusedSelectArgs &a) {
  const size_t bytes = Layout<CAP>::kDynamicBytes;
  CUDA_CHECK(ctx, cudaFuncSetAttribute(fused_select_kernel<OP, CAP>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  dim3 grid(a.lists.segments, (a.nq + BQ - 1) / BQ);
  fused_select_kernel<OP, CAP><<<grid, kThreads, bytes, ctx.stream>>>(a);
  CUDA_CHECK_LAUNCH(ctx, "fused_select_kernel");
  return KNN_OK;
}

template <int OP>
KnnStatus launch_op(DeviceContext &ctx, const FusedSelectArgs &a) {
  switch (a.lists.cap) {
    case 32: return launch_typed<OP, 32>(ctx, a);
    case 64: return launch_typed<OP, 64>(ctx, a);
    case 128: return launch_typed<OP, 128>(ctx, a);
  }
  ctx.error = "fused select: unsupported list capacity";
  return KNN_INTERNAL_ERROR;
}

}  // namespace

bool fused_select_supports(KnnMetric metric, int cap) {
  return metric != KNN_METRIC_COSINE && cap <= kMaxFusedCap;
}

int fused_select_rows_per_block() { return BQ; }

KnnStatus launch_fused_select(DeviceContext &ctx, const FusedSelectArgs &a) {
  if (a.nq <= 0 || a.nt <= 0) return KNN_OK;
  const CandidateLists &l = a.lists;
  if (l.kp < 1 || l.kp > l.cap || !fused_select_supports(a.metric, l.cap)) {
    ctx.error = "fused select: arguments out of range";
    return KNN_INTERNAL_ERROR;
  }
  switch (a.metric) {
    case KNN_METRIC_L2: return launch_op<kSquaredDiff>(ctx, a);
    case KNN_METRIC_L1: return launch_op<kAbsDiff>(ctx, a);
    case KNN_METRIC_IP: return launch_op<kProduct>(ctx, a);
    default: break;
  }
  ctx.error = "fused select: unsupported metric";
  return KNN_INTERNAL_ERROR;
}

}  // namespace cuda
}  // namespace knn
