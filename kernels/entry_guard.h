// entry_guard.h -- the wall between C++ and the C ABI. Every extern "C"
// entry of the engine (knn_job.cpp) and of the CUDA module (cuda_module.cu)
// runs its body through guarded(): whatever it throws becomes a status and
// a one-line message, and the handlers allocate nothing (a bad_alloc must
// not throw again on its way out).
#pragma once

#include <cstddef>
#include <cstdio>
#include <exception>
#include <new>

#include "knn_engine.h"

namespace knn {

// Copies a message into a caller's buffer, truncating; never throws.
inline void copy_message(char *dst, size_t len, const char *msg) noexcept {
  if (dst == nullptr || len == 0) return;
  std::snprintf(dst, len, "%s", msg != nullptr ? msg : "");
}

// Runs body() (which returns a KnnStatus); an exception becomes
// KNN_OUT_OF_MEMORY or KNN_INTERNAL_ERROR with "<where>: <what>" in errbuf.
template <class Body>
KnnStatus guarded(const char *where, char *errbuf, size_t errlen, Body &&body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    if (errbuf != nullptr && errlen > 0)
      std::snprintf(errbuf, errlen, "%s: out of memory", where);
    return KNN_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    if (errbuf != nullptr && errlen > 0) std::snprintf(errbuf, errlen, "%s: %s", where, e.what());
    return KNN_INTERNAL_ERROR;
  } catch (...) {
    if (errbuf != nullptr && errlen > 0)
      std::snprintf(errbuf, errlen, "%s: unknown exception", where);
    return KNN_INTERNAL_ERROR;
  }
}

}  // namespace knn
