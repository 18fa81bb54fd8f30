// knn_bench.cpp -- times the engines on the benchmark data sets, engine
// only (host arrays in, host results out), through the job API that the
// extension uses.
//
//   bench/knn_bench DATA_DIR [--k 20] [--repeat 2] [--out results.json]
//                   [--sets a,b,c] [--cpu-max-rows 100000] [--metric l2]
//                   [--methods brute,ti,auto,cpu] [--threads 0]
//                   [--module-dir .] [--gpu-memory-fractions 0,0.5,0.25]
//                   [--devices 0/0,1]
//
// GPU methods brute-sgemm, brute-dgemm, brute-hgemm force the brute
// force's GEMM filter (SGEMM, DGEMM, fp16 tensor cores) through the
// module's test entry (knn_cuda_testing.h), for A/B comparisons;
// brute-hgemm-pipelined also overlaps each tile's GEMM with the previous
// tile's selection. brute-full-sort is brute force with k beyond the lists
// taken by the full sort, as before the fp16 filter's large-k path.
//
// DATA_DIR holds NAME.f32 (raw little-endian float32, row-major) with
// NAME.json beside it ("rows", "dims"), and optionally
// fashion-mnist.idx (uncompressed IDX images: 16-byte header, uint8
// pixels), of which the first --fashion-rows (20000) rows are used.
// bench/run_bench.sh prepares such a directory from the .xz files.
// --queries 1,4,12: instead of the self-join, batches of that many of each
// set's rows (evenly spaced) against all its rows (small query batches).
//
// Per data set: a self-join with self-match exclusion (keys = row ids,
// the all-kNN graph), timed for each of --methods: brute, ti, auto on the
// GPU; cpu (= cpu-auto), cpu-ti, cpu-brute on the CPU engine with
// --threads threads, and cpu-blas / cpu-avx2 (the CPU brute force forced
// to its SGEMM or its AVX2 variant, through knn::cpu_run_tuned, which SQL
// cannot reach) (CPU runs only up to --cpu-max-rows rows: the CPU is
// the slow reference). --gpu-memory-fractions 0,0.5,0.25 runs each set
// once per GPU memory budget, given as a fraction of the set's size (0: no
// limit; rows named SET-memF). --devices 0/0,1 runs each GPU method once
// per GPU list (knn_gpu.devices' syntax, lists separated by '/'; runs
// labelled "gpu ti @0,1"), for one-GPU against split timings. The GPU
// module is looked for in --module-dir. Every result is compared bit for
// bit with a reference run: CPU brute force, else another CPU run, else
// GPU brute force, else the first run. Prints a table; writes JSON.
//
// --radius R: instead of the k-NN self-join, the range self-join (every
// pair at distance < R, self-matches excluded; <= with --radius-inclusive
// 1; at most --range-cap K pairs a row, 0 = all), its pairs taken through
// knn_job_take_pairs as the extension takes them, timed to the last pair,
// and compared by count and an order-sensitive hash of (query, target,
// distance bits). --distinct 1 keeps the first of each set of identical
// rows (skin: 51444 of 245057 rows; its exact duplicates alone give 172
// pairs a row on average at any radius).
//
// --element float32,float16,float16-widened: each set's rows are rounded to
// float16 once (round to nearest even, as halfvec stores them), then joined
// as float32 rows of those values (rows named SET), as KNN_ELEMENT_FLOAT16
// rows (SET-f16: they reach the GPU module as float16 where it takes them)
// and as float16 rows that the job widens on the host first (SET-f16w,
// knn_job_testing.h: what a module without knn_cuda_takes_float16 gets).
// The GPU runs of each element are compared bit for bit with the float32
// ones, and every run's line gives the job's time outside the engine
// (wall - engine: the host widening, where the job widens) and the device
// pool's peak use during the join (sampled every millisecond).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <dlfcn.h>

#include <atomic>
#include <thread>

#include "cpu/cpu_tuning.h"
#include "cuda/knn_cuda_testing.h"
#include "half_float.h"
#include "knn_engine.h"
#include "knn_job_testing.h"
#include "knn_vocabulary.h"

