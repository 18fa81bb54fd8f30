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
 * threads and GPU memory before this returns or raises.
 */
extern void knn_run_problem(KnnProblem *problem, int64 *neighbors,
							double *distances, KnnStats *stats);

#endif							/* KNN_RUN_H */
