// group_join.cu -- knn::cuda::group_join: a per-group join in one call
// (group_join.cuh says how the work is split).
//
// Groups are taken in the layout's order. Each one either joins the
// current batch of small groups or, when it is large (enough pairs for the
// ordinary methods' launches to be amortised, and for TI or the GEMM
// filter to pay off), when k exceeds the segmented lists, or for bit rows,
// runs alone. A batch is bounded by half the join's memory budget, so a
// join of any size runs in bounded memory; a group that alone exceeds
// that runs alone too (the ordinary methods work in chunks).
//
// A batch: its query and target rows are gathered on the host straight
// into pinned staging memory and uploaded, group after group (one copy
// when a self-join's query rows are its target rows); the work items are
// built on the host, larger target ranges first; the segmented selection
// runs in launches of bounded work (a cancel is seen between them); the
// rerank gives every query its k results, whose target rows are mapped to
// the problem's rows on the device; they are downloaded and put in place.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../entry_guard.h"
#include "../group_subproblem.h"
#include "../problem_check.h"
#include "../result_padding.h"
#include "../stats_sum.h"
#include "../stopwatch.h"
#include "bitonic.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "device_thread.cuh"
#include "grid.cuh"
#include "group_join.cuh"
#include "host_transfer.cuh"

namespace knn {
namespace cuda {
namespace {

// A group with this many pairs runs alone: its own launches take
// milliseconds, and TI or the GEMM filter beat exact tiles at that size.
constexpr double kAloneMinPairs = static_cast<double>(int64_t(1) << 27);
// Batch rows stay addressable with the 32-bit rows of the work items and
// the candidate lists.
constexpr int64_t kMaxBatchRows = int64_t(1) << 30;
// Work (query slots x target slots x dimensions) of one segmented launch:
// a few milliseconds on a current GPU, so that a cancel is seen soon.
constexpr double kWorkPerLaunch = 16.0 * 1024 * 1024 * 1024;
// Fewer work items than this leave the GPU partly idle: the targets of
// each group are then split into ranges of at least kMinRangeTargets rows
// (each query gets one list per range; the rerank merges them).
constexpr int64_t kWantedTiles = 2048;
constexpr int64_t kMinRangeTargets = 1024;
constexpr int kTileTargets = 64;  // group_select.cu's tile: ranges are multiples of it

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// rows[i] := to[rows[i]] (empty slots, -1, stay): batch target rows to the
// problem's rows, on the device, so that the host only moves whole results.
__global__ void map_rows_kernel(int64_t *rows, int64_t n, const int64_t *to) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (rows[i] >= 0) rows[i] = to[rows[i]];
}

KnnStatus launch_map_rows(DeviceContext &ctx, int64_t *rows, int64_t n, const int64_t *to) {
  if (n == 0) return KNN_OK;
  constexpr int kThreads = 256;
  map_rows_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, ctx.stream>>>(rows, n, to);
  CUDA_CHECK_LAUNCH(ctx, "map_rows_kernel");
  return KNN_OK;
}

// Why the layout cannot be used, or nullptr: offsets from 0, non-decreasing,
// within the rows; rows in range and ascending inside each group.
const char *layout_invalid_reason(const int64_t *rows, const int64_t *begin, int64_t n_groups,
                                  int64_t n_rows) {
  if (begin == nullptr) return "group layout: NULL offsets";
  if (begin[0] != 0) return "group layout: offsets must start at 0";
  for (int64_t g = 0; g < n_groups; g++) {
    if (begin[g + 1] < begin[g] || begin[g + 1] > n_rows) return "group layout: bad offsets";
    if (rows == nullptr && begin[g + 1] > begin[g]) return "group layout: NULL rows";
    for (int64_t i = begin[g]; i < begin[g + 1]; i++) {
      if (rows[i] < 0 || rows[i] >= n_rows) return "group layout: row out of range";
      if (i > begin[g] && rows[i] <= rows[i - 1]) return "group layout: rows not ascending";
    }
  }
  return nullptr;
}

// Copies the listed rows of `src` (row_bytes each) one after the other to
// `dst`: up to PinnedStaging::kMaxWorkers host threads gather rows straight
// into their two pinned slices while the DMA engine copies the previous
// slice, so that the gather is the only host pass over the data.
KnnStatus upload_gathered(DeviceContext &ctx, void *dst, const void *src, size_t row_bytes,
                          const int64_t *list, int64_t n) {
  if (n == 0) return KNN_OK;
  const auto *from = static_cast<const unsigned char *>(src);
  auto *to = static_cast<unsigned char *>(dst);
  const int64_t rows_per_slice = static_cast<int64_t>(PinnedStaging::kSliceBytes / row_bytes);
  if (ctx.staging == nullptr || rows_per_slice == 0) {  // rows longer than a slice
    std::vector<unsigned char> gathered(static_cast<size_t>(n) * row_bytes);
    for (int64_t i = 0; i < n; i++)
      std::memcpy(gathered.data() + i * row_bytes, from + list[i] * row_bytes, row_bytes);
    return upload_to_device(ctx, dst, gathered.data(), gathered.size());
  }
  PinnedStaging &st = *ctx.staging;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int workers = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({static_cast<int64_t>((static_cast<size_t>(n) * row_bytes) >> 20),
                            PinnedStaging::kMaxWorkers, static_cast<int64_t>(cores)})));
  KNN_TRY(st.reserve(ctx, workers));
  const int64_t share = ceil_div64(n, workers);
  auto part = [&](DeviceContext &c, int w) -> KnnStatus {
    c.cancel = ctx.cancel;  // a helper thread's context has none of its own
    const int64_t end = std::min(n, (w + 1) * share);
    bool filled[2] = {false, false};
    int b = 0;
    for (int64_t r0 = std::min(n, w * share); r0 < end; r0 += rows_per_slice, b ^= 1) {
      KNN_TRY(c.cancel_point());
      const int64_t count = std::min(rows_per_slice, end - r0);
      const int s = 2 * w + b;
      if (filled[b]) CUDA_CHECK(c, cudaEventSynchronize(st.event(s)));  // its last copy is done
      unsigned char *slice = st.slice(s);
      for (int64_t i = 0; i < count; i++)
        std::memcpy(slice + i * row_bytes, from + list[r0 + i] * row_bytes, row_bytes);
      CUDA_CHECK(c, cudaMemcpyAsync(to + r0 * row_bytes, slice, count * row_bytes,
                                    cudaMemcpyHostToDevice, st.upload_stream()));
      CUDA_CHECK(c, cudaEventRecord(st.event(s), st.upload_stream()));
      filled[b] = true;
    }
    return KNN_OK;
  };
  const KnnStatus status = run_shares<PinnedStaging::kMaxWorkers>(ctx, workers, part);
  // Every copy issued is waited for, also after a failure: the slices are
  // the next transfer's.
  const cudaError_t done = cudaStreamSynchronize(st.upload_stream());
  KNN_TRY(status);
  CUDA_CHECK(ctx, done);
  return KNN_OK;
}

