// multi_device.cu -- one join split across GPUs by query rows (see
// multi_device.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "../stopwatch.h"
#include "device_runtime.cuh"
#include "device_thread.cuh"
#include "multi_device.cuh"
#include "peer_rows.cuh"
#include "share_vote.cuh"

namespace knn {
namespace cuda {
namespace {

// Under n_devices = 0 (every GPU) a join takes another GPU only when each
// engine still gets this much work (query rows x target rows x dimensions):
// about 60 ms of brute force on one H200 (1e6 x 1e6 x 768 took 4.9 s).
// Below it the second engine's setup (its thread, its own copy of the
// targets; the first time, its CUDA context: about 0.3 s) costs more than
// it saves. A list of GPUs is always split: the user asked for it.
constexpr double kMinSplitWork = 1e13;

// How often the watching thread looks at the caller's cancel and the
// engines' outcome: a stop reaches the engines within this plus their
// cancel-point spacing.
constexpr auto kWatchPeriod = std::chrono::milliseconds(1);

// Bytes of one row of the problem's element type.
int64_t row_bytes(const KnnProblem &p) {
  switch (p.element) {
    case KNN_ELEMENT_FLOAT16: return int64_t{2} * p.dim;
    case KNN_ELEMENT_BIT: return (int64_t{p.dim} + 7) / 8;
    default: return int64_t{4} * p.dim;
  }
}

// The GPU's relative speed for the split: its multiprocessors (equal GPUs
// get equal rows).
double device_weight(int device) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms < 1) {
    (void)cudaGetLastError();
    return 1.0;
  }
  return static_cast<double>(sms);
}

// "NVIDIA H200 x2 (GPUs 0,1)" or "NVIDIA H100 + NVIDIA A100 (GPUs 0,1)".
void describe_devices(const SplitPlan &plan, const char *const *names, char *out, size_t len) {
  bool same = true;
  for (int i = 1; i < plan.n_engines; i++) same = same && std::strcmp(names[i], names[0]) == 0;
  std::string text = names[0];
  if (same) {
    text += " x" + std::to_string(plan.n_engines);
  } else {
    for (int i = 1; i < plan.n_engines; i++) text += std::string(" + ") + names[i];
  }
  text += " (GPUs ";
  for (int i = 0; i < plan.n_engines; i++)
    text += (i ? "," : "") + std::to_string(plan.engines[i].device);
  text += ")";
  std::snprintf(out, len, "%s", text.c_str());
}

// A TI join's variant ends in "level-1 kept X%" (ti_join.cu: describe),
// the share of the cluster pairs its level 1 kept over the query clusters
// it ran over (KnnStats::query_clusters): a share divided by clusters its
// own only. The split's figure weighs each engine's by those clusters,
// so that it speaks for all of them, not for the first engine's alone
// (rounded as the engines' are). Left as it is where an engine lacks it.
void merge_level1_kept(const KnnStats *shares, const bool *started, int n, KnnStats *merged) {
  static const char kKept[] = "level-1 kept ";
  char *at = std::strstr(merged->variant, kKept);
  if (at == nullptr) return;
  double kept = 0, clusters = 0;
  for (int i = 0; i < n; i++) {
    if (!started[i]) continue;
    const char *text = std::strstr(shares[i].variant, kKept);
    double percent = 0;
    if (text == nullptr || std::sscanf(text + sizeof kKept - 1, "%lf", &percent) != 1) return;
    kept += percent * static_cast<double>(shares[i].query_clusters);
    clusters += static_cast<double>(shares[i].query_clusters);
  }
  if (clusters <= 0) return;
  const size_t used = static_cast<size_t>(at - merged->variant);
  std::snprintf(at, sizeof merged->variant - used, "%s%.1f%%", kKept, kept / clusters);
}

}  // namespace

KnnProblem query_share(const KnnProblem &p, int64_t first, int64_t n, int device) {
  KnnProblem share = p;
  share.queries = static_cast<const unsigned char *>(p.queries) + first * row_bytes(p);
  share.n_queries = n;
  if (p.query_keys != nullptr) share.query_keys = p.query_keys + first;
  if (p.query_groups != nullptr) share.query_groups = p.query_groups + first;
  share.n_devices = 1;
  share.devices[0] = device;
  return share;
}