namespace {

struct DataSet {
  std::string name;
  int64_t rows = 0;
  int dims = 0;
  std::vector<float> x;
};

// Reads "key": number from a small JSON file (the data sets' descriptions).
bool json_number(const std::string &text, const std::string &key, int64_t *value) {
  const size_t at = text.find("\"" + key + "\"");
  if (at == std::string::npos) return false;
  const size_t colon = text.find(':', at);
  if (colon == std::string::npos) return false;
  *value = std::atoll(text.c_str() + colon + 1);
  return true;
}

bool load_f32(const std::string &dir, const std::string &name, DataSet *d) {
  std::ifstream meta(dir + "/" + name + ".json");
  if (!meta) return false;
  std::stringstream ss;
  ss << meta.rdbuf();
  int64_t rows = 0, dims = 0;
  if (!json_number(ss.str(), "rows", &rows) || !json_number(ss.str(), "dims", &dims)) return false;
  FILE *f = std::fopen((dir + "/" + name + ".f32").c_str(), "rb");
  if (f == nullptr) return false;
  d->name = name;
  d->rows = rows;
  d->dims = static_cast<int>(dims);
  d->x.resize(static_cast<size_t>(rows) * dims);
  const bool ok = std::fread(d->x.data(), sizeof(float), d->x.size(), f) == d->x.size();
  std::fclose(f);
  return ok;
}

bool load_idx(const std::string &path, int64_t max_rows, DataSet *d) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char header[16];
  bool ok = std::fread(header, 1, 16, f) == 16;
  auto be32 = [&](int i) {
    return (int64_t(header[i]) << 24) | (int64_t(header[i + 1]) << 16) |
           (int64_t(header[i + 2]) << 8) | int64_t(header[i + 3]);
  };
  const int64_t count = be32(4), h = be32(8), w = be32(12);
  d->name = "fashion-mnist-" + std::to_string(std::min(count, max_rows) / 1000) + "k";
  d->rows = std::min(count, max_rows);
  d->dims = static_cast<int>(h * w);
  std::vector<unsigned char> bytes(static_cast<size_t>(d->rows) * d->dims);
  ok = ok && std::fread(bytes.data(), 1, bytes.size(), f) == bytes.size();
  std::fclose(f);
  d->x.assign(bytes.begin(), bytes.end());
  return ok;
}

// --distinct: the first of each set of bitwise-identical rows, in order.
void keep_distinct_rows(DataSet *d) {
  std::set<std::vector<uint32_t>> seen;
  std::vector<float> kept;
  std::vector<uint32_t> row(static_cast<size_t>(d->dims));
  for (int64_t i = 0; i < d->rows; i++) {
    std::memcpy(row.data(), d->x.data() + i * d->dims, row.size() * sizeof(float));
    if (seen.insert(row).second)
      kept.insert(kept.end(), d->x.begin() + i * d->dims, d->x.begin() + (i + 1) * d->dims);
  }
  d->rows = static_cast<int64_t>(kept.size()) / std::max(1, d->dims);
  d->x.swap(kept);
  d->name += "-distinct";
}

// One entry of --methods.
struct Config {
  KnnDevice device = KNN_DEVICE_CPU;
  KnnMethod method = KNN_METHOD_AUTO;
  knn::CpuTuning::Variant forced = knn::CpuTuning::Variant::kAuto;
  int gpu_filter = 0;  // GPU brute force with a forced GEMM filter (knn_cuda_testing.h);
                       // -1: the engine's filter, large k by the full sort
  bool gpu_pipeline = false;  // ... and its tiles pipelined (fp16 filter)
  std::string name;  // "auto", "ti", "brute", "blas", "avx2", "brute-hgemm", ...
};

std::string g_module_dir = ".";

