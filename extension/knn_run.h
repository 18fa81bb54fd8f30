/*
 * knn_run.h -- running one engine job from a backend.
 */
#ifndef KNN_RUN_H
#define KNN_RUN_H

#include "postgres.h"

#include "knn_engine.h"

/*
 * Runs the problem on the engine the settings choose (it fills the
 * problem's device, gpu_memory_limit, n_threads and fault from them),
 * answering every interrupt and postmaster death within a few
 * milliseconds; ERROR (with a SQLSTATE) on failure, NOTICE when the GPU was
 * wanted but the CPU engine ran. The engine has stopped and released its
 * threads and GPU memory before this returns or raises. A join that runs on
 * the GPU first takes one of the server's knn_gpu.max_gpu_jobs slots,
 * waiting (cancellably) while all are taken, and gives it back before this
 * returns or raises.
 */
extern void knn_run_problem(KnnProblem *problem, int64 *neighbors,
							double *distances, KnnStats *stats);

/*
 * Range jobs (problem->range set): receives the pairs as the engine hands
 * them over, in its order (by query row, then distance, then target row).
 * Runs on the backend's thread and may raise: the job is stopped first.
 */
typedef void (*KnnPairSink) (void *arg, const int64 *query_rows, const int64 *target_rows,
							 const double *distances, int64 n);

/*
 * Runs a range problem as knn_run_problem runs a join (settings, interrupts,
 * errors, the notice), handing its pairs to sink in blocks while the engine
 * works, so that memory stays bounded however many pairs there are. Range
 * jobs run on the CPU engine and never take a GPU slot.
 */
extern void knn_run_range_problem(KnnProblem *problem, KnnPairSink sink, void *sink_arg,
								  KnnStats *stats);

/* What admission did for one join (knn_gpu.max_gpu_jobs). */
typedef struct KnnAdmissionRecord
{
	bool		admitted;		/* the join took a GPU slot */
	bool		queued;			/* ... after waiting for one */
	int			slot;			/* which (0-based), -1 = none */
	int			max_gpu_jobs;	/* of how many */
	double		seconds_queued; /* from the engine's request to the slot */
	int64		gpu_memory_limit;	/* bytes handed to the engine, 0 = free */
} KnnAdmissionRecord;

/* The admission of this backend's last knn_run_problem call. */
extern const KnnAdmissionRecord *knn_run_last_admission(void);

#endif							/* KNN_RUN_H */
