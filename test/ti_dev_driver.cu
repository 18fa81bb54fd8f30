// ti_dev_driver.cu -- development driver of the GPU TI join (not part of
// the product): exactness against references and timings.
//
//   ti_dev_driver check            random problems vs a CPU brute force
//   ti_dev_driver bench DIR [..]   the benchmark sets (DIR/NAME.f32, rows and
//                                  dims given below) vs a GPU brute force on
//                                  all (or every s-th) query and a CPU brute
//                                  force on a sample; timings; variant sweeps
//
// Build (from the repository root; the brute-force objects are optional,
// without them the non-finite case reports the missing fallback):
//   nvcc -std=c++17 -O3 --fmad=false -Xcompiler -fPIC,-ffp-contract=off,-pthread \
//     -Ikernels -arch=sm_90 -o test/ti_dev_driver test/ti_dev_driver.cu \
//     kernels/cuda/ti_*.cu [other kernels/cuda/*.cu but cuda_module.cu] -lcublas
//
// The CPU reference computes every pair with knn_distance.h (host build,
// -ffp-contract=off) and sorts with knn_result_before; the GPU reference
// does the same on the device. Results must match bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../kernels/cuda/ti_common.cuh"
#include "../kernels/knn_distance.h"

using knn::cuda::DeviceContext;
using knn::cuda::ti::FilterKind;
using knn::cuda::ti::ListKind;
using knn::cuda::ti::TiOptions;

// Brute force of the engine, when its object is linked in.
namespace knn {
namespace cuda {
__attribute__((weak)) KnnStatus brute_force_join(const KnnProblem &, int64_t *, double *,
                                                  KnnStats *, DeviceContext &ctx) {
  ctx.error = "brute_force_join is not linked into this driver";
  return KNN_INTERNAL_ERROR;
}
}  // namespace cuda
}  // namespace knn

#define CK(call)                                                                    \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,             \
                   cudaGetErrorString(e_));                                         \
      std::exit(2);                                                                 \
    }                                                                               \
  } while (0)

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Engine {
  DeviceContext ctx;
  Engine() {
    CK(cudaSetDevice(0));
    ctx.device = 0;
    CK(cudaGetDeviceProperties(&ctx.prop, 0));
    CK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    if (cublasCreate(&ctx.cublas) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      std::exit(2);
    }
    cublasSetStream(ctx.cublas, ctx.stream);
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    ctx.memory_budget = (size_t)(free_b * 0.8);
    std::printf("device: %s, %d SMs, smem/SM %zu, max threads/SM %d, budget %.1f GiB\n",
                ctx.prop.name, ctx.prop.multiProcessorCount, ctx.prop.sharedMemPerMultiprocessor,
                ctx.prop.maxThreadsPerMultiProcessor, ctx.memory_budget / 1073741824.0);
  }
};

// ---------------- references ----------------

static double pair_distance(KnnMetric metric, const float *a, const float *b, int dim) {
  if (metric == KNN_METRIC_L1) return knn_l1_from_sum(knn_l1_sum(a, b, dim));
  return knn_l2_from_squared(knn_l2_squared(a, b, dim));
}

// Exact results of the listed queries (rows/dist: ids.size() x k).
static void cpu_reference(const KnnProblem &p, const std::vector<int64_t> &ids,
                          std::vector<int64_t> &rows, std::vector<double> &dist) {
  const int k = p.k;
  rows.assign(ids.size() * k, -1);
  dist.assign(ids.size() * k, std::nan(""));
  unsigned nthreads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < nthreads; t++) {
    pool.emplace_back([&, t]() {
      std::vector<std::pair<double, int64_t>> cand;
      for (size_t qi = t; qi < ids.size(); qi += nthreads) {
        int64_t i = ids[qi];
        const float *q = p.queries + i * p.dim;
        cand.clear();
        for (int64_t j = 0; j < p.n_targets; j++) {
          if (p.query_keys && p.target_keys && p.query_keys[i] == p.target_keys[j]) continue;
          cand.emplace_back(pair_distance(p.metric, q, p.targets + j * p.dim, p.dim), j);
        }
        size_t take = std::min<size_t>(k, cand.size());
        std::partial_sort(cand.begin(), cand.begin() + take, cand.end(),
                          [](const std::pair<double, int64_t> &a,
                             const std::pair<double, int64_t> &b) {
                            return knn_result_before(a.first, a.second, b.first, b.second);
                          });
        for (size_t s = 0; s < take; s++) {
          rows[qi * k + s] = cand[s].second;
          dist[qi * k + s] = cand[s].first;
        }
      }
    });
  }
  for (auto &th : pool) th.join();
}

