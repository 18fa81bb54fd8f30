// gpu_cold_start.h -- whether a join under KNN_DEVICE_AUTO should run on the
// CPU while this process's GPU runtime is still being created.
//
// A process's first GPU join pays for loading the GPU module, starting the
// driver and creating the CUDA context and cuBLAS handle: about 0.3 s on
// an H200 host, 0.1 s of it the context and handle alone
// (test/gpu_first_use_test.cpp prints both), and then the join itself.
// Where the CPU engine would answer sooner than that, the job layer runs
// the join on the CPU and then creates the runtime in the background, so
// that a later join finds it ready (knn_job.cpp).
#pragma once

#include "knn_engine.h"

namespace knn {

// What the GPU runtime's creation costs a new process, in seconds.
constexpr double kGpuColdStartSeconds = 0.3;
// What a GPU join near the break-even costs besides (host to host): a
// 10000 x 784 self-join, k = 10, took 0.10-0.18 s on a warm H200.
constexpr double kGpuJoinNearBreakEvenSeconds = 0.1;

// The CPU engine's predicted seconds for this problem (its brute force, a
// bound on what AUTO picks), from the CPU cost model's calibration.
double predict_cpu_seconds(const KnnProblem &problem);

// How much slower than predicted a CPU join runs on a busy host: the
// threads runnable right now (the fourth field of /proc/loadavg,
// "running/total", this one included) over the cores, at least 1. The
// prediction assumes idle cores; many sessions joining at once share
// them (64 sessions on 16 cores took their first joins to the CPU and
// held it). 1 where loadavg is not given.
double cpu_contention_from_loadavg(const char *loadavg, unsigned cores);
double cpu_contention();

// True when the CPU engine is predicted to answer before a cold GPU could,
// its prediction scaled by the host's contention.
inline bool cpu_answers_before_cold_gpu(const KnnProblem &problem) {
  return predict_cpu_seconds(problem) * cpu_contention() <
         kGpuColdStartSeconds + kGpuJoinNearBreakEvenSeconds;
}

}  // namespace knn
