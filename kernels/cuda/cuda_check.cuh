// cuda_check.cuh -- every CUDA and cuBLAS call of the GPU engine goes
// through one of these macros. A failed call sets ctx.error to a one-line
// message naming the call and its place, and the enclosing function returns
// a KnnStatus: KNN_OUT_OF_MEMORY for allocation failures, else
// KNN_DEVICE_ERROR. Functions that use them return KnnStatus.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

// Records a failed CUDA runtime call in ctx and returns the status it maps to.
inline KnnStatus cuda_failure(DeviceContext &ctx, cudaError_t err, const char *call,
                              const char *file, int line) {
  char msg[512];
  std::snprintf(msg, sizeof msg, "%s:%d: %s failed: %s (%s)", file, line, call,
                cudaGetErrorString(err), cudaGetErrorName(err));
  if (ctx.error.empty()) ctx.error = msg;
  // Clear the error if it is not sticky, so that cleanup calls still work.
  (void)cudaGetLastError();
  return err == cudaErrorMemoryAllocation ? KNN_OUT_OF_MEMORY : KNN_DEVICE_ERROR;
}

inline const char *cublas_status_text(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown cuBLAS status";
  }
}

inline KnnStatus cublas_failure(DeviceContext &ctx, cublasStatus_t st, const char *call,
                                const char *file, int line) {
  char msg[512];
  std::snprintf(msg, sizeof msg, "%s:%d: %s failed: %s", file, line, call,
                cublas_status_text(st));
  if (ctx.error.empty()) ctx.error = msg;
  return st == CUBLAS_STATUS_ALLOC_FAILED ? KNN_OUT_OF_MEMORY : KNN_DEVICE_ERROR;
}

}  // namespace cuda
}  // namespace knn

// Returns from the enclosing KnnStatus function when a CUDA call fails.
#define CUDA_CHECK(ctx, call)                                                       \
  do {                                                                              \
    cudaError_t knn_err_ = (call);                                                  \
    if (knn_err_ != cudaSuccess)                                                    \
      return ::knn::cuda::cuda_failure((ctx), knn_err_, #call, __FILE__, __LINE__); \
  } while (0)

// The same after a kernel launch (launch errors surface through
// cudaGetLastError); `kernel` names the launch in the message.
#define CUDA_CHECK_LAUNCH(ctx, kernel)                                              \
  do {                                                                              \
    cudaError_t knn_err_ = cudaGetLastError();                                      \
    if (knn_err_ != cudaSuccess)                                                    \
      return ::knn::cuda::cuda_failure((ctx), knn_err_, "launch of " kernel,        \
                                       __FILE__, __LINE__);                         \
  } while (0)

#define CUBLAS_CHECK(ctx, call)                                                       \
  do {                                                                                \
    cublasStatus_t knn_st_ = (call);                                                  \
    if (knn_st_ != CUBLAS_STATUS_SUCCESS)                                             \
      return ::knn::cuda::cublas_failure((ctx), knn_st_, #call, __FILE__, __LINE__); \
  } while (0)

// Propagates a non-OK KnnStatus from a helper.
#define KNN_TRY(expr)                      \
  do {                                     \
    KnnStatus knn_status_ = (expr);        \
    if (knn_status_ != KNN_OK) return knn_status_; \
  } while (0)