// GPU reference: one thread per checked query, every target in row order.
__global__ void gpu_reference_kernel(KnnMetric metric, const float *Q, const float *T, int64_t nt,
                                     int dim, int k, int64_t first, int64_t step, int64_t count,
                                     const int64_t *qk, const int64_t *tk, double *out_d,
                                     int64_t *out_r) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= count) return;
  int64_t i = first + c * step;
  const float *q = Q + i * dim;
  double *d = out_d + c * k;
  int64_t *r = out_r + c * k;
  for (int s = 0; s < k; s++) {
    d[s] = __longlong_as_double(0x7ff8000000000000ll);
    r[s] = -1;
  }
  int filled = 0;
  for (int64_t j = 0; j < nt; j++) {
    if (qk && tk && qk[i] == tk[j]) continue;
    const float *t = T + j * dim;
    double v = metric == KNN_METRIC_L1 ? knn_l1_from_sum(knn_l1_sum(q, t, dim))
                                       : knn_l2_from_squared(knn_l2_squared(q, t, dim));
    if (filled == k && !knn_result_before(v, j, d[k - 1], r[k - 1])) continue;
    int s = filled < k ? filled++ : k - 1;
    while (s > 0 && knn_result_before(v, j, d[s - 1], r[s - 1])) {
      d[s] = d[s - 1];
      r[s] = r[s - 1];
      s--;
    }
    d[s] = v;
    r[s] = j;
  }
}

