// knn_bench.cpp -- times the engines on the benchmark data sets, engine
// only (host arrays in, host results out), through the job API that the
// extension uses.
//
//   bench/knn_bench DATA_DIR [--k 20] [--repeat 2] [--out results.json]
//                   [--sets a,b,c] [--cpu-max-rows 100000] [--metric l2]
//                   [--methods brute,ti,auto,cpu]
//
// DATA_DIR holds NAME.f32 (raw little-endian float32, row-major) with
// NAME.json beside it ("rows", "dims"), and optionally
// fashion-mnist.idx (uncompressed IDX images: 16-byte header, uint8
// pixels), of which the first 20000 rows are used. bench/run_bench.sh
// prepares such a directory from the .xz files.
//
// Per data set: a self-join with self-match exclusion (keys = row ids,
// the all-kNN graph), timed for GPU brute, GPU TI, GPU auto and the CPU
// engine (only up to --cpu-max-rows rows: the CPU is the slow reference).
// Every GPU result is compared bit for bit with the CPU result when the
// CPU ran, else with GPU brute force. Prints a table; writes JSON.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "knn_engine.h"

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
  d->name = "fashion-mnist-20k";
  d->rows = std::min(count, max_rows);
  d->dims = static_cast<int>(h * w);
  std::vector<unsigned char> bytes(static_cast<size_t>(d->rows) * d->dims);
  ok = ok && std::fread(bytes.data(), 1, bytes.size(), f) == bytes.size();
  std::fclose(f);
  d->x.assign(bytes.begin(), bytes.end());
  return ok;
}

