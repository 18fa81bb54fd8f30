/*
 * knn_admission.h -- a GPU shared by the server's sessions: the
 * cluster-wide admission slots (knn_gpu.max_gpu_jobs), the memory each
 * admitted join may use (knn_gpu.gpu_memory_budget), and where the server's
 * GPU probe record lives.
 */
#ifndef KNN_ADMISSION_H
#define KNN_ADMISSION_H

#include "postgres.h"

/*
 * Names the server's probe record for the engine (knn_engine.h): called
 * from _PG_init, in the postmaster (shared_preload_libraries) or in a
 * backend. Without a readable postmaster.pid nothing is set and every
 * process probes, as before.
 */
extern void knn_admission_setup_probe_record(void);

/*
 * Hands the engine knn_gpu.max_gpu_contexts and where its permit files
 * live (pg_stat_tmp/knn_gpu_context.<i>, knn_engine_set_gpu_contexts):
 * before every job, so that a reload reaches the next one.
 */
extern void knn_admission_push_gpu_contexts(void);

/*
 * One pass over the slots: true when this backend now holds one (or held
 * one already). ERROR (SQLSTATE 58P01 and the like) when a slot file cannot
 * be opened or locked for another reason than "taken".
 */
extern bool knn_admission_try_acquire(void);

/* Gives the slot back (no-op without one). Never raises. */
extern void knn_admission_release(void);

/* The slot this backend holds, or -1. */
extern int	knn_admission_slot(void);

/*
 * Bytes of GPU memory an admitted join may use: the smaller of
 * knn_gpu.gpu_memory_limit and knn_gpu.gpu_memory_budget /
 * knn_gpu.max_gpu_jobs, where set; 0 = what is free.
 */
extern int64 knn_admission_memory_limit(void);

#endif							/* KNN_ADMISSION_H */