// The groups of one batch: group_order[first .. end) of the segmented ones.
struct Batch {
  size_t first = 0, end = 0;
  int64_t queries = 0, targets = 0;
};

class GroupJoin {
 public:
  GroupJoin(const KnnProblem &p, const KnnGroupLayout &l, const PlainJoin &plain,
            int64_t *neighbors, double *distances, DeviceContext &ctx)
      : p_(p), l_(l), plain_(plain), neighbors_(neighbors), distances_(distances), ctx_(ctx) {}

  KnnStatus run();
  void describe(KnnStats *stats) const;

 private:
  int64_t queries_of(int64_t g) const { return l_.query_begin[g + 1] - l_.query_begin[g]; }
  int64_t targets_of(int64_t g) const { return l_.target_begin[g + 1] - l_.target_begin[g]; }
  size_t batch_bytes(int64_t queries, int64_t targets) const;
  void plan();
  KnnStatus run_batch(const Batch &b);
  std::vector<GroupTile> make_tiles(const Batch &b, const std::vector<int64_t> &first_query,
                                    const std::vector<int64_t> &first_target, int max_ranges,
                                    int *ranges_used) const;
  KnnStatus select(const std::vector<GroupTile> &tiles, GroupSelectArgs a);
  KnnStatus run_alone(int64_t g);
  void add_alone_stats(const KnnStats &s);

  const KnnProblem &p_;
  const KnnGroupLayout &l_;
  const PlainJoin &plain_;
  int64_t *neighbors_;
  double *distances_;
  DeviceContext &ctx_;
  bool keyed_ = false;
  int cap_ = 32;

  std::vector<int64_t> segmented_;  // groups of the batches, in order
  std::vector<Batch> batches_;
  std::vector<int64_t> alone_;      // groups that run alone

  // What ran, for the statistics.
  int64_t launches_ = 0;
  int64_t exact_pairs_ = 0;
  double seconds_transfer_ = 0, seconds_filter_ = 0, seconds_select_ = 0;
  KnnStats alone_stats_{};
  int64_t alone_run_ = 0;
};