static void gpu_reference(const KnnProblem &p, int64_t step, std::vector<int64_t> &ids,
                          std::vector<int64_t> &rows, std::vector<double> &dist) {
  int64_t count = (p.n_queries + step - 1) / step;
  ids.resize(count);
  for (int64_t c = 0; c < count; c++) ids[c] = c * step;
  float *Q, *T;
  int64_t *qk = nullptr, *tk = nullptr, *r;
  double *d;
  CK(cudaMalloc(&Q, p.n_queries * p.dim * 4));
  CK(cudaMalloc(&T, p.n_targets * p.dim * 4));
  CK(cudaMemcpy(Q, p.queries, p.n_queries * p.dim * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(T, p.targets, p.n_targets * p.dim * 4, cudaMemcpyHostToDevice));
  if (p.query_keys && p.target_keys) {
    CK(cudaMalloc(&qk, p.n_queries * 8));
    CK(cudaMalloc(&tk, p.n_targets * 8));
    CK(cudaMemcpy(qk, p.query_keys, p.n_queries * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tk, p.target_keys, p.n_targets * 8, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&d, count * p.k * 8));
  CK(cudaMalloc(&r, count * p.k * 8));
  gpu_reference_kernel<<<(unsigned)((count + 127) / 128), 128>>>(
      p.metric, Q, T, p.n_targets, p.dim, p.k, 0, step, count, qk, tk, d, r);
  CK(cudaGetLastError());
  rows.resize(count * p.k);
  dist.resize(count * p.k);
  CK(cudaMemcpy(rows.data(), r, count * p.k * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dist.data(), d, count * p.k * 8, cudaMemcpyDeviceToHost));
  cudaFree(Q);
  cudaFree(T);
  cudaFree(qk);
  cudaFree(tk);
  cudaFree(d);
  cudaFree(r);
}

static bool same_double(double a, double b) {
  if (a != a || b != b) return a != a && b != b;
  uint64_t x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return x == y;
}

// Number of mismatching queries; prints the first few.
static int64_t compare(const char *what, const std::vector<int64_t> &ids, int k,
                       const std::vector<int64_t> &ref_rows, const std::vector<double> &ref_dist,
                       const int64_t *rows, const double *dist, int64_t rows_stride_ids = 1) {
  int64_t bad = 0;
  for (size_t c = 0; c < ids.size(); c++) {
    int64_t i = ids[c];
    bool ok = true;
    for (int s = 0; s < k && ok; s++)
      ok = ref_rows[c * k + s] == rows[i * k + s] && same_double(ref_dist[c * k + s], dist[i * k + s]);
    if (!ok) {
      if (bad < 3) {
        std::printf("  MISMATCH %s query %lld:\n", what, (long long)i);
        for (int s = 0; s < k && s < 24; s++)
          std::printf("    [%d] ref (%lld, %.17g)  got (%lld, %.17g)\n", s,
                      (long long)ref_rows[c * k + s], ref_dist[c * k + s],
                      (long long)rows[i * k + s], dist[i * k + s]);
      }
      bad++;
    }
  }
  (void)rows_stride_ids;
  return bad;
}

static KnnStatus run_ti(Engine &e, const KnnProblem &p, const TiOptions &o, int64_t *rows,
                        double *dist, KnnStats *st) {
  e.ctx.error.clear();
  std::memset(st, 0, sizeof *st);
  KnnStatus s = knn::cuda::ti::ti_join_with_options(p, rows, dist, st, e.ctx, o);
  if (s != KNN_OK) std::printf("  ti_join status %d: %s\n", (int)s, e.ctx.error.c_str());
  return s;
}

// ---------------- random problems ----------------

enum Gen { kUniform, kGrid, kDuplicates, kBlobs, kFarAway, kTiny, kSignedZeros, kHuge };

static void generate(Gen g, int64_t n, int dim, std::mt19937_64 &rng, std::vector<float> &x) {
  x.resize(n * dim);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  switch (g) {
    case kUniform:
      for (auto &v : x) v = u(rng);
      break;
    case kGrid:
      for (auto &v : x) v = (float)(rng() % 5);
      break;
    case kDuplicates: {
      int64_t base = std::max<int64_t>(1, n / 7);
      for (int64_t i = 0; i < n; i++) {
        int64_t src = i < base ? i : (int64_t)(rng() % base);
        for (int d = 0; d < dim; d++)
          x[i * dim + d] = i < base ? (float)(rng() % 100) * 0.25f : x[src * dim + d];
      }
      break;
    }
    case kBlobs: {
      std::normal_distribution<float> nd(0.0f, 0.05f);
      std::vector<float> centre(16 * dim);
      for (auto &v : centre) v = u(rng) * 10.0f;
      for (int64_t i = 0; i < n; i++) {
        int c = (int)(rng() % 16);
        for (int d = 0; d < dim; d++) x[i * dim + d] = centre[c * dim + d] + nd(rng);
      }
      break;
    }
    case kFarAway:
      for (auto &v : x) v = 1.0e5f + (float)(rng() % 1000) * 0.125f;
      break;
    case kTiny:  // squares underflow into subnormals and zero
      for (auto &v : x) v = (float)(rng() % 7) * 1.0e-22f;
      break;
    case kSignedZeros:
      for (auto &v : x) {
        int r = (int)(rng() % 4);
        v = r == 0 ? -0.0f : (r == 1 ? 0.0f : (float)(r - 1));
      }
      break;
    case kHuge:  // large but no distance overflows
      for (auto &v : x) v = (float)(rng() % 1000) * 1.0e14f;
      break;
  }
}

struct Case {
  const char *name;
  Gen gen;
  int64_t nq, nt;
  int dim, k;
  KnnMetric metric;
  bool self;
  int keys;  // 0 none, 1 row ids, 2 shuffled ids, 3 two rows per key,
             // 4 query ids vs target keys row % 1000
  FilterKind filter;
  ListKind list;
  int parts;
  bool dedup;
  size_t budget = 0;  // 0: the engine's
};

static int run_checks(Engine &e) {
  const KnnMetric L2 = KNN_METRIC_L2, L1 = KNN_METRIC_L1;
  const FilterKind FA = FilterKind::Adaptive, FF = FilterKind::Full, FP = FilterKind::Partial;
  const ListKind LA = ListKind::Adaptive, LR = ListKind::Registers, LS = ListKind::Shared,
                 LG = ListKind::Global;
  std::vector<Case> cases = {
      {"uniform d3 self keys", kUniform, 3000, 3000, 3, 20, L2, true, 1, FA, LA, 0, true},
      {"grid d4 self keys (ties)", kGrid, 3000, 3000, 4, 20, L2, true, 1, FA, LA, 0, true},
      {"grid d4 self keys nodedup", kGrid, 3000, 3000, 4, 20, L2, true, 1, FA, LA, 0, false},
      {"dups d21 self keys", kDuplicates, 2500, 2500, 21, 20, L2, true, 1, FA, LA, 0, true},
      {"dups d21 L1", kDuplicates, 2500, 2500, 21, 20, L1, true, 1, FA, LA, 0, true},
      {"blobs d38 self", kBlobs, 3000, 3000, 38, 20, L2, true, 0, FA, LA, 0, true},
      {"blobs d61 gemm", kBlobs, 3000, 3000, 61, 20, L2, true, 1, FA, LA, 0, true},
      {"far d61 gemm", kFarAway, 2000, 2000, 61, 20, L2, true, 1, FA, LA, 0, true},
      {"uniform d100 generic", kUniform, 1500, 1500, 100, 10, L2, true, 1, FA, LA, 0, true},
      {"grid d130 generic L1", kGrid, 1200, 1200, 130, 7, L1, true, 1, FA, LA, 0, true},
      {"two sets", kBlobs, 1700, 2300, 16, 20, L2, false, 0, FA, LA, 0, true},
      {"two sets L1 grid", kGrid, 1900, 1300, 7, 12, L1, false, 0, FA, LA, 0, true},
      {"k > targets", kUniform, 300, 15, 5, 20, L2, false, 0, FA, LA, 0, true},
      {"k = targets self", kGrid, 21, 21, 3, 20, L2, true, 1, FA, LA, 0, true},
      {"k1", kGrid, 3000, 3000, 4, 1, L2, true, 1, FA, LA, 0, true},
      {"k5 shared adaptive", kUniform, 3000, 3000, 8, 5, L2, true, 1, FA, LA, 0, true},
      {"shuffled keys", kGrid, 2000, 2000, 4, 20, L2, true, 2, FA, LA, 0, true},
      {"two rows per key", kGrid, 2000, 2000, 4, 20, L2, true, 3, FA, LA, 0, true},
      {"registers", kDuplicates, 3000, 3000, 8, 20, L2, true, 1, FF, LR, 1, true},
      {"shared", kDuplicates, 3000, 3000, 8, 20, L2, true, 1, FF, LS, 1, true},
      {"global", kDuplicates, 3000, 3000, 8, 20, L2, true, 1, FF, LG, 1, true},
      {"parts 2", kGrid, 3000, 3000, 4, 20, L2, true, 1, FF, LA, 2, true},
      {"parts 3 L1", kGrid, 3000, 3000, 4, 20, L1, true, 1, FF, LA, 3, true},
      {"parts 8 shared", kBlobs, 3000, 3000, 24, 20, L2, true, 1, FF, LS, 8, true},
      {"parts 8 global", kBlobs, 3000, 3000, 24, 20, L2, true, 1, FF, LG, 8, true},
      {"partial", kGrid, 3000, 3000, 4, 20, L2, true, 1, FP, LA, 0, true},
      {"partial L1 two sets", kBlobs, 2000, 2500, 3, 40, L1, false, 0, FP, LA, 0, true},
      {"k64 global", kGrid, 2500, 2500, 4, 64, L2, true, 1, FA, LA, 0, true},
      {"k100 full", kDuplicates, 2500, 2500, 21, 100, L2, true, 1, FF, LA, 0, true},
      {"d1", kGrid, 2000, 2000, 1, 20, L2, true, 1, FA, LA, 0, true},
      {"tiny values (underflow)", kTiny, 2000, 2000, 5, 20, L2, true, 1, FA, LA, 0, true},
      {"tiny values L1", kTiny, 2000, 2000, 5, 20, L1, true, 1, FA, LA, 0, true},
      {"signed zeros", kSignedZeros, 2000, 2000, 6, 20, L2, true, 1, FA, LA, 0, true},
      {"huge finite values", kHuge, 2000, 2000, 4, 20, L2, true, 1, FA, LA, 0, true},
      {"two sets, shared keys", kGrid, 1500, 1800, 4, 20, L2, false, 4, FA, LA, 0, true},
      {"small budget (chunks)", kGrid, 3000, 3000, 8, 20, L2, true, 1, FF, LA, 1, true,
       2500000},
  };
  int failed = 0;
  std::mt19937_64 rng(12345);
  size_t free_before = 0, free_after = 0, total_mem = 0;
  CK(cudaMemGetInfo(&free_before, &total_mem));
  for (const Case &c : cases) {
    std::vector<float> qx, tx;
    generate(c.gen, c.nq, c.dim, rng, qx);
    if (!c.self) generate(c.gen, c.nt, c.dim, rng, tx);
    std::vector<int64_t> qkeys, tkeys;
    KnnProblem p{};
    p.queries = qx.data();
    p.n_queries = c.nq;
    p.targets = c.self ? qx.data() : tx.data();
    p.n_targets = c.self ? c.nq : c.nt;
    p.dim = c.dim;
    p.k = c.k;
    p.metric = c.metric;
    if (c.keys) {
      qkeys.resize(c.nq);
      for (int64_t i = 0; i < c.nq; i++) qkeys[i] = c.keys == 3 ? i / 2 : i;
      if (c.keys == 2) std::shuffle(qkeys.begin(), qkeys.end(), rng);
      tkeys = qkeys;
      if (c.keys == 4) {
        tkeys.resize(c.nt);
        for (int64_t j = 0; j < c.nt; j++) tkeys[j] = j % 1000;
      }
      p.query_keys = qkeys.data();
      p.target_keys = c.self ? qkeys.data() : tkeys.data();
    }
    TiOptions o;
    o.filter = c.filter;
    o.list = c.list;
    o.threads_per_query = c.parts;
    o.dedup = c.dedup;
    std::vector<int64_t> rows(c.nq * c.k, 12345);
    std::vector<double> dist(c.nq * c.k, -7.0);
    KnnStats st;
    const size_t saved_budget = e.ctx.memory_budget;
    if (c.budget) e.ctx.memory_budget = c.budget;
    KnnStatus s = run_ti(e, p, o, rows.data(), dist.data(), &st);
    e.ctx.memory_budget = saved_budget;
    std::vector<int64_t> ids(c.nq), ref_rows;
    std::vector<double> ref_dist;
    std::iota(ids.begin(), ids.end(), 0);
    cpu_reference(p, ids, ref_rows, ref_dist);
    int64_t bad = s == KNN_OK ? compare(c.name, ids, c.k, ref_rows, ref_dist, rows.data(),
                                        dist.data())
                              : c.nq;
    std::printf("%s %-28s %-44s clusters %lld/%lld dist %lld (%.2f%%)\n",
                bad ? "FAIL" : "PASS", c.name, st.variant, (long long)st.query_clusters,
                (long long)st.target_clusters, (long long)st.distance_computations,
                100.0 * st.distance_computations / std::max<double>(1, (double)c.nq * p.n_targets));
    if (bad) failed++;
  }
  // Non-finite input goes to brute force.
  {
    std::vector<float> x(500 * 4);
    for (auto &v : x) v = (float)(rng() % 10);
    x[17] = 1.0e30f;
    KnnProblem p{};
    p.queries = p.targets = x.data();
    p.n_queries = p.n_targets = 500;
    p.dim = 4;
    p.k = 5;
    p.metric = KNN_METRIC_L2;
    std::vector<int64_t> rows(500 * 5);
    std::vector<double> dist(500 * 5);
    KnnStats st;
    TiOptions o;
    KnnStatus s = run_ti(e, p, o, rows.data(), dist.data(), &st);
    std::printf("INFO huge values -> status %d method '%s'\n", (int)s, st.method);
    // cancellation and an impossible budget end cleanly
    int32_t flag = 1;
    for (auto &v : x) v = (float)(rng() % 10);
    e.ctx.cancel = &flag;
    s = run_ti(e, p, o, rows.data(), dist.data(), &st);
    e.ctx.cancel = nullptr;
    std::printf("%s cancelled join -> status %d\n", s == KNN_CANCELLED ? "PASS" : "FAIL", (int)s);
    if (s != KNN_CANCELLED) failed++;
    const size_t saved = e.ctx.memory_budget;
    e.ctx.memory_budget = 10000;
    s = run_ti(e, p, o, rows.data(), dist.data(), &st);
    e.ctx.memory_budget = saved;
    std::printf("%s tiny budget -> status %d (%s)\n", s == KNN_OUT_OF_MEMORY ? "PASS" : "FAIL",
                (int)s, e.ctx.error.c_str());
    if (s != KNN_OUT_OF_MEMORY) failed++;
  }
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&free_after, &total_mem));
  std::printf("INFO device memory free before %.1f MiB, after %.1f MiB\n", free_before / 1048576.0,
              free_after / 1048576.0);
  std::printf("checks: %d failed of %zu\n", failed, cases.size());
  return failed;
}

