// ti_topk.cuh -- the per-thread "kNearests" lists of level 2 (section
// III-C), in registers, shared memory or global memory (section IV-C2).
//
// A list keeps the k' smallest entries (value, row) seen so far in
// ascending order of (value, row); that order is knn_result_before on the
// float8 results (ti_common.cuh). Unfilled slots hold (+inf, kNoRow), which
// every real entry precedes. Values are never NaN on this path (ti_join.cu
// sends non-finite inputs to brute force).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ti_common.cuh"

namespace knn {
namespace cuda {
namespace ti {

__device__ __forceinline__ bool entry_before(float va, int32_t ra, float vb, int32_t rb) {
  return va < vb || (va == vb && ra < rb);
}

// Registers: KC compile-time slots so every index is a constant. The first
// KC - k' slots hold sentinels (-1, -1) that precede every real entry and
// never move, so the last slot is always the k'-th smallest real entry.
template <int KC>
struct RegisterList {
  float v[KC];
  int32_t r[KC];

  __device__ __forceinline__ void init(int kprime, float *, int32_t *, int64_t) {
#pragma unroll
    for (int i = 0; i < KC; i++) {
      bool sentinel = i < KC - kprime;
      v[i] = sentinel ? -1.0f : __int_as_float(0x7f800000);
      r[i] = sentinel ? -1 : kNoRow;
    }
  }

  __device__ __forceinline__ float last_value() const { return v[KC - 1]; }
  __device__ __forceinline__ int32_t last_row() const { return r[KC - 1]; }

  // Precondition: (nv, nr) precedes the last entry, which drops out.
  __device__ __forceinline__ void insert(float nv, int32_t nr) {
#pragma unroll
    for (int j = KC - 1; j > 0; j--) {
      bool shift = entry_before(nv, nr, v[j - 1], r[j - 1]);
      bool here = !shift && entry_before(nv, nr, v[j], r[j]);
      float keep_v = here ? nv : v[j];
      int32_t keep_r = here ? nr : r[j];
      v[j] = shift ? v[j - 1] : keep_v;
      r[j] = shift ? r[j - 1] : keep_r;
    }
    if (entry_before(nv, nr, v[0], r[0])) {
      v[0] = nv;
      r[0] = nr;
    }
  }

  // Writes the k' real slots in order to out_v/out_r[i * stride].
  __device__ __forceinline__ void store(int kprime, float *out_v, int32_t *out_r,
                                        int64_t stride) const {
#pragma unroll
    for (int i = 0; i < KC; i++) {
      int slot = i - (KC - kprime);
      if (slot >= 0) {
        out_v[slot * stride] = v[i];
        out_r[slot * stride] = r[i];
      }
    }
  }
};

// Shared or global memory: k' slots at base[i * stride] (the layout of
// figure 6(b): neighbouring threads own neighbouring words).
struct StridedList {
  float *v = nullptr;
  int32_t *r = nullptr;
  int64_t stride = 0;
  int kprime = 0;

  __device__ __forceinline__ void init(int kp, float *base_v, int32_t *base_r, int64_t s) {
    v = base_v;
    r = base_r;
    stride = s;
    kprime = kp;
    for (int i = 0; i < kprime; i++) {
      v[i * stride] = __int_as_float(0x7f800000);
      r[i * stride] = kNoRow;
    }
  }

  __device__ __forceinline__ float last_value() const { return v[(kprime - 1) * stride]; }
  __device__ __forceinline__ int32_t last_row() const { return r[(kprime - 1) * stride]; }

  __device__ __forceinline__ void insert(float nv, int32_t nr) {
    int j = kprime - 1;
    while (j > 0) {
      float pv = v[(j - 1) * stride];
      int32_t pr = r[(j - 1) * stride];
      if (!entry_before(nv, nr, pv, pr)) break;
      v[j * stride] = pv;
      r[j * stride] = pr;
      j--;
    }
    v[j * stride] = nv;
    r[j * stride] = nr;
  }

  __device__ __forceinline__ void store(int kp, float *out_v, int32_t *out_r,
                                        int64_t out_stride) const {
    for (int i = 0; i < kp; i++) {
      out_v[i * out_stride] = v[i * stride];
      out_r[i * out_stride] = r[i * stride];
    }
  }
};

}  // namespace ti
}  // namespace cuda
}  // namespace knn
