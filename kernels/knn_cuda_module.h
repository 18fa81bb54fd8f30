/*
 * knn_cuda_module.h -- the symbols that the GPU engine module
 * (knn_gpu_cuda.so) exports. The job layer loads the module with dlopen, so
 * knn_gpu.so itself never links CUDA and loads on hosts without a driver.
 */
#ifndef KNN_CUDA_MODULE_H
#define KNN_CUDA_MODULE_H

#include "knn_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Describes the GPU the module would use. Returns 1 and a line such as
 * "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" when one is usable, else 0 and
 * the reason.
 */
typedef int (*knn_cuda_probe_fn) (char *buf, size_t len);
#define KNN_CUDA_PROBE_SYMBOL "knn_cuda_probe"

/*
 * Runs a whole join on the GPU, blocking: float32 rows, float16 rows where
 * knn_cuda_takes_float16 (below) says so, or bit rows (Hamming, Jaccard)
 * with k <= KNN_CUDA_BIT_MAX_K. Polls *cancel (non-zero = stop)
 * between launches and chunks. Frees every device allocation of the join
 * before it returns, whatever the outcome. A join runs on the GPUs of
 * problem->devices (split by query rows where there are several). What the
 * process keeps between joins (until released, see below): on each GPU it
 * has used, the context and a reserve in the memory pool (what the last
 * join freed where it had no gpu_memory_limit, for 2 s after it while the
 * idle release runs, else up to 64 MiB, at most an eighth of the device's
 * memory), and per engine on it a stream, a cuBLAS handle and 32 MiB of
 * pinned staging memory.
 */
/* The largest k of the GPU bit join (bit rows); larger k: the CPU engine. */
#define KNN_CUDA_BIT_MAX_K 256

typedef KnnStatus (*knn_cuda_run_fn) (const KnnProblem *problem,
									  int64_t *neighbors, double *distances,
									  KnnStats *stats, const int32_t *cancel,
									  char *errbuf, size_t errlen);
#define KNN_CUDA_RUN_SYMBOL "knn_cuda_run"

/*
 * Float16 rows (KNN_ELEMENT_FLOAT16) for knn_cuda_run: returns 1 when the
 * module joins this problem's float16 rows as they are (they travel to the
 * GPU as float16, half the bytes, and are widened there, exactly), 0 when
 * the caller must give it the float32 rows of the same values instead. The
 * module takes them where its brute force runs (AUTO's choice or
 * KNN_METHOD_BRUTE); its TI path, the range and the grouped entries take
 * float32 rows. Optional: an older module lacks it and takes float32 rows
 * only.
 */
typedef int (*knn_cuda_takes_float16_fn) (const KnnProblem *problem);
#define KNN_CUDA_TAKES_FLOAT16_SYMBOL "knn_cuda_takes_float16"

/*
 * Range joins (problem->range != KNN_RANGE_NONE; float32 rows, the job
 * layer widens float16, or bit rows): every pair within the radius, capped
 * per query at problem->k (0 = no cap), exactly as the CPU range engine
 * (kernels/cpu/range_join.h) returns them. The pairs of one query row, in
 * (distance, target row) order, go to sink in ascending query order, on
 * the calling thread, while the GPU computes the next ones; sink returns 0
 * to stop the join (it then ends KNN_CANCELLED) and may block (the caller's
 * queue is full). Polls *cancel as knn_cuda_run does; frees every device
 * allocation before it returns. Targets: fewer than 2^31 - 1 rows.
 */
typedef int (*knn_cuda_pair_sink_fn) (void *context, int64_t query_row,
									  const int64_t *target_rows,
									  const double *distances, int64_t n);
typedef KnnStatus (*knn_cuda_range_fn) (const KnnProblem *problem,
										knn_cuda_pair_sink_fn sink, void *sink_context,
										KnnStats *stats, const int32_t *cancel,
										char *errbuf, size_t errlen);
#define KNN_CUDA_RANGE_SYMBOL "knn_cuda_range"
#define KNN_CUDA_RANGE_MAX_TARGETS ((int64_t) 0x7ffffffe)

/*
 * A per-group join (KnnProblem's query_groups and target_groups) in one
 * call: float32 rows, or bit rows with k <= KNN_CUDA_BIT_MAX_K. The job
 * layer has already partitioned the rows (group_split.h), and the module
 * joins group g's queries query_rows[query_begin[g] .. query_begin[g+1])
 * with its targets target_rows[target_begin[g] .. target_begin[g+1])
 * (rows ascending inside a group; begin arrays of n_groups + 1 offsets
 * from 0). Queries in no group get empty slots. Results, cancel and
 * memory as knn_cuda_run. Optional: an older module lacks it, and the job
 * layer then runs one knn_cuda_run per group.
 */
typedef struct KnnGroupLayout
{
	int64_t		n_groups;
	const int64_t *query_rows;
	const int64_t *query_begin;
	const int64_t *target_rows;
	const int64_t *target_begin;
} KnnGroupLayout;