// ---------------- benchmark sets ----------------

struct DataSet {
  const char *name;
  int64_t rows;
  int dim;
  double torch_seconds;  // torch addmm+topk on an H200, from the brief
};

static bool load(const std::string &dir, const DataSet &d, std::vector<float> &x) {
  std::string path = dir + "/" + d.name + ".f32";
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  x.resize(d.rows * d.dim);
  size_t got = std::fread(x.data(), 4, x.size(), f);
  std::fclose(f);
  return got == x.size();
}

static double time_ti(Engine &e, const KnnProblem &p, const TiOptions &o, int reps,
                      std::vector<int64_t> &rows, std::vector<double> &dist, KnnStats &st) {
  std::vector<double> t;
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    if (run_ti(e, p, o, rows.data(), dist.data(), &st) != KNN_OK) return -1;
    t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static int run_bench(Engine &e, const std::string &dir, bool sweep, bool brute) {
  std::vector<DataSet> sets = {{"skin", 245057, 4, 1.37},
                               {"kegg_std", 63608, 28, 0.092},
                               {"keggD_std", 48827, 21, 0.056},
                               {"ipums", 256932, 61, 1.59},
                               {"kdd", 494021, 38, 5.61}};
  int failed = 0;
  double log_speedup = 0;
  int counted = 0;
  std::vector<std::string> summary;
  for (const DataSet &d : sets) {
    std::vector<float> x;
    if (!load(dir, d, x)) {
      std::printf("%s: cannot read\n", d.name);
      continue;
    }
    std::vector<int64_t> keys(d.rows);
    std::iota(keys.begin(), keys.end(), 0);
    KnnProblem p{};
    p.queries = p.targets = x.data();
    p.n_queries = p.n_targets = d.rows;
    p.dim = d.dim;
    p.k = 20;
    p.metric = KNN_METRIC_L2;
    p.query_keys = p.target_keys = keys.data();
    std::vector<int64_t> rows(d.rows * 20);
    std::vector<double> dist(d.rows * 20);
    KnnStats st;
    TiOptions o;
    run_ti(e, p, o, rows.data(), dist.data(), &st);  // warm-up
    double t = time_ti(e, p, o, 5, rows, dist, st);
    std::printf("%s: %lld x %d  ti %.4f s  [xfer %.4f cluster %.4f filter %.4f select %.4f]  "
                "%s  clusters %lld  dist %lld (%.3f%% of pairs)\n",
                d.name, (long long)d.rows, d.dim, t, st.seconds_transfer, st.seconds_cluster,
                st.seconds_filter, st.seconds_select, st.variant, (long long)st.query_clusters,
                (long long)st.distance_computations,
                100.0 * st.distance_computations / ((double)d.rows * d.rows));
    // exactness: GPU reference on all (or every s-th) query, CPU on a sample
    int64_t step = std::max<int64_t>(1, (int64_t)((double)d.rows * d.rows / 7e10) + 1);
    std::vector<int64_t> ids, ref_rows;
    std::vector<double> ref_dist;
    double t0 = now_s();
    gpu_reference(p, step, ids, ref_rows, ref_dist);
    double tref = now_s() - t0;
    int64_t bad = compare(d.name, ids, 20, ref_rows, ref_dist, rows.data(), dist.data());
    std::vector<int64_t> sample;
    for (int i = 0; i < 300; i++) sample.push_back((int64_t)((i * 7919LL * 104729LL) % d.rows));
    std::vector<int64_t> cpu_rows;
    std::vector<double> cpu_dist;
    cpu_reference(p, sample, cpu_rows, cpu_dist);
    int64_t bad_cpu = compare(d.name, sample, 20, cpu_rows, cpu_dist, rows.data(), dist.data());
    std::printf("  exact: gpu-ref %lld/%zu queries differ (step %lld, %.2f s); cpu-ref %lld/%zu "
                "differ\n",
                (long long)bad, ids.size(), (long long)step, tref, (long long)bad_cpu,
                sample.size());
    if (bad || bad_cpu) failed++;
    double brute_t = -1;
    if (brute) {
      KnnStats bs{};
      std::vector<int64_t> brows(d.rows * 20);
      std::vector<double> bdist(d.rows * 20);
      e.ctx.error.clear();
      double b0 = now_s();
      KnnStatus s = knn::cuda::brute_force_join(p, brows.data(), bdist.data(), &bs, e.ctx);
      brute_t = now_s() - b0;
      if (s != KNN_OK) {
        std::printf("  brute: status %d %s\n", (int)s, e.ctx.error.c_str());
        brute_t = -1;
      } else {
        int64_t bb = 0;
        for (size_t i = 0; i < brows.size(); i++)
          if (brows[i] != rows[i] || !same_double(bdist[i], dist[i])) bb++;
        std::printf("  brute: %.3f s, %lld slots differ from ti\n", brute_t, (long long)bb);
      }
    }
    double base = brute_t > 0 ? brute_t : d.torch_seconds;
    log_speedup += std::log(base / t);
    counted++;
    char line[256];
    std::snprintf(line, sizeof line, "%-10s ti %.4f s  base %.3f s (%s)  speedup %.1fx  %s",
                  d.name, t, base, brute_t > 0 ? "brute" : "torch", base / t, st.variant);
    summary.push_back(line);

    if (sweep) {
      auto show = [&](const char *label, const TiOptions &so) {
        KnnStats ss;
        std::vector<int64_t> r2(d.rows * 20);
        std::vector<double> d2(d.rows * 20);
        double ts = time_ti(e, p, so, 3, r2, d2, ss);
        int64_t diff = 0;
        for (size_t i = 0; i < r2.size(); i++)
          if (r2[i] != rows[i] || !same_double(d2[i], dist[i])) diff++;
        std::printf("  sweep %-22s %.4f s [cl %.4f fi %.4f] %-40s dist %lld  diff %lld\n", label,
                    ts, ss.seconds_cluster, ss.seconds_filter, ss.variant,
                    (long long)ss.distance_computations, (long long)diff);
        if (diff) failed++;
      };
      for (int parts : {1, 2, 4, 8}) {
        TiOptions so;
        so.threads_per_query = parts;
        char label[32];
        std::snprintf(label, sizeof label, "parts %d", parts);
        show(label, so);
      }
      {
        TiOptions so;
        so.list = ListKind::Shared;
        show("list shared", so);
        so.list = ListKind::Global;
        show("list global", so);
      }
      for (double f : {1.5, 2.0, 4.0, 6.0}) {
        TiOptions so;
        so.landmark_factor = f;
        char label[32];
        std::snprintf(label, sizeof label, "landmarks %.1f sqrt", f);
        show(label, so);
      }
      const bool small = d.rows * (double)d.rows < 7e10 && d.dim < 30;
      if (small) {
        TiOptions so;
        so.dedup = false;
        show("no dedup", so);
      }
      {
        TiOptions sg;
        sg.gemm_assign_min_stride = 1 << 30;
        show("assign direct", sg);
        sg.gemm_assign_min_stride = 8;
        show("assign gemm", sg);
      }
      // partial vs full for large k (k / d > 8 re-measured)
      for (int kk : {64, 256}) {
        if (!small) break;
        KnnProblem pk = p;
        pk.k = kk;
        std::vector<int64_t> r3(d.rows * kk);
        std::vector<double> d3(d.rows * kk);
        for (FilterKind fk : {FilterKind::Full, FilterKind::Partial}) {
          TiOptions so;
          so.filter = fk;
          KnnStats ss;
          double ts = time_ti(e, pk, so, 3, r3, d3, ss);
          std::printf("  k=%d %-8s %.4f s %-40s dist %lld\n", kk,
                      fk == FilterKind::Full ? "full" : "partial", ts, ss.variant,
                      (long long)ss.distance_computations);
        }
      }
    }
  }
  std::printf("\nSUMMARY\n");
  for (auto &s : summary) std::printf("%s\n", s.c_str());
  if (counted) std::printf("geometric-mean speedup %.1fx over %d sets\n",
                           std::exp(log_speedup / counted), counted);
  std::printf("bench exactness failures: %d\n", failed);
  return failed;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    std::printf("usage: %s check | bench DIR [sweep] [brute]\n", argv[0]);
    return 2;
  }
  Engine e;
  std::string mode = argv[1];
  if (mode == "check") return run_checks(e) ? 1 : 0;
  if (mode == "bench" && argc >= 3) {
    bool sweep = false, brute = false;
    for (int i = 3; i < argc; i++) {
      if (std::string(argv[i]) == "sweep") sweep = true;
      if (std::string(argv[i]) == "brute") brute = true;
    }
    return run_bench(e, argv[2], sweep, brute) ? 1 : 0;
  }
  return 2;
}
