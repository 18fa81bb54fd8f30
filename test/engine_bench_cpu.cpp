// engine_bench_cpu.cpp -- times knn::cpu_run on a real data set (a timing
// tool, not a unit test). Self-join with self-match exclusion, like the
// all-kNN graph the extension builds.
//
//   engine_bench_cpu FILE ROWS DIMS [k=20] [method=auto|ti|brute]
//                    [metric=l2|cosine|ip|l1] [threads=0] [verify=200]
//
// FILE is raw little-endian float32, row-major (the .f32 data sets), or an
// uncompressed IDX image file (name ending in .idx: 16-byte header, then
// uint8 pixels), of which the first ROWS rows are used. verify=N checks N
// evenly spaced queries bit for bit against brute force over all targets.
//
// Build: g++ -std=c++17 -O3 -ffp-contract=off -pthread -Ikernels
//        test/engine_bench_cpu.cpp kernels/cpu/*.cpp -o /tmp/engine_bench_cpu
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_engine.h"

namespace {

bool read_rows(const char *path, int64_t rows, int dims, std::vector<float> *out) {
  FILE *f = std::fopen(path, "rb");
  if (f == nullptr) return false;
  const size_t n = static_cast<size_t>(rows) * dims;
  out->resize(n);
  const std::string name = path;
  bool ok;
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".idx") == 0) {
    std::vector<unsigned char> bytes(n);
    ok = std::fseek(f, 16, SEEK_SET) == 0 && std::fread(bytes.data(), 1, n, f) == n;
    for (size_t i = 0; i < n; i++) (*out)[i] = bytes[i];
  } else {
    ok = std::fread(out->data(), sizeof(float), n, f) == n;
  }
  std::fclose(f);
  return ok;
}

KnnMetric parse_metric(const std::string &s) {
  if (s == "cosine") return KNN_METRIC_COSINE;
  if (s == "ip") return KNN_METRIC_IP;
  if (s == "l1") return KNN_METRIC_L1;
  return KNN_METRIC_L2;
}

KnnMethod parse_method(const std::string &s) {
  if (s == "ti") return KNN_METHOD_TI;
  if (s == "brute") return KNN_METHOD_BRUTE;
  return KNN_METHOD_AUTO;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s FILE ROWS DIMS [k] [method] [metric] [threads] [verify]\n",
                 argv[0]);
    return 2;
  }
  const int64_t rows = std::atoll(argv[2]);
  const int dims = std::atoi(argv[3]);
  const int k = argc > 4 ? std::atoi(argv[4]) : 20;
  const KnnMethod method = parse_method(argc > 5 ? argv[5] : "auto");
  const KnnMetric metric = parse_metric(argc > 6 ? argv[6] : "l2");
  const int threads = argc > 7 ? std::atoi(argv[7]) : 0;
  const int64_t verify = argc > 8 ? std::atoll(argv[8]) : 200;

  std::vector<float> data;
  if (!read_rows(argv[1], rows, dims, &data)) {
    std::fprintf(stderr, "cannot read %lld x %d floats from %s\n",
                 static_cast<long long>(rows), dims, argv[1]);
    return 1;
  }
  std::vector<int64_t> keys(rows);
  for (int64_t i = 0; i < rows; i++) keys[i] = i;

  KnnProblem p{};
  p.queries = data.data();
  p.n_queries = rows;
  p.targets = data.data();
  p.n_targets = rows;
  p.dim = dims;
  p.k = k;
  p.metric = metric;
  p.method = method;
  p.device = KNN_DEVICE_CPU;
  p.query_keys = keys.data();
  p.target_keys = keys.data();
  p.n_threads = threads;

  std::vector<int64_t> neighbors(rows * k);
  std::vector<double> distances(rows * k);
  KnnStats stats;
  std::string error;
  const int32_t cancel = 0;
  const auto start = std::chrono::steady_clock::now();
  const KnnStatus status = knn::cpu_run(p, neighbors.data(), distances.data(),
                                        &stats, &cancel, &error);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (status != KNN_OK) {
    std::fprintf(stderr, "status %d: %s\n", status, error.c_str());
    return 1;
  }
  std::printf("%s %lldx%d k=%d: %.3f s  [%s, %s/%s, clusters %lld/%lld, "
              "distances %lld of %lld (%.2f%%), cluster %.3f filter %.3f select %.3f]\n",
              argv[1], static_cast<long long>(rows), dims, k, wall, stats.device,
              stats.method, stats.variant, static_cast<long long>(stats.query_clusters),
              static_cast<long long>(stats.target_clusters),
              static_cast<long long>(stats.distance_computations),
              static_cast<long long>(stats.pairs),
              100.0 * stats.distance_computations / std::max<double>(1, stats.pairs),
              stats.seconds_cluster, stats.seconds_filter, stats.seconds_select);

  if (verify > 0) {
    // Brute force for a sample of the queries (all targets, same keys).
    const int64_t n = std::min(verify, rows);
    std::vector<float> sample(n * dims);
    std::vector<int64_t> sample_keys(n), sample_rows(n);
    for (int64_t i = 0; i < n; i++) {
      sample_rows[i] = i * rows / n;
      sample_keys[i] = keys[sample_rows[i]];
      std::memcpy(&sample[i * dims], &data[sample_rows[i] * dims], sizeof(float) * dims);
    }
    KnnProblem b = p;
    b.queries = sample.data();
    b.n_queries = n;
    b.query_keys = sample_keys.data();
    b.method = KNN_METHOD_BRUTE;
    std::vector<int64_t> bn(n * k);
    std::vector<double> bd(n * k);
    if (knn::cpu_run(b, bn.data(), bd.data(), nullptr, &cancel, &error) != KNN_OK) {
      std::fprintf(stderr, "verify run failed: %s\n", error.c_str());
      return 1;
    }
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; i++)
      for (int r = 0; r < k; r++) {
        const int64_t at = sample_rows[i] * k + r;
        if (neighbors[at] != bn[i * k + r] ||
            std::memcmp(&distances[at], &bd[i * k + r], sizeof(double)) != 0)
          mismatches++;
      }
    std::printf("verify: %lld queries against brute force, %lld mismatching slots\n",
                static_cast<long long>(n), static_cast<long long>(mismatches));
    if (mismatches != 0) return 1;
  }
  return 0;
}
