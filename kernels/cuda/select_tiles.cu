// select_tiles.cu -- streaming k-selection over distance tiles.
//
// Each query keeps, per target segment, a sorted list of its kp best
// (value, row) entries seen so far (device memory, carried from tile to
// tile). One warp handles one (query, segment) of a tile: it loads the
// list into shared memory, reads its stretch of the tile row (coalesced),
// and a lane keeps a pair only when it beats the current kp-th entry (the
// threshold; after the first few tiles almost nothing passes; for float
// tiles a cheap float test with proven margins, TileValue::may_beat,
// rejects most pairs before the exact (key, row) test). Survivors
// are appended to a buffer behind the list (ballot + popc give each lane
// its slot); when the buffer is nearly full, the warp sorts list + buffer
// (bitonic) and keeps the kp best. The ordering is the total (key, row)
// order of select_keys.cuh, so ties are kept by smaller row, as the exact
// result requires. Splitting the targets into segments gives small query
// batches enough warps (down to one query: many warps over its targets).
// fp16 tiles (the fp16 filter's) have a kernel of their own that reads 8
// consecutive columns per lane and load (select_half_tile_kernel).
#include <cuda_fp16.h>

#include <cstdint>

#include "bitonic.cuh"
#include "brute_kernels.cuh"
#include "cuda_check.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 8;  // tile loads in flight per lane (float and double tiles)
// fp16 tiles: each lane loads kHalfVec consecutive halves at once (16
// bytes), kHalfLoads such loads per step, and the matching target terms as
// float4s: 0.6 load instructions per value instead of 3.
constexpr int kHalfVec = 8;
constexpr int kHalfLoads = 2;
// At most 64 registers: 8 blocks of 4 warps per multiprocessor, so that
// the 4096 warps of a 4096-row tile run in one wave on 132 multiprocessors.
constexpr int kHalfBlocksPerSm = 8;

// Shared-memory slots of a warp's list: CAP for the list, the rest a
// buffer for new entries. At least 128: with CAP = 32 (k <= 16) a buffer of
// only 32 slots was sorted into the list after every step that took an
// entry: ncu on an H200 counted 10.7 M shared-load and 6.3 M shared-store
// wavefronts in one 4096 x 16384 fp16 tile of the 300000 x 768 k = 10 join
// (its third column of tiles), with L1/TEX the busiest unit (79 %); with
// 96 slots the buffer takes many steps' entries per sort.
__host__ __device__ constexpr int list_slots(int cap) { return 2 * cap > 128 ? 2 * cap : 128; }

// The list of one (query, segment) that a warp fills: the kp best entries
// so far, sorted, then a buffer for new ones (list_slots(CAP) in all,
// shared memory), and the thresholds the tests compare with. The
// thresholds are those of the last sort: until the next one a lane may
// take entries that the buffered ones already beat, which the sort drops.
// OUTLINED: the sort is a called function, not inlined into the caller's
// loop: the fp16 kernel's loop then keeps its values in registers instead
// of spilling them (64 registers, see kHalfBlocksPerSm).
template <int CAP, bool OUTLINED = false>
struct WarpList {
  static constexpr int kSlots = list_slots(CAP);
  uint64_t *key;
  uint32_t *row;
  int kp;
  int lane;
  int buffered = 0;
  uint64_t thr_key;
  uint32_t thr_row;
  // The threshold's value rounded up to float and widened by 2^-18 of
  // itself, for the prefilter (the widening absorbs the rounding of the
  // prefilter's own float sum, see TileValue::may_beat); +inf while the
  // list is not full or its threshold is NaN (no prefiltering).
  float thr_up;
  double thr_d;  // the threshold's value (+inf likewise), for double tiles

  // The calling warp's list `list` of `lists`, in the warp's slots of
  // the block's shared memory (kWarps warps a block).
  static __device__ __forceinline__ WarpList of_warp(const CandidateLists &lists, int64_t list) {
    __shared__ uint64_t s_key[kWarps][kSlots];
    __shared__ uint32_t s_row[kWarps][kSlots];
    const int warp = threadIdx.x / 32;
    WarpList w{s_key[warp], s_row[warp], lists.kp, static_cast<int>(threadIdx.x % 32)};
    for (int i = w.lane; i < kSlots; i += 32) {
      w.key[i] = i < CAP ? lists.key[list + i] : kEmptyKey;
      w.row[i] = i < CAP ? lists.row[list + i] : kEmptyRow;
    }
    __syncwarp();
    w.thresholds();
    return w;
  }