KnnStatus plan_engines(const KnnProblem &p, double work, SplitPlan *plan, DeviceContext &ctx) {
  std::string why;
  const int visible = visible_devices(&why);
  if (visible == 0) {
    ctx.error = "no usable GPU: " + why;
    return KNN_NO_DEVICE;
  }
  int devices[KNN_MAX_DEVICES];
  int n = 0;
  if (p.n_devices > 0) {
    for (int i = 0; i < p.n_devices; i++) {
      if (p.devices[i] >= visible) {
        ctx.error = "knn_gpu.devices lists GPU " + std::to_string(p.devices[i]) +
                    ", but this process sees " + std::to_string(visible) +
                    (visible == 1 ? " GPU (0)" : " GPUs (0 to " + std::to_string(visible - 1) + ")");
        return KNN_NO_DEVICE;
      }
      devices[n++] = p.devices[i];
    }
  } else {
    const int gain = static_cast<int>(std::min<double>(
        std::min(visible, KNN_MAX_DEVICES), std::max(1.0, work / kMinSplitWork)));
    for (int d = 0; d < gain; d++) devices[n++] = d;
  }

  plan->n_engines = n;
  double weights[KNN_MAX_DEVICES], total = 0;
  for (int i = 0; i < n; i++) {
    Engine &e = plan->engines[i];
    e = Engine{};
    e.index = i;
    e.device = devices[i];
    for (int j = 0; j < i; j++) e.replica += devices[j] == devices[i];
    for (int j = 0; j < n; j++) e.sharing += j != i && devices[j] == devices[i];
    weights[i] = n > 1 ? device_weight(devices[i]) / e.sharing : 1.0;
    total += weights[i];
  }
  // Contiguous ranges, cut at the cumulative weights.
  double before = 0;
  int64_t first = 0;
  for (int i = 0; i < n; i++) {
    before += weights[i];
    const int64_t end = i + 1 == n ? p.n_queries
                                   : static_cast<int64_t>(static_cast<double>(p.n_queries) *
                                                          (before / total));
    plan->engines[i].first_query = first;
    plan->engines[i].n_queries = std::max<int64_t>(0, end - first);
    first = std::max(first, end);
  }
  return KNN_OK;
}

