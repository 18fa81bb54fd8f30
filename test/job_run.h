// job_run.h -- the engine tests' way to run a join as the extension runs
// one (knn_job_start, polling, knn_job_finish) and to compare two results
// bit for bit. GoogleTest, no PostgreSQL.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "knn_engine.h"

namespace job_run {

struct JobResult {
  KnnStatus status = KNN_INTERNAL_ERROR;
  std::vector<int64_t> neighbors;
  std::vector<double> distances;
  KnnStats stats{};
  std::string message;
  double seconds = 0;  // start to finish, as a backend sees it
};

// Every slot is poisoned first: the engine must write each one.
inline JobResult run_job(const KnnProblem &p) {
  JobResult r;
  r.neighbors.assign(static_cast<size_t>(p.n_queries * p.k), -2);
  r.distances.assign(r.neighbors.size(), -2.0);
  char err[512] = "";
  const auto start = std::chrono::steady_clock::now();
  KnnJob *job = knn_job_start(&p, r.neighbors.data(), r.distances.data(), err, sizeof err);
  if (job == nullptr) {
    r.message = err;
    return r;
  }
  while (knn_job_wait(job, 50) == 0) {
  }
  r.status = knn_job_finish(job, &r.stats, err, sizeof err);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.message = err;
  return r;
}

// Same neighbours, order and distances, bit for bit (NaN matches NaN, the
// sign of zero counts).
inline void expect_identical(const JobResult &a, const JobResult &b, const std::string &what) {
  ASSERT_EQ(a.neighbors.size(), b.neighbors.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.neighbors.size(); i++) {
    const bool same_distance =
        std::memcmp(&a.distances[i], &b.distances[i], sizeof(double)) == 0 ||
        (std::isnan(a.distances[i]) && std::isnan(b.distances[i]));
    if (a.neighbors[i] != b.neighbors[i] || !same_distance) {
      if (bad++ < 5)
        ADD_FAILURE() << what << ": slot " << i << ": " << a.neighbors[i] << " "
                      << a.distances[i] << " vs " << b.neighbors[i] << " " << b.distances[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

}  // namespace job_run
