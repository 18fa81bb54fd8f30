// bit_join.cu -- exact Hamming / Jaccard joins of bit rows by popcount
// (bit_join.cuh).
//
// One warp owns one query and walks every target in row order, 32 at a
// time (lane i takes target base + i). The targets are stored word-major
// (word w of every row, then word w + 1), so the 32 lanes read 32
// neighbouring words at once; the query's words are one address for the
// whole warp. Counts are integers and the Jaccard quotient is the same
// IEEE double division as the CPU engine's, so the distances are exact and
// equal to the CPU engine's bit for bit; nothing needs certifying.
//
// Selection, per warp in shared memory: a sorted list of CAP >= k entries
// (key, row) and a buffer of CAP entries. A target enters the buffer when
// the list holds fewer than k entries or its key is strictly below the
// k-th entry's: rows arrive in increasing order, so on an equal key the
// kept, smaller row wins (ties by target row). When the buffer could
// overflow in the next round, the warp sorts list + buffer (bitonic.cuh)
// and keeps the CAP best. Keys are select_keys.cuh's order keys.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include <math_constants.h>

#include "../result_padding.h"
#include "bit_join.cuh"
#include "bit_rows.cuh"
#include "bitonic.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "grid.cuh"
#include "host_transfer.cuh"
#include "select_keys.cuh"
#include "../stopwatch.h"