// Device bytes of a batch with these rows, one list per query (the
// ranges' extra lists are fitted into what the budget leaves).
size_t GroupJoin::batch_bytes(int64_t queries, int64_t targets) const {
  const size_t per_row = 4 * static_cast<size_t>(p_.dim) + 4 + 1 + (keyed_ ? 8 : 0);
  return (static_cast<size_t>(queries) + targets) * per_row + static_cast<size_t>(targets) * 8 +
         static_cast<size_t>(queries) *
             (static_cast<size_t>(cap_) * 12 + static_cast<size_t>(p_.k) * 24);
}

void GroupJoin::plan() {
  const bool segmentable = p_.element == KNN_ELEMENT_FLOAT32 && p_.k <= kGroupMaxCap;
  const size_t limit = ctx_.memory_budget / 2;
  Batch open;
  for (int64_t g = 0; g < l_.n_groups; g++) {
    const int64_t nq = queries_of(g), nt = targets_of(g);
    if (nq == 0 || nt == 0) continue;  // targets nobody asks for
    const bool alone = !segmentable ||
                       static_cast<double>(nq) * static_cast<double>(nt) >= kAloneMinPairs ||
                       batch_bytes(nq, nt) > limit || nq > kMaxBatchRows || nt > kMaxBatchRows;
    if (alone) {
      alone_.push_back(g);
      continue;
    }
    if (open.end > open.first &&
        (batch_bytes(open.queries + nq, open.targets + nt) > limit ||
         open.queries + nq > kMaxBatchRows || open.targets + nt > kMaxBatchRows)) {
      batches_.push_back(open);
      open = Batch{};
      open.first = open.end = segmented_.size();
    }
    segmented_.push_back(g);
    open.end = segmented_.size();
    open.queries += nq;
    open.targets += nt;
  }
  if (open.end > open.first) batches_.push_back(open);
}

// The work items of a batch, longer target ranges first (the launch's
// last blocks are short ones). A group's targets are split into up to
// max_ranges ranges when the batch has too few query tiles for the GPU.
std::vector<GroupTile> GroupJoin::make_tiles(const Batch &b,
                                             const std::vector<int64_t> &first_query,
                                             const std::vector<int64_t> &first_target,
                                             int max_ranges, int *ranges_used) const {
  int64_t query_tiles = 0;
  for (size_t i = b.first; i < b.end; i++)
    query_tiles += ceil_div64(queries_of(segmented_[i]), kGroupTileQueries);
  const int64_t want_ranges = std::max<int64_t>(1, ceil_div64(kWantedTiles, query_tiles));
  std::vector<GroupTile> tiles;
  *ranges_used = 1;
  for (size_t i = b.first; i < b.end; i++) {
    const int64_t g = segmented_[i];
    const int64_t nq = queries_of(g), nt = targets_of(g);
    const int64_t ranges = std::max<int64_t>(
        1, std::min<int64_t>(
               {want_ranges, nt / kMinRangeTargets, static_cast<int64_t>(max_ranges)}));
    const int64_t range = ceil_div64(ceil_div64(nt, ranges), kTileTargets) * kTileTargets;
    for (int64_t q0 = 0; q0 < nq; q0 += kGroupTileQueries)
      for (int64_t s = 0; s * range < nt; s++) {
        GroupTile t;
        t.query_first = static_cast<int32_t>(first_query[i - b.first] + q0);
        t.query_count = static_cast<int32_t>(std::min<int64_t>(kGroupTileQueries, nq - q0));
        t.target_first = static_cast<int32_t>(first_target[i - b.first] + s * range);
        t.target_count = static_cast<int32_t>(std::min(range, nt - s * range));
        t.segment = static_cast<int32_t>(s);
        tiles.push_back(t);
        *ranges_used = std::max(*ranges_used, static_cast<int>(s + 1));
      }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const GroupTile &x, const GroupTile &y) {
    return x.target_count > y.target_count;
  });
  return tiles;
}

