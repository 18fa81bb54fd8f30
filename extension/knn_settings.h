/*
 * knn_settings.h -- the knn_gpu.* settings (GUCs).
 */
#ifndef KNN_SETTINGS_H
#define KNN_SETTINGS_H

#include "postgres.h"

#include "knn_engine.h"

extern int	knn_gpu_device;			/* KnnDevice: knn_gpu.device = auto|gpu|cpu */
extern int	knn_gpu_memory_limit_mb;	/* knn_gpu.gpu_memory_limit, 0 = all free */
extern int	knn_gpu_threads;			/* knn_gpu.threads, 0 = all cores */

/*
 * knn_gpu.threads as a job takes it (0: all cores): at most the server's
 * cores. More never speed the CPU engine up; they multiply its per-thread
 * scratch memory and how long a cancel waits for every thread to reach its
 * next look at the cancel flag (256 threads on 2 cores: seconds).
 */
extern int32 knn_threads_for_job(void);
extern bool knn_gpu_enable_knn_join;	/* knn_gpu.enable_knn_join (CustomScan) */
extern bool knn_gpu_exact_over_index;	/* knn_gpu.exact_over_index (CustomScan) */
extern bool knn_gpu_shard_prefetch;		/* knn_gpu.shard_prefetch (knn_shard.c) */
extern bool knn_gpu_shard_relay;		/* knn_gpu.shard_relay (knn_shard.c) */
extern bool knn_gpu_direct_return;		/* knn_gpu.direct_return (knn_join_function_scan.c) */
extern int	knn_gpu_max_result_memory_mb;	/* knn_gpu.max_result_memory: result arrays held at once, 0 = auto */

/* knn_gpu.max_result_memory in bytes (0: a quarter of the physical memory). */
extern int64 knn_result_memory_bytes(void);

/* Query rows whose result arrays (slots each) fit knn_gpu.max_result_memory; at least 1. */
extern int64 knn_result_rows_per_run(int32 slots);
extern int	knn_gpu_fault_injection;	/* KnnFault: knn_gpu.fault_injection (tests) */
extern int	knn_gpu_max_gpu_jobs;		/* knn_gpu.max_gpu_jobs: GPU joins at once, cluster-wide */
extern int	knn_gpu_memory_budget_mb;	/* knn_gpu.gpu_memory_budget, 0 = none */
extern int	knn_gpu_idle_release_s;	/* knn_gpu.gpu_idle_release, seconds, 0 = never */
extern bool knn_gpu_service;			/* knn_gpu.gpu_service: joins run in the GPU service */
extern int	knn_gpu_max_gpu_contexts;	/* knn_gpu.max_gpu_contexts: processes holding a GPU context, 0 = no limit */

/* knn_gpu.devices, parsed: the GPUs a join may be split across (KnnProblem.devices). */
extern int32 knn_gpu_n_devices;	/* 0 = all */
extern int32 knn_gpu_device_list[KNN_MAX_DEVICES];

/*
 * knn_gpu.fault_injection = admit_cpu (tests only, superuser): CPU joins
 * take an admission slot as GPU joins do, so that the queue can be tested
 * without a GPU. The extension's own value, never handed to the engine.
 */
#define KNN_GPU_FAULT_ADMIT_CPU 1000
/*
 * knn_gpu.fault_injection = service_cpu (tests only, superuser): k-NN joins
 * go to the GPU service, started as a CPU stand-in that runs them on its
 * CPU engine, so that the service is tested without a GPU.
 */
#define KNN_GPU_FAULT_SERVICE_CPU 1001
/*
 * knn_gpu.fault_injection = ship_cancel_at_sync (tests only, superuser): a
 * sharded join's shipping of query rows fails as a cancel would, once a
 * shard's closing pipeline sync is sent and before its answer is read (the
 * narrow window where a real cancel or statement_timeout left the
 * connection in pipeline mode).
 */
#define KNN_GPU_FAULT_SHIP_CANCEL_AT_SYNC 1002

/* Defines every setting; called once from _PG_init. */
extern void knn_settings_define(void);

#endif							/* KNN_SETTINGS_H */