struct Run {
  std::string engine, method;
  std::vector<double> seconds;
  KnnStatus status = KNN_OK;
  std::string error;
  KnnStats stats{};
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
  std::string verified_against;  // "cpu", "gpu-brute" or ""
  bool match = false;
  int64_t mismatches = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

KnnStatus run_once(const KnnProblem &p, std::vector<int64_t> *nb, std::vector<double> *dist,
                   KnnStats *stats, std::string *error, double *seconds) {
  nb->assign(static_cast<size_t>(p.n_queries) * p.k, -7);
  dist->assign(nb->size(), -7.0);
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

bool same_distance(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

int64_t count_mismatches(const Run &a, const Run &b) {
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

KnnMetric parse_metric(const std::string &s) {
  if (s == "cosine") return KNN_METRIC_COSINE;
  if (s == "ip") return KNN_METRIC_IP;
  if (s == "l1") return KNN_METRIC_L1;
  return KNN_METRIC_L2;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s DATA_DIR [--k 20] [--repeat 2] [--out FILE] [--sets a,b] "
                 "[--cpu-max-rows N] [--metric l2|cosine|ip|l1]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  int k = 20, repeat = 2;
  int64_t cpu_max_rows = 100000;
  std::string out_path = "bench/results/knn_bench.json";
  std::string metric_name = "l2";
  std::string methods = "brute,ti,auto,cpu";
  std::vector<std::string> sets = {"3DNet_head5000", "arcene", "keggD_std", "kegg_std", "blog",
                                   "fashion-mnist", "skin", "ipums", "kdd"};
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--k") k = std::atoi(v.c_str());
    else if (a == "--repeat") repeat = std::max(1, std::atoi(v.c_str()));
    else if (a == "--out") out_path = v;
    else if (a == "--cpu-max-rows") cpu_max_rows = std::atoll(v.c_str());
    else if (a == "--metric") metric_name = v;
    else if (a == "--methods") methods = v;
    else if (a == "--sets") {
      sets.clear();
      std::stringstream ss(v);
      std::string s;
      while (std::getline(ss, s, ',')) sets.push_back(s);
    }
  }
  const KnnMetric metric = parse_metric(metric_name);

  char engine_line[512] = "";
  const int have_gpu = knn_engine_describe(engine_line, sizeof engine_line);
  std::printf("engine: %s\n", engine_line);

  std::ostringstream json;
  json << "{\n  \"engine\": \"" << json_escape(engine_line) << "\",\n  \"k\": " << k
       << ",\n  \"metric\": \"" << metric_name << "\",\n  \"repeat\": " << repeat
       << ",\n  \"datasets\": [";
  std::vector<std::string> table;
  bool first_set = true, all_match = true;

  for (const std::string &name : sets) {
    DataSet d;
    const bool ok = name == "fashion-mnist" ? load_idx(dir + "/fashion-mnist.idx", 20000, &d)
                                            : load_f32(dir, name, &d);
    if (!ok) {
      std::printf("%-18s missing, skipped\n", name.c_str());
      continue;
    }
    std::vector<int64_t> keys(d.rows);
    for (int64_t i = 0; i < d.rows; i++) keys[i] = i;
    KnnProblem p{};
    p.queries = p.targets = d.x.data();
    p.n_queries = p.n_targets = d.rows;
    p.dim = d.dims;
    p.k = k;
    p.metric = metric;
    p.query_keys = p.target_keys = keys.data();

    struct Config { const char *engine; KnnDevice device; KnnMethod method; const char *label; };
    std::vector<Config> configs;
    auto wanted = [&](const char *m) {
      return ("," + methods + ",").find("," + std::string(m) + ",") != std::string::npos;
    };
    if (have_gpu) {
      if (wanted("brute")) configs.push_back({"gpu", KNN_DEVICE_GPU, KNN_METHOD_BRUTE, "brute"});
      if (wanted("ti")) configs.push_back({"gpu", KNN_DEVICE_GPU, KNN_METHOD_TI, "ti"});
      if (wanted("auto")) configs.push_back({"gpu", KNN_DEVICE_GPU, KNN_METHOD_AUTO, "auto"});
    }
    if (wanted("cpu") && d.rows <= cpu_max_rows)
      configs.push_back({"cpu", KNN_DEVICE_CPU, KNN_METHOD_AUTO, "auto"});

    std::vector<Run> runs;
    for (const Config &c : configs) {
      Run r;
      r.engine = c.engine;
      r.method = c.label;
      p.device = c.device;
      p.method = c.method;
      // One untimed GPU run first: module load, context and handles.
      const int tries = c.device == KNN_DEVICE_GPU ? repeat + 1 : 1;
      for (int t = 0; t < tries; t++) {
        double s = 0;
        r.status = run_once(p, &r.neighbors, &r.distances, &r.stats, &r.error, &s);
        if (r.status != KNN_OK) break;
        if (c.device != KNN_DEVICE_GPU || t > 0) r.seconds.push_back(s);
      }
      std::printf("%-18s %s %-5s %8.4f s  %s %s %s\n", d.name.c_str(), r.engine.c_str(),
                  r.method.c_str(), median(r.seconds), r.stats.method, r.stats.variant,
                  r.status == KNN_OK ? "" : r.error.c_str());
      std::fflush(stdout);
      runs.push_back(std::move(r));
    }
    // Verification: every GPU run against the CPU, else against GPU brute.
    const Run *cpu = nullptr, *brute = nullptr;
    for (const Run &r : runs) {
      if (r.engine == "cpu" && r.status == KNN_OK) cpu = &r;
      if (r.engine == "gpu" && r.method == "brute" && r.status == KNN_OK) brute = &r;
    }
    for (Run &r : runs) {
      if (r.engine != "gpu" || r.status != KNN_OK) continue;
      const Run *ref = cpu != nullptr ? cpu : (&r != brute ? brute : nullptr);
      if (ref == nullptr) continue;
      r.verified_against = ref == cpu ? "cpu" : "gpu-brute";
      r.mismatches = count_mismatches(r, *ref);
      r.match = r.mismatches == 0;
      all_match = all_match && r.match;
    }

    json << (first_set ? "" : ",") << "\n    {\"name\": \"" << d.name << "\", \"rows\": " << d.rows
         << ", \"dims\": " << d.dims << ", \"runs\": [";
    first_set = false;
    bool first_run = true;
    for (const Run &r : runs) {
      char line[512];
      std::snprintf(line, sizeof line, "%-18s %8lld %6d  %-3s %-5s %9.4f  %-8s %s",
                    d.name.c_str(), static_cast<long long>(d.rows), d.dims, r.engine.c_str(),
                    r.method.c_str(), median(r.seconds),
                    r.verified_against.empty() ? "-"
                    : r.match ? ("=" + r.verified_against).c_str()
                              : "MISMATCH",
                    r.status == KNN_OK ? r.stats.variant : r.error.c_str());
      table.push_back(line);
      json << (first_run ? "" : ",") << "\n      {\"engine\": \"" << r.engine
           << "\", \"method\": \"" << r.method << "\", \"status\": " << r.status
           << ", \"error\": \"" << json_escape(r.error) << "\", \"seconds\": [";
      for (size_t i = 0; i < r.seconds.size(); i++) json << (i ? ", " : "") << r.seconds[i];
      json << "], \"median\": " << (r.seconds.empty() ? 0.0 : median(r.seconds))
           << ", \"device\": \"" << json_escape(r.stats.device) << "\", \"ran\": \""
           << json_escape(r.stats.method) << "\", \"variant\": \""
           << json_escape(r.stats.variant) << "\", \"distance_computations\": "
           << r.stats.distance_computations << ", \"seconds_transfer\": "
           << r.stats.seconds_transfer << ", \"seconds_cluster\": " << r.stats.seconds_cluster
           << ", \"seconds_filter\": " << r.stats.seconds_filter
           << ", \"seconds_select\": " << r.stats.seconds_select
           << ", \"verified_against\": \"" << r.verified_against
           << "\", \"mismatches\": " << r.mismatches << "}";
      first_run = false;
    }
    json << "]}";
  }
  json << "\n  ]\n}\n";

  std::printf("\n%-18s %8s %6s  %-3s %-5s %9s  %-8s %s\n", "data set", "rows", "dims", "eng",
              "meth", "seconds", "verified", "variant");
  for (const std::string &line : table) std::printf("%s\n", line.c_str());
  std::ofstream out(out_path);
  out << json.str();
  std::printf("\nwrote %s%s\n", out_path.c_str(), all_match ? "" : "  (MISMATCHES: see table)");
  return all_match ? 0 : 1;
}