struct Run {
  KnnDevice device = KNN_DEVICE_CPU;
  KnnMethod method = KNN_METHOD_AUTO;
  std::string method_name;
  std::string devices;  // the GPU list it ran with ("" = the default)
  std::string label;  // "gpu ti", "cpu brute", ...
  std::vector<double> seconds;
  KnnStatus status = KNN_OK;
  std::string error;
  KnnStats stats{};
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
  std::string verified_against;  // the reference run's label, or ""
  bool match = false;
  int64_t mismatches = 0;
  // Range joins: the pairs returned and their order-sensitive hash.
  bool range = false;
  int64_t range_pairs = 0;
  uint64_t range_hash = 0;
  int64_t pool_peak = -1;  // --element: the device pool's peak bytes during the timed runs
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A forced CPU variant runs on this thread (cpu_run_tuned), not as a job.
KnnStatus run_tuned(const KnnProblem &p, knn::CpuTuning::Variant forced,
                    std::vector<int64_t> *nb, std::vector<double> *dist, KnnStats *stats,
                    std::string *error, double *seconds) {
  knn::CpuTuning tuning;
  tuning.variant = forced;
  char err[512] = "";
  const auto t0 = std::chrono::steady_clock::now();
  const KnnStatus st =
      knn::cpu_run_tuned(p, tuning, nb->data(), dist->data(), stats, nullptr, err, sizeof err);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *error = err;
  return st;
}

// A forced GPU filter runs through the module's test entry, on this thread.
KnnStatus run_gpu_tuned(const KnnProblem &p, int filter, bool pipeline, std::vector<int64_t> *nb,
                        std::vector<double> *dist, KnnStats *stats, std::string *error,
                        double *seconds) {
  static knn_cuda_run_tuned_fn entry = nullptr;
  if (entry == nullptr) {
    void *module = dlopen((g_module_dir + "/knn_gpu_cuda.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (module != nullptr)
      entry = reinterpret_cast<knn_cuda_run_tuned_fn>(dlsym(module, KNN_CUDA_RUN_TUNED_SYMBOL));
    if (entry == nullptr) {
      *error = "no knn_gpu_cuda.so test entry in " + g_module_dir;
      return KNN_INTERNAL_ERROR;
    }
  }
  KnnCudaTestOptions o{};
  o.brute_filter = filter > 0 ? filter : 0;
  o.brute_no_large_k = filter < 0 ? 1 : 0;
  o.brute_pipeline = pipeline ? 1 : 0;
  char err[512] = "";
  const auto t0 = std::chrono::steady_clock::now();
  const KnnStatus st = entry(&p, &o, nb->data(), dist->data(), stats, nullptr, err, sizeof err);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *error = err;
  return st;
}

KnnStatus run_once(const KnnProblem &p, knn::CpuTuning::Variant forced, int gpu_filter,
                   bool gpu_pipeline,
                   std::vector<int64_t> *nb, std::vector<double> *dist, KnnStats *stats,
                   std::string *error, double *seconds) {
  nb->assign(static_cast<size_t>(p.n_queries) * p.k, -7);
  dist->assign(nb->size(), -7.0);
  if (gpu_filter != 0)
    return run_gpu_tuned(p, gpu_filter, gpu_pipeline, nb, dist, stats, error, seconds);
  if (forced != knn::CpuTuning::Variant::kAuto)
    return run_tuned(p, forced, nb, dist, stats, error, seconds);
  char err[512] = "";
  const auto t0 = std::chrono::steady_clock::now();
  KnnJob *job = knn_job_start(&p, nb->data(), dist->data(), err, sizeof err);
  if (job == nullptr) {
    *error = err;
    return KNN_INTERNAL_ERROR;
  }
  while (!knn_job_wait(job, 50)) {
  }
  const KnnStatus st = knn_job_finish(job, stats, err, sizeof err);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *error = err;
  return st;
}

// A range job's pairs, taken as the extension takes them, folded into a
// count and an order-sensitive hash of (query, target, distance bits),
// a word at a time (cheap next to the engine).
KnnStatus run_range_once(const KnnProblem &p, KnnStats *stats, std::string *error,
                         double *seconds, int64_t *pairs, uint64_t *hash) {
  constexpr int64_t kBatch = 65536;
  std::vector<int64_t> q(kBatch), t(kBatch);
  std::vector<double> d(kBatch);
  *pairs = 0;
  *hash = 14695981039346656037ull;
  auto fold = [hash](uint64_t v) {
    *hash = (*hash ^ v) * 0x9E3779B97F4A7C15ull;
    *hash ^= *hash >> 29;
  };
  char err[512] = "";
  const auto t0 = std::chrono::steady_clock::now();
  KnnJob *job = knn_job_start(&p, nullptr, nullptr, err, sizeof err);
  if (job == nullptr) {
    *error = err;
    return KNN_INTERNAL_ERROR;
  }
  for (;;) {
    const int64_t n = knn_job_take_pairs(job, q.data(), t.data(), d.data(), kBatch, 50);
    if (n < 0) break;
    for (int64_t i = 0; i < n; i++) {
      uint64_t bits;
      std::memcpy(&bits, &d[i], sizeof bits);
      fold(static_cast<uint64_t>(q[i]));
      fold(static_cast<uint64_t>(t[i]));
      fold(bits);
    }
    *pairs += n;
  }
  const KnnStatus st = knn_job_finish(job, stats, err, sizeof err);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *error = err;
  return st;
}

bool same_distance(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

int64_t count_mismatches(const Run &a, const Run &b) {
  if (a.range || b.range) return a.range_pairs == b.range_pairs && a.range_hash == b.range_hash ? 0 : 1;
  if (a.neighbors.size() != b.neighbors.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < a.neighbors.size(); i++)
    if (a.neighbors[i] != b.neighbors[i] || !same_distance(a.distances[i], b.distances[i])) bad++;
  return bad;
}

std::string json_escape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

struct Options {
  std::string dir;
  int k = 20, repeat = 2, threads = 0;
  int64_t cpu_max_rows = 100000;
  std::string out_path = "bench/results/knn_bench.json";
  KnnMetric metric = KNN_METRIC_L2;
  std::vector<Config> configs;
  std::vector<std::string> sets = {"3DNet_head5000", "arcene", "keggD_std", "kegg_std", "blog",
                                   "fashion-mnist", "skin", "ipums", "kdd"};
  int64_t fashion_rows = 20000;
  // Query batch sizes: when set, each set is joined as small batches of its
  // rows (evenly spaced) against all its rows instead of as a self-join.
  std::vector<int64_t> query_batches;
  // GPU memory budgets as fractions of the data set's size (rows x dims x
  // 4 bytes; 0: no limit): each set is run once per fraction.
  std::vector<double> memory_fractions;
  // GPU lists (knn_gpu.devices' syntax): each GPU method runs once per list.
  std::vector<std::string> device_lists;
  // Range self-join instead of k-NN (--radius); NaN: k-NN.
  double radius = std::nan("");
  bool radius_inclusive = false;
  int range_cap = 0;
  bool distinct = false;  // identical rows kept once
  // --element: the row types each set is joined as ("float32", "float16",
  // "float16-widened"); empty: float32 rows as read, not rounded.
  std::vector<std::string> elements;
};

std::vector<std::string> split(const std::string &list) {
  std::vector<std::string> items;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) items.push_back(item);
  return items;
}

// "brute", "ti", "auto": the GPU; "cpu" or "cpu-METHOD": the CPU engine;
// "cpu-blas", "cpu-avx2": a forced CPU brute-force variant.
bool parse_methods(const std::string &list, Options *o) {
  o->configs.clear();
  for (const std::string &item : split(list)) {
    Config c;
    const bool cpu = item.compare(0, 3, "cpu") == 0;
    c.device = cpu ? KNN_DEVICE_CPU : KNN_DEVICE_GPU;
    c.name = !cpu ? item : item == "cpu" ? "auto" : item.substr(4);
    if (!cpu && c.name.compare(0, 6, "brute-") == 0) {
      const std::string f = c.name.substr(6);
      c.method = KNN_METHOD_BRUTE;
      c.gpu_filter = f == "sgemm" ? 1 : f == "dgemm" ? 2 : f == "hgemm" ? 3 : f == "full-sort" ? -1 : 0;
      if (f == "hgemm-pipelined") {
        c.gpu_filter = 3;
        c.gpu_pipeline = true;
      }
      if (c.gpu_filter == 0) {
        std::fprintf(stderr, "unknown method %s (brute-sgemm, brute-dgemm, brute-hgemm, brute-hgemm-pipelined, brute-full-sort)\n",
                     item.c_str());
        return false;
      }
    } else if (cpu && (c.name == "blas" || c.name == "avx2")) {
      c.method = KNN_METHOD_BRUTE;
      c.forced = c.name == "blas" ? knn::CpuTuning::Variant::kBlas
                                  : knn::CpuTuning::Variant::kAvx2;
    } else if ((cpu && item != "cpu" && item[3] != '-') ||
               !knn_method_parse(c.name.c_str(), &c.method)) {
      std::fprintf(stderr, "unknown method %s (%s, each optionally cpu-; cpu-blas, cpu-avx2)\n",
                   item.c_str(), knn_method_list());
      return false;
    } else {
      c.name = knn_method_name(c.method);
    }
    o->configs.push_back(c);
  }
  return true;
}

bool parse_options(int argc, char **argv, Options *o) {
  if (argc < 2) return false;
  o->dir = argv[1];
  if (!parse_methods("brute,ti,auto,cpu", o)) return false;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--k") o->k = std::atoi(v.c_str());
    else if (a == "--repeat") o->repeat = std::max(1, std::atoi(v.c_str()));
    else if (a == "--out") o->out_path = v;
    else if (a == "--cpu-max-rows") o->cpu_max_rows = std::atoll(v.c_str());
    else if (a == "--threads") o->threads = std::atoi(v.c_str());
    else if (a == "--module-dir") {
      knn_engine_set_module_dir(v.c_str());
      g_module_dir = v;
    }
    else if (a == "--sets") o->sets = split(v);
    else if (a == "--fashion-rows") o->fashion_rows = std::max<int64_t>(1, std::atoll(v.c_str()));
    else if (a == "--radius") o->radius = std::atof(v.c_str());
    else if (a == "--radius-inclusive") o->radius_inclusive = std::atoi(v.c_str()) != 0;
    else if (a == "--range-cap") o->range_cap = std::max(0, std::atoi(v.c_str()));
    else if (a == "--distinct") o->distinct = std::atoi(v.c_str()) != 0;
    else if (a == "--element") {
      o->elements = split(v);
      for (const std::string &e : o->elements)
        if (e != "float32" && e != "float16" && e != "float16-widened") {
          std::fprintf(stderr, "unknown element %s (float32, float16, float16-widened)\n", e.c_str());
          return false;
        }
    }
    else if (a == "--queries") {
      o->query_batches.clear();
      for (const std::string &n : split(v)) o->query_batches.push_back(std::max<int64_t>(1, std::atoll(n.c_str())));
    }
    else if (a == "--devices") {
      o->device_lists.clear();
      for (std::string list = v;;) {
        const size_t slash = list.find('/');
        const std::string item = list.substr(0, slash);
        int32_t devices[KNN_MAX_DEVICES], n = 0;
        char why[128] = "";
        if (!knn_device_list_parse(item.c_str(), devices, &n, why, sizeof why)) {
          std::fprintf(stderr, "--devices %s: %s\n", item.c_str(), why);
          return false;
        }
        o->device_lists.push_back(item);
        if (slash == std::string::npos) break;
        list = list.substr(slash + 1);
      }
    }
    else if (a == "--gpu-memory-fractions") {
      o->memory_fractions.clear();
      for (const std::string &f : split(v)) o->memory_fractions.push_back(std::max(0.0, std::atof(f.c_str())));
    }
    else if (a == "--methods") {
      if (!parse_methods(v, o)) return false;
    } else if (a == "--metric") {
      if (!knn_metric_parse(v.c_str(), &o->metric)) {
        std::fprintf(stderr, "unknown metric %s (%s)\n", v.c_str(), knn_metric_list());
        return false;
      }
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

// The most device pool bytes (knn_cuda_test_pool_used, GPU 0) seen while
// it lives, sampled every millisecond; -1 without the module's entry.
class PoolPeak {
 public:
  PoolPeak() {
    void *module = dlopen((g_module_dir + "/knn_gpu_cuda.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (module != nullptr)
      used_ = reinterpret_cast<knn_cuda_test_pool_used_fn>(
          dlsym(module, KNN_CUDA_TEST_POOL_USED_SYMBOL));
    if (used_ == nullptr) return;
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        peak_ = std::max(peak_, used_(0));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  ~PoolPeak() { finish(); }
  int64_t finish() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return peak_;
  }

 private:
  knn_cuda_test_pool_used_fn used_ = nullptr;
  std::atomic<bool> stop_{false};
  int64_t peak_ = -1;
  std::thread thread_;
};

bool g_pool_peak = false;  // --element given: sample the pool's peak in GPU runs

// Times one engine and method on a prepared problem (GPU runs on the GPU
// list `devices`, "" = the default).
Run time_config(KnnProblem p, const Config &c, int repeat, const std::string &devices) {
  Run r;
  const KnnDevice device = c.device;
  r.device = p.device = device;
  r.method = p.method = c.method;
  r.method_name = c.name;
  r.label = std::string(knn_device_name(device)) + " " + c.name;
  if (!devices.empty()) {
    knn_device_list_parse(devices.c_str(), p.devices, &p.n_devices, nullptr, 0);  // parsed before
    r.devices = devices;
    r.label += " @" + devices;
  }
  // One untimed GPU run first: module load, context and handles.
  const int tries = device == KNN_DEVICE_GPU ? repeat + 1 : repeat;
  r.range = p.range != KNN_RANGE_NONE;
  for (int t = 0; t < tries; t++) {
    double s = 0;
    std::unique_ptr<PoolPeak> peak;
    if (g_pool_peak && device == KNN_DEVICE_GPU && t > 0) peak.reset(new PoolPeak());
    if (r.range)
      r.status = run_range_once(p, &r.stats, &r.error, &s, &r.range_pairs, &r.range_hash);
    else
      r.status = run_once(p, c.forced, c.gpu_filter, c.gpu_pipeline, &r.neighbors, &r.distances, &r.stats, &r.error, &s);
    if (peak != nullptr) r.pool_peak = std::max(r.pool_peak, peak->finish());
    if (r.status != KNN_OK) break;
    if (device != KNN_DEVICE_GPU || t > 0) r.seconds.push_back(s);
  }
  return r;
}

// Every run against the reference: CPU brute (the AVX2 one first), else a
// CPU run, else GPU brute, else the first run (one GPU against a split).
bool verify(std::vector<Run> *runs) {
  const Run *ref = nullptr;
  int best = -1;
  for (const Run &r : *runs) {
    if (r.status != KNN_OK) continue;
    const bool brute = r.method == KNN_METHOD_BRUTE, cpu = r.device == KNN_DEVICE_CPU;
    const int rank = cpu && r.method_name == "avx2" ? 4 : cpu && brute ? 3 : cpu ? 2
                     : brute ? 1 : 0;
    if (rank > best) {
      best = rank;
      ref = &r;
    }
  }
  bool all_match = true;
  for (Run &r : *runs) {
    if (ref == nullptr || &r == ref || r.status != KNN_OK) continue;
    r.verified_against = ref->label;
    r.mismatches = count_mismatches(r, *ref);
    r.match = r.mismatches == 0;
    all_match = all_match && r.match;
  }
  return all_match;
}

std::string table_line(const DataSet &d, const Run &r) {
  const std::string verified = r.verified_against.empty() ? "-"
                               : r.match                  ? "=" + r.verified_against
                                                          : "MISMATCH";
  char line[512];
  std::snprintf(line, sizeof line, "%-18s %8lld %6d  %-9s %9.4f  %-11s %s", d.name.c_str(),
                static_cast<long long>(d.rows), d.dims, r.label.c_str(), median(r.seconds),
                verified.c_str(), r.status == KNN_OK ? r.stats.variant : r.error.c_str());
  return line;
}

void write_json_run(std::ostream &json, const Run &r) {
  json << "\n      {\"engine\": \"" << knn_device_name(r.device) << "\", \"method\": \""
       << r.method_name << "\", \"status\": " << r.status << ", \"error\": \""
       << json_escape(r.error) << "\", \"seconds\": [";
  for (size_t i = 0; i < r.seconds.size(); i++) json << (i ? ", " : "") << r.seconds[i];
  json << "], \"median\": " << (r.seconds.empty() ? 0.0 : median(r.seconds))
       << ", \"device\": \"" << json_escape(r.stats.device_name) << "\", \"ran\": \""
       << knn_method_name(r.stats.method) << "\", \"variant\": \""
       << json_escape(r.stats.variant) << "\", \"distance_computations\": "
       << r.stats.distance_computations << ", \"seconds_transfer\": "
       << r.stats.seconds_transfer << ", \"seconds_cluster\": " << r.stats.seconds_cluster
       << ", \"seconds_filter\": " << r.stats.seconds_filter
       << ", \"seconds_select\": " << r.stats.seconds_select
       << ", \"seconds_engine_total\": " << r.stats.seconds_total
       << ", \"devices\": \"" << r.devices << "\", \"gpus\": [";
  for (int i = 0; i < r.stats.n_devices && i < KNN_MAX_DEVICES; i++)
    json << (i ? ", " : "") << "{\"gpu\": " << r.stats.device_work[i].device
         << ", \"queries\": " << r.stats.device_work[i].queries
         << ", \"seconds\": " << r.stats.device_work[i].seconds << "}";
  json << "]"
       << ", \"verified_against\": \"" << r.verified_against
       << "\", \"mismatches\": " << r.mismatches;
  if (r.pool_peak >= 0) json << ", \"pool_peak_bytes\": " << r.pool_peak;
  if (r.range)
    json << ", \"range_pairs\": " << r.range_pairs << ", \"pairs_per_second\": "
         << (r.seconds.empty() ? 0.0 : r.range_pairs / median(r.seconds));
  json << "}";
}

// Runs every configuration on one problem over data set d (named `name`
// in the output); false on a mismatch. kept (may be null) receives the runs.
bool bench_problem(const Options &o, bool have_gpu, const DataSet &d, const std::string &name,
                   const KnnProblem &p, bool first, std::ostream &json,
                   std::vector<std::string> *table, std::vector<Run> *kept = nullptr) {
  DataSet label;
  label.name = name;
  label.rows = d.rows;
  label.dims = d.dims;
  std::vector<Run> runs;
  for (const Config &c : o.configs) {
    if (c.device == KNN_DEVICE_GPU ? !have_gpu : d.rows > o.cpu_max_rows) continue;
    const bool per_list = c.device == KNN_DEVICE_GPU && !o.device_lists.empty();
    const std::vector<std::string> lists = per_list ? o.device_lists : std::vector<std::string>{""};
    for (const std::string &devices : lists) {
      runs.push_back(time_config(p, c, o.repeat, devices));
      const Run &r = runs.back();
      std::printf("%-18s %-9s %8.4f s  %s %s %s\n", name.c_str(), r.label.c_str(),
                  median(r.seconds), knn_method_name(r.stats.method), r.stats.variant,
                  r.status == KNN_OK ? "" : r.error.c_str());
      if (!o.elements.empty() && r.status == KNN_OK)
        std::printf("%-18s %-9s engine %.4f s (transfer %.4f), outside the engine %.4f s, "
                    "device pool peak %s MiB\n",
                    name.c_str(), r.label.c_str(), r.stats.seconds_total,
                    r.stats.seconds_transfer, median(r.seconds) - r.stats.seconds_total,
                    r.pool_peak < 0 ? "-" : std::to_string(r.pool_peak >> 20).c_str());
      if (r.range && r.status == KNN_OK)
        std::printf("%-18s %-9s %.2f pairs a row, %.3g pairs/s, %lld distances for %lld pairs, "
                    "engine %.4f s (cluster %.4f, find %.4f, hand-over %.4f), %s\n",
                    name.c_str(), r.label.c_str(), static_cast<double>(r.range_pairs) / p.n_queries,
                    r.range_pairs / median(r.seconds),
                    static_cast<long long>(r.stats.distance_computations),
                    static_cast<long long>(r.stats.pairs), r.stats.seconds_total,
                    r.stats.seconds_cluster, r.stats.seconds_filter, r.stats.seconds_select,
                    r.stats.device_name);
      std::fflush(stdout);
    }
  }
  const bool all_match = verify(&runs);
  json << (first ? "" : ",") << "\n    {\"name\": \"" << name << "\", \"rows\": " << d.rows
       << ", \"dims\": " << d.dims << ", \"queries\": " << p.n_queries << ", \"runs\": [";
  for (size_t i = 0; i < runs.size(); i++) {
    json << (i ? "," : "");
    write_json_run(json, runs[i]);
    table->push_back(table_line(label, runs[i]));
  }
  json << "]}";
  if (kept != nullptr) kept->swap(runs);
  return all_match;
}

// --element: the set's rows rounded to float16 once, joined as each row
// type (bench_problem per type); every GPU run of a float16 type is
// compared with the float32 run of the same label. False on a mismatch.
bool bench_elements(const Options &o, bool have_gpu, const DataSet &d, const KnnProblem &p,
                    bool *first, std::ostream &json, std::vector<std::string> *table) {
  std::vector<uint16_t> halves(d.x.size());
  std::vector<float> rounded(d.x.size());
  for (size_t i = 0; i < d.x.size(); i++) {
    halves[i] = knn_float_to_half(d.x[i]);
    rounded[i] = knn_half_to_float(halves[i]);
  }
  bool all_match = true;
  std::vector<Run> float32_runs;
  for (const std::string &e : o.elements) {
    KnnProblem b = p;
    const bool half = e != "float32";
    b.element = half ? KNN_ELEMENT_FLOAT16 : KNN_ELEMENT_FLOAT32;
    b.queries = b.targets = half ? static_cast<const void *>(halves.data()) : rounded.data();
    const std::string name =
        d.name + (e == "float16" ? "-f16" : e == "float16-widened" ? "-f16w" : "");
    knn_job_test_float16_upload(e == "float16-widened" ? 0 : 1);
    std::vector<Run> runs;
    all_match = bench_problem(o, have_gpu, d, name, b, *first, json, table, &runs) && all_match;
    knn_job_test_float16_upload(1);
    *first = false;
    if (!half) {
      float32_runs.swap(runs);
      continue;
    }
    for (const Run &r : runs)
      for (const Run &f : float32_runs)
        if (r.status == KNN_OK && f.status == KNN_OK && r.label == f.label) {
          const int64_t bad = count_mismatches(r, f);
          std::printf("%-18s %-9s against the float32 rows: %s\n", name.c_str(), r.label.c_str(),
                      bad == 0 ? "identical" : "MISMATCH");
          all_match = all_match && bad == 0;
        }
  }
  return all_match;
}

// The self-join of a data set (the all-kNN graph, self-matches excluded),
// or, with --queries, batches of its rows (evenly spaced, the same
// exclusion) against all of them; false on a mismatch.
bool bench_set(const Options &o, bool have_gpu, const DataSet &d, bool *first,
               std::ostream &json, std::vector<std::string> *table) {
  std::vector<int64_t> keys(d.rows);
  for (int64_t i = 0; i < d.rows; i++) keys[i] = i;
  KnnProblem p{};
  p.queries = p.targets = d.x.data();
  p.n_queries = p.n_targets = d.rows;
  p.dim = d.dims;
  p.k = o.k;
  p.metric = o.metric;
  p.n_threads = o.threads;
  p.query_keys = p.target_keys = keys.data();
  if (!std::isnan(o.radius)) {
    p.range = o.radius_inclusive ? KNN_RANGE_AT_MOST : KNN_RANGE_BELOW;
    p.max_distance = o.radius;
    p.k = o.range_cap;
  }
  if (!o.elements.empty()) return bench_elements(o, have_gpu, d, p, first, json, table);
  if (!o.memory_fractions.empty()) {
    bool all_match = true;
    for (double f : o.memory_fractions) {
      KnnProblem b = p;
      const double data_bytes = static_cast<double>(d.rows) * d.dims * sizeof(float);
      b.gpu_memory_limit = f > 0 ? static_cast<int64_t>(f * data_bytes) : 0;
      char suffix[64] = "";
      if (f > 0) std::snprintf(suffix, sizeof suffix, "-mem%g", f);
      all_match = bench_problem(o, have_gpu, d, d.name + suffix, b, *first, json, table) &&
                  all_match;
      *first = false;
    }
    return all_match;
  }
  if (o.query_batches.empty()) {
    const bool ok = bench_problem(o, have_gpu, d, d.name, p, *first, json, table);
    *first = false;
    return ok;
  }
  bool all_match = true;
  for (int64_t n : o.query_batches) {
    n = std::min(n, d.rows);
    std::vector<float> rows(static_cast<size_t>(n) * d.dims);
    std::vector<int64_t> row_keys(n);
    for (int64_t i = 0; i < n; i++) {
      row_keys[i] = i * d.rows / n;
      std::copy_n(d.x.data() + row_keys[i] * d.dims, d.dims, rows.data() + i * d.dims);
    }
    KnnProblem b = p;
    b.queries = rows.data();
    b.n_queries = n;
    b.query_keys = row_keys.data();
    all_match = bench_problem(o, have_gpu, d, d.name + "-q" + std::to_string(n), b, *first, json,
                              table) && all_match;
    *first = false;
  }
  return all_match;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (!parse_options(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s DATA_DIR [--k 20] [--repeat 2] [--out FILE] [--sets a,b] "
                 "[--cpu-max-rows N] [--metric l2|cosine|ip|l1] "
                 "[--methods brute,ti,auto,brute-hgemm,brute-hgemm-pipelined,brute-full-sort,brute-dgemm,brute-sgemm,"
                 "cpu,cpu-ti,cpu-brute,"
                 "cpu-blas,cpu-avx2] [--threads N] "
                 "[--module-dir DIR] [--fashion-rows 20000] [--queries 1,4,12] "
                 "[--gpu-memory-fractions 0,0.5,0.25,0.125] [--devices 0/0,1] "
                 "[--radius R [--radius-inclusive 1] [--range-cap K]] [--distinct 1] "
                 "[--element float32,float16,float16-widened]\n",
                 argv[0]);
    return 2;
  }
  g_pool_peak = !o.elements.empty();
  char engine_line[512] = "";
  const int have_gpu = knn_engine_describe(engine_line, sizeof engine_line);
  std::printf("engine: %s\n", engine_line);

  std::ostringstream json;
  json << "{\n  \"engine\": \"" << json_escape(engine_line) << "\",\n  \"k\": " << o.k
       << ",\n  \"metric\": \"" << knn_metric_name(o.metric) << "\",\n  \"repeat\": " << o.repeat;
  if (!std::isnan(o.radius))
    json << ",\n  \"radius\": " << o.radius << ",\n  \"radius_inclusive\": "
         << (o.radius_inclusive ? "true" : "false") << ",\n  \"range_cap\": " << o.range_cap;
  json << ",\n  \"datasets\": [";
  std::vector<std::string> table;
  bool first_set = true, all_match = true;
  for (const std::string &name : o.sets) {
    DataSet d;
    const bool ok = name == "fashion-mnist" ? load_idx(o.dir + "/fashion-mnist.idx", o.fashion_rows, &d)
                                            : load_f32(o.dir, name, &d);
    if (!ok) {
      std::printf("%-18s missing, skipped\n", name.c_str());
      continue;
    }
    if (o.distinct) keep_distinct_rows(&d);
    all_match = bench_set(o, have_gpu != 0, d, &first_set, json, &table) && all_match;
  }
  json << "\n  ]\n}\n";

  std::printf("\n%-18s %8s %6s  %-9s %9s  %-11s %s\n", "data set", "rows", "dims", "run",
              "seconds", "verified", "variant");
  for (const std::string &line : table) std::printf("%s\n", line.c_str());
  std::ofstream out(o.out_path);
  out << json.str();
  std::printf("\nwrote %s%s\n", o.out_path.c_str(), all_match ? "" : "  (MISMATCHES: see table)");
  return all_match ? 0 : 1;
}
