// loaded_module.h -- the GPU tests' look at the module's runtime entries,
// as the job layer loaded it (RTLD_NOLOAD: never a second copy).
#pragma once

#include <dlfcn.h>

#include "knn_cuda_module.h"

namespace gpu_test {

// Empty (null entries) when the module is not loaded.
struct Module {
  knn_cuda_runtime_ready_fn ready = nullptr;
  knn_cuda_warm_up_fn warm_up = nullptr;
  knn_cuda_release_fn release = nullptr;
};

inline Module loaded_module() {
  Module m;
  void *h = dlopen("./knn_gpu_cuda.so", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return m;
  m.ready = reinterpret_cast<knn_cuda_runtime_ready_fn>(dlsym(h, KNN_CUDA_RUNTIME_READY_SYMBOL));
  m.warm_up = reinterpret_cast<knn_cuda_warm_up_fn>(dlsym(h, KNN_CUDA_WARM_UP_SYMBOL));
  m.release = reinterpret_cast<knn_cuda_release_fn>(dlsym(h, KNN_CUDA_RELEASE_SYMBOL));
  dlclose(h);  // drops the reference NOLOAD took; the job layer keeps its own
  return m;
}

}  // namespace gpu_test
