// gemm_join.cpp -- the certified SGEMM brute force (gemm_join.h).
//
// Per query a list of candidates: every eligible target whose lower bound
// passed the query's threshold when its tile was filtered (gemm_bound.h).
// The threshold only tightens: when a list fills up, tau becomes the k-th
// smallest upper bound in it and the entries whose lower bound exceeds
// tau are dropped. At the end the kept candidates are re-ranked with the
// canonical distance; a list that outgrows its limit is abandoned and the
// query redone by the exact brute force.
#include "gemm_join.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "blas_buffers.h"
#include "blas_library.h"
#include "brute_force.h"
#include "gemm_bound.h"
#include "lane_sums.h"
#include "parallel_for.h"
#include "row_distance.h"
#include "top_k.h"
#include "../stopwatch.h"

namespace knn {
namespace cpu {
namespace {



// Candidate lists of all queries held at once by the symmetric variant,
// at their first capacity (vectors may hold up to twice their size).
constexpr int64_t kSymmetricStateBytes = int64_t{512} << 20;
// Entries all lists together may take beyond their first capacity (near
// ties); a list that needs more once these are taken is redone exactly.
constexpr int64_t kSpareEntries = (int64_t{256} << 20) / 48;

// Tile entries tested at once, without branches, before any is kept.
constexpr int64_t kChunk = 32;

// Does a[c] + m[c] g[c] <= thr hold for some c < len? (One branch-free
// pass that vectorises; the same double expression as the keep test.)
__attribute__((target_clones("avx2", "default"))) bool any_passes_row(
    const double *a, const double *m, const float *g, int64_t len, double thr) {
  int any = 0;
  for (int64_t c = 0; c < len; c++) any |= (a[c] + m[c] * g[c] <= thr);
  return any != 0;
}

// The same with one target's a and m against queries' thresholds.
__attribute__((target_clones("avx2", "default"))) bool any_passes_column(
    double a, double m, const float *g, int64_t len, const double *thr) {
  int any = 0;
  for (int64_t c = 0; c < len; c++) any |= (a + m * g[c] <= thr[c]);
  return any != 0;
}

struct Candidate {
  double v;      // a[t] + m[t] g: compared with the query's threshold
  double upper;  // U
  int64_t row;
};

class GemmJoin {
 public:
  GemmJoin(const JoinInput &input, const JoinOutput &output, std::vector<float> qn,
           std::vector<float> tn)
      : in_(input), out_(output), bound_(input.metric, input.dim),
        qn_(std::move(qn)), tn_(std::move(tn)),
        first_cap_(2 * int64_t{input.k} + 32),
        max_cap_(16 * int64_t{input.k} + 1024), spare_(kSpareEntries) {
    a_.resize(tn_.size());
    m_.resize(tn_.size());
    for (size_t t = 0; t < tn_.size(); t++) {
      a_[t] = bound_.a(tn_[t]);
      m_[t] = bound_.m(tn_[t]);
    }
  }

  // Queries [q0, q1) get fresh lists.
  void reset(int64_t q0, int64_t q1) {
    lists_.resize(q1 - q0);
    thr_.assign(q1 - q0, std::numeric_limits<double>::infinity());
    tau_.assign(q1 - q0, std::numeric_limits<double>::infinity());
    cap_.assign(q1 - q0, first_cap_);
    for (auto &l : lists_) l.clear();
    base_ = q0;
  }

  // G rows are queries q0.., columns targets t0.. (the query's view).
  void filter_rows(const float *g, int64_t ldg, int64_t q0, int64_t nq, int64_t t0, int64_t nt) {
    const double *a = a_.data() + t0, *m = m_.data() + t0;
    for (int64_t r = 0; r < nq; r++) {
      const int64_t q = q0 + r;
      const float *row = g + r * ldg;
      for (int64_t c0 = 0; c0 < nt; c0 += kChunk) {
        const int64_t len = std::min(kChunk, nt - c0);
        if (!any_passes_row(a + c0, m + c0, row + c0, len, thr_[q - base_])) continue;
        for (int64_t c = c0; c < c0 + len; c++) {
          const double v = a[c] + m[c] * row[c];
          if (v <= thr_[q - base_]) keep(q, t0 + c, row[c], v);
        }
      }
    }
  }

