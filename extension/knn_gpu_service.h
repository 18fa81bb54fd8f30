/*
 * knn_gpu_service.h -- the GPU service (knn_gpu.gpu_service): one
 * background worker per server that owns the GPU and runs the k-NN joins
 * of every backend (the engine's side: kernels/gpu_service.h).
 */
#ifndef KNN_GPU_SERVICE_EXT_H
#define KNN_GPU_SERVICE_EXT_H

#include "postgres.h"

#include "knn_engine.h"

/*
 * Before a job (knn_run.c): tells the engine whether this job's k-NN join
 * goes to the service, and starts the service when it should and none
 * runs (a device = gpu join waits here, cancellably, until it listens).
 * Range and per-group joins never go. Clears the test-only fault value
 * service_cpu from the problem.
 */
extern void knn_gpu_service_prepare(KnnProblem *problem);

/*
 * Whether the rows read now should go into the engine's shared row buffer
 * (knn_matrix.c): when this session's k-NN joins may go to the service.
 */
extern bool knn_gpu_service_rows_wanted(void);

/* The background worker's entry (bgw_function_name). */
extern PGDLLEXPORT void knn_gpu_service_main(Datum arg);

#endif							/* KNN_GPU_SERVICE_EXT_H */