  __device__ __forceinline__ void thresholds() {
    thr_key = key[kp - 1];
    thr_row = row[kp - 1];
    if (thr_key >= kNanKey) {
      thr_up = INFINITY;
      thr_d = INFINITY;
    } else {
      thr_d = key_value(thr_key);
      thr_up = TileValue::prefilter_threshold(thr_d);
    }
  }

  // Called by all lanes together: the lanes whose `take` is set append
  // (k, t) to the buffer (ballot + popc give each its slot); a nearly full
  // buffer is sorted into the list (bitonic), which keeps the kp best.
  __device__ __forceinline__ void offer(bool take, uint64_t k, uint32_t t) {
    const unsigned mask = __ballot_sync(0xffffffffu, take);
    if (take) {
      const int pos = CAP + buffered + __popc(mask & ((1u << lane) - 1));
      key[pos] = k;
      row[pos] = t;
    }
    buffered += __popc(mask);
    if (buffered > kSlots - CAP - 32) {  // room for the next offer
      if constexpr (OUTLINED)
        merge_outlined();
      else
        merge();
    }
  }

  __device__ __forceinline__ void merge() {
    __syncwarp();
    bitonic_sort(key, row, nullptr, kSlots, lane, 32, WarpSync());
    for (int i = kp + lane; i < kSlots; i += 32) {
      key[i] = kEmptyKey;
      row[i] = kEmptyRow;
    }
    __syncwarp();
    buffered = 0;
    thresholds();
  }

  __device__ __noinline__ void merge_outlined() { merge(); }

  __device__ __forceinline__ void store(const CandidateLists &lists, int64_t list) {
    if (buffered > 0) merge();
    __syncwarp();
    for (int i = lane; i < CAP; i += 32) {
      lists.key[list + i] = key[i];
      lists.row[list + i] = row[i];
    }
  }
};

// This warp's tile row, query and list in the launch, or false when the
// launch has no row for it (then the whole warp leaves).
template <int CAP>
__device__ __forceinline__ bool warp_row(const SelectTileArgs &a, int *tile_row, int64_t *q,
                                         int64_t *list) {
  *tile_row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (*tile_row >= a.nq) return false;
  *q = a.query_base + *tile_row;
  *list = (*q * a.lists.segments + blockIdx.y) * CAP;
  return true;
}

// The stretch [c_begin, c_end) of the tile's columns that segment s reads.
__device__ __forceinline__ void segment_columns(const SelectTileArgs &a, int s, int *c_begin,
                                                int *c_end) {
  const int seg_len = ((a.nt + a.lists.segments - 1) / a.lists.segments + 31) & ~31;
  *c_begin = s * seg_len;
  *c_end = min(a.nt, *c_begin + seg_len);
}

