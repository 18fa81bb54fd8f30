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
 * Runs a whole join on the GPU, blocking. Polls *cancel (non-zero = stop)
 * between launches and chunks. Frees every device allocation of the join
 * before it returns, whatever the outcome. What the process keeps between
 * joins: on device 0, a stream, a cuBLAS handle, 32 MiB of pinned staging
 * memory and up to 64 MiB reserved in the memory pool
 * (at most an eighth of the device's memory).
 */
typedef KnnStatus (*knn_cuda_run_fn) (const KnnProblem *problem,
									  int64_t *neighbors, double *distances,
									  KnnStats *stats, const int32_t *cancel,
									  char *errbuf, size_t errlen);
#define KNN_CUDA_RUN_SYMBOL "knn_cuda_run"

#ifdef __cplusplus
}
#endif

#endif							/* KNN_CUDA_MODULE_H */
