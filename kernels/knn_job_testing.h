/*
 * knn_job_testing.h -- a switch of the job layer (knn_job.cpp) for the
 * engine tests and bench/knn_bench only; the extension never calls it.
 * Plain C.
 */
#ifndef KNN_JOB_TESTING_H
#define KNN_JOB_TESTING_H

#ifdef __cplusplus
extern "C" {
#endif

/*
 * enabled = 0: every job of this process widens float16 rows to float32 on
 * the host before any engine runs, as it does for a GPU module without
 * knn_cuda_takes_float16 (the "before" of bench/knn_bench --element
 * float16,float16-widened); 1 (the default): float16 rows reach the GPU
 * module as they are where it takes them.
 */
void		knn_job_test_float16_upload(int enabled);

#ifdef __cplusplus
}
#endif

#endif							/* KNN_JOB_TESTING_H */