  // G rows are targets t0.., columns queries q0.. (the other block's view).
  void filter_columns(const float *g, int64_t ldg, int64_t t0, int64_t nt, int64_t q0, int64_t nq) {
    const double *thr = thr_.data() + (q0 - base_);
    for (int64_t r = 0; r < nt; r++) {
      const int64_t t = t0 + r;
      const float *row = g + r * ldg;
      const double a = a_[t], m = m_[t];
      for (int64_t c0 = 0; c0 < nq; c0 += kChunk) {
        const int64_t len = std::min(kChunk, nq - c0);
        if (!any_passes_column(a, m, row + c0, len, thr + c0)) continue;
        for (int64_t c = c0; c < c0 + len; c++) {
          const double v = a + m * row[c];
          if (v <= thr[c]) keep(q0 + c, t, row[c], v);
        }
      }
    }
  }

  // Exact results of queries [q0, q1); overflowed ones go to *redo. A
  // cancel ends it between queries (a block of 512 queries with a large k
  // took up to 0.6 s).
  void rerank(int64_t q0, int64_t q1, std::vector<float> *sums, std::vector<const float *> *rows,
              TopK *best, std::vector<int64_t> *redo, int64_t *computed) {
    const int64_t k = in_.k;
    for (int64_t q = q0; q < q1; q++) {
      if (in_.cancelled()) return;
      std::vector<Candidate> &list = lists_[q - base_];
      if (cap_[q - base_] < 0) {
        redo->push_back(q);
        continue;
      }
      release(q);
      tighten(q);  // the final tau: fewer exact distances
      const double thr = thr_[q - base_];
      rows->clear();
      for (const Candidate &c : list)
        if (c.v <= thr) rows->push_back(in_.target_row(c.row));
      sums->resize(rows->size());
      lane_sums_scattered(in_.metric, in_.query_row(q), rows->data(),
                          static_cast<int64_t>(rows->size()), in_.dim, sums->data());
      *computed += static_cast<int64_t>(rows->size());
      best->clear();
      size_t i = 0;
      for (const Candidate &c : list) {
        if (!(c.v <= thr)) continue;
        const double key = ordering_key(in_.metric, (*sums)[i++], qn_[q], tn_[c.row]);
        best->offer(key, c.row);
      }
      list.clear();
      list.shrink_to_fit();
      best->write_sorted(k, out_.neighbors + q * k, out_.distances + q * k,
                         [&](double key) { return distance_from_key(in_.metric, key); });
    }
  }

 private:
  void keep(int64_t q, int64_t t, float g, double v) {
    if (in_.excluded(q, t)) return;
    const int64_t i = q - base_;
    std::vector<Candidate> &list = lists_[i];
    list.push_back({v, bound_.upper(qn_[q], tn_[t], g), t});
    if (static_cast<int64_t>(list.size()) >= cap_[i]) compact(q);
  }

  // tau = min(tau, the k-th smallest U of the list), and the threshold.
  void tighten(int64_t q) {
    const int64_t i = q - base_;
    std::vector<Candidate> &list = lists_[i];
    const int64_t k = in_.k;
    if (static_cast<int64_t>(list.size()) < k) return;
    std::nth_element(list.begin(), list.begin() + (k - 1), list.end(),
                     [](const Candidate &x, const Candidate &y) { return x.upper < y.upper; });
    tau_[i] = std::min(tau_[i], list[k - 1].upper);
    thr_[i] = bound_.threshold(qn_[q], tau_[i]);
  }

