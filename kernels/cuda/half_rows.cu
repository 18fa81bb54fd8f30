// half_rows.cu -- fp16 rows on the device:
//  * a float16 problem's rows (KNN_ELEMENT_FLOAT16), uploaded as they are
//    into the upper half of the float rows' buffer and widened in place
//    into the float rows every kernel reads (launch_widen_half_in_place);
//  * the rows of the fp16 tensor-core filter: each float row scaled by a
//    power of two, rounded to fp16 (stride half_row_stride(dim), zero
//    padded), and the per-row numbers its error bound uses
//    (half_bound.cuh). One warp per row: coalesced loads, warp reductions.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "brute_kernels.cuh"
#include "cuda_check.cuh"
#include "grid.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;
// Rows whose inverse scale leaves [2^-kScaleRange, 2^kScaleRange] are
// never prefiltered (their float scale is NaN): the float product of two
// scales then stays normal.
constexpr int kScaleRange = 60;

// binary16 -> binary32 exactly as the job layer's host widening
// (half_float.h's knn_half_to_float): every finite value and infinity
// exactly (__half2float), a NaN as the quiet NaN of its sign (no payload).
__device__ __forceinline__ float widen_half(uint16_t h) {
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0)
    return __uint_as_float((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7FC00000u);
  return __half2float(__ushort_as_half(h));
}

// x[i] = h[i] widened, i < n. Not __restrict__: in the last step of
// launch_widen_half_in_place one thread's x[0] covers its own h[0].
__global__ void widen_half_kernel(const uint16_t *h, int64_t n, float *x) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = widen_half(h[i]);
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__global__ void to_half_kernel(const float *__restrict__ x, int64_t n, int dim, int ld,
                               __half *__restrict__ xh, HalfRowStats *__restrict__ stats,
                               float *__restrict__ scale) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < n;
       r += warps) {
    const float *row = x + r * dim;
    float m = 0.0f;
    for (int j = lane; j < dim; j += 32) m = fmaxf(m, fabsf(row[j]));
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, off));
    int e = 0;
    if (m > 0.0f) frexpf(m, &e);  // m = f 2^e, f in [1/2, 1): x 2^-e has max in [1/2, 1)
    double h2 = 0.0, r2 = 0.0, x2 = 0.0, s2 = 0.0;
    bool rounded_to_nearest = true;
    __half *out = xh + r * ld;
    for (int j = lane; j < ld; j += 32) {
      if (j >= dim) {
        out[j] = __float2half_rn(0.0f);
        continue;
      }
      const double xs = ldexp(static_cast<double>(row[j]), -e);  // exact
      const __half h = __double2half(xs);                        // round to nearest
      const double hd = static_cast<double>(__half2float(h));
      const double rd = xs - hd;  // exact
      out[j] = h;
      h2 += hd * hd;
      if (fabs(hd) < 0x1p-14) s2 += hd * hd;  // fp16 subnormal (or zero)
      r2 += rd * rd;
      x2 += xs * xs;
      rounded_to_nearest =
          rounded_to_nearest && fabs(rd) <= 0x1p-11 * fabs(xs) + 0x1p-25;
    }
    h2 = warp_sum(h2);
    r2 = warp_sum(r2);
    x2 = warp_sum(x2);
    s2 = warp_sum(s2);
    rounded_to_nearest = __all_sync(kFullMask, rounded_to_nearest);
    if (lane == 0) {
      const double inv = ldexp(1.0, e);
      const double up = 1.0 + 0x1p-30;
      HalfRowStats s;
      s.inv = inv;
      s.hn = sqrt(h2) * up * inv;
      s.rn = (sqrt(r2) + sqrt(s2)) * up * inv;
      s.xn = (sqrt(x2) + sqrt(r2)) * up * inv;
      s.sq = x2 * inv * inv;
      stats[r] = s;
      const bool few_subnormals = sqrt(s2) * up <= kHalfSubnormalShare * sqrt(x2);
      scale[r] = (rounded_to_nearest && few_subnormals && e >= -kScaleRange && e <= kScaleRange)
                     ? static_cast<float>(inv)
                     : NAN;
    }
  }
}

}  // namespace

// With m = n - a values left, a step widens the next max(1, m / 2) of
// them: it reads bytes [2n + 2a, 2n + 2a + m) and writes bytes
// [4a, 4a + 2m) at most, which end where the reads begin, so no value is
// overwritten before it is read (the one value of the last step is read
// and written by one thread). Steps run in order on `stream`: about
// log2(n) launches.
KnnStatus launch_widen_half_in_place(DeviceContext &ctx, cudaStream_t stream, float *x,
                                     int64_t n) {
  const uint16_t *h = reinterpret_cast<const uint16_t *>(x) + n;
  for (int64_t a = 0; a < n;) {
    const int64_t count = std::max<int64_t>(1, (n - a) / 2);
    widen_half_kernel<<<grid_stride_blocks(count, kThreads), kThreads, 0, stream>>>(h + a, count,
                                                                                    x + a);
    CUDA_CHECK_LAUNCH(ctx, "widen_half_kernel");
    a += count;
  }
  return KNN_OK;
}

KnnStatus launch_to_half(DeviceContext &ctx, const float *x, int64_t n, int dim, uint16_t *xh,
                         HalfRowStats *stats, float *scale) {
  if (n <= 0) return KNN_OK;
  const int blocks = grid_stride_blocks(n * 32, kThreads);
  to_half_kernel<<<blocks, kThreads, 0, ctx.stream>>>(x, n, dim, half_row_stride(dim),
                                                      reinterpret_cast<__half *>(xh), stats,
                                                      scale);
  CUDA_CHECK_LAUNCH(ctx, "to_half_kernel");
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