KnnStatus run_split(const KnnProblem &p, const SplitPlan &plan, const EngineRun &run,
                    KnnStats *stats, const int32_t *cancel, DeviceContext &ctx) {
  const Clock::time_point start = Clock::now();
  const int n = plan.n_engines;
  // The engines' cancel flag: the caller's cancel, or a failure of any engine.
  int32_t stop = 0;
  KnnStats shares[KNN_MAX_DEVICES] = {};
  double seconds[KNN_MAX_DEVICES] = {};
  // The engines with rows vote on dividing a TI self-join by clusters
  // (share_vote.cuh; other methods never vote). Declared before
  // the threads: it outlives them.
  int voters = 0;
  int members[KNN_MAX_DEVICES];
  for (int i = 0; i < n; i++)
    if (plan.engines[i].n_queries > 0) members[voters++] = i;
  ShareVote vote(voters);
  // The same engines share one upload of the target rows where all of
  // them run brute force on resident targets (peer_rows.cuh).
  PeerRows peer_rows(members, voters);
  // ... and the cluster assignment of a TI self-join (ti_clustering.cu).
  // Their buffers come from the pools of shared rows (device_runtime.cuh),
  // so that the join's other arrays are not mapped on every GPU.
  PeerRows peer_assign(members, voters, PeerRows::kAssignPatience);
  // ... and the upload of its points (ti_join.cu), which comes first.
  PeerRows peer_points(members, voters, PeerRows::kAssignPatience);

  DeviceThread threads[KNN_MAX_DEVICES];
  bool started[KNN_MAX_DEVICES] = {};
  KnnStatus status = KNN_OK;
  int failed = -1;  // the engine whose failure ended the join

  for (int i = 0; i < n && status == KNN_OK; i++) {
    const Engine &e = plan.engines[i];
    if (e.n_queries == 0) continue;
    started[i] = threads[i].start_on(e.device, [&, i](DeviceContext &ectx) {
      const Clock::time_point t0 = Clock::now();
      ectx.share_vote = &vote;
      ectx.share_voter = i;
      ectx.peer_rows = &peer_rows;
      ectx.peer_assign = &peer_assign;
      ectx.peer_points = &peer_points;
      const KnnStatus st = run(plan.engines[i], &shares[i], &stop, ectx);
      peer_rows.decline(i);  // (if it never offered: the others wait no more)
      peer_assign.decline(i);
      peer_points.decline(i);
      seconds[i] = seconds_since(t0);
      return st;
    });
    if (!started[i]) {
      status = KNN_INTERNAL_ERROR;
      ctx.error = "no thread could be started for GPU " + std::to_string(e.device);
      __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    }
  }

  // Watch until every engine has returned.
  for (;;) {
    bool all_done = true;
    for (int i = 0; i < n; i++) {
      if (!started[i]) continue;
      if (!threads[i].done()) {
        all_done = false;
        continue;
      }
      const KnnStatus st = threads[i].status();
      if (st != KNN_OK && st != KNN_CANCELLED && failed < 0 && status == KNN_OK) {
        failed = i;
        __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
      }
    }
    if (all_done) break;
    if (cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0)
      __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    std::this_thread::sleep_for(kWatchPeriod);
  }

  bool cancelled = false;
  for (int i = 0; i < n; i++) {
    if (!started[i]) continue;
    DeviceContext engine_ctx;
    const KnnStatus st = threads[i].finish(engine_ctx);
    if (i == failed) {
      const Engine &e = plan.engines[i];
      status = st;
      ctx.error = "GPU " + std::to_string(e.device) + " (engine " + std::to_string(i + 1) +
                  " of " + std::to_string(n) + "): " + engine_ctx.error;
    }
    cancelled = cancelled || st == KNN_CANCELLED;
  }
  if (status == KNN_OK && cancelled) {
    status = KNN_CANCELLED;
    ctx.error = "canceled";
  }
  if (status != KNN_OK) return status;

  // The merged statistics: counts summed, phase times the slowest engine's.
  KnnStats merged{};
  const char *names[KNN_MAX_DEVICES];
  bool first = true;
  for (int i = 0; i < n; i++) {
    names[i] = "GPU";
    if (!started[i]) continue;
    const KnnStats &s = shares[i];
    names[i] = s.device_name;
    if (first) {
      merged.method = s.method;
      std::memcpy(merged.variant, s.variant, sizeof merged.variant);
      first = false;
    }
    merged.query_clusters += s.query_clusters;
    merged.target_clusters = std::max(merged.target_clusters, s.target_clusters);
    merged.distance_computations += s.distance_computations;
    merged.threads_per_query = std::max(merged.threads_per_query, s.threads_per_query);
    merged.seconds_transfer = std::max(merged.seconds_transfer, s.seconds_transfer);
    merged.seconds_cluster = std::max(merged.seconds_cluster, s.seconds_cluster);
    merged.seconds_filter = std::max(merged.seconds_filter, s.seconds_filter);
    merged.seconds_select = std::max(merged.seconds_select, s.seconds_select);
    KnnDeviceWork &w = merged.device_work[merged.n_devices++];
    w.device = plan.engines[i].device;
    w.queries = plan.engines[i].n_queries;
    w.seconds = seconds[i];
  }
  // Engines without rows still borrowed no GPU; their names come from a
  // started engine on the same GPU, or stay "GPU".
  for (int i = 0; i < n; i++)
    if (!started[i])
      for (int j = 0; j < n; j++)
        if (started[j] && plan.engines[j].device == plan.engines[i].device) names[i] = names[j];
  merge_level1_kept(shares, started, n, &merged);
  merged.device = KNN_DEVICE_GPU;
  describe_devices(plan, names, merged.device_name, sizeof merged.device_name);
  merged.pairs = p.n_queries * p.n_targets;
  merged.seconds_total = seconds_since(start);
  if (stats != nullptr) *stats = merged;
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