  // Tightens tau and drops what it excludes; abandons a list that stays
  // too long.
  void compact(int64_t q) {
    const int64_t i = q - base_;
    std::vector<Candidate> &list = lists_[i];
    tighten(q);
    const double thr = thr_[i];
    list.erase(std::remove_if(list.begin(), list.end(),
                              [thr](const Candidate &c) { return !(c.v <= thr); }),
               list.end());
    const int64_t size = static_cast<int64_t>(list.size());
    if (size * 2 <= cap_[i]) return;
    // Too many near-ties: a longer list, or the exact brute force decides.
    const int64_t more = cap_[i];
    if (2 * more <= max_cap_ && spare_.fetch_sub(more) >= more) {
      cap_[i] += more;
      return;
    }
    if (2 * more <= max_cap_) spare_ += more;  // not granted
    release(q);
    cap_[i] = -1;
    thr_[i] = -std::numeric_limits<double>::infinity();
    list.clear();
    list.shrink_to_fit();
  }

  // Returns the list's entries beyond its first capacity to the spares.
  void release(int64_t q) {
    const int64_t i = q - base_;
    if (cap_[i] > first_cap_) spare_ += cap_[i] - first_cap_;
    if (cap_[i] > 0) cap_[i] = first_cap_;
  }

  const JoinInput &in_;
  const JoinOutput out_;
  const GemmBound bound_;
  const std::vector<float> qn_, tn_;
  std::vector<double> a_, m_;
  const int64_t first_cap_, max_cap_;
  std::atomic<int64_t> spare_;
  int64_t base_ = 0;
  std::vector<std::vector<Candidate>> lists_;
  std::vector<double> thr_, tau_;
  std::vector<int64_t> cap_;  // -1: overflowed
};

// Per worker: what a re-rank needs.
struct RerankScratch {
  std::vector<float> sums;
  std::vector<const float *> rows;
  std::vector<int64_t> redo;
  int64_t computed = 0;
  TopK best;