namespace knn {
namespace cuda {
namespace {

constexpr int kWarps = 4;  // queries per block
// Word pairs (query word x target word) per launch: a few milliseconds on
// a current GPU, so a cancel is seen soon.
constexpr double kWordPairsPerLaunch = 4.0 * 1024 * 1024 * 1024;

struct BitArgs {
  const uint64_t *queries = nullptr;  // nq rows of `words`, row-major
  int nq = 0;
  const uint64_t *targets = nullptr;  // word-major: word w of row t at w * nt + t
  int64_t nt = 0;
  int words = 0;
  int k = 1;
  const int64_t *query_keys = nullptr;  // this launch's queries; null: no exclusion
  const int64_t *target_keys = nullptr;
  int64_t *out_rows = nullptr;  // nq * k
  double *out_dist = nullptr;
};

template <int CAP, bool kJaccard>
__global__ void __launch_bounds__(kWarps * 32) bit_select_kernel(BitArgs a) {
  extern __shared__ __align__(16) unsigned char dyn[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q = blockIdx.x * kWarps + warp;
  if (q >= a.nq) return;  // the whole warp: no block-wide barrier below
  uint64_t *key = reinterpret_cast<uint64_t *>(dyn) + warp * 2 * CAP;
  uint32_t *row = reinterpret_cast<uint32_t *>(reinterpret_cast<uint64_t *>(dyn) + kWarps * 2 * CAP) +
                  warp * 2 * CAP;
  for (int i = lane; i < 2 * CAP; i += 32) {
    key[i] = kEmptyKey;
    row[i] = kEmptyRow;
  }
  const uint64_t *qrow = a.queries + static_cast<int64_t>(q) * a.words;
  unsigned long long q_ones = 0;
  if (kJaccard) {
    for (int w = lane; w < a.words; w += 32) q_ones += __popcll(qrow[w]);
    for (int off = 16; off > 0; off >>= 1) q_ones += __shfl_xor_sync(0xffffffffu, q_ones, off);
  }
  const int64_t qkey = a.query_keys != nullptr ? a.query_keys[q] : 0;
  __syncwarp();

  int buffered = 0;  // entries in the buffer (the same in every lane)
  uint64_t thr = kEmptyKey;  // key of the k-th entry; kEmptyKey: fewer than k
  auto merge = [&]() {
    bitonic_sort(key, row, nullptr, 2 * CAP, lane, 32, WarpSync());
    for (int i = CAP + lane; i < 2 * CAP; i += 32) {
      key[i] = kEmptyKey;
      row[i] = kEmptyRow;
    }
    __syncwarp();
    thr = key[a.k - 1];
    buffered = 0;
  };

  for (int64_t base = 0; base < a.nt; base += 32) {
    const int64_t t = base + lane;
    bool pass = false;
    uint64_t k_t = kEmptyKey;
    if (t < a.nt && !(a.query_keys != nullptr && a.target_keys[t] == qkey)) {
      k_t = order_key(bit_pair_distance<kJaccard>(qrow, a.targets, a.nt, t, a.words, q_ones));
      pass = thr == kEmptyKey || k_t < thr;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, pass);
    if (pass) {
      const int pos = CAP + buffered + __popc(ballot & ((1u << lane) - 1));
      key[pos] = k_t;
      row[pos] = static_cast<uint32_t>(t);
    }
    buffered += __popc(ballot);
    __syncwarp();
    if (buffered > CAP - 32) merge();
  }
  if (buffered > 0) merge();
  int64_t *out_rows = a.out_rows + static_cast<int64_t>(q) * a.k;
  double *out_dist = a.out_dist + static_cast<int64_t>(q) * a.k;
  for (int j = lane; j < a.k; j += 32) {
    const bool empty = key[j] == kEmptyKey;
    out_rows[j] = empty ? -1 : static_cast<int64_t>(row[j]);
    out_dist[j] = empty ? CUDART_NAN : key_value(key[j]);
  }
}

size_t shared_bytes(int cap) { return static_cast<size_t>(kWarps) * 2 * cap * (8 + 4); }

template <int CAP>
KnnStatus launch_cap(DeviceContext &ctx, const BitArgs &a, bool jaccard) {
  const unsigned blocks = static_cast<unsigned>(ceil_div(a.nq, kWarps));
  if (jaccard)
    bit_select_kernel<CAP, true><<<blocks, kWarps * 32, shared_bytes(CAP), ctx.stream>>>(a);
  else
    bit_select_kernel<CAP, false><<<blocks, kWarps * 32, shared_bytes(CAP), ctx.stream>>>(a);
  CUDA_CHECK_LAUNCH(ctx, "bit_select_kernel");
  return KNN_OK;
}

KnnStatus launch(DeviceContext &ctx, const BitArgs &a, int cap, bool jaccard) {
  switch (cap) {
    case 32: return launch_cap<32>(ctx, a, jaccard);
    case 64: return launch_cap<64>(ctx, a, jaccard);
    case 128: return launch_cap<128>(ctx, a, jaccard);
    default: return launch_cap<256>(ctx, a, jaccard);
  }
}
static_assert(KNN_CUDA_BIT_MAX_K == 256, "launch() covers lists of up to 256 entries");

}  // namespace

std::vector<uint64_t> pack_bit_rows(const void *rows, int64_t n, int dim, int64_t words,
                                    bool transpose) {
  std::vector<uint64_t> out(static_cast<size_t>(n * words), 0);
  const int64_t row_bytes = (static_cast<int64_t>(dim) + 7) / 8;
  const unsigned char last_mask =
      dim % 8 == 0 ? 0xFF : static_cast<unsigned char>(0xFF << (8 - dim % 8));
  const auto *bytes = static_cast<const unsigned char *>(rows);
  std::vector<uint64_t> row(static_cast<size_t>(words));
  for (int64_t i = 0; i < n; i++) {
    std::fill(row.begin(), row.end(), 0);
    auto *r = reinterpret_cast<unsigned char *>(row.data());
    std::memcpy(r, bytes + i * row_bytes, static_cast<size_t>(row_bytes));
    r[row_bytes - 1] &= last_mask;
    for (int64_t w = 0; w < words; w++)
      out[static_cast<size_t>(transpose ? w * n + i : i * words + w)] = row[w];
  }
  return out;
}

KnnStatus bit_join(const KnnProblem &p, int64_t *neighbors, double *distances, KnnStats *stats,
                   DeviceContext &ctx) {
  const Clock::time_point start = Clock::now();
  *stats = KnnStats{};
  stats->method = KNN_METHOD_BRUTE;
  stats->threads_per_query = 32;
  if (p.k > KNN_CUDA_BIT_MAX_K) {
    ctx.error = "the GPU bit join takes k up to 256";
    return KNN_INVALID_ARGUMENT;
  }
  if (p.n_targets >= static_cast<int64_t>(kEmptyRow)) {
    ctx.error = "the GPU bit join takes fewer than 2^32 - 1 targets";
    return KNN_INVALID_ARGUMENT;
  }
  if (p.n_queries == 0 || p.n_targets == 0) {
    fill_padding(p.n_queries, p.k, neighbors, distances);
    std::snprintf(stats->variant, sizeof stats->variant, "empty");
    return KNN_OK;
  }
  const int64_t words = bit_row_words(p.dim);
  const int cap = std::max(32, next_pow2(p.k));
  const bool jaccard = p.metric == KNN_METRIC_JACCARD;
  const bool exclude = p.query_keys != nullptr;

  // What stays on the device for the whole join; the rest of the budget
  // goes to the queries and results of one launch.
  const size_t fixed = static_cast<size_t>(p.n_targets) * (words * 8 + (exclude ? 8 : 0));
  const size_t per_query = static_cast<size_t>(words * 8 + (exclude ? 8 : 0) + p.k * 16);
  if (fixed + kWarps * per_query > ctx.memory_budget) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "the bit rows of the targets (%.1f MiB) do not fit the GPU memory budget "
                  "(%.1f MiB)",
                  fixed / 1048576.0, ctx.memory_budget / 1048576.0);
    ctx.error = msg;
    return KNN_OUT_OF_MEMORY;
  }
  const double pairs_per_query = static_cast<double>(p.n_targets) * static_cast<double>(words);
  int64_t chunk = static_cast<int64_t>(std::max(1.0, kWordPairsPerLaunch / pairs_per_query));
  chunk = std::min<int64_t>(chunk, static_cast<int64_t>((ctx.memory_budget - fixed) / per_query));
  chunk = std::min<int64_t>({chunk, p.n_queries, std::numeric_limits<int>::max() / 2});
  chunk = std::max<int64_t>(chunk, 1);

