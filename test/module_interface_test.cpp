// module_interface_test.cpp -- the job layer loads a GPU module only when it
// was built against the same interface (knn_cuda_module.h:
// knn_cuda_interface): a knn_gpu_cuda.so of another build, left installed
// beside a rebuilt knn_gpu.so, would read and write KnnProblem and KnnStats
// at other offsets. No GPU: the modules are fakes (fake_cuda_module.cpp).
//
// The job layer loads the module once per process, so each case runs in a
// child process of its own (a death test that exits 0 when all held).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "knn_engine.h"

namespace {

// In the child: what knn_engine_describe says with the fake module of dir,
// and what a join forced onto the GPU ends with.
struct Outcome {
  int usable;
  std::string description;
  KnnStatus status;
  std::string error;
  std::vector<int64_t> neighbors;
};

Outcome try_module(const char *dir) {
  knn_engine_set_module_dir(dir);
  Outcome o;
  char buf[1024] = "";
  o.usable = knn_engine_describe(buf, sizeof buf);
  o.description = buf;
  std::vector<float> rows = {0.0f, 1.0f, 2.0f, 3.0f};
  KnnProblem p{};
  p.queries = rows.data();
  p.targets = rows.data();
  p.n_queries = 2;
  p.n_targets = 2;
  p.dim = 2;
  p.k = 1;
  p.metric = KNN_METRIC_L2;
  p.device = KNN_DEVICE_GPU;
  p.method = KNN_METHOD_AUTO;
  std::vector<int64_t> nb(2);
  std::vector<double> dist(2);
  char err[1024] = "";
  KnnJob *job = knn_job_start(&p, nb.data(), dist.data(), err, sizeof err);
  if (job == nullptr) {
    o.status = KNN_INTERNAL_ERROR;
    o.error = err;
    return o;
  }
  while (!knn_job_wait(job, 50)) {
  }
  KnnStats stats{};
  o.status = knn_job_finish(job, &stats, err, sizeof err);
  o.error = err;
  o.neighbors = nb;
  return o;
}

bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

// Exits 0 when the module was refused before any of its entries ran: the
// join asked of the GPU ran on the CPU engine, with the reason.
void expect_refused(const char *dir) {
  const Outcome o = try_module(dir);
  bool ok = true;
  if (o.usable != 0) ok = false, std::fprintf(stderr, "usable: %d\n", o.usable);
  if (!contains(o.description, "is from another build of knn_gpu"))
    ok = false, std::fprintf(stderr, "description: %s\n", o.description.c_str());
  if (contains(o.description, "fake GPU") || contains(o.error, "fake GPU"))
    ok = false, std::fprintf(stderr, "an entry of the refused module ran\n");
  if (o.status != KNN_OK || !contains(o.error, "is from another build of knn_gpu") ||
      !contains(o.error, "the CPU engine ran") || o.neighbors != std::vector<int64_t>{0, 1})
    ok = false, std::fprintf(stderr, "join: %d %s\n", o.status, o.error.c_str());
  std::exit(ok ? 0 : 1);
}

TEST(ModuleInterface, AModuleWithoutTheEntryIsRefused) {
  EXPECT_EXIT(expect_refused("test/fake_module_none"), ::testing::ExitedWithCode(0), "");
}

TEST(ModuleInterface, AModuleOfAnotherBuildIsRefused) {
  EXPECT_EXIT(expect_refused("test/fake_module_other"), ::testing::ExitedWithCode(0), "");
}

// The same fake with this build's interface is loaded and used: the check
// itself does not refuse every module.
TEST(ModuleInterface, AModuleOfThisBuildIsUsed) {
  EXPECT_EXIT(
      {
        const Outcome o = try_module("test/fake_module_same");
        const bool ok = o.usable == 1 && contains(o.description, "fake GPU probed") &&
                        o.status == KNN_DEVICE_ERROR && contains(o.error, "fake GPU run");
        if (!ok)
          std::fprintf(stderr, "%d %s / %d %s\n", o.usable, o.description.c_str(), o.status,
                       o.error.c_str());
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
