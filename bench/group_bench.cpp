// group_bench.cpp -- times a per-group join (KnnProblem's query_groups and
// target_groups) three ways through the job API, on seeded random data:
//   grouped   one job with the groups: the GPU module's grouped entry
//             (one call, segmented launches; kernels/cuda/group_join.cuh)
//   per-group one plain GPU job per group, rows gathered per group: what
//             the job layer did before (and does with a module without the
//             grouped entry)
//   cpu       one job with the groups on the CPU engine (--cpu)
// and checks that all of them return the same neighbours and distances.
//
//   bench/group_bench [--queries 100000] [--targets 1000000] [--groups 100]
//                     [--dim 32] [--k 10] [--metric l2] [--seed 1]
//                     [--repeat 2] [--cpu] [--module-dir .] [--out FILE]
//
// Rows are uniform in [-1, 1); each row's group is drawn uniformly. Times
// are wall seconds of the whole job (partition, transfers, kernels), the
// best of --repeat runs after one warm-up join; the engine's seconds (and
// its phases) are its statistics, summed over the jobs of per-group. One JSON object per run
// goes to stdout (and is appended to --out).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "knn_engine.h"
#include "knn_vocabulary.h"

namespace {

struct Options {
  int64_t queries = 100000, targets = 1000000, groups = 100;
  int dim = 32, k = 10, repeat = 2;
  KnnMetric metric = KNN_METRIC_L2;
  uint64_t seed = 1;
  bool cpu = false;
  std::string module_dir = ".", out;
};

// splitmix64: fast, seeded, the same on every host.
struct Random {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
};

struct Result {
  KnnStatus status = KNN_INTERNAL_ERROR;
  std::string message;
  KnnStats stats{};
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
  double seconds = 0;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

KnnStatus run_job(const KnnProblem &p, int64_t *nb, double *d, KnnStats *stats, std::string *msg) {
  char err[512] = "";
  KnnJob *job = knn_job_start(&p, nb, d, err, sizeof err);
  if (job == nullptr) {
    *msg = err;
    return KNN_INTERNAL_ERROR;
  }
  const KnnStatus st = knn_job_finish(job, stats, err, sizeof err);
  *msg = err;
  return st;
}

Result run_whole(const KnnProblem &p) {
  Result r;
  r.neighbors.resize(static_cast<size_t>(p.n_queries) * p.k);
  r.distances.resize(r.neighbors.size());
  const double t0 = now();
  r.status = run_job(p, r.neighbors.data(), r.distances.data(), &r.stats, &r.message);
  r.seconds = now() - t0;
  return r;
}

// One plain job per group (groups are 0 .. groups-1 here), rows gathered
// per group as the job layer's split did.
Result run_per_group(const KnnProblem &p, int64_t groups) {
  Result r;
  r.neighbors.assign(static_cast<size_t>(p.n_queries) * p.k, -1);
  r.distances.assign(r.neighbors.size(), NAN);
  const double t0 = now();
  std::vector<std::vector<int64_t>> q_rows(groups), t_rows(groups);
  for (int64_t i = 0; i < p.n_queries; i++) q_rows[p.query_groups[i]].push_back(i);
  for (int64_t j = 0; j < p.n_targets; j++) t_rows[p.target_groups[j]].push_back(j);
  const auto *qx = static_cast<const float *>(p.queries);
  const auto *tx = static_cast<const float *>(p.targets);
  std::vector<float> qs, ts;
  std::vector<int64_t> nb;
  std::vector<double> d;
  r.status = KNN_OK;
  for (int64_t g = 0; g < groups && r.status == KNN_OK; g++) {
    const int64_t nq = static_cast<int64_t>(q_rows[g].size());
    const int64_t nt = static_cast<int64_t>(t_rows[g].size());
    if (nq == 0 || nt == 0) continue;
    qs.resize(static_cast<size_t>(nq) * p.dim);
    ts.resize(static_cast<size_t>(nt) * p.dim);
    for (int64_t i = 0; i < nq; i++)
      std::memcpy(&qs[i * p.dim], qx + q_rows[g][i] * p.dim, p.dim * sizeof(float));
    for (int64_t j = 0; j < nt; j++)
      std::memcpy(&ts[j * p.dim], tx + t_rows[g][j] * p.dim, p.dim * sizeof(float));
    KnnProblem sub = p;
    sub.query_groups = sub.target_groups = nullptr;
    sub.queries = qs.data();
    sub.n_queries = nq;
    sub.targets = ts.data();
    sub.n_targets = nt;
    sub.k = static_cast<int32_t>(std::min<int64_t>(p.k, nt));
    nb.resize(static_cast<size_t>(nq) * sub.k);
    d.resize(nb.size());
    KnnStats s{};
    r.status = run_job(sub, nb.data(), d.data(), &s, &r.message);
    if (r.stats.device_name[0] == '\0') r.stats = s;  // the first group's names, the sums below
    else {
      r.stats.seconds_total += s.seconds_total;
      r.stats.seconds_transfer += s.seconds_transfer;
      r.stats.seconds_filter += s.seconds_filter;
      r.stats.seconds_select += s.seconds_select;
    }
    for (int64_t i = 0; i < nq; i++)
      for (int j = 0; j < sub.k; j++) {
        const int64_t t = nb[i * sub.k + j];
        r.neighbors[q_rows[g][i] * p.k + j] = t < 0 ? -1 : t_rows[g][t];
        r.distances[q_rows[g][i] * p.k + j] = d[i * sub.k + j];
      }
  }
  r.seconds = now() - t0;
  return r;
}

int64_t differences(const Result &a, const Result &b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.neighbors.size(); i++) {
    const double x = a.distances[i], y = b.distances[i];
    const bool same_d = (std::isnan(x) && std::isnan(y)) || std::memcmp(&x, &y, sizeof x) == 0;
    if (a.neighbors[i] != b.neighbors[i] || !same_d) n++;
  }
  return n;
}

bool parse(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--cpu") {
      o->cpu = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (a == "--queries") o->queries = std::atoll(v.c_str());
    else if (a == "--targets") o->targets = std::atoll(v.c_str());
    else if (a == "--groups") o->groups = std::atoll(v.c_str());
    else if (a == "--dim") o->dim = std::atoi(v.c_str());
    else if (a == "--k") o->k = std::atoi(v.c_str());
    else if (a == "--seed") o->seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--repeat") o->repeat = std::max(1, std::atoi(v.c_str()));
    else if (a == "--module-dir") o->module_dir = v;
    else if (a == "--out") o->out = v;
    else if (a == "--metric") {
      if (!knn_metric_parse(v.c_str(), &o->metric)) return false;
    } else {
      return false;
    }
  }
  return o->queries >= 0 && o->targets >= 0 && o->groups >= 1 && o->dim >= 1 && o->k >= 1;
}

