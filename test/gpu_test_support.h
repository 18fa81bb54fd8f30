// gpu_test_support.h -- what every GPU test binary needs: the module found
// in the directory the tests run from, and a skip (with the reason) where
// no GPU is usable.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "knn_engine.h"

namespace gpu_test {

// The module lives in the directory the tests run from.
class ModuleDir : public ::testing::Environment {
 public:
  void SetUp() override { knn_engine_set_module_dir("."); }
};

// Asks the engine once per process (describing loads the module and probes).
inline bool gpu_available(std::string *why) {
  static int state = -1;
  static std::string line;
  if (state < 0) {
    char buf[512] = "";
    state = knn_engine_describe(buf, sizeof buf);
    line = buf;
  }
  *why = line;
  return state == 1;
}

}  // namespace gpu_test

#define REQUIRE_GPU()                                                 \
  do {                                                                \
    std::string why_;                                                 \
    if (!gpu_test::gpu_available(&why_))                              \
      GTEST_SKIP() << "no GPU is available (" << why_ << ")";         \
  } while (0)