// The segmented launches over the tiles, each of bounded work; a cancel
// is seen between them.
KnnStatus GroupJoin::select(const std::vector<GroupTile> &tiles, GroupSelectArgs a) {
  DeviceBuffer<GroupTile> d_tiles;
  KNN_TRY(d_tiles.allocate(ctx_, tiles.size(), "group work items"));
  CUDA_CHECK(ctx_, cudaMemcpyAsync(d_tiles.get(), tiles.data(), tiles.size() * sizeof(GroupTile),
                                   cudaMemcpyHostToDevice, ctx_.stream));
  const double dims = static_cast<double>(std::max(p_.dim, 4));
  size_t first = 0;
  while (first < tiles.size()) {
    double work = 0;
    size_t end = first;
    while (end < tiles.size() && (end == first || work < kWorkPerLaunch)) {
      const int64_t padded = ceil_div64(tiles[end].target_count, kTileTargets) * kTileTargets;
      work += static_cast<double>(kGroupTileQueries) * static_cast<double>(padded) * dims;
      exact_pairs_ += static_cast<int64_t>(tiles[end].query_count) * tiles[end].target_count;
      end++;
    }
    a.tiles = d_tiles.get() + first;
    a.n_tiles = static_cast<int64_t>(end - first);
    KNN_TRY(launch_group_select(ctx_, a));
    launches_++;
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
    KNN_TRY(ctx_.cancel_point());
    first = end;
  }
  return KNN_OK;
}

