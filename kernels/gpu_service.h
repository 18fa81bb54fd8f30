/*
 * gpu_service.h -- the GPU service's engine, for the background worker
 * that hosts it (extension/knn_gpu_service.c). Plain C ABI: no PostgreSQL
 * and no CUDA headers.
 *
 * The service loads the GPU module once, creates its runtime (context,
 * streams, cuBLAS, pinned staging) before it listens, and runs the
 * backends' k-NN joins (gpu_service_server.h) as engine jobs of its own
 * process on the GPU (knn_job_start with KNN_DEVICE_GPU), each on a thread
 * with every signal blocked. The module's runtime lock makes them take the
 * GPU one at a time; each runs within the gpu_memory_limit its backend's
 * admission slot gave it. The idle release (knn_engine_set_gpu_idle_release)
 * applies to the service's runtime as to any process's.
 */
#ifndef KNN_GPU_SERVICE_H
#define KNN_GPU_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "knn_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct KnnGpuServiceHandle KnnGpuServiceHandle;

/*
 * Removes a dead service's socket file at socket_path (the caller holds
 * the service's lock), prepares the GPU (module, probe, runtime) with every
 * signal blocked, and listens at socket_path (relative to the working
 * directory, mode 0600). Without a usable GPU it
 * returns NULL (errbuf says why) unless serve_cpu_stand_in: then it serves
 * the test jobs that ask for the CPU engine and answers every other job
 * KNN_NO_DEVICE. description: the GPU (or why none) for the log.
 */
KnnGpuServiceHandle *knn_gpu_service_open(const char *socket_path, int serve_cpu_stand_in,
										  char *description, size_t description_len,
										  char *errbuf, size_t errlen);

/* Cancels the running jobs, stops listening and frees the service. */
void		knn_gpu_service_close(KnnGpuServiceHandle *service);

/* Jobs answered so far (for the log). */
int64_t		knn_gpu_service_jobs_answered(const KnnGpuServiceHandle *service);

/*
 * For the backends (knn_gpu_service.c), as the job layer looks
 * (gpu_service_client.h): 1 when a process holds the service's lock; 1
 * when a service listens (its socket exists and the lock is held).
 */
int			knn_gpu_service_running(const char *lock_path);
int			knn_gpu_service_listening(const char *socket_path, const char *lock_path);

/*
 * Loads the GPU module (probing, and rewriting the server's probe record)
 * and creates the first GPU's runtime, blocking; from then on the process's
 * k-NN joins may run side by side on runtime replicas of their own
 * (knn_cuda_set_concurrent_joins). Returns 1 when a GPU is usable;
 * description then names it, else says why not. Defined by the job layer
 * (knn_job.cpp).
 */
int			knn_engine_prepare_gpu(char *description, size_t len);

#ifdef __cplusplus
}
#endif

#endif							/* KNN_GPU_SERVICE_H */