typedef KnnStatus (*knn_cuda_run_groups_fn) (const KnnProblem *problem,
											 const KnnGroupLayout *groups,
											 int64_t *neighbors, double *distances,
											 KnnStats *stats, const int32_t *cancel,
											 char *errbuf, size_t errlen);
#define KNN_CUDA_RUN_GROUPS_SYMBOL "knn_cuda_run_groups"

/*
 * The device runtime that joins share (the CUDA context, a stream, the
 * cuBLAS handle, pinned staging memory, a pool reserve): creating it costs
 * a fraction of a second, the context above all, so the job layer creates
 * it ahead of the first GPU join while the CPU engine answers small joins
 * (knn_job.cpp, gpu_cold_start.h).
 *
 * runtime_ready: 1 when the first GPU's exists (non-blocking).
 * warm_up: creates the first GPU's (blocking; waits for a running join);
 *   a join creates the others' on their first use.
 * release: gives all of it back, the context included, so the process holds
 *   no GPU memory (blocking; waits for a running join); the next join or
 *   warm-up creates it again.
 * set_idle_release: a thread of the module releases it once no join has
 *   used it for idle_ms (0 = never; the default).
 * shutdown: stops that thread (process exit).
 */
typedef int (*knn_cuda_runtime_ready_fn) (void);
#define KNN_CUDA_RUNTIME_READY_SYMBOL "knn_cuda_runtime_ready"
typedef KnnStatus (*knn_cuda_warm_up_fn) (char *errbuf, size_t errlen);
#define KNN_CUDA_WARM_UP_SYMBOL "knn_cuda_warm_up"
typedef KnnStatus (*knn_cuda_release_fn) (char *errbuf, size_t errlen);
#define KNN_CUDA_RELEASE_SYMBOL "knn_cuda_release"
typedef void (*knn_cuda_set_idle_release_fn) (int64_t idle_ms);
#define KNN_CUDA_SET_IDLE_RELEASE_SYMBOL "knn_cuda_set_idle_release"
typedef void (*knn_cuda_shutdown_fn) (void);
#define KNN_CUDA_SHUTDOWN_SYMBOL "knn_cuda_shutdown"

/*
 * set_release_notify: registers notify (NULL = none), which the module
 * calls each time it has given back the last runtime it held, on every GPU
 * (idle release, release), from the thread that released it; the process
 * then holds no GPU context, and the job layer gives back its context
 * permit (gpu_context_permit.h). notify must not call into the module.
 * Optional: an older module lacks it, and the permit is then kept until
 * the process exits.
 */
typedef void (*knn_cuda_release_notify_fn) (void);
typedef void (*knn_cuda_set_release_notify_fn) (knn_cuda_release_notify_fn notify);
#define KNN_CUDA_SET_RELEASE_NOTIFY_SYMBOL "knn_cuda_set_release_notify"

/*
 * set_concurrent_joins: how many k-NN joins of this process may run on one
 * GPU at once (1 to KNN_MAX_DEVICES; default 1: one after another). Each
 * further one takes a runtime replica of its own (a stream, a cuBLAS handle
 * and pinned staging, made on first use) under the GPU's one context; only
 * joins with a gpu_memory_limit of their own run side by side. The GPU
 * service sets it; a backend keeps 1. Optional: an older module lacks it.
 */
typedef void (*knn_cuda_set_concurrent_joins_fn) (int32_t n);
#define KNN_CUDA_SET_CONCURRENT_JOINS_SYMBOL "knn_cuda_set_concurrent_joins"

/*
 * The interface the module was built against. The job layer hands the
 * module KnnProblem, KnnStats and KnnGroupLayout by pointer, so a module of
 * another build whose structs differ (a knn_gpu_cuda.so left installed when
 * knn_gpu.so was rebuilt, say without CUDA) would read and write them at
 * the wrong offsets. The job layer loads a module only when its
 * knn_cuda_interface() equals this build's knn_cuda_interface_id(): the
 * structs' sizes and the offsets of their last members, and
 * KNN_CUDA_INTERFACE_VERSION, to be raised when an entry's meaning changes
 * while every size stays. A module without the entry is refused too.
 */
#define KNN_CUDA_INTERFACE_VERSION 1
typedef uint64_t (*knn_cuda_interface_fn) (void);
#define KNN_CUDA_INTERFACE_SYMBOL "knn_cuda_interface"

static inline uint64_t
knn_cuda_interface_id(void)
{
	const uint64_t parts[] = {
		KNN_CUDA_INTERFACE_VERSION,
		sizeof(KnnProblem), offsetof(KnnProblem, range), offsetof(KnnProblem, devices),
		sizeof(KnnStats), offsetof(KnnStats, variant), offsetof(KnnStats, seconds_queued),
		sizeof(KnnDeviceWork), KNN_MAX_DEVICES, sizeof(KnnGroupLayout)
	};
	uint64_t	h = 14695981039346656037ull;	/* FNV-1a over the parts */

	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
	{
		h ^= parts[i];
		h *= 1099511628211ull;
	}
	return h;
}

#ifdef __cplusplus
}
#endif

#endif							/* KNN_CUDA_MODULE_H */