  const Clock::time_point t_transfer = Clock::now();
  const std::vector<uint64_t> targets = pack_bit_rows(p.targets, p.n_targets, p.dim, words, true);
  const std::vector<uint64_t> queries = pack_bit_rows(p.queries, p.n_queries, p.dim, words, false);
  KNN_TRY(ctx.cancel_point());
  DeviceBuffer<uint64_t> d_targets, d_queries;
  DeviceBuffer<int64_t> d_target_keys, d_query_keys, d_rows;
  DeviceBuffer<double> d_dist;
  KNN_TRY(d_targets.allocate(ctx, targets.size(), "bit targets"));
  KNN_TRY(d_queries.allocate(ctx, static_cast<size_t>(chunk * words), "bit queries"));
  KNN_TRY(d_rows.allocate(ctx, static_cast<size_t>(chunk * p.k), "bit result rows"));
  KNN_TRY(d_dist.allocate(ctx, static_cast<size_t>(chunk * p.k), "bit result distances"));
  if (exclude) {
    KNN_TRY(d_target_keys.allocate(ctx, static_cast<size_t>(p.n_targets), "target keys"));
    KNN_TRY(d_query_keys.allocate(ctx, static_cast<size_t>(chunk), "query keys"));
  }
  // Uploads use the staging stream: the allocations must be complete.
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  KNN_TRY(upload_to_device(ctx, d_targets.get(), targets.data(), d_targets.bytes()));
  if (exclude)
    KNN_TRY(upload_to_device(ctx, d_target_keys.get(), p.target_keys, d_target_keys.bytes()));
  double transfer = seconds_since(t_transfer);
  double select = 0;

  for (int64_t q0 = 0; q0 < p.n_queries; q0 += chunk) {
    KNN_TRY(ctx.cancel_point());
    const int nq = static_cast<int>(std::min(chunk, p.n_queries - q0));
    Clock::time_point t = Clock::now();
    KNN_TRY(upload_to_device(ctx, d_queries.get(), queries.data() + q0 * words,
                             static_cast<size_t>(nq * words) * 8));
    if (exclude)
      KNN_TRY(upload_to_device(ctx, d_query_keys.get(), p.query_keys + q0,
                               static_cast<size_t>(nq) * 8));
    transfer += seconds_since(t);
    t = Clock::now();
    BitArgs a;
    a.queries = d_queries.get();
    a.nq = nq;
    a.targets = d_targets.get();
    a.nt = p.n_targets;
    a.words = static_cast<int>(words);
    a.k = p.k;
    a.query_keys = exclude ? d_query_keys.get() : nullptr;
    a.target_keys = exclude ? d_target_keys.get() : nullptr;
    a.out_rows = d_rows.get();
    a.out_dist = d_dist.get();
    KNN_TRY(launch(ctx, a, cap, jaccard));
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
    select += seconds_since(t);
    t = Clock::now();
    KNN_TRY(download_to_host(ctx, neighbors + q0 * p.k, d_rows.get(),
                             static_cast<size_t>(nq) * p.k * 8));
    KNN_TRY(download_to_host(ctx, distances + q0 * p.k, d_dist.get(),
                             static_cast<size_t>(nq) * p.k * 8));
    transfer += seconds_since(t);
  }
  std::snprintf(stats->variant, sizeof stats->variant, "bit popcount (warp per query, list %d)",
                cap);
  stats->pairs = p.n_queries * p.n_targets;
  stats->distance_computations = stats->pairs;
  stats->seconds_transfer = transfer;
  stats->seconds_select = select;
  stats->seconds_total = seconds_since(start);
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