KnnStatus GroupJoin::run_batch(const Batch &b) {
  const int dim = p_.dim;
  const int k = p_.k;
  // The batch's rows, group after group, and where each group starts.
  std::vector<int64_t> q_rows, t_rows, first_query, first_target;
  q_rows.reserve(static_cast<size_t>(b.queries));
  t_rows.reserve(static_cast<size_t>(b.targets));
  for (size_t i = b.first; i < b.end; i++) {
    const int64_t g = segmented_[i];
    first_query.push_back(static_cast<int64_t>(q_rows.size()));
    first_target.push_back(static_cast<int64_t>(t_rows.size()));
    q_rows.insert(q_rows.end(), l_.query_rows + l_.query_begin[g],
                  l_.query_rows + l_.query_begin[g + 1]);
    t_rows.insert(t_rows.end(), l_.target_rows + l_.target_begin[g],
                  l_.target_rows + l_.target_begin[g + 1]);
  }
  const bool same_rows = p_.queries == p_.targets && q_rows == t_rows &&
                         (!keyed_ || p_.query_keys == p_.target_keys);
  const int64_t nq = b.queries, nt = b.targets;
  const bool cosine = p_.metric == KNN_METRIC_COSINE;

  // Lists: one per query and target range, as many ranges as the budget
  // leaves room for (at most what the rerank merges).
  const size_t base = batch_bytes(nq, nt);
  const size_t list_bytes = static_cast<size_t>(nq) * cap_ * 12;
  const size_t spare = ctx_.memory_budget > base ? ctx_.memory_budget - base : 0;
  const int max_ranges = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(kMaxListEntries / cap_,
                           static_cast<int64_t>(spare / 2 / std::max<size_t>(list_bytes, 1)))));
  int segments = 1;
  const std::vector<GroupTile> tiles =
      make_tiles(b, first_query, first_target, max_ranges, &segments);

  DeviceBuffer<float> q_x, q_norm, t_x, t_norm;
  DeviceBuffer<uint8_t> q_zero, t_zero;
  DeviceBuffer<int64_t> q_keys, t_keys, t_problem_rows;
  DeviceBuffer<uint64_t> list_key;
  DeviceBuffer<uint32_t> list_row;
  DeviceBuffer<uint64_t> out_key;
  DeviceBuffer<int64_t> out_row;
  DeviceBuffer<double> out_dist;
  KNN_TRY(q_x.allocate(ctx_, static_cast<size_t>(nq) * dim, "group query rows"));
  if (!same_rows) KNN_TRY(t_x.allocate(ctx_, static_cast<size_t>(nt) * dim, "group target rows"));
  if (cosine) {
    KNN_TRY(q_norm.allocate(ctx_, nq, "group query rows"));
    KNN_TRY(q_zero.allocate(ctx_, nq, "group query rows"));
    if (!same_rows) {
      KNN_TRY(t_norm.allocate(ctx_, nt, "group target rows"));
      KNN_TRY(t_zero.allocate(ctx_, nt, "group target rows"));
    }
  }
  if (keyed_) {
    KNN_TRY(q_keys.allocate(ctx_, nq, "group query keys"));
    if (!same_rows) KNN_TRY(t_keys.allocate(ctx_, nt, "group target keys"));
  }
  KNN_TRY(t_problem_rows.allocate(ctx_, nt, "group target rows"));
  const size_t slots = static_cast<size_t>(nq) * segments * cap_;
  KNN_TRY(list_key.allocate(ctx_, slots, "group candidate lists"));
  KNN_TRY(list_row.allocate(ctx_, slots, "group candidate lists"));
  KNN_TRY(out_key.allocate(ctx_, static_cast<size_t>(nq) * k, "group results"));
  KNN_TRY(out_row.allocate(ctx_, static_cast<size_t>(nq) * k, "group results"));
  KNN_TRY(out_dist.allocate(ctx_, static_cast<size_t>(nq) * k, "group results"));
  // The uploads run on the staging stream: the allocations must be complete.
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));

  Clock::time_point t0 = Clock::now();
  const size_t row_bytes = 4 * static_cast<size_t>(dim);
  KNN_TRY(upload_gathered(ctx_, q_x.get(), p_.queries, row_bytes, q_rows.data(), nq));
  if (keyed_) KNN_TRY(upload_gathered(ctx_, q_keys.get(), p_.query_keys, 8, q_rows.data(), nq));
  if (!same_rows) {
    KNN_TRY(upload_gathered(ctx_, t_x.get(), p_.targets, row_bytes, t_rows.data(), nt));
    if (keyed_) KNN_TRY(upload_gathered(ctx_, t_keys.get(), p_.target_keys, 8, t_rows.data(), nt));
  }
  KNN_TRY(upload_to_device(ctx_, t_problem_rows.get(), t_rows.data(),
                           t_rows.size() * sizeof(int64_t)));
  seconds_transfer_ += seconds_since(t0);
  KNN_TRY(ctx_.cancel_point());
  const float *tx = same_rows ? q_x.get() : t_x.get();
  const float *tn = same_rows ? q_norm.get() : t_norm.get();
  const int64_t *tk = same_rows ? q_keys.get() : t_keys.get();

  t0 = Clock::now();
  if (cosine) {
    KNN_TRY(launch_row_stats(ctx_, q_x.get(), nq, dim, q_norm.get(), q_zero.get()));
    if (!same_rows) KNN_TRY(launch_row_stats(ctx_, t_x.get(), nt, dim, t_norm.get(), t_zero.get()));
  }
  const CandidateLists lists{list_key.get(), list_row.get(), segments, cap_, k};
  KNN_TRY(launch_clear_entries(ctx_, lists.key, lists.row, static_cast<int64_t>(slots)));
  GroupSelectArgs a;
  a.metric = p_.metric;
  a.dim = dim;
  a.queries = q_x.get();
  a.targets = tx;
  a.query_norm = q_norm.get();
  a.target_norm = tn;
  a.query_keys = q_keys.get();
  a.target_keys = tk;
  a.lists = lists;
  KNN_TRY(select(tiles, a));
  seconds_filter_ += seconds_since(t0);

  t0 = Clock::now();
  RerankArgs r;
  r.lists = lists;
  r.k = k;
  r.exact_lists = true;
  r.metric = p_.metric;
  r.dim = dim;
  r.q.x = q_x.get();
  r.q.norm = q_norm.get();
  r.q.n = nq;
  r.t.x = tx;
  r.t.norm = tn;
  r.t.n = nt;
  r.out = ResultArrays{out_key.get(), out_row.get(), out_dist.get()};
  KNN_TRY(launch_rerank(ctx_, r));
  KNN_TRY(launch_map_rows(ctx_, out_row.get(), nq * static_cast<int64_t>(k), t_problem_rows.get()));
  exact_pairs_ += nq * static_cast<int64_t>(k);
  CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  seconds_select_ += seconds_since(t0);
  KNN_TRY(ctx_.cancel_point());

  t0 = Clock::now();
  std::vector<int64_t> rows(static_cast<size_t>(nq) * k);
  std::vector<double> dist(static_cast<size_t>(nq) * k);
  KNN_TRY(download_to_host(ctx_, rows.data(), out_row.get(), rows.size() * sizeof(int64_t)));
  KNN_TRY(download_to_host(ctx_, dist.data(), out_dist.get(), dist.size() * sizeof(double)));
  for (int64_t i = 0; i < nq; i++) {
    std::memcpy(neighbors_ + q_rows[i] * k, rows.data() + i * k, k * sizeof(int64_t));
    std::memcpy(distances_ + q_rows[i] * k, dist.data() + i * k, k * sizeof(double));
  }
  seconds_transfer_ += seconds_since(t0);
  return KNN_OK;
}