// T: the tile's element type (float or double); KIND: the TileValueKind (a
// constant, so that the loop holds only its case). Float tiles go through
// the float prefilter of TileValue::may_beat_as (for the fp16 kinds they
// hold the fp16 filter's dots unrounded); double (DGEMM) tiles compute the
// bound directly (TileValue::bound_l2_double, the only kind of double
// tiles), with the targets' double norms loaded together with the tile
// values. A step loads kUnroll values per lane and prefilters them all;
// only when some lane may keep one does the warp walk them again (rarely,
// once the lists are warm), reloading what the exact test needs.
template <int CAP, typename T, int KIND>
__global__ void __launch_bounds__(kWarps * 32) select_tile_kernel(SelectTileArgs a) {
  constexpr bool kDouble = sizeof(T) == sizeof(double);
  constexpr TileValueKind kKind = static_cast<TileValueKind>(KIND);
  constexpr bool kNorms =
      !kDouble && (kKind == TileValueKind::kExactCosine || kKind >= TileValueKind::kBoundL2);
  constexpr bool kScales = !kDouble && is_half_kind(kKind);
  const int lane = threadIdx.x % 32;
  int tile_row;
  int64_t q, list;
  if (!warp_row<CAP>(a, &tile_row, &q, &list)) return;  // no block barriers below
  WarpList<CAP> w = WarpList<CAP>::of_warp(a.lists, list);
  int c_begin, c_end;
  segment_columns(a, blockIdx.y, &c_begin, &c_end);
  const T *values =
      reinterpret_cast<const T *>(kDouble ? static_cast<const void *>(a.tile_d)
                                          : static_cast<const void *>(a.tile)) +
      tile_row * a.ld;
  const bool exclude = a.query_keys != nullptr;
  const int64_t qkey = exclude ? a.query_keys[q] : 0;
  const float qn = kNorms ? a.value.query_norm[q] : 0.0f;
  const float *tnorm = a.value.target_norm + a.target_base;
  const float qs = kScales ? a.value.query_scale[q] : 1.0f;
  const float *tscale = kScales ? a.value.target_scale + a.target_base : nullptr;
  const double qn_d = kDouble ? a.value.query_norm_d[q] : 0.0;
  const double *tnorm_d = kDouble ? a.value.target_norm_d + a.target_base : nullptr;

  for (int c0 = c_begin; c0 < c_end; c0 += 32 * kUnroll) {
    unsigned maybe_bits = 0;
    {
      T v[kUnroll];
      float tn[kUnroll];
      float ts[kUnroll];
      double tn_d[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; u++) {
        const int c = c0 + u * 32 + lane;
        v[u] = c < c_end ? values[c] : T(0);
        if constexpr (kNorms) tn[u] = c < c_end ? tnorm[c] : 0.0f;
        else tn[u] = 0.0f;
        if constexpr (kScales) ts[u] = c < c_end ? tscale[c] : 1.0f;
        else ts[u] = 1.0f;
        if constexpr (kDouble) tn_d[u] = c < c_end ? tnorm_d[c] : 0.0;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; u++) {
        const int c = c0 + u * 32 + lane;
        bool maybe;
        if constexpr (kDouble) {
          maybe = c < c_end && !(a.value.bound_l2_double(v[u], qn_d, tn_d[u]) > w.thr_d);
        } else {
          // The fp16 kinds' dots are scaled: the prefilter takes them unscaled.
          const float vp = kScales ? static_cast<float>(v[u]) * (qs * ts[u]) : static_cast<float>(v[u]);
          maybe = c < c_end && a.value.may_beat_as(kKind, vp, qn, tn[u], w.thr_up);
        }
        maybe_bits |= maybe ? 1u << u : 0u;
      }
    }
    if (!__any_sync(0xffffffffu, maybe_bits != 0)) continue;  // the common case
#pragma unroll 1
    for (int u = 0; u < kUnroll; u++) {
      const bool maybe = (maybe_bits >> u) & 1u;
      if (!__any_sync(0xffffffffu, maybe)) continue;
      const int c = c0 + u * 32 + lane;
      const int64_t t = a.target_base + c;
      bool take = false;
      uint64_t k = kEmptyKey;
      if (maybe && !(exclude && a.target_keys[t] == qkey)) {
        if constexpr (kDouble)
          k = order_key(a.value.bound_l2_double(values[c], qn_d, tnorm_d[c]));
        else
          k = order_key(a.value.at(kKind, static_cast<float>(values[c]), q, t));
        take = entry_before(k, static_cast<uint32_t>(t), w.thr_key, w.thr_row);
      }
      w.offer(take, k, static_cast<uint32_t>(t));
    }
  }
  w.store(a.lists, list);
}

// Value e (0..7) of eight halves packed in a uint4.
__device__ __forceinline__ float half_at(const uint4 &r, int e) {
  const unsigned word = e < 2 ? r.x : e < 4 ? r.y : e < 6 ? r.z : r.w;
  return __half2float(__ushort_as_half(static_cast<unsigned short>(word >> (16 * (e % 2)))));
}

__device__ __forceinline__ float float_at(const float4 &f, int e) {
  return e == 0 ? f.x : e == 1 ? f.y : e == 2 ? f.z : f.w;
}

