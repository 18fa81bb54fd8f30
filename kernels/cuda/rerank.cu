// rerank.cu -- from candidate lists to exact results, and the proof that
// they are exact.
//
// One block per query: it merges the query's segment lists (sorted by the
// selection value), takes the kp best candidates, computes their exact
// distances with knn_distance.h (one thread per candidate), sorts them by
// (exact value, row) and writes the k best.
//
// Certification (GEMM lists, whose selection value is a lower bound L of
// the exact value X, see tile_value.cuh): a target missing from the
// candidates has (L, row) at or after the kp-th candidate's (L*, row*), so
// X >= L >= L*. If L* > X_k (the k-th exact value among the candidates),
// strictly, every missing target comes after the k-th result and the k
// best are exact; equality is not enough because a tie would be decided by
// row. If L* is NaN (cosine with a zero vector: the exact value is NaN),
// every missing target is NaN with a row after row*, which is enough when
// the k-th result is a number or a NaN with a row <= row*. When no list was
// ever full, every eligible target is a candidate. A query that is not
// certified is redone by the caller with exact tiles.
#include <cmath>

#include "bitonic.cuh"
#include "brute_kernels.cuh"
#include "cuda_check.cuh"
#include "exact_pair.cuh"

namespace knn {
namespace cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) rerank_kernel(RerankArgs a, int n_in, int n_cand) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t *lkey = reinterpret_cast<uint64_t *>(smem);          // n_in
  uint64_t *ekey = lkey + n_in;                                 // n_cand
  double *edist = reinterpret_cast<double *>(ekey + n_cand);    // n_cand
  uint32_t *lrow = reinterpret_cast<uint32_t *>(edist + n_cand);  // n_in
  uint32_t *erow = lrow + n_in;                                 // n_cand
  __shared__ int s_truncated;
  __shared__ int s_count;

  const int64_t i = blockIdx.x;
  const int tid = threadIdx.x;
  const int total = a.lists.segments * a.lists.cap;
  const int64_t base = i * total;
  if (tid == 0) {
    s_truncated = 0;
    s_count = 0;
  }
  __syncthreads();
  for (int j = tid; j < n_in; j += kThreads) {
    if (j < total) {
      lkey[j] = a.lists.key[base + j];
      lrow[j] = a.lists.row[base + j];
      // A list holding kp entries may have dropped targets (unless kp
      // covers the whole chunk).
      if (j % a.lists.cap == a.lists.kp - 1 && lkey[j] != kEmptyKey && a.lists.kp < a.t.n)
        s_truncated = 1;
    } else {
      lkey[j] = kEmptyKey;
      lrow[j] = kEmptyRow;
    }
  }
  __syncthreads();
  if (a.lists.segments > 1) bitonic_sort(lkey, lrow, nullptr, n_in, tid, kThreads, BlockSync());
  for (int j = tid; j < n_in; j += kThreads)
    if (lkey[j] != kEmptyKey && (j + 1 == n_in || lkey[j + 1] == kEmptyKey)) s_count = j + 1;
  __syncthreads();
  const int count = min(a.lists.kp, s_count);

  const float *q = a.q.x + i * a.dim;
  const float q_norm = a.metric == KNN_METRIC_COSINE ? a.q.norm[i] : 0.0f;
  for (int j = tid; j < n_cand; j += kThreads) {
    if (j < count) {
      const uint32_t t = lrow[j];
      const float t_norm = a.metric == KNN_METRIC_COSINE ? a.t.norm[t] : 0.0f;
      double value, dist;
      exact_pair(a.metric, q, a.t.x + static_cast<int64_t>(t) * a.dim, a.dim, q_norm, t_norm,
                 &value, &dist);
      ekey[j] = order_key(value);
      erow[j] = t;
      edist[j] = dist;
    } else {
      ekey[j] = kEmptyKey;
      erow[j] = kEmptyRow;
      edist[j] = NAN;
    }
  }
  __syncthreads();
  bitonic_sort(ekey, erow, edist, n_cand, tid, kThreads, BlockSync());

  const int64_t slot = a.out_index != nullptr ? a.out_index[i] : i;
  if (tid == 0 && a.certified != nullptr) {
    bool proven = true;
    if (!a.exact_lists && s_truncated && count >= a.k) {
      const uint64_t l_key = lkey[a.lists.kp - 1];
      const uint32_t l_row = lrow[a.lists.kp - 1];
      const uint64_t x_key = ekey[a.k - 1];
      if (l_key == kNanKey)
        proven = x_key != kNanKey || erow[a.k - 1] <= l_row;
      else
        proven = x_key != kNanKey && x_key != kEmptyKey && key_value(l_key) > key_value(x_key);
    }
    a.certified[i] = proven ? 1 : 0;
  }
  for (int j = tid; j < a.k; j += kThreads) {
    const int64_t o = slot * a.k + j;
    if (j < count) {
      a.out.key[o] = ekey[j];
      a.out.row[o] = a.t.offset + erow[j];
      a.out.dist[o] = edist[j];
    } else {
      a.out.key[o] = kEmptyKey;
      a.out.row[o] = -1;
      a.out.dist[o] = NAN;
    }
  }
}

}  // namespace

KnnStatus launch_rerank(DeviceContext &ctx, const RerankArgs &a) {
  if (a.q.n <= 0) return KNN_OK;
  // k may exceed kp only when the chunk has fewer than k targets (then kp
  // is all of them).
  const int total = a.lists.segments * a.lists.cap;
  if (total > kMaxListEntries || a.lists.kp > a.lists.cap || a.q.n > 2147483647LL) {
    ctx.error = "rerank: list layout out of range";
    return KNN_INTERNAL_ERROR;
  }
  const int n_in = next_pow2(total);
  const int n_cand = next_pow2(a.lists.kp);
  const size_t bytes = static_cast<size_t>(n_in) * 12 + static_cast<size_t>(n_cand) * 20;
  rerank_kernel<<<static_cast<unsigned>(a.q.n), kThreads, bytes, ctx.stream>>>(a, n_in, n_cand);
  CUDA_CHECK_LAUNCH(ctx, "rerank_kernel");
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
