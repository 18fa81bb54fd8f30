/*
 * knn_cuda_testing.h -- a second entry of the GPU engine module
 * (knn_gpu_cuda.so), for the engine tests only: knn_cuda_run with choices
 * that the engine otherwise makes for itself forced (join_tuning.cuh), so
 * that every variant can be compared with the CPU engine. The job layer
 * (knn_job.cpp) never looks this symbol up, so nothing reaches it from SQL.
 * Plain C, no CUDA headers.
 */
#ifndef KNN_CUDA_TESTING_H
#define KNN_CUDA_TESTING_H

#include "../knn_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Zero in every field: the engine's own choices. */
typedef struct KnnCudaTestOptions
{
	int			sgemm_filter;	/* brute force: SGEMM bound for L2 where a DGEMM one is used */
	int			ti_filter;		/* 0 adaptive, 1 full, 2 partial */
	int			ti_list;		/* top-k lists: 0 adaptive, 1 registers, 2 shared, 3 global */
	int			ti_threads_per_query;	/* 0 adaptive, else 1 .. 8 */
	int			ti_keep_duplicates;	/* 1: no merging of bitwise-identical rows */
	int			ti_gemm_assign_min_stride;	/* 0 default; the cuBLAS assignment from this stride */
	double		ti_landmark_factor;	/* 0 default; clusters per set = factor * sqrt(rows) */
	int			brute_filter;	/* brute force GEMM filter: 0 auto, 1 SGEMM, 2 DGEMM (L2),
								 * 3 fp16 tensor cores (not L1) */
	int			brute_pipeline;	/* fp16 filter: next tile's GEMM beside the selection */

	/*
	 * A join split across GPUs (knn_gpu.devices, multi_device.cuh): engine
	 * split_test_engine (1-based, in list order; 0 = none), once it holds
	 * its runtime and 64 MiB of device memory, waits split_test_wait_ms
	 * (stopping early on a cancel), then fails with KNN_DEVICE_ERROR when
	 * split_test_fail is non-zero, else joins its rows.
	 */
	int			split_test_engine;
	int			split_test_wait_ms;
	int			split_test_fail;

	/* 1: brute force with k beyond the lists takes the full sort, not large_k_select.cu */
	int			brute_no_large_k;
	int			no_small_join;	/* brute force: 1 = never the tiny-join path (small_join.cu) */

	/*
	 * The out-of-core TI join's hooks (ti_out_of_core.cu), for tests of
	 * its cancel and failure paths. ti_order_probe: the join stores 1 there
	 * as it starts putting the rows in their spatial order and 2 once they
	 * are (a cancel answered inside the order leaves 1; joins cut in row
	 * ranges, without an order, store nothing). ti_pinning_hook:
	 * once the join's host thread has started pinning the mapped kNN lists,
	 * the join turns a 0 there into 1 (a retry, finding no 0, runs on) and
	 * waits (answering a cancel) until the test
	 * stores 2 (fail now, the pinning still under way) or 3 (fail once the
	 * pinning is done); it then fails with KNN_DEVICE_ERROR,
	 * KNN_CUDA_TEST_PINNING_FAILURE. Joins without mapped lists never store.
	 */
	int32_t    *ti_order_probe;
	int32_t    *ti_pinning_hook;

	/*
	 * A TI self-join split across engines: each engine ORs into
	 * ti_shared_probe 1 where it shared the upload of the points with the
	 * others (ti_join.cu), 2 where it shared the cluster assignment
	 * (ti_clustering.cu).
	 */
	int32_t    *ti_shared_probe;

	/*
	 * Engine ti_upload_slice_fail (1-based, as split_test_engine; 0 = none)
	 * of a TI self-join sharing the upload of its points fails its own
	 * slice with KNN_OUT_OF_MEMORY once the engines agreed to share, as a
	 * lack of device memory would; it then answers its rows another way,
	 * and the others upload its slice from the host.
	 */
	int			ti_upload_slice_fail;

	/*
	 * A TI join adds to ti_level1_probe the number of query clusters its
	 * level-1 filter ran over (each engine of a split its own: a share
	 * divided by clusters filters its own clusters only, ti_join.cu).
	 */
	int32_t    *ti_level1_probe;

	/*
	 * Engine ti_level1_fail (1-based, as split_test_engine; 0 = none) of
	 * a TI self-join split across engines fails its level-1 filter with
	 * KNN_OUT_OF_MEMORY, as a lack of device memory would; it then answers
	 * its rows another way (level 1 runs before the engines' vote on
	 * dividing by clusters, ti_join.cu).
	 */
	int			ti_level1_fail;

	/*
	 * Engine ti_shared_pool_late (1-based; 0 = none) of a TI self-join
	 * sharing the upload of its points takes its buffer from the GPU's
	 * default pool, as where its pool of shared rows could not be made, and
	 * then makes that pool, as a concurrent join would, before offering
	 * the buffer: the other GPUs must be granted the pool the buffer came
	 * from (peer_rows.cuh).
	 */
	int			ti_shared_pool_late;
} KnnCudaTestOptions;

/* The message of the failure ti_pinning_hook makes. */
#define KNN_CUDA_TEST_PINNING_FAILURE "forced failure (out-of-core pinning test hook)"

/* knn_cuda_run (knn_cuda_module.h) with options; NULL options: the defaults. */
typedef KnnStatus (*knn_cuda_run_tuned_fn) (const KnnProblem *problem,
											const KnnCudaTestOptions *options,
											int64_t *neighbors, double *distances,
											KnnStats *stats, const int32_t *cancel,
											char *errbuf, size_t errlen);
#define KNN_CUDA_RUN_TUNED_SYMBOL "knn_cuda_run_tuned"

/* How many GPUs the module sees (0 without a usable one). */
typedef int (*knn_cuda_test_device_count_fn) (void);
#define KNN_CUDA_TEST_DEVICE_COUNT_SYMBOL "knn_cuda_test_device_count"

/*
 * Bytes of device memory that joins hold from GPU `device`'s memory pool
 * right now (0 between joins: every join frees what it took); -1 when the
 * device does not exist.
 */
typedef int64_t (*knn_cuda_test_pool_used_fn) (int device);
#define KNN_CUDA_TEST_POOL_USED_SYMBOL "knn_cuda_test_pool_used"

/*
 * Bytes the same pools hold from the driver, used or kept for the next
 * join (the same signature).
 */
#define KNN_CUDA_TEST_POOL_RESERVED_SYMBOL "knn_cuda_test_pool_reserved"

#ifdef __cplusplus
}
#endif

#endif							/* KNN_CUDA_TESTING_H */