// The fp16 tiles (the fp16 filter's scaled dots, fp16 kinds only), as
// select_tile_kernel with float tiles, but each lane reads kHalfVec
// consecutive columns per load: one 16-byte load of the tile and four of
// the target norms and scales, where the whole group lies in the segment
// (launch_cap checks the alignment this needs), else element by element.
// The order in which the columns are offered does not matter: a list
// keeps the kp best of everything offered to it.
template <int CAP, int KIND>
__global__ void __launch_bounds__(kWarps * 32, kHalfBlocksPerSm)
    select_half_tile_kernel(SelectTileArgs a) {
  constexpr TileValueKind kKind = static_cast<TileValueKind>(KIND);
  constexpr int kPerLane = kHalfVec * kHalfLoads;
  constexpr int kStep = 32 * kPerLane;
  const int lane = threadIdx.x % 32;
  int tile_row;
  int64_t q, list;
  if (!warp_row<CAP>(a, &tile_row, &q, &list)) return;  // no block barriers below
  WarpList<CAP, true> w = WarpList<CAP, true>::of_warp(a.lists, list);
  int c_begin, c_end;
  segment_columns(a, blockIdx.y, &c_begin, &c_end);
  const __half *values = reinterpret_cast<const __half *>(a.tile_h) + tile_row * a.ld;
  const bool exclude = a.query_keys != nullptr;
  const int64_t qkey = exclude ? a.query_keys[q] : 0;
  const TileValue::HalfTerms terms = a.value.half_terms(q, a.target_base);
  const float qn = terms.query_norm, qs = terms.query_scale;
  const float *tnorm = terms.target_norm, *tscale = terms.target_scale;

  for (int c0 = c_begin; c0 < c_end; c0 += kStep) {
    unsigned maybe_bits = 0;
    {
      uint4 h[kHalfLoads];
      float4 tn[2 * kHalfLoads], ts[2 * kHalfLoads];
#pragma unroll
      for (int l = 0; l < kHalfLoads; l++) {
        const int c = c0 + l * 32 * kHalfVec + lane * kHalfVec;
        if (c + kHalfVec <= c_end) {
          h[l] = *reinterpret_cast<const uint4 *>(values + c);
          tn[2 * l] = *reinterpret_cast<const float4 *>(tnorm + c);
          tn[2 * l + 1] = *reinterpret_cast<const float4 *>(tnorm + c + 4);
          ts[2 * l] = *reinterpret_cast<const float4 *>(tscale + c);
          ts[2 * l + 1] = *reinterpret_cast<const float4 *>(tscale + c + 4);
        } else {
          unsigned bits[kHalfVec / 2] = {};
          float n[kHalfVec], s[kHalfVec];
#pragma unroll
          for (int e = 0; e < kHalfVec; e++) {
            const bool in = c + e < c_end;
            bits[e / 2] |= static_cast<unsigned>(in ? __half_as_ushort(values[c + e]) : 0)
                           << (16 * (e % 2));
            n[e] = in ? tnorm[c + e] : 0.0f;
            s[e] = in ? tscale[c + e] : 1.0f;
          }
          h[l] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
          tn[2 * l] = make_float4(n[0], n[1], n[2], n[3]);
          tn[2 * l + 1] = make_float4(n[4], n[5], n[6], n[7]);
          ts[2 * l] = make_float4(s[0], s[1], s[2], s[3]);
          ts[2 * l + 1] = make_float4(s[4], s[5], s[6], s[7]);
        }
      }
#pragma unroll
      for (int l = 0; l < kHalfLoads; l++) {
        const int c = c0 + l * 32 * kHalfVec + lane * kHalfVec;
#pragma unroll
        for (int e = 0; e < kHalfVec; e++) {
          const float tne = float_at(tn[2 * l + e / 4], e % 4);
          const float tse = float_at(ts[2 * l + e / 4], e % 4);
          // The tiles hold scaled dots: the prefilter takes them unscaled.
          const float vp = half_at(h[l], e) * (qs * tse);
          // & rather than &&: no branch per value (see may_beat_as).
          const bool maybe = (c + e < c_end) & a.value.may_beat_as(kKind, vp, qn, tne, w.thr_up);
          maybe_bits |= maybe ? 1u << (l * kHalfVec + e) : 0u;
        }
      }
    }
    if (!__any_sync(0xffffffffu, maybe_bits != 0)) continue;  // the common case
#pragma unroll 1
    for (int u = 0; u < kPerLane; u++) {
      const bool maybe = (maybe_bits >> u) & 1u;
      if (!__any_sync(0xffffffffu, maybe)) continue;
      const int c = c0 + (u / kHalfVec) * 32 * kHalfVec + lane * kHalfVec + u % kHalfVec;
      const int64_t t = a.target_base + c;
      bool take = false;
      uint64_t k = kEmptyKey;
      if (maybe && !(exclude && a.target_keys[t] == qkey)) {
        k = order_key(a.value.at(kKind, __half2float(values[c]), q, t));
        take = entry_before(k, static_cast<uint32_t>(t), w.thr_key, w.thr_row);
      }
      w.offer(take, k, static_cast<uint32_t>(t));
    }
  }
  w.store(a.lists, list);
}

template <int CAP, int KIND>
void launch_kind(DeviceContext &ctx, const SelectTileArgs &a, dim3 grid) {
  select_tile_kernel<CAP, float, KIND><<<grid, kWarps * 32, 0, ctx.stream>>>(a);
}