  void run(GemmJoin &join, int64_t q0, int64_t q1) {
    join.rerank(q0, q1, &sums, &rows, &best, &redo, &computed);
  }
};

std::vector<RerankScratch> rerank_scratch(const JoinInput &in, int workers) {
  const int64_t capacity = std::min<int64_t>(in.k, std::max<int64_t>(1, in.n_targets));
  std::vector<RerankScratch> scratch(workers);
  for (RerankScratch &s : scratch) s.best = TopK(capacity);
  return scratch;
}

// The overflowed queries of every worker, in order; counts the re-ranked pairs.
std::vector<int64_t> collect_redo(std::vector<RerankScratch> &scratch, JoinReport *report) {
  std::vector<int64_t> redo;
  for (RerankScratch &s : scratch) {
    report->distance_computations += s.computed;
    redo.insert(redo.end(), s.redo.begin(), s.redo.end());
  }
  std::sort(redo.begin(), redo.end());
  return redo;
}

bool norms_ok(const GemmBound &bound, const std::vector<float> &norms) {
  for (float n : norms)
    if (!bound.norm_ok(n)) return false;
  return true;
}

// Does x[0..count) hold a subnormal? On the bits, without branches, so
// that it vectorises (a test per value with && branches on every zero of
// sparse data): magnitude bits in [1, 0x7fffff].
__attribute__((target_clones("avx2", "default"))) bool any_subnormal(const float *x,
                                                                     int64_t count) {
  int any = 0;
  for (int64_t i = 0; i < count; i++) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    any |= ((bits & 0x7fffffffu) - 1u) < 0x007fffffu;
  }
  return any != 0;
}

// True when some value is subnormal (gemm_bound.h, section 5).
bool has_subnormal(const float *x, int64_t count, const JoinInput &in) {
  constexpr int64_t kPerItem = int64_t{1} << 18;
  std::atomic<bool> found{false};
  parallel_for((count + kPerItem - 1) / kPerItem, in.n_threads, in.cancel,
               [&](int64_t item, int) {
                 const int64_t begin = item * kPerItem;
                 if (any_subnormal(x + begin, std::min(count - begin, kPerItem))) found = true;
               });
  return found;
}

// Every block pair (i <= j) of the one matrix once; block i's rows take
// the tile row-wise, block j's column-wise, each under its block's lock.
void symmetric_pass(const JoinInput &in, GemmJoin &join, int64_t block) {
  const int64_t n = in.n_queries;
  const int64_t n_blocks = (n + block - 1) / block;
  std::vector<std::pair<int64_t, int64_t>> pairs;
  // Diagonal blocks first: each query's threshold then starts from a
  // whole block of targets, so fewer later candidates pass it.
  for (int64_t i = 0; i < n_blocks; i++) pairs.push_back({i, i});
  for (int64_t i = 0; i < n_blocks; i++)
    for (int64_t j = i + 1; j < n_blocks; j++) pairs.push_back({i, j});
  std::unique_ptr<std::mutex[]> locks(new std::mutex[n_blocks]);
  const int workers = parallel_workers(static_cast<int64_t>(pairs.size()), in.n_threads);
  // No bigger than the join: a fresh tile is page faults and zeroing.
  const int64_t side = std::min(block, n);
  std::vector<std::vector<float>> tiles(workers, std::vector<float>(side * side));
  parallel_for(static_cast<int64_t>(pairs.size()), in.n_threads, in.cancel,
               [&](int64_t item, int worker) {
    const int64_t i = pairs[item].first, j = pairs[item].second;
    const int64_t r0 = i * block, nr = std::min(block, n - r0);
    const int64_t c0 = j * block, nc = std::min(block, n - c0);
    float *g = tiles[worker].data();
    gemm_abt(in.query_row(r0), nr, in.query_row(c0), nc, in.dim, g, nc);
    {
      std::lock_guard<std::mutex> lock(locks[i]);
      join.filter_rows(g, nc, r0, nr, c0, nc);
    }
    if (i != j) {
      std::lock_guard<std::mutex> lock(locks[j]);
      join.filter_columns(g, nc, r0, nr, c0, nc);
    }
  });
}

// Query blocks against every target tile; a block owns its queries and
// re-ranks them at once, so candidate lists live only while a block runs.
std::vector<int64_t> general_pass(const JoinInput &in, GemmJoin &join, int64_t block,
                                  JoinReport *report) {
  const int64_t n_blocks = (in.n_queries + block - 1) / block;
  const int workers = parallel_workers(n_blocks, in.n_threads);
  std::vector<std::vector<float>> tiles(
      workers, std::vector<float>(std::min(block, in.n_queries) * std::min(block, in.n_targets)));
  std::vector<RerankScratch> scratch = rerank_scratch(in, workers);
  parallel_for(n_blocks, in.n_threads, in.cancel, [&](int64_t item, int worker) {
    const int64_t q0 = item * block, nq = std::min(block, in.n_queries - q0);
    float *g = tiles[worker].data();
    for (int64_t t0 = 0; t0 < in.n_targets; t0 += block) {
      if (in.cancelled()) return;
      const int64_t nt = std::min(block, in.n_targets - t0);
      gemm_abt(in.query_row(q0), nq, in.target_row(t0), nt, in.dim, g, nt);
      join.filter_rows(g, nt, q0, nq, t0, nt);
    }
    scratch[worker].run(join, q0, q0 + nq);
  });
  return collect_redo(scratch, report);
}

// Re-ranks every query in parallel; returns the overflowed ones.
std::vector<int64_t> rerank_all(const JoinInput &in, GemmJoin &join, JoinReport *report) {
  constexpr int64_t kQueriesPerItem = 64;
  const int64_t n_items = (in.n_queries + kQueriesPerItem - 1) / kQueriesPerItem;
  std::vector<RerankScratch> scratch =
      rerank_scratch(in, parallel_workers(n_items, in.n_threads));
  parallel_for(n_items, in.n_threads, in.cancel, [&](int64_t item, int worker) {
    const int64_t q0 = item * kQueriesPerItem;
    scratch[worker].run(join, q0, std::min(in.n_queries, q0 + kQueriesPerItem));
  });
  return collect_redo(scratch, report);
}

}  // namespace

// A tile side: up to 512 x 512 floats (1 MiB, L2-sized) amortise the
// SGEMM's packing; fewer rows in many dimensions keep one tile's SGEMM
// (2 B^2 d flops, about 20 ms at 40 GFLOP/s) well inside the 50 ms a
// cancel may wait.
int64_t gemm_block_rows(int dim) {
  const double rows = std::sqrt(4e8 / std::max(1, dim));
  return std::max<int64_t>(64, std::min<int64_t>(512, static_cast<int64_t>(rows) / 32 * 32));
}

GemmOutcome gemm_join(const JoinInput &all_threads, const JoinOutput &output,
                      const GemmOptions &options, JoinReport *report) {
  const Clock::time_point start = Clock::now();
  if (all_threads.metric == KNN_METRIC_L1 || !blas_library().usable() ||
      all_threads.n_queries == 0 || all_threads.n_targets == 0 ||
      all_threads.dim > GemmBound::kMaxDim)
    return GemmOutcome::kUnsupported;
  // No more threads than OpenBLAS has buffers for (blas_buffers.h); none
  // at all: the AVX2 loop answers instead.
  const BlasBufferLease lease(all_threads.n_threads);
  if (lease.granted() == 0) return GemmOutcome::kUnsupported;
  JoinInput input = all_threads;
  input.n_threads = lease.granted();
  const GemmBound bound(input.metric, input.dim);
  std::vector<float> qn = squared_norms(input.queries, input.n_queries, input.dim, input);
  std::vector<float> tn = input.same_rows()
                              ? qn
                              : squared_norms(input.targets, input.n_targets, input.dim, input);
  if (input.cancelled()) return GemmOutcome::kCancelled;
  if (!norms_ok(bound, qn) || !norms_ok(bound, tn) ||
      has_subnormal(input.queries, input.n_queries * input.dim, input) ||
      (!input.same_rows() && has_subnormal(input.targets, input.n_targets * input.dim, input)))
    return GemmOutcome::kUnsupported;

  const int64_t block = options.block_rows > 0 ? std::min<int64_t>(options.block_rows, 4096)
                                               : gemm_block_rows(input.dim);
  report->threads_used = input.n_threads;
  GemmJoin join(input, output, std::move(qn), std::move(tn));
  join.reset(0, input.n_queries);
  const int64_t state_bytes =
      input.n_queries * (2 * int64_t{input.k} + 32) * 2 * int64_t{sizeof(Candidate)};
  const bool symmetric =
      options.symmetric && input.same_rows() && state_bytes <= kSymmetricStateBytes;
  // seconds_filter: SGEMM and bounds; seconds_select: exact re-rank (the
  // general pass interleaves the two: all of it counts as filter there).
  std::vector<int64_t> redo;
  Clock::time_point select_start;
  if (symmetric) {
    symmetric_pass(input, join, block);
    report->seconds_filter = seconds_since(start);
    if (input.cancelled()) return GemmOutcome::kCancelled;
    select_start = Clock::now();
    redo = rerank_all(input, join, report);
  } else {
    redo = general_pass(input, join, block, report);
    report->seconds_filter = seconds_since(start);
    select_start = Clock::now();
  }
  if (input.cancelled()) return GemmOutcome::kCancelled;
  if (!redo.empty()) {
    JoinReport exact;
    if (!brute_force_queries(input, output, redo.data(), static_cast<int64_t>(redo.size()),
                             &exact))
      return GemmOutcome::kCancelled;
    report->distance_computations += exact.distance_computations;
  }
  report->seconds_select = seconds_since(select_start);
  report->variant = symmetric ? "blas/symmetric" : "blas";
  return GemmOutcome::kDone;
}

}  // namespace cpu
}  // namespace knn
