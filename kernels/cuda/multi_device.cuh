// multi_device.cuh -- one join split across GPUs (internal to kernels/cuda/).
//
// Every method's result for a query depends on that query and the targets
// alone (exact distances, ties by target row), so a join splits by query
// rows: each engine -- a GPU listed in the problem, with a runtime of its
// own (device_runtime.cuh) -- joins a contiguous range of the query rows
// with every target, and writes its rows' results straight into their
// place in the output arrays. The results are therefore exactly those of
// one GPU, whatever the method (brute force and its tensor-core filter,
// TI, bit rows) and however each engine plans its own memory (targets
// that do not fit an engine are chunked or streamed by its method, as on
// one GPU). A TI self-join's engines each cluster the whole set, as one
// GPU does, and filter their own queries only (ti_join_share); other
// joins give each engine its rows as a problem of their own
// (query_share). Brute-force engines whose targets stay resident upload
// them once between them, each a slice, and copy the others' slices GPU to
// GPU (peer_rows.cuh): the host's links carry the targets once, not once
// per GPU.
//
// The ranges are sized by each GPU's streaming multiprocessors (equal GPUs:
// equal rows, which is equal work for brute force and, rows being in no
// spatial order, about equal work for TI). Each engine runs on its own host
// thread (signals blocked); the caller's thread watches: the caller's cancel
// or the first failure of any engine stops all of them at their next cancel
// point, and the join ends with that engine's status and a message naming
// its GPU. Every engine frees its memory on every path (its method's RAII
// owners, then a drain of its stream) before the join returns.
//
// The bound on GPU contexts (knn_gpu.max_gpu_contexts) counts processes,
// not GPUs: the job layer's one permit (gpu_context_permit.h) covers every
// runtime of the process, on every GPU a split join uses, and goes back
// when the last of them is released (device_runtime.cu's release notify).
#pragma once

#include <cstdint>
#include <functional>

#include "../knn_engine.h"
#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

// One engine of a join: a GPU, which of its runtimes, and its query rows.
struct Engine {
  int index = 0;         // position in the list (0-based)
  int device = 0;        // CUDA ordinal
  int replica = 0;       // runtime of that GPU (its n-th listing)
  int sharing = 1;       // engines of this join on the same GPU
  int64_t first_query = 0;
  int64_t n_queries = 0;
};

struct SplitPlan {
  int n_engines = 0;  // listed engines (some may get no rows)
  Engine engines[KNN_MAX_DEVICES];
};

// The engines of a problem: the GPUs it lists, or (n_devices = 0) every
// GPU the process sees where each would get at least kMinSplitWork of
// `work` (else the first GPU alone), and their query ranges. KNN_NO_DEVICE
// (with the reason) when a listed GPU does not exist.
KnnStatus plan_engines(const KnnProblem &p, double work, SplitPlan *plan, DeviceContext &ctx);

// Joins one engine's rows on the calling thread, writing their results in
// place (cuda_module.cu: borrows the engine's runtime, sets its memory
// share, runs the method on the engine's query rows).
using EngineRun = std::function<KnnStatus(const Engine &engine, KnnStats *stats,
                                          const int32_t *cancel, DeviceContext &ctx)>;

// Runs every engine with rows on a thread of its own and merges the
// statistics (counts summed, phase times the slowest engine's, the work
// of each engine in stats->device_work). On failure ctx.error names the
// GPU whose engine failed first.
KnnStatus run_split(const KnnProblem &p, const SplitPlan &plan, const EngineRun &run,
                    KnnStats *stats, const int32_t *cancel, DeviceContext &ctx);

// The problem restricted to query rows [first, first + n) (rows, keys and
// groups offset; the same targets), listing only `device`.
KnnProblem query_share(const KnnProblem &p, int64_t first, int64_t n, int device);

}  // namespace cuda
}  // namespace knn
