// context_permit_test.cpp -- GPU context permits (gpu_context_permit.h,
// knn_gpu.max_gpu_contexts): the flock'd files that bound how many
// processes hold a GPU context. CPU only: no GPU is needed to take them.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gpu_context_permit.h"
#include "job_run.h"
#include "knn_engine.h"
#include "permit_holder.h"

namespace {

using knn::GpuContextPermit;
using Outcome = GpuContextPermit::Outcome;

using permit_test::PermitDir;
using permit_test::PermitHolder;

Outcome take(GpuContextPermit &p, const PermitDir &dir, int32_t limit, std::string *why = nullptr) {
  char buf[512] = "x";
  const Outcome o = p.try_take(dir.path.c_str(), limit, buf, sizeof buf);
  if (why != nullptr) *why = buf;
  return o;
}

TEST(ContextPermit, TakenUpToTheLimitThenRefused) {
  PermitDir dir;
  ASSERT_FALSE(dir.path.empty());
  GpuContextPermit a, b, c;
  EXPECT_EQ(take(a, dir, 2), Outcome::kTaken);
  EXPECT_EQ(take(b, dir, 2), Outcome::kTaken);
  EXPECT_TRUE(a.held());
  EXPECT_TRUE(b.held());
  EXPECT_NE(a.index(), b.index());
  EXPECT_GE(a.index(), 0);
  EXPECT_LT(b.index(), 2);
  std::string why;
  EXPECT_EQ(take(c, dir, 2, &why), Outcome::kNoneFree);
  EXPECT_FALSE(c.held());
  EXPECT_EQ(c.index(), -1);
  EXPECT_EQ(why, "");
  // A holder asking again keeps the one it has.
  const int a_index = a.index();
  EXPECT_EQ(take(a, dir, 2), Outcome::kTaken);
  EXPECT_EQ(a.index(), a_index);
  // A larger limit has room for c.
  EXPECT_EQ(take(c, dir, 3), Outcome::kTaken);
  EXPECT_EQ(c.index(), 2);
}

TEST(ContextPermit, GivenBackOnCloseAndOnDestruction) {
  PermitDir dir;
  GpuContextPermit a, b;
  ASSERT_EQ(take(a, dir, 1), Outcome::kTaken);
  EXPECT_EQ(take(b, dir, 1), Outcome::kNoneFree);
  a.give_back();
  EXPECT_FALSE(a.held());
  EXPECT_EQ(a.index(), -1);
  a.give_back();  // idempotent
  EXPECT_EQ(take(b, dir, 1), Outcome::kTaken);
  EXPECT_EQ(b.index(), 0);
  {
    GpuContextPermit scoped;
    EXPECT_EQ(take(scoped, dir, 2), Outcome::kTaken);
    EXPECT_EQ(take(a, dir, 2), Outcome::kNoneFree);
  }
  EXPECT_EQ(take(a, dir, 2), Outcome::kTaken);
}

TEST(ContextPermit, TakenByAnotherProcessAfterTheHolderExits) {
  PermitDir dir;
  PermitHolder holder;
  ASSERT_TRUE(holder.start(dir.path, 1));
  GpuContextPermit p;
  EXPECT_EQ(take(p, dir, 1), Outcome::kNoneFree);
  const int status = holder.let_go();  // the child exits normally
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(take(p, dir, 1), Outcome::kTaken);
}

TEST(ContextPermit, AKilledHolderGivesItBack) {
  PermitDir dir;
  PermitHolder holder;
  ASSERT_TRUE(holder.start(dir.path, 1));
  GpuContextPermit p;
  EXPECT_EQ(take(p, dir, 1), Outcome::kNoneFree);
  EXPECT_TRUE(WIFSIGNALED(holder.kill_it()));
  EXPECT_EQ(take(p, dir, 1), Outcome::kTaken);
}

TEST(ContextPermit, LimitZeroIsNoLimit) {
  PermitDir dir;
  std::vector<GpuContextPermit> many(20);
  for (GpuContextPermit &p : many) {
    EXPECT_EQ(take(p, dir, 0), Outcome::kNotNeeded);
    EXPECT_FALSE(p.held());
  }
  // Nothing was created or locked: a limit of 1 is still free.
  GpuContextPermit one;
  EXPECT_EQ(take(one, dir, 1), Outcome::kTaken);
  // Even without a directory, no limit needs none.
  GpuContextPermit none;
  EXPECT_EQ(none.try_take("", 0, nullptr, 0), Outcome::kNotNeeded);
}

TEST(ContextPermit, BadDirectoryIsAClearError) {
  GpuContextPermit p;
  char why[512] = "";
  EXPECT_EQ(p.try_take("/nonexistent/knn_permit_dir", 4, why, sizeof why), Outcome::kFailed);
  EXPECT_NE(std::string(why).find("/nonexistent/knn_permit_dir/knn_gpu_context.0"),
            std::string::npos)
      << why;
  EXPECT_NE(std::string(why).find("No such file or directory"), std::string::npos) << why;
  EXPECT_FALSE(p.held());
  EXPECT_EQ(p.try_take("", 4, why, sizeof why), Outcome::kFailed);
  EXPECT_NE(std::string(why).find("no directory"), std::string::npos) << why;
  EXPECT_EQ(p.try_take(nullptr, 4, why, sizeof why), Outcome::kFailed);
  // A permit's name taken by something that is not a regular file.
  PermitDir dir;
  const std::string odd = dir.path + "/knn_gpu_context.0";
  ASSERT_EQ(mkdir(odd.c_str(), 0700), 0);
  std::string reason;
  EXPECT_EQ(take(p, dir, 2, &reason), Outcome::kFailed);
  EXPECT_TRUE(reason.find("knn_gpu_context.0") != std::string::npos) << reason;
}

// Where no GPU is usable the job layer never asks for a permit: a CPU host
// runs AUTO and GPU joins as before, whatever the permit settings say.
TEST(ContextPermit, JobsWithoutAGpuNeverAskForOne) {
  knn_engine_set_module_dir("/nonexistent/knn_gpu_module_dir");
  knn_engine_set_gpu_contexts("/nonexistent/knn_permit_dir", 1);
  const int n = 64, dim = 4, k = 3;
  std::vector<float> rows(n * dim);
  for (size_t i = 0; i < rows.size(); i++) rows[i] = static_cast<float>((i * 37) % 11);
  for (KnnDevice device : {KNN_DEVICE_AUTO, KNN_DEVICE_GPU}) {
    KnnProblem p{};
    p.element = KNN_ELEMENT_FLOAT32;
    p.queries = p.targets = rows.data();
    p.n_queries = p.n_targets = n;
    p.dim = dim;
    p.k = k;
    p.metric = KNN_METRIC_L2;
    p.device = device;
    const job_run::JobResult r = job_run::run_job(p);
    EXPECT_EQ(r.status, KNN_OK) << r.message;
    EXPECT_EQ(r.stats.device, KNN_DEVICE_CPU);
    EXPECT_EQ(std::string(r.stats.device_name).find("context"), std::string::npos)
        << r.stats.device_name;
    EXPECT_EQ(r.stats.seconds_queued, 0.0);
  }
  knn_engine_set_gpu_contexts("", 0);
}

}  // namespace
