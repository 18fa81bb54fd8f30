// blas_library.cpp -- finding and loading the BLAS (blas_library.h).
#include "blas_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "../signal_free_thread.h"

namespace knn {
namespace cpu {
namespace {

typedef void (*SetThreadsFn)(int);
typedef char *(*OpenblasConfigFn)(void);
typedef const char *(*BlisVersionFn)(void);

struct Candidate {
  const char *soname;
  const char *name;
  const char *set_threads;  // the library's "use n threads" entry
  bool openblas;            // needs OpenBLAS's buffer allocator (blas_buffers.h)
};

// In order of preference. libblas.so.3 (the reference BLAS, or whatever
// the alternatives system points it to) is deliberately absent.
const Candidate kCandidates[] = {
    {"libopenblas.so.0", "OpenBLAS", "openblas_set_num_threads", true},
    {"libopenblaso.so.0", "OpenBLAS", "openblas_set_num_threads", true},
    {"libblis.so.4", "BLIS", "bli_thread_set_num_threads", false},
    {"libblis.so.3", "BLIS", "bli_thread_set_num_threads", false},
};

// "OpenBLAS 0.3.21 NO_AFFINITY ..." -> "OpenBLAS 0.3.21".
void version_of(void *handle, const Candidate &c, char *out, size_t len) {
  const char *text = nullptr;
  if (auto config = reinterpret_cast<OpenblasConfigFn>(dlsym(handle, "openblas_get_config")))
    text = config();
  else if (auto version = reinterpret_cast<BlisVersionFn>(dlsym(handle, "bli_info_get_version_str")))
    text = version();
  char word[64] = "";
  if (text != nullptr) {
    // OpenBLAS's config starts with "OpenBLAS 0.3.21 ..."; BLIS gives "0.9.0".
    const char *start = std::strncmp(text, "OpenBLAS ", 9) == 0 ? text + 9 : text;
    std::sscanf(start, "%63s", word);
  }
  std::snprintf(out, len, "%s%s%s (%s)", c.name, word[0] ? " " : "", word, c.soname);
}

void load(BlasLibrary *lib) noexcept {
  // OpenBLAS starts a pool of (cores - 1) threads while it is loaded,
  // unless told that one thread will do (a user's own setting is kept);
  // whatever it starts inherits this mask.
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  const SignalsBlocked blocked;
  for (const Candidate &c : kCandidates) {
    void *handle = dlopen(c.soname, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) continue;
    auto sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "sgemm_"));
    auto set_threads = reinterpret_cast<SetThreadsFn>(dlsym(handle, c.set_threads));
    auto buffer_alloc = reinterpret_cast<BufferAllocFn>(dlsym(handle, "blas_memory_alloc"));
    auto buffer_free = reinterpret_cast<BufferFreeFn>(dlsym(handle, "blas_memory_free"));
    if (sgemm == nullptr || set_threads == nullptr ||
        (c.openblas && (buffer_alloc == nullptr || buffer_free == nullptr))) {
      dlclose(handle);
      continue;
    }
    set_threads(1);
    version_of(handle, c, lib->description, sizeof lib->description);
    if (c.openblas) {
      lib->buffer_alloc = buffer_alloc;
      lib->buffer_free = buffer_free;
    }
    lib->sgemm = sgemm;  // the handle stays open for the life of the process
    return;
  }
  std::snprintf(lib->description, sizeof lib->description,
                "none (no libopenblas.so.0 or libblis.so.4)");
}

}  // namespace

const BlasLibrary &blas_library() noexcept {
  static BlasLibrary lib;
  static std::once_flag once;
  try {
    std::call_once(once, [] { load(&lib); });
  } catch (...) {
    // call_once itself failed (no thread resources): no BLAS.
  }
  return lib;
}

void gemm_abt(const float *a, int64_t rows_a, const float *b, int64_t rows_b,
              int dim, float *g, int64_t ldg) {
  // Column-major view: B is dim x rows_b, A is dim x rows_a, and
  // G^T (rows_b x rows_a, column-major, ld ldg) = B^T A is G row-major.
  const int m = static_cast<int>(rows_b), n = static_cast<int>(rows_a), k = dim;
  const int ld = dim, ldc = static_cast<int>(ldg);
  const float one = 1.0f, zero = 0.0f;
  blas_library().sgemm("T", "N", &m, &n, &k, &one, b, &ld, a, &ld, &zero, g, &ldc);
}

}  // namespace cpu
}  // namespace knn