// One group through the ordinary methods, its rows gathered on the host.
KnnStatus GroupJoin::run_alone(int64_t g) {
  const int64_t *q_rows = l_.query_rows + l_.query_begin[g];
  const int64_t *t_rows = l_.target_rows + l_.target_begin[g];
  const int64_t nq = queries_of(g), nt = targets_of(g);
  // A large group's gather takes seconds: it looks at cancel as it goes.
  GroupSubProblem group;
  if (!make_group_subproblem(p_, q_rows, nq, t_rows, nt, ctx_.cancel, &group))
    return ctx_.cancel_point();
  const KnnProblem &sub = group.problem;
  std::vector<int64_t> nb(static_cast<size_t>(nq) * sub.k);
  std::vector<double> d(nb.size());
  KnnStats s{};
  KNN_TRY(plain_(sub, nb.data(), d.data(), &s));
  add_alone_stats(s);
  scatter_group_results(q_rows, nq, t_rows, sub.k, p_.k, nb.data(), d.data(), neighbors_,
                        distances_);
  return KNN_OK;
}

void GroupJoin::add_alone_stats(const KnnStats &s) {
  if (alone_run_++ == 0) {
    alone_stats_.method = s.method;
    std::memcpy(alone_stats_.variant, s.variant, sizeof alone_stats_.variant);
  }
  add_run_stats(s, &alone_stats_);
}

KnnStatus GroupJoin::run() {
  keyed_ = p_.query_keys != nullptr && p_.target_keys != nullptr;
  cap_ = next_pow2(std::max(p_.k, 32));
  fill_padding(p_.n_queries, p_.k, neighbors_, distances_);
  plan();
  for (const Batch &b : batches_) {
    KNN_TRY(ctx_.cancel_point());
    KNN_TRY(run_batch(b));  // its device memory is freed before the next step
  }
  for (int64_t g : alone_) {
    KNN_TRY(ctx_.cancel_point());
    KNN_TRY(run_alone(g));
  }
  return KNN_OK;
}

// "groups: 100, segmented 100 in 2 launches, alone 0"; the counts and
// seconds of both kinds summed. The method: brute force where any group
// was segmented, else the first lone group's.
void GroupJoin::describe(KnnStats *stats) const {
  const KnnStats &a = alone_stats_;
  stats->method = segmented_.empty() && alone_run_ > 0 ? a.method : KNN_METHOD_BRUTE;
  const std::string variant =
      "groups: " + std::to_string(segmented_.size() + alone_.size()) + ", segmented " +
      std::to_string(segmented_.size()) + " in " + std::to_string(launches_) + " launches, alone " +
      std::to_string(alone_run_);
  copy_message(stats->variant, sizeof stats->variant, variant.c_str());
  stats->query_clusters = a.query_clusters;
  stats->target_clusters = a.target_clusters;
  stats->distance_computations = exact_pairs_ + a.distance_computations;
  stats->threads_per_query =
      std::max(segmented_.empty() ? 0 : 256 / kGroupTileQueries, a.threads_per_query);
  stats->seconds_transfer = seconds_transfer_ + a.seconds_transfer;
  stats->seconds_cluster = a.seconds_cluster;
  stats->seconds_filter = seconds_filter_ + a.seconds_filter;
  stats->seconds_select = seconds_select_ + a.seconds_select;
  int64_t pairs = 0;
  for (int64_t g = 0; g < l_.n_groups; g++) pairs += queries_of(g) * targets_of(g);
  stats->pairs = pairs;
}

}  // namespace

KnnStatus group_join(const KnnProblem &p, const KnnGroupLayout &groups, const PlainJoin &plain,
                     int64_t *neighbors, double *distances, KnnStats *stats,
                     DeviceContext &ctx) {
  const Clock::time_point start = Clock::now();
  if (groups.n_groups < 0) {
    ctx.error = "group layout: negative group count";
    return KNN_INVALID_ARGUMENT;
  }
  if (const char *why = layout_invalid_reason(groups.query_rows, groups.query_begin,
                                              groups.n_groups, p.n_queries)) {
    ctx.error = why;
    return KNN_INVALID_ARGUMENT;
  }
  if (const char *why = layout_invalid_reason(groups.target_rows, groups.target_begin,
                                              groups.n_groups, p.n_targets)) {
    ctx.error = why;
    return KNN_INVALID_ARGUMENT;
  }
  GroupJoin join(p, groups, plain, neighbors, distances, ctx);
  const KnnStatus st = join.run();
  if (stats != nullptr) {
    join.describe(stats);
    stats->seconds_total = seconds_since(start);
  }
  return st;
}

}  // namespace cuda
}  // namespace knn
