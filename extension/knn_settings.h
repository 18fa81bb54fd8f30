/*
 * knn_settings.h -- the knn_gpu.* settings (GUCs).
 */
#ifndef KNN_SETTINGS_H
#define KNN_SETTINGS_H

#include "postgres.h"

extern int	knn_gpu_device;			/* KnnDevice: knn_gpu.device = auto|gpu|cpu */
extern int	knn_gpu_memory_limit_mb;	/* knn_gpu.gpu_memory_limit, 0 = all free */
extern int	knn_gpu_threads;			/* knn_gpu.threads, 0 = all cores */
extern bool knn_gpu_enable_knn_join;	/* knn_gpu.enable_knn_join (CustomScan) */
extern bool knn_gpu_exact_over_index;	/* knn_gpu.exact_over_index (CustomScan) */
extern int	knn_gpu_fault_injection;	/* KnnFault: knn_gpu.fault_injection (tests) */

/* Defines every setting; called once from _PG_init. */
extern void knn_settings_define(void);

#endif							/* KNN_SETTINGS_H */
