// cuda_check.cuh -- every CUDA and cuBLAS call of the GPU engine goes
// through CUDA_CHECK / CUBLAS_CHECK / CUDA_CHECK_LAUNCH. A failed call sets
// ctx.error to a one-line message naming the call and its place, and the
// enclosing function returns a KnnStatus: KNN_OUT_OF_MEMORY for allocation
// failures, else KNN_DEVICE_ERROR. Functions that use them return KnnStatus.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

inline bool call_failed(cudaError_t err) { return err != cudaSuccess; }
inline bool call_failed(cublasStatus_t st) { return st != CUBLAS_STATUS_SUCCESS; }

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

// Records a failed CUDA runtime call in ctx and returns the status it maps to.
inline KnnStatus record_failure(DeviceContext &ctx, cudaError_t err, const char *call,
                                const char *file, int line) {
  char msg[512];
  std::snprintf(msg, sizeof msg, "%s:%d: %s failed: %s (%s)", file, line, call,
                cudaGetErrorString(err), cudaGetErrorName(err));
  if (ctx.error.empty()) ctx.error = msg;
  // Clear the error if it is not sticky, so that cleanup calls still work.
  (void)cudaGetLastError();
  return err == cudaErrorMemoryAllocation ? KNN_OUT_OF_MEMORY : KNN_DEVICE_ERROR;
}

// The same for a failed cuBLAS call.
inline KnnStatus record_failure(DeviceContext &ctx, cublasStatus_t st, const char *call,
                                const char *file, int line) {
  char msg[512];
  std::snprintf(msg, sizeof msg, "%s:%d: %s failed: %s", file, line, call,
                cublas_status_text(st));
  if (ctx.error.empty()) ctx.error = msg;
  return st == CUBLAS_STATUS_ALLOC_FAILED ? KNN_OUT_OF_MEMORY : KNN_DEVICE_ERROR;
}

}  // namespace cuda
}  // namespace knn

// Returns from the enclosing KnnStatus function when a CUDA or cuBLAS call
// (or a CUB call, which returns a cudaError_t) fails; `what` names it.
#define KNN_CHECK_RESULT(ctx, result, what)                                           \
  do {                                                                                \
    const auto knn_result_ = (result);                                                \
    if (::knn::cuda::call_failed(knn_result_))                                        \
      return ::knn::cuda::record_failure((ctx), knn_result_, what, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK(ctx, call) KNN_CHECK_RESULT(ctx, call, #call)
#define CUBLAS_CHECK(ctx, call) KNN_CHECK_RESULT(ctx, call, #call)

// After a kernel launch (launch errors surface through cudaGetLastError);
// `kernel` names the launch in the message.
#define CUDA_CHECK_LAUNCH(ctx, kernel) KNN_CHECK_RESULT(ctx, cudaGetLastError(), "launch of " kernel)

// Propagates a non-OK KnnStatus from a helper.
#define KNN_TRY(expr)                              \
  do {                                             \
    const KnnStatus knn_status_ = (expr);          \
    if (knn_status_ != KNN_OK) return knn_status_; \
  } while (0)
