// blas_library.h -- an optimised SGEMM found at run time (dlopen), so that
// knn_gpu.so links no BLAS and loads where none is installed. Internal to
// kernels/cpu/.
//
// Only optimised libraries are tried (OpenBLAS, then BLIS); the reference
// BLAS (libblas.so.3) is never loaded: it is slower than the engine's own
// AVX2 loop. The library is told to use one thread: the engine runs SGEMMs
// on its own threads (parallel_for), one tile each, so knn_gpu.threads
// bounds all the work and a cancel is seen between tiles. It is loaded
// with every signal blocked, so the threads OpenBLAS starts when loaded
// (and any it starts later, from engine threads whose signals are all
// blocked) never run a PostgreSQL signal handler.
#pragma once

#include <cstdint>

namespace knn {
namespace cpu {

// Fortran sgemm_ (column-major), as every BLAS exports it.
typedef void (*SgemmFn)(const char *transa, const char *transb, const int *m,
                        const int *n, const int *k, const float *alpha,
                        const float *a, const int *lda, const float *b,
                        const int *ldb, const float *beta, float *c,
                        const int *ldc);

// OpenBLAS's own work-buffer allocator (exported, not in its headers); see
// blas_buffers.h for why the engine calls it.
typedef void *(*BufferAllocFn)(int procpos);
typedef void (*BufferFreeFn)(void *buffer);

struct BlasLibrary {
  SgemmFn sgemm = nullptr;  // null when no optimised BLAS could be loaded
  // OpenBLAS only (null for BLIS): blas_memory_alloc / blas_memory_free.
  BufferAllocFn buffer_alloc = nullptr;
  BufferFreeFn buffer_free = nullptr;
  char description[160] = "";  // "OpenBLAS 0.3.21 (libopenblas.so.0)" or "none (why)"

  bool usable() const { return sgemm != nullptr; }
};

// Loaded once per process (thread-safe); never throws. An OpenBLAS without
// blas_memory_alloc/free is not used (blas_buffers.h needs them).
const BlasLibrary &blas_library() noexcept;

// G (rows_a x rows_b, row-major, leading dimension ldg) = A * B^T for
// row-major A (rows_a x dim) and B (rows_b x dim). Sizes must fit in int
// (callers tile). Requires blas_library().usable(), and a BlasBufferLease
// (blas_buffers.h) that grants the caller's thread a buffer.
void gemm_abt(const float *a, int64_t rows_a, const float *b, int64_t rows_b,
              int dim, float *g, int64_t ldg);

}  // namespace cpu
}  // namespace knn
