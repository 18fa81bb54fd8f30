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
#include <cuda_fp16.h>

#include "bitonic.cuh"
#include "brute_kernels.cuh"
#include "cuda_check.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 8;  // tile loads in flight per lane

template <int CAP>
__device__ __forceinline__ void merge_buffer(uint64_t *key, uint32_t *row, int kp, int lane) {
  __syncwarp();
  bitonic_sort(key, row, nullptr, 2 * CAP, lane, 32, WarpSync());
  for (int i = kp + lane; i < 2 * CAP; i += 32) {
    key[i] = kEmptyKey;
    row[i] = kEmptyRow;
  }
  __syncwarp();
}

// T: the tile's element type; KIND: the TileValueKind (a constant, so
// that the loop holds only its case). Float and fp16 tiles go through the float
// prefilter of TileValue::may_beat_as; double (DGEMM) tiles compute the
// bound directly (TileValue::bound_l2_double, the only kind of double
// tiles), with the targets' double norms loaded together with the tile
// values. A step loads kUnroll values per lane and prefilters them all;
// only when some lane may keep one does the warp walk them again (rarely,
// once the lists are warm), reloading what the exact test needs.
template <int CAP, typename T, int KIND>
__global__ void __launch_bounds__(kWarps * 32) select_tile_kernel(SelectTileArgs a) {
  constexpr bool kDouble = sizeof(T) == sizeof(double);
  constexpr bool kHalfTile = sizeof(T) == sizeof(__half);
  constexpr TileValueKind kKind = static_cast<TileValueKind>(KIND);
  constexpr bool kNorms =
      !kDouble && (kKind == TileValueKind::kExactCosine || kKind >= TileValueKind::kBoundL2);
  constexpr bool kScales = !kDouble && (kKind == TileValueKind::kBoundL2Half ||
                                        kKind == TileValueKind::kBoundIpHalf ||
                                        kKind == TileValueKind::kBoundCosineHalf);
  __shared__ uint64_t s_key[kWarps][2 * CAP];
  __shared__ uint32_t s_row[kWarps][2 * CAP];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tile_row = blockIdx.x * kWarps + warp;
  if (tile_row >= a.nq) return;  // the whole warp leaves; no block barriers below
  const int segment = blockIdx.y;
  const int64_t q = a.query_base + tile_row;
  const int64_t list = (q * a.lists.segments + segment) * CAP;
  uint64_t *key = s_key[warp];
  uint32_t *row = s_row[warp];

  for (int i = lane; i < CAP; i += 32) {
    key[i] = a.lists.key[list + i];
    row[i] = a.lists.row[list + i];
    key[CAP + i] = kEmptyKey;
    row[CAP + i] = kEmptyRow;
  }
  __syncwarp();
  uint64_t thr_key = key[a.lists.kp - 1];
  uint32_t thr_row = row[a.lists.kp - 1];
  // The threshold's value rounded up to float and widened by 2^-18 of
  // itself, for the prefilter (the widening absorbs the rounding of the
  // prefilter's own float sum, see TileValue::may_beat); +inf while the list
  // is not full or its threshold is NaN (no prefiltering).
  auto threshold_up = [&]() {
    if (thr_key >= kNanKey) return INFINITY;
    const float up = __double2float_ru(key_value(thr_key));
    return up + fabsf(up) * 0x1p-18f;
  };
  float thr_up = threshold_up();
  auto threshold_d = [&]() { return thr_key < kNanKey ? key_value(thr_key) : INFINITY; };
  double thr_d = threshold_d();
  int buffered = 0;

  const int seg_len = ((a.nt + a.lists.segments - 1) / a.lists.segments + 31) & ~31;
  const int c_begin = segment * seg_len;
  const int c_end = min(a.nt, c_begin + seg_len);
  const T *values =
      reinterpret_cast<const T *>(kDouble     ? static_cast<const void *>(a.tile_d)
                                  : kHalfTile ? static_cast<const void *>(a.tile_h)
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
  const unsigned lower_lanes = (1u << lane) - 1;

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
          maybe = c < c_end && !(a.value.bound_l2_double(v[u], qn_d, tn_d[u]) > thr_d);
        } else {
          // fp16 tiles hold scaled dots: the prefilter takes them unscaled.
          const float vp = kScales ? static_cast<float>(v[u]) * (qs * ts[u]) : static_cast<float>(v[u]);
          maybe = c < c_end && a.value.may_beat_as(kKind, vp, qn, tn[u], thr_up);
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
        take = entry_before(k, static_cast<uint32_t>(t), thr_key, thr_row);
      }
      const unsigned mask = __ballot_sync(0xffffffffu, take);
      if (take) {
        const int pos = CAP + buffered + __popc(mask & lower_lanes);
        key[pos] = k;
        row[pos] = static_cast<uint32_t>(t);
      }
      buffered += __popc(mask);
      if (buffered > CAP - 32) {
        merge_buffer<CAP>(key, row, a.lists.kp, lane);
        buffered = 0;
        thr_key = key[a.lists.kp - 1];
        thr_row = row[a.lists.kp - 1];
        thr_up = threshold_up();
        thr_d = threshold_d();
      }
    }
  }
  if (buffered > 0) merge_buffer<CAP>(key, row, a.lists.kp, lane);
  __syncwarp();
  for (int i = lane; i < CAP; i += 32) {
    a.lists.key[list + i] = key[i];
    a.lists.row[list + i] = row[i];
  }
}

template <int CAP, int KIND>
void launch_kind(DeviceContext &ctx, const SelectTileArgs &a, dim3 grid) {
  select_tile_kernel<CAP, float, KIND><<<grid, kWarps * 32, 0, ctx.stream>>>(a);
}

// fp16 tiles hold the fp16 filter's dots only.
template <int CAP, int KIND>
void launch_half_kind(DeviceContext &ctx, const SelectTileArgs &a, dim3 grid) {
  select_tile_kernel<CAP, __half, KIND><<<grid, kWarps * 32, 0, ctx.stream>>>(a);
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