void report(const Options &o, const char *how, const Result &r, int64_t differ, FILE *out) {
  char line[1536];
  std::snprintf(line, sizeof line,
                "{\"how\": \"%s\", \"queries\": %lld, \"targets\": %lld, \"groups\": %lld, "
                "\"dim\": %d, \"k\": %d, \"metric\": \"%s\", \"status\": \"%s\", "
                "\"seconds\": %.4f, \"engine_seconds\": %.4f, \"engine_transfer\": %.4f, "
                "\"engine_filter\": %.4f, \"engine_select\": %.4f, \"device\": \"%s\", "
                "\"variant\": \"%s\", \"differences\": %lld}\n",
                how, static_cast<long long>(o.queries), static_cast<long long>(o.targets),
                static_cast<long long>(o.groups), o.dim, o.k, knn_metric_name(o.metric),
                knn_status_name(r.status), r.seconds, r.stats.seconds_total,
                r.stats.seconds_transfer, r.stats.seconds_filter, r.stats.seconds_select,
                r.stats.device_name,
                r.stats.variant, static_cast<long long>(differ));
  std::fputs(line, stdout);
  if (out != nullptr) std::fputs(line, out);
  if (r.status != KNN_OK) std::fprintf(stderr, "%s: %s\n", how, r.message.c_str());
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s [--queries N] [--targets N] [--groups G] [--dim D] [--k K] "
                 "[--metric l2|cosine|ip|l1] [--seed S] [--repeat R] [--cpu] "
                 "[--module-dir DIR] [--out FILE]\n",
                 argv[0]);
    return 2;
  }
  knn_engine_set_module_dir(o.module_dir.c_str());
  Random rng{o.seed};
  std::vector<float> q(static_cast<size_t>(o.queries) * o.dim);
  std::vector<float> t(static_cast<size_t>(o.targets) * o.dim);
  for (float &v : q) v = rng.uniform();
  for (float &v : t) v = rng.uniform();
  std::vector<int64_t> qg(o.queries), tg(o.targets);
  for (auto &g : qg) g = static_cast<int64_t>(rng.next() % o.groups);
  for (auto &g : tg) g = static_cast<int64_t>(rng.next() % o.groups);

  KnnProblem p{};
  p.element = KNN_ELEMENT_FLOAT32;
  p.queries = q.data();
  p.n_queries = o.queries;
  p.targets = t.data();
  p.n_targets = o.targets;
  p.dim = o.dim;
  p.k = o.k;
  p.metric = o.metric;
  p.method = KNN_METHOD_AUTO;
  p.device = KNN_DEVICE_GPU;
  p.query_groups = qg.data();
  p.target_groups = tg.data();

  {  // warm-up: the GPU runtime exists before the first timed join
    KnnProblem w = p;
    w.n_queries = std::min<int64_t>(o.queries, 100);
    w.n_targets = std::min<int64_t>(o.targets, 1000);
    (void)run_whole(w);
  }
  FILE *out = o.out.empty() ? nullptr : std::fopen(o.out.c_str(), "a");
  Result grouped, per_group, cpu;
  for (int r = 0; r < o.repeat; r++) {
    Result g = run_whole(p);
    if (r == 0 || g.seconds < grouped.seconds) grouped = std::move(g);
  }
  for (int r = 0; r < o.repeat; r++) {
    Result g = run_per_group(p, o.groups);
    if (r == 0 || g.seconds < per_group.seconds) per_group = std::move(g);
  }
  report(o, "grouped-gpu", grouped, 0, out);
  report(o, "per-group-gpu", per_group, differences(grouped, per_group), out);
  int64_t worst = differences(grouped, per_group);
  if (o.cpu) {
    p.device = KNN_DEVICE_CPU;
    cpu = run_whole(p);
    const int64_t d = differences(grouped, cpu);
    report(o, "grouped-cpu", cpu, d, out);
    worst = std::max(worst, d);
  }
  if (out != nullptr) std::fclose(out);
  return grouped.status == KNN_OK && per_group.status == KNN_OK && worst == 0 ? 0 : 1;
}