// fp16 tiles hold the fp16 filter's dots only.
template <int CAP, int KIND>
void launch_half_kind(DeviceContext &ctx, const SelectTileArgs &a, dim3 grid) {
  select_half_tile_kernel<CAP, KIND><<<grid, kWarps * 32, 0, ctx.stream>>>(a);
}

// What select_half_tile_kernel's 16-byte loads need: tile rows of whole
// groups of kHalfVec halves (brute_plan.cu rounds the tile width up), and
// 16-byte aligned tile and target terms at the tile's first column.
bool half_vector_layout(const SelectTileArgs &a) {
  auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.ld % kHalfVec == 0 && aligned(a.tile_h) &&
         aligned(a.value.target_norm + a.target_base) &&
         aligned(a.value.target_scale + a.target_base);
}

template <int CAP>
KnnStatus launch_cap(DeviceContext &ctx, const SelectTileArgs &a) {
  dim3 grid((a.nq + kWarps - 1) / kWarps, a.lists.segments);
  if (a.tile_d != nullptr && a.value.kind != TileValueKind::kBoundL2Double) {
    ctx.error = "select_tile: double tiles hold DGEMM dots of L2 only";
    return KNN_INTERNAL_ERROR;
  }
  if (a.tile_h != nullptr && !is_half_kind(a.value.kind)) {
    ctx.error = "select_tile: fp16 tiles hold the fp16 filter's dots only";
    return KNN_INTERNAL_ERROR;
  }
  if (a.tile_h != nullptr && !half_vector_layout(a)) {
    ctx.error = "select_tile: fp16 tiles of a width that is not a multiple of 8, or unaligned";
    return KNN_INTERNAL_ERROR;
  }
  if (a.tile_d != nullptr) {
    select_tile_kernel<CAP, double, static_cast<int>(TileValueKind::kBoundL2Double)>
        <<<grid, kWarps * 32, 0, ctx.stream>>>(a);
  } else if (a.tile_h != nullptr) {
    switch (a.value.kind) {
      case TileValueKind::kBoundL2Half: launch_half_kind<CAP, 7>(ctx, a, grid); break;
      case TileValueKind::kBoundIpHalf: launch_half_kind<CAP, 8>(ctx, a, grid); break;
      default: launch_half_kind<CAP, 9>(ctx, a, grid); break;
    }
  } else {
    switch (a.value.kind) {
      case TileValueKind::kExactSum: launch_kind<CAP, 0>(ctx, a, grid); break;
      case TileValueKind::kExactNegDot: launch_kind<CAP, 1>(ctx, a, grid); break;
      case TileValueKind::kExactCosine: launch_kind<CAP, 2>(ctx, a, grid); break;
      case TileValueKind::kBoundL2: launch_kind<CAP, 3>(ctx, a, grid); break;
      case TileValueKind::kBoundIp: launch_kind<CAP, 4>(ctx, a, grid); break;
      case TileValueKind::kBoundCosine: launch_kind<CAP, 5>(ctx, a, grid); break;
      case TileValueKind::kBoundL2Half: launch_kind<CAP, 7>(ctx, a, grid); break;
      case TileValueKind::kBoundIpHalf: launch_kind<CAP, 8>(ctx, a, grid); break;
      case TileValueKind::kBoundCosineHalf: launch_kind<CAP, 9>(ctx, a, grid); break;
      default:
        ctx.error = "select_tile: float tiles of an unknown kind";
        return KNN_INTERNAL_ERROR;
    }
  }
  CUDA_CHECK_LAUNCH(ctx, "select_tile_kernel");
  return KNN_OK;
}

}  // namespace

KnnStatus launch_select_tile(DeviceContext &ctx, const SelectTileArgs &a) {
  if (a.nq <= 0 || a.nt <= 0) return KNN_OK;
  if (a.lists.kp < 1 || a.lists.kp > a.lists.cap) {
    ctx.error = "select_tile: kp out of range";
    return KNN_INTERNAL_ERROR;
  }
  switch (a.lists.cap) {
    case 32: return launch_cap<32>(ctx, a);
    case 64: return launch_cap<64>(ctx, a);
    case 128: return launch_cap<128>(ctx, a);
    case 256: return launch_cap<256>(ctx, a);
  }
  ctx.error = "select_tile: unsupported list capacity";
  return KNN_INTERNAL_ERROR;
}

}  // namespace cuda
}  // namespace knn
