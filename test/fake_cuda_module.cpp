// fake_cuda_module.cpp -- a stand-in for knn_gpu_cuda.so that the job layer
// must refuse or accept by its interface entry (module_interface_test.cpp).
// Built three times: FAKE_INTERFACE 0 has no knn_cuda_interface, 1 answers
// another build's id, 2 this build's. Its probe says "fake GPU probed",
// so the test sees whether the job layer called any entry of it.
#include <cstdio>

#include "knn_cuda_module.h"

extern "C" {

#if FAKE_INTERFACE == 1
__attribute__((visibility("default"))) uint64_t knn_cuda_interface(void) {
  return knn_cuda_interface_id() + 1;
}
#elif FAKE_INTERFACE == 2
__attribute__((visibility("default"))) uint64_t knn_cuda_interface(void) {
  return knn_cuda_interface_id();
}
#endif

__attribute__((visibility("default"))) int knn_cuda_probe(char *buf, size_t len) {
  std::snprintf(buf, len, "fake GPU probed");
  return 1;
}

__attribute__((visibility("default"))) KnnStatus knn_cuda_run(const KnnProblem *, int64_t *,
                                                              double *, KnnStats *,
                                                              const int32_t *, char *errbuf,
                                                              size_t errlen) {
  std::snprintf(errbuf, errlen, "fake GPU run");
  return KNN_DEVICE_ERROR;
}
}
