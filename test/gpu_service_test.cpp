// gpu_service_test.cpp -- the GPU service's transport (gpu_service_wire.h,
// gpu_service_server.h, gpu_service_client.h) with client and server in
// one process: results equal to the engine run directly, hostile jobs
// rejected before anything of them is read, cancel, and the death of
// either end. The run functions are the CPU engine or fakes: no GPU.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_engine.h"
#include "gpu_service.h"
#include "gpu_service_client.h"
#include "gpu_service_rows.h"
#include "gpu_service_server.h"
#include "gpu_service_wire.h"
#include "job_run.h"
#include "knn_engine.h"

namespace {

using namespace knn::service;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A fresh directory for the socket, removed afterwards.
struct SocketDir {
  std::string dir, path, lock;
  SocketDir() {
    char tmpl[] = "/tmp/knn_service_test.XXXXXX";
    if (mkdtemp(tmpl) != nullptr) dir = tmpl;
    path = dir + "/service.sock";
    lock = dir + "/service.lock";
  }
  ~SocketDir() {
    unlink(path.c_str());
    unlink(lock.c_str());
    rmdir(dir.c_str());
  }
};

// The service's lock, held as the service's worker holds it
// (knn_gpu_service.c): an exclusive flock for its life.
struct HeldLock {
  int fd = -1;
  explicit HeldLock(const std::string &path) {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  }
  ~HeldLock() { release(); }
  void release() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

// A socket file as a dead service leaves it: bound, then closed.
void leave_stale_socket(const std::string &path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  close(fd);
}

struct Rows {
  std::vector<float> queries, targets;
  std::vector<int64_t> keys;
};

Rows make_rows(int64_t nq, int64_t nt, int32_t dim) {
  Rows r;
  r.queries.resize(static_cast<size_t>(nq * dim));
  r.targets.resize(static_cast<size_t>(nt * dim));
  for (size_t i = 0; i < r.queries.size(); i++) r.queries[i] = float((i * 7919) % 1000) / 1000.0f;
  for (size_t i = 0; i < r.targets.size(); i++) r.targets[i] = float((i * 104729) % 997) / 997.0f;
  for (int64_t i = 0; i < nt; i++) r.keys.push_back(1000 + i);
  return r;
}

KnnProblem problem_of(const Rows &r, int64_t nq, int64_t nt, int32_t dim, int32_t k) {
  KnnProblem p;
  std::memset(&p, 0, sizeof p);
  p.element = KNN_ELEMENT_FLOAT32;
  p.queries = r.queries.data();
  p.n_queries = nq;
  p.targets = r.targets.data();
  p.n_targets = nt;
  p.dim = dim;
  p.k = k;
  p.metric = KNN_METRIC_L2;
  p.device = KNN_DEVICE_CPU;
  p.n_threads = 2;
  return p;
}

// The CPU engine as the service's run function, counting its calls.
struct CpuService {
  std::atomic<int> calls{0};
  RunFunction function() {
    return [this](const KnnProblem &p, bool, int64_t *n, double *d, KnnStats *s,
                  const int32_t *cancel, char *e, size_t el) {
      calls++;
      return knn::cpu_run(p, n, d, s, cancel, e, el);
    };
  }
};

job_run::JobResult through_service(const std::string &path, const KnnProblem &p,
                                   const int32_t *cancel = nullptr) {
  job_run::JobResult r;
  r.neighbors.assign(static_cast<size_t>(p.n_queries * p.k), -2);
  r.distances.assign(r.neighbors.size(), -2.0);
  static const int32_t never = 0;
  char err[512] = "";
  r.status = run(path.c_str(), false, p, r.neighbors.data(), r.distances.data(), &r.stats,
                 cancel != nullptr ? cancel : &never, err, sizeof err);
  r.message = err;
  return r;
}

// A server on dir's socket (nullptr, and the test fails, where it cannot listen).
std::unique_ptr<Server> serve_on(const SocketDir &dir, RunFunction run) {
  char why[256] = "";
  auto server = Server::listen(dir.path.c_str(), std::move(run), why, sizeof why);
  EXPECT_NE(server, nullptr) << why;
  return server;
}

// The small join of the tests that do not look at results.
struct SmallJoin {
  Rows rows = make_rows(10, 100, 8);
  KnnProblem problem = problem_of(rows, 10, 100, 8, 3);
};

// Every test: a fresh socket directory, and the small join.
class GpuService : public ::testing::Test {
 protected:
  SocketDir dir;
  const SmallJoin small;
  const KnnProblem &p = small.problem;
};

TEST_F(GpuService, ResultsAreTheEnginesOwn) {
  CpuService engine;
  auto server = serve_on(dir, engine.function());
  ASSERT_NE(server, nullptr);
  struct stat st;
  ASSERT_EQ(stat(dir.path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  const Rows rows = make_rows(37, 501, 13);
  // Two matrices; k above the targets' count (empty slots); a self-join of
  // one matrix with keys (self-matches excluded).
  for (int32_t k : {1, 7, 600}) {
    const KnnProblem join = problem_of(rows, 37, 501, 13, k);
    const auto direct = job_run::run_job(join);
    const auto served = through_service(dir.path, join);
    ASSERT_EQ(served.status, KNN_OK) << served.message;
    job_run::expect_identical(direct, served, "k = " + std::to_string(k));
    EXPECT_STREQ(served.stats.device_name, direct.stats.device_name);
  }
  KnnProblem self = problem_of(rows, 501, 501, 13, 5);
  self.queries = rows.targets.data();
  self.query_keys = rows.keys.data();
  self.target_keys = rows.keys.data();
  const auto direct = job_run::run_job(self);
  const auto served = through_service(dir.path, self);
  ASSERT_EQ(served.status, KNN_OK) << served.message;
  job_run::expect_identical(direct, served, "self-join");
  EXPECT_EQ(server->jobs_answered(), 4);
}

// A service whose answer names a target row that is not one (a bug, or
// the job's memory written by another): an error, not a row the caller
// would read its targets at (review r12adm).
TEST_F(GpuService, TargetRowsOutsideTheTargetsAreRefused) {
  for (const int64_t bad : {int64_t{-2}, int64_t{501}, int64_t{1} << 40}) {
    std::atomic<int> calls{0};
    auto server = serve_on(dir, [&](const KnnProblem &q, bool, int64_t *n, double *d, KnnStats *s,
                                   const int32_t *cancel, char *e, size_t el) {
      calls++;
      const KnnStatus st = knn::cpu_run(q, n, d, s, cancel, e, el);
      n[q.n_queries * q.k / 2] = bad;
      return st;
    });
    ASSERT_NE(server, nullptr);
    const Rows rows = make_rows(37, 501, 13);
    const auto served = through_service(dir.path, problem_of(rows, 37, 501, 13, 5));
    EXPECT_EQ(served.status, KNN_INTERNAL_ERROR) << bad;
    EXPECT_NE(served.message.find("target row " + std::to_string(bad) + " of 501"),
              std::string::npos)
        << served.message;
    EXPECT_EQ(calls.load(), 1);
  }
}

// The service keeps its jobs' memory for the next jobs: a small join after a
// large one (k above its targets' count: empty slots) answers as on fresh
// memory, nothing of the earlier join's in it.
TEST_F(GpuService, KeptJobMemoryAnswersAsFresh) {
  CpuService engine;
  auto server = serve_on(dir, engine.function());
  ASSERT_NE(server, nullptr);
  const Rows large = make_rows(37, 501, 13), small_rows = make_rows(5, 3, 13);
  for (int round = 0; round < 3; round++) {
    const KnnProblem big = problem_of(large, 37, 501, 13, 600);
    const auto served_big = through_service(dir.path, big);
    ASSERT_EQ(served_big.status, KNN_OK) << served_big.message;
    job_run::expect_identical(job_run::run_job(big), served_big, "large join");
    const KnnProblem tiny = problem_of(small_rows, 5, 3, 13, 7);
    const auto served = through_service(dir.path, tiny);
    ASSERT_EQ(served.status, KNN_OK) << served.message;
    job_run::expect_identical(job_run::run_job(tiny), served, "small join after a large one");
  }
  EXPECT_EQ(server->jobs_answered(), 6);
}

// A job file made by hand: a header planned for a valid problem, then
// spoiled by the test.
struct HandMadeJob {
  int fd = -1;
  uint64_t size = 0;
  WireHeader header{};
  HandMadeJob(const KnnProblem &p) {
    const char *why = nullptr;
    EXPECT_TRUE(plan_layout(p, false, false, &header, &size, &why));
    fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  }
  ~HandMadeJob() {
    if (fd >= 0) close(fd);
  }
  // Writes the header into a file of `bytes` bytes, sealed if asked.
  void write(uint64_t bytes, bool seal) {
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    ASSERT_EQ(pwrite(fd, &header, std::min<uint64_t>(sizeof header, bytes), 0),
              static_cast<ssize_t>(std::min<uint64_t>(sizeof header, bytes)));
    if (seal) {
      ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
  }
};

// Sends the job file (or, with fd < 0, the request alone) and returns the reply.
WireReply send_raw(const std::string &path, int fd) {
  WireReply reply;
  std::memset(&reply, 0, sizeof reply);
  reply.status = -1;
  char why[256];
  const int sock = connect_to(path.c_str(), why, sizeof why);
  EXPECT_GE(sock, 0) << why;
  if (sock < 0) return reply;
  if (fd >= 0) {
    EXPECT_TRUE(send_job(sock, fd));
  } else {
    JobRequest req{kMagic, kVersion};
    EXPECT_EQ(::send(sock, &req, sizeof req, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof req));
  }
  const int32_t never = 0;
  EXPECT_EQ(await_reply(sock, &reply, nullptr, &never, 10000), 1);
  close(sock);
  return reply;
}

TEST_F(GpuService, HostileJobsAreRejectedBeforeTheyAreRead) {
  CpuService engine;
  auto server = serve_on(dir, engine.function());
  ASSERT_NE(server, nullptr);

  struct Case {
    const char *name;
    void (*spoil)(HandMadeJob &job);
    bool seal;
    int64_t size_change;  // bytes added to (or taken from) the planned size
    const char *expected;
  };
  const Case cases[] = {
      {"truncated below its regions", [](HandMadeJob &) {}, true, -64, "outside"},
      {"smaller than a header", [](HandMadeJob &) {}, true, -1, "smaller than its header"},
      {"wrong magic", [](HandMadeJob &j) { j.header.magic ^= 1; }, true, 0, "not a job"},
      {"header size of another build", [](HandMadeJob &j) { j.header.header_bytes += 8; }, true, 0,
       "not a job"},
      {"region past the end",
       [](HandMadeJob &j) { j.header.targets.offset = uint64_t{1} << 40; }, true, 0, "outside"},
      {"offset that wraps",
       [](HandMadeJob &j) { j.header.queries.offset = ~uint64_t{0} - 63; }, true, 0, "outside"},
      {"misaligned region", [](HandMadeJob &j) { j.header.queries.offset += 4; }, true, 0,
       "outside"},
      {"length that disagrees with the counts", [](HandMadeJob &j) { j.header.n_targets += 1; },
       true, 0, "length"},
      {"counts that overflow",
       [](HandMadeJob &j) { j.header.n_queries = int64_t{1} << 62; }, true, 0, "too large"},
      {"negative count", [](HandMadeJob &j) { j.header.n_targets = -1; }, true, 0, "negative"},
      {"k = 0", [](HandMadeJob &j) { j.header.k = 0; }, true, 0, "k must"},
      {"zero dimension", [](HandMadeJob &j) { j.header.dim = 0; }, true, 0, "dimension"},
      {"unknown element", [](HandMadeJob &j) { j.header.element = 9; }, true, 0, "element"},
      {"results over the query rows",
       [](HandMadeJob &j) { j.header.distances.offset = j.header.queries.offset; }, true, 0,
       "overlap"},
      {"too many devices", [](HandMadeJob &j) { j.header.n_devices = KNN_MAX_DEVICES + 1; }, true,
       0, "device"},
      {"unknown flag", [](HandMadeJob &j) { j.header.flags |= 64; }, true, 0, "flags"},
      {"negative memory limit", [](HandMadeJob &j) { j.header.gpu_memory_limit = -1; }, true, 0,
       "memory limit"},
      {"unknown metric", [](HandMadeJob &j) { j.header.metric = 77; }, true, 0, "unknown metric"},
      {"bit metric on float rows", [](HandMadeJob &j) { j.header.metric = KNN_METRIC_HAMMING; },
       true, 0, "bit rows"},
      {"too many threads", [](HandMadeJob &j) { j.header.n_threads = 100000; }, true, 0,
       "n_threads"},
  };
  for (const Case &c : cases) {
    HandMadeJob job(p);
    c.spoil(job);
    const uint64_t bytes = c.size_change == -1 ? sizeof(WireHeader) - 8 : job.size + c.size_change;
    job.write(bytes, c.seal);
    const WireReply reply = send_raw(dir.path, job.fd);
    EXPECT_EQ(reply.status, KNN_INVALID_ARGUMENT) << c.name;
    EXPECT_NE(std::strstr(reply.message, c.expected), nullptr) << c.name << ": " << reply.message;
  }
  // A request without a descriptor, and a pipe instead of a memory file.
  WireReply reply = send_raw(dir.path, -1);
  EXPECT_EQ(reply.status, KNN_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(reply.message, "no job"), nullptr) << reply.message;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  reply = send_raw(dir.path, fds[0]);
  close(fds[0]);
  close(fds[1]);
  EXPECT_EQ(reply.status, KNN_INVALID_ARGUMENT);
  // Files that are not tmpfs: a regular file, and a hugetlbfs memfd (its
  // pages could fail to come back after a hole: a SIGBUS for a mapping).
  char name[] = "gpu_service_test_job_XXXXXX";  // the build tree: not tmpfs
  const int regular = mkstemp(name);
  ASSERT_GE(regular, 0);
  unlink(name);
  {
    HandMadeJob job(p);
    close(job.fd);
    job.fd = regular;
    job.write(job.size, false);
    reply = send_raw(dir.path, job.fd);
    EXPECT_EQ(reply.status, KNN_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(reply.message, "not a memory file"), nullptr) << reply.message;
  }
  const int huge = memfd_create("hostile_huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (huge >= 0) {
    ASSERT_EQ(ftruncate(huge, 2 << 20), 0);
    (void)fcntl(huge, F_ADD_SEALS, F_SEAL_SHRINK);
    reply = send_raw(dir.path, huge);
    close(huge);
    EXPECT_EQ(reply.status, KNN_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(reply.message, "not a memory file"), nullptr) << reply.message;
  }
  EXPECT_EQ(engine.calls.load(), 0) << "a hostile job reached the engine";

  // The service still answers a sound job.
  const auto served = through_service(dir.path, p);
  EXPECT_EQ(served.status, KNN_OK) << served.message;
  EXPECT_EQ(engine.calls.load(), 1);
}

// Regions that each lie inside the job file and have their counts' lengths
// but that the service cannot copy one after another (past 2^62 bytes in
// all): refused by validate_header. Before, the copy was planned without
// the regions it could not place, a buffer of the placed ones' size, and
// the rows were read into it whole (review r12adm). No file of that size is
// needed to ask.
TEST(GpuServiceWire, RegionsTheServiceCannotPackAreRefused) {
  KnnProblem p{};
  p.element = KNN_ELEMENT_FLOAT32;
  p.metric = KNN_METRIC_L2;
  p.method = KNN_METHOD_AUTO;
  p.device = KNN_DEVICE_GPU;
  p.k = 1;
  p.dim = 1 << 24;
  p.n_queries = 1;
  p.n_targets = 1;
  WireHeader h{};
  uint64_t size = 0;
  const char *why = nullptr;
  ASSERT_TRUE(plan_layout(p, false, false, &h, &size, &why)) << why;
  EXPECT_EQ(validate_header(h, size), nullptr) << "the sound job";
  // 2^36 + 1 target rows of 2^26 bytes, laid out by hand after the queries.
  h.n_targets = (int64_t{1} << 36) + 1;
  const uint64_t row = uint64_t{4} << 24;
  uint64_t at = h.queries.offset + h.queries.length;
  h.targets.offset = at;
  h.targets.length = row * static_cast<uint64_t>(h.n_targets);
  at += h.targets.length;
  const auto aligned = [](uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; };
  h.neighbors.offset = aligned(at);
  h.distances.offset = aligned(h.neighbors.offset + h.neighbors.length);
  at = h.distances.offset + h.distances.length;
  const char *refused = validate_header(h, at);
  ASSERT_NE(refused, nullptr);
  EXPECT_NE(std::strstr(refused, "too large"), nullptr) << refused;
}

// The admission slot's share of the GPU memory budget is known only after
// the job was prepared: it reaches the service with the submission.
TEST_F(GpuService, TheSlotsMemoryLimitReachesTheService) {
  std::atomic<int64_t> seen{-1};
  auto server = serve_on(dir, [&seen](const KnnProblem &problem, bool, int64_t *n, double *d,
                                      KnnStats *s, const int32_t *cancel, char *e, size_t el) {
    seen = problem.gpu_memory_limit;
    return knn::cpu_run(problem, n, d, s, cancel, e, el);
  });
  ASSERT_NE(server, nullptr);
  PreparedJob job;
  char err[512] = "";
  ASSERT_EQ(job.prepare(p, false, err, sizeof err), KNN_OK) << err;
  std::vector<int64_t> neighbors(static_cast<size_t>(p.n_queries * p.k));
  std::vector<double> distances(neighbors.size());
  const int32_t never = 0;
  EXPECT_EQ(job.submit(dir.path.c_str(), int64_t{3} << 30, neighbors.data(), distances.data(),
                       nullptr, &never, err, sizeof err),
            KNN_OK)
      << err;
  EXPECT_EQ(seen.load(), int64_t{3} << 30);
}

// A run function that waits for its cancel word and says when it saw it
// (ignoring_cancel: one that waits for release instead, as a service
// whose engine does not stop).
struct WaitsForCancel {
  bool ignoring_cancel = false;
  std::atomic<bool> started{false};
  std::atomic<bool> saw_cancel{false};
  std::atomic<bool> release{false};
  RunFunction function() {
    return [this](const KnnProblem &, bool, int64_t *, double *, KnnStats *,
                  const int32_t *cancel, char *e, size_t el) {
      started = true;
      const auto t = Clock::now();
      while ((ignoring_cancel ? !release.load() : __atomic_load_n(cancel, __ATOMIC_RELAXED) == 0) &&
             seconds_since(t) < 20)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      saw_cancel = __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0;
      std::snprintf(e, el, "cancelled");
      return KNN_CANCELLED;
    };
  }
  void await_start() const {
    const auto t = Clock::now();
    while (!started && seconds_since(t) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// Sends p to a server running fake, cancels it once fake runs, and
// returns the seconds from the cancel to the join's end (r: its result).
double cancelled_join(const SocketDir &dir, const KnnProblem &p, WaitsForCancel &fake,
                      job_run::JobResult *r) {
  auto server = serve_on(dir, fake.function());
  if (server == nullptr) return -1;
  int32_t cancel = 0;
  std::thread client([&] { *r = through_service(dir.path, p, &cancel); });
  fake.await_start();
  const auto t = Clock::now();
  __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
  client.join();
  const double waited = seconds_since(t);
  fake.release = true;
  return waited;
}

TEST_F(GpuService, CancelReachesTheServiceJob) {
  WaitsForCancel fake;
  job_run::JobResult r;
  EXPECT_LT(cancelled_join(dir, p, fake, &r), 0.5);
  EXPECT_EQ(r.status, KNN_CANCELLED) << r.message;
  EXPECT_TRUE(fake.saw_cancel.load());
}

// Cancel and statement_timeout end a join within about a second even where
// the service does not stop it.
TEST_F(GpuService, ACancelGivesUpWithinASecond) {
  WaitsForCancel fake;
  fake.ignoring_cancel = true;
  job_run::JobResult r;
  const double waited = cancelled_join(dir, p, fake, &r);
  EXPECT_GT(waited, 0.9);
  EXPECT_LT(waited, 1.5);
  EXPECT_EQ(r.status, KNN_CANCELLED) << r.message;
}

// Whether this process maps a file whose name contains name (/proc/self/maps).
bool maps_file(const char *name) {
  FILE *f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return false;
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr)
    found = std::strstr(line, name) != nullptr;
  std::fclose(f);
  return found;
}

// A hostile peer that punches holes in its job and grows it while the job
// runs (F_SEAL_SHRINK stops neither): the service maps none of it, so no
// fault can kill it; it answers (here: the results written back into the
// holes), and serves the next job.
TEST_F(GpuService, AHostilePeerCannotFaultTheService) {
  WaitsForCancel fake;
  fake.ignoring_cancel = true;
  std::atomic<bool> hostile_mapped{true};
  RunFunction run = [&](const KnnProblem &problem, bool stand_in, int64_t *n, double *d,
                        KnnStats *s, const int32_t *cancel, char *e, size_t el) {
    hostile_mapped = maps_file("memfd:hostile");
    fake.function()(problem, stand_in, n, d, s, cancel, e, el);
    return knn::cpu_run(problem, n, d, s, cancel, e, el);
  };
  auto server = serve_on(dir, run);
  ASSERT_NE(server, nullptr);
  HandMadeJob job(p);
  job.write(job.size, false);
  ASSERT_EQ(fcntl(job.fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);  // as a backend's buffer
  for (const Region *r : {&job.header.queries, &job.header.targets}) {
    std::vector<unsigned char> bytes(r->length, 0);
    const auto *from = r == &job.header.queries ? p.queries : p.targets;
    std::memcpy(bytes.data(), from, r->length);
    ASSERT_EQ(pwrite(job.fd, bytes.data(), bytes.size(), static_cast<off_t>(r->offset)),
              static_cast<ssize_t>(bytes.size()));
  }
  char why[256] = "";
  const int sock = connect_to(dir.path.c_str(), why, sizeof why);
  ASSERT_GE(sock, 0) << why;
  ASSERT_TRUE(send_job(sock, job.fd));
  fake.await_start();
  EXPECT_FALSE(hostile_mapped.load()) << "the service maps the peer's memfd";
  EXPECT_EQ(fallocate(job.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                      static_cast<off_t>(job.size)),
            0);
  EXPECT_EQ(fallocate(job.fd, 0, static_cast<off_t>(job.size), 1 << 20), 0);  // grows
  fake.release = true;
  WireReply reply;
  const int32_t never = 0;
  ASSERT_EQ(await_reply(sock, &reply, nullptr, &never, 10000), 1);
  close(sock);
  EXPECT_EQ(reply.status, KNN_OK) << reply.message;
  // The results came back by pwrite into the punched file: the engine's own.
  const auto direct = job_run::run_job(p);
  std::vector<int64_t> neighbors(direct.neighbors.size());
  ASSERT_EQ(pread(job.fd, neighbors.data(), job.header.neighbors.length,
                  static_cast<off_t>(job.header.neighbors.offset)),
            static_cast<ssize_t>(job.header.neighbors.length));
  EXPECT_EQ(neighbors, direct.neighbors);
  // The service lives on.
  const auto served = through_service(dir.path, p);
  EXPECT_EQ(served.status, KNN_OK) << served.message;
}

TEST_F(GpuService, TheBackendsDeathCancelsItsJob) {
  WaitsForCancel fake;
  auto server = serve_on(dir, fake.function());
  ASSERT_NE(server, nullptr);
  HandMadeJob job(p);
  job.write(job.size, true);
  char why[256] = "";
  const int sock = connect_to(dir.path.c_str(), why, sizeof why);
  ASSERT_GE(sock, 0) << why;
  ASSERT_TRUE(send_job(sock, job.fd));
  fake.await_start();
  const auto t = Clock::now();
  close(sock);  // the backend is gone
  while (!fake.saw_cancel && seconds_since(t) < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(fake.saw_cancel.load());
  EXPECT_LT(seconds_since(t), 0.5);
}

TEST_F(GpuService, TheServicesDeathEndsTheJoinWithAnError) {
  WaitsForCancel fake;
  auto server = serve_on(dir, fake.function());
  ASSERT_NE(server, nullptr);
  job_run::JobResult r;
  std::thread client([&] { r = through_service(dir.path, p); });
  fake.await_start();
  const auto t = Clock::now();
  server->stop();
  client.join();
  EXPECT_LT(seconds_since(t), 1.0);
  EXPECT_EQ(r.status, KNN_DEVICE_ERROR);
  EXPECT_NE(r.message.find("GPU service ended"), std::string::npos) << r.message;
  // Nothing is left behind, and a join now finds no service.
  EXPECT_FALSE(listening(dir.path.c_str(), dir.lock.c_str()));
  const auto after = through_service(dir.path, p);
  EXPECT_EQ(after.status, KNN_DEVICE_ERROR);
  EXPECT_NE(after.message.find("no GPU service answers"), std::string::npos) << after.message;
}

// The job layer's route (knn_engine_set_gpu_service): the service as the
// background worker runs it (knn_gpu_service_open, a CPU stand-in here).
TEST_F(GpuService, JobsGoThroughTheServiceWhenItIsOn) {
  const Rows rows = make_rows(40, 3000, 16);
  KnnProblem join = problem_of(rows, 40, 3000, 16, 4);
  const auto direct = job_run::run_job(join);
  ASSERT_EQ(direct.status, KNN_OK);

  // No service listens: AUTO lets the CPU answer this small join at once.
  const std::string &lock = dir.lock;
  knn_engine_set_gpu_service(dir.path.c_str(), lock.c_str(), KNN_GPU_SERVICE_CPU_STAND_IN);
  join.device = KNN_DEVICE_AUTO;
  auto r = job_run::run_job(join);
  EXPECT_EQ(r.status, KNN_OK) << r.message;
  EXPECT_NE(std::strstr(r.stats.device_name, "GPU service starting"), nullptr)
      << r.stats.device_name;
  job_run::expect_identical(direct, r, "before the service");

  char description[384] = "", why[512] = "";
  HeldLock held(lock);  // as the service's worker
  KnnGpuServiceHandle *service =
      knn_gpu_service_open(dir.path.c_str(), 1, description, sizeof description, why, sizeof why);
  ASSERT_NE(service, nullptr) << why;
  for (KnnDevice device : {KNN_DEVICE_AUTO, KNN_DEVICE_GPU}) {
    join.device = device;
    r = job_run::run_job(join);
    EXPECT_EQ(r.status, KNN_OK) << r.message;
    EXPECT_NE(std::strstr(r.stats.device_name, "via GPU service"), nullptr) << r.stats.device_name;
    job_run::expect_identical(direct, r, "through the service");
  }
  EXPECT_EQ(knn_gpu_service_jobs_answered(service), 2);
  knn_gpu_service_close(service);
  held.release();
  EXPECT_FALSE(listening(dir.path.c_str(), lock.c_str()));

  // The service gone: GPU waits for one (cancellably); here it fails after
  // its wait only under GPU, so AUTO is checked: the small join runs on
  // the CPU again.
  join.device = KNN_DEVICE_AUTO;
  r = job_run::run_job(join);
  EXPECT_EQ(r.status, KNN_OK) << r.message;
  job_run::expect_identical(direct, r, "after the service");
  // GPU: no service holds the lock, so the join stops waiting after 2 s.
  join.device = KNN_DEVICE_GPU;
  r = job_run::run_job(join);
  EXPECT_EQ(r.status, KNN_DEVICE_ERROR);
  EXPECT_NE(r.message.find("no GPU service runs"), std::string::npos) << r.message;
  EXPECT_LT(r.seconds, 5.0);
  knn_engine_set_gpu_service("", "", KNN_GPU_SERVICE_OFF);
}

// A socket file that a dead service left (a crash: nothing clears
// pg_stat_tmp) is no service; a join under GPU waits while a new service,
// holding the lock, replaces it, and then runs there.
TEST_F(GpuService, AStaleSocketIsNoService) {
  leave_stale_socket(dir.path);
  EXPECT_FALSE(listening(dir.path.c_str(), dir.lock.c_str()));
  const auto refused = through_service(dir.path, p);
  EXPECT_EQ(refused.status, KNN_DEVICE_ERROR);
  EXPECT_NE(refused.message.find("no GPU service answers"), std::string::npos) << refused.message;

  const auto direct = job_run::run_job(p);
  ASSERT_EQ(direct.status, KNN_OK);
  HeldLock held(dir.lock);  // a new service starts: its lock first, its socket later
  EXPECT_TRUE(listening(dir.path.c_str(), dir.lock.c_str()));  // the old file, for now
  KnnGpuServiceHandle *service = nullptr;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    char description[384] = "", why[512] = "";
    service = knn_gpu_service_open(dir.path.c_str(), 1, description, sizeof description, why,
                                   sizeof why);
    EXPECT_NE(service, nullptr) << why;
  });
  knn_engine_set_gpu_service(dir.path.c_str(), dir.lock.c_str(), KNN_GPU_SERVICE_CPU_STAND_IN);
  KnnProblem join = p;
  join.device = KNN_DEVICE_GPU;
  const auto r = job_run::run_job(join);
  starter.join();
  EXPECT_EQ(r.status, KNN_OK) << r.message;
  EXPECT_NE(std::strstr(r.stats.device_name, "via GPU service"), nullptr) << r.stats.device_name;
  job_run::expect_identical(direct, r, "after the stale socket");
  knn_engine_set_gpu_service("", "", KNN_GPU_SERVICE_OFF);
  knn_gpu_service_close(service);
}

// A peer that sends part of a request and stays holds neither the other
// jobs nor stop().
TEST_F(GpuService, APartialRequestHoldsNothing) {
  CpuService engine;
  auto server = serve_on(dir, engine.function());
  ASSERT_NE(server, nullptr);
  char why[256] = "";
  const int sock = connect_to(dir.path.c_str(), why, sizeof why);
  ASSERT_GE(sock, 0) << why;
  const char half[4] = {1, 2, 3, 4};
  ASSERT_EQ(::send(sock, half, sizeof half, MSG_NOSIGNAL), 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto served = through_service(dir.path, p);
  EXPECT_EQ(served.status, KNN_OK) << served.message;
  // A second half-sender that connected just before stop().
  const int late = connect_to(dir.path.c_str(), why, sizeof why);
  ASSERT_GE(late, 0) << why;
  ASSERT_EQ(::send(late, half, 2, MSG_NOSIGNAL), 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t = Clock::now();
  server->stop();
  EXPECT_LT(seconds_since(t), 0.5);
  close(sock);
  close(late);
}

// A memory file larger than its header says: only what the header uses is
// read and written, not what the peer allocated.
TEST_F(GpuService, OnlyWhatTheHeaderUsesIsTouched) {
  CpuService engine;
  auto server = serve_on(dir, engine.function());
  ASSERT_NE(server, nullptr);
  HandMadeJob job(p);
  const uint64_t extra = uint64_t{512} << 20;
  job.write(job.size + extra, true);
  const WireReply reply = send_raw(dir.path, job.fd);
  EXPECT_EQ(reply.status, KNN_OK) << reply.message;
  struct stat st;
  ASSERT_EQ(fstat(job.fd, &st), 0);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, job.size + (uint64_t{1} << 20))
      << "the service touched pages beyond the job";
}

// A full backlog (a service that does not accept) does not hold a
// cancelled connect.
TEST_F(GpuService, AConnectHonoursTheCancel) {
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, dir.path.c_str(), dir.path.size() + 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 0), 0);
  std::vector<int> queued;
  for (int i = 0; i < 64; i++) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
      ASSERT_EQ(errno, EAGAIN);
      close(fd);
      break;
    }
    queued.push_back(fd);
  }
  ASSERT_LT(queued.size(), 64u) << "the backlog never filled";
  int32_t cancel = 0;
  int error = 0;
  char why[256] = "";
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
  });
  const auto t = Clock::now();
  EXPECT_EQ(connect_to(dir.path.c_str(), why, sizeof why, &cancel, &error), -1);
  canceller.join();
  EXPECT_LT(seconds_since(t), 0.5);
  EXPECT_EQ(error, ECANCELED) << why;
  for (int fd : queued) close(fd);
  close(listener);
}

// ---- the shared row buffer (gpu_service_rows.h) ----

// A copy of rows in a segment of this process's shared row buffer.
struct SharedCopy {
  KnnSharedRows *rows = nullptr;
  SharedCopy(const void *from, size_t bytes) {
    rows = knn_shared_rows_create(bytes);
    EXPECT_NE(rows, nullptr);
    if (rows != nullptr) std::memcpy(knn_shared_rows_data(rows), from, bytes);
  }
  ~SharedCopy() { knn_shared_rows_free(rows); }
  const float *data() const { return static_cast<const float *>(knn_shared_rows_data(rows)); }
};

// through_service's steps, saying whether the job was the shared row buffer.
job_run::JobResult through_prepared(const std::string &path, const KnnProblem &p,
                                    bool *in_shared_rows) {
  job_run::JobResult r;
  r.neighbors.assign(static_cast<size_t>(p.n_queries * p.k), -2);
  r.distances.assign(r.neighbors.size(), -2.0);
  const int32_t never = 0;
  char err[512] = "";
  PreparedJob job;
  r.status = job.prepare(p, false, err, sizeof err);
  *in_shared_rows = job.in_shared_rows();
  if (r.status == KNN_OK)
    r.status = job.submit(path.c_str(), p.gpu_memory_limit, r.neighbors.data(),
                          r.distances.data(), &r.stats, &never, err, sizeof err);
  r.message = err;
  return r;
}

ino_t inode_of(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// Rows read into the shared row buffer go to the service as they lie:
// the job is the buffer's memfd (the same one, join after join, no larger
// for the second join), and the answers are the engine's own: two
// matrices, one matrix on both sides with keys, and either side outside
// the buffer (copied into the job's own segment).
TEST_F(GpuService, RowsInTheSharedBufferGoAsTheyLie) {
  CpuService engine;
  auto server = serve_on(dir, engine.function());
  ASSERT_NE(server, nullptr);
  const Rows rows = make_rows(37, 501, 13);
  SharedCopy queries(rows.queries.data(), rows.queries.size() * sizeof(float));
  SharedCopy targets(rows.targets.data(), rows.targets.size() * sizeof(float));
  ASSERT_NE(targets.rows, nullptr);
  const ArenaState before = current_arena_state();
  ASSERT_GE(before.fd, 0);
  const int seals = fcntl(before.fd, F_GET_SEALS);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0) << "the service's mapping could fault";
  EXPECT_EQ(seals & F_SEAL_GROW, 0);

  KnnProblem join = problem_of(rows, 37, 501, 13, 7);
  const auto direct = job_run::run_job(join);
  join.queries = queries.data();
  join.targets = targets.data();
  bool shared = false;
  for (int round = 0; round < 2; round++) {
    const auto served = through_prepared(dir.path, join, &shared);
    EXPECT_TRUE(shared);
    ASSERT_EQ(served.status, KNN_OK) << served.message;
    job_run::expect_identical(direct, served, "two matrices, round " + std::to_string(round));
  }
  const ArenaState after = current_arena_state();
  EXPECT_EQ(inode_of(after.fd), inode_of(before.fd));
  EXPECT_EQ(after.size, before.size) << "the second join grew the buffer";
  EXPECT_EQ(after.live_segments, 2u);

  KnnProblem self = problem_of(rows, 501, 501, 13, 5);
  self.queries = rows.targets.data();
  self.query_keys = rows.keys.data();
  self.target_keys = rows.keys.data();
  const auto self_direct = job_run::run_job(self);
  self.queries = self.targets = targets.data();
  auto served = through_prepared(dir.path, self, &shared);
  EXPECT_TRUE(shared);
  ASSERT_EQ(served.status, KNN_OK) << served.message;
  job_run::expect_identical(self_direct, served, "one matrix with keys");

  join.targets = rows.targets.data();  // not in the buffer
  served = through_prepared(dir.path, join, &shared);
  EXPECT_TRUE(shared);
  ASSERT_EQ(served.status, KNN_OK) << served.message;
  job_run::expect_identical(direct, served, "targets outside the buffer");
  join.queries = rows.queries.data();
  join.targets = targets.data();
  served = through_prepared(dir.path, join, &shared);
  EXPECT_TRUE(shared);
  ASSERT_EQ(served.status, KNN_OK) << served.message;
  job_run::expect_identical(direct, served, "queries outside the buffer");
  EXPECT_EQ(engine.calls.load(), 5);

  // Rows not in the buffer: a memfd of the job's own, as before.
  served = through_prepared(dir.path, p, &shared);
  EXPECT_FALSE(shared);
  EXPECT_EQ(served.status, KNN_OK) << served.message;
  EXPECT_EQ(engine.calls.load(), 6);
}

// One job at a time holds the buffer's header: a second one copies.
TEST_F(GpuService, OneJobAtATimeHoldsTheSharedBuffer) {
  const Rows rows = make_rows(10, 100, 8);
  SharedCopy queries(rows.queries.data(), rows.queries.size() * sizeof(float));
  KnnProblem join = p;
  join.queries = queries.data();
  char err[512] = "";
  PreparedJob first, second;
  ASSERT_EQ(first.prepare(join, false, err, sizeof err), KNN_OK) << err;
  ASSERT_EQ(second.prepare(join, false, err, sizeof err), KNN_OK) << err;
  EXPECT_TRUE(first.in_shared_rows());
  EXPECT_FALSE(second.in_shared_rows());
}

// The bytes the shared row buffer's memfd has allocated.
uint64_t allocated_bytes(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A segment grows in place at the top and within the room it was given,
// and moves (contents kept) when another lies above it; an emptied buffer
// keeps the pages its last use needed (up to kKeepBytes), no more.
TEST_F(GpuService, SharedSegmentsGrowAndMove) {
  const ArenaState start = current_arena_state();
  KnnSharedRows *a = knn_shared_rows_create(1000);
  ASSERT_NE(a, nullptr);
  std::memset(knn_shared_rows_data(a), 0x5a, 1000);
  KnnSharedRows *b = knn_shared_rows_create(100);
  ASSERT_NE(b, nullptr);
  void *b_data = knn_shared_rows_data(b);
  ASSERT_EQ(knn_shared_rows_grow(b, 100 * kMiB), 1);  // past kKeepBytes
  EXPECT_EQ(knn_shared_rows_data(b), b_data) << "the top segment moved";
  void *a_data = knn_shared_rows_data(a);
  ASSERT_EQ(knn_shared_rows_grow(a, 5000), 1);
  EXPECT_EQ(knn_shared_rows_data(a), a_data) << "a moved within the step it was given";
  ASSERT_EQ(knn_shared_rows_grow(a, 3 * kMiB), 1);
  EXPECT_NE(knn_shared_rows_data(a), a_data);
  const auto *bytes = static_cast<const unsigned char *>(knn_shared_rows_data(a));
  EXPECT_EQ(std::count(bytes, bytes + 1000, 0x5a), 1000);
  EXPECT_EQ(knn_shared_rows_grow(a, uint64_t{1} << 50), 0) << "beyond the reservation";
  const int fd = current_arena_state().fd;
  // Live: a (3 MB, stepped to 4), b (100 MB), the header, and at most the
  // pages an earlier test's join left kept under a's old place.
  EXPECT_LE(allocated_bytes(fd), 108 * kMiB);
  EXPECT_GE(allocated_bytes(fd), 103 * kMiB);
  knn_shared_rows_free(a);
  knn_shared_rows_free(b);
  knn_shared_rows_free(nullptr);
  const ArenaState end = current_arena_state();
  EXPECT_EQ(end.live_segments, 0u);
  if (start.fd >= 0) {
    EXPECT_EQ(inode_of(end.fd), inode_of(start.fd));
  }
  // The last use reached past kKeepBytes: kKeepBytes stay (b's pages under it).
  EXPECT_EQ(allocated_bytes(end.fd), kKeepBytes);
  // A small use: what it needed stays (its pages are reused), the rest goes.
  KnnSharedRows *c = knn_shared_rows_create(10 * kMiB);
  ASSERT_NE(c, nullptr);
  knn_shared_rows_free(c);
  EXPECT_GE(allocated_bytes(end.fd), 10 * kMiB);
  EXPECT_LE(allocated_bytes(end.fd), 12 * kMiB + 4096);
}

// The buffer's reservation of address space counts against RLIMIT_AS: a
// quarter of the limit at most, none under a small one.
TEST_F(GpuService, TheReservationFitsTheAddressSpaceLimit) {
  EXPECT_EQ(reservation_bytes(uint64_t{1} << 62), uint64_t{1} << 40);
  EXPECT_EQ(reservation_bytes(uint64_t{8} << 30), uint64_t{2} << 30);
  EXPECT_EQ(reservation_bytes(uint64_t{512} << 20), 0u);
}

// Pages are allocated for what is asked, in 2 MB steps, not ahead: two
// segments growing by turns (as two matrices read row by row) end with
// about their rows' bytes allocated, not twice that.
TEST_F(GpuService, TheSharedBufferBacksWhatIsAsked) {
  const uint64_t row = 3000;  // bytes per row
  KnnSharedRows *rows[2] = {knn_shared_rows_create(2 * kMiB), knn_shared_rows_create(2 * kMiB)};
  ASSERT_NE(rows[0], nullptr);
  ASSERT_NE(rows[1], nullptr);
  uint64_t asked[2] = {2 * kMiB, 2 * kMiB};
  for (uint64_t n = 0; n < 15000; n++) {  // 45 MB each
    for (int i = 0; i < 2; i++) {
      if ((n + 1) * row <= asked[i]) continue;
      asked[i] = ((n + 1) * row + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
      ASSERT_EQ(knn_shared_rows_grow(rows[i], asked[i]), 1);
      std::memset(static_cast<char *>(knn_shared_rows_data(rows[i])) + n * row, 1, row);
    }
  }
  const uint64_t written = 2 * 15000 * row;
  const uint64_t allocated = allocated_bytes(current_arena_state().fd);
  EXPECT_GE(allocated, written);
  EXPECT_LE(allocated, written + 4 * 2 * kMiB + kKeepBytes / 8) << "backed ahead of the rows";
  knn_shared_rows_free(rows[0]);
  knn_shared_rows_free(rows[1]);
}

// A join left without the service's answer (a cancel the service did not
// heed within a second) spoils the buffer: the service may still write
// into it. The next rows go into a new memfd.
TEST_F(GpuService, AJobLeftWithoutAnswerSpoilsTheSharedBuffer) {
  const Rows rows = make_rows(10, 100, 8);
  ino_t spoilt = 0;
  {
    SharedCopy queries(rows.queries.data(), rows.queries.size() * sizeof(float));
    spoilt = inode_of(current_arena_state().fd);
    KnnProblem join = p;
    join.queries = queries.data();
    WaitsForCancel fake;
    fake.ignoring_cancel = true;
    job_run::JobResult r;
    cancelled_join(dir, join, fake, &r);
    EXPECT_EQ(r.status, KNN_CANCELLED) << r.message;
    EXPECT_EQ(current_arena_state().fd, -1);
    // No new segment in it, and its segments cannot grow.
    SharedCopy other(rows.queries.data(), 64);
    EXPECT_NE(inode_of(current_arena_state().fd), spoilt);
    EXPECT_EQ(knn_shared_rows_grow(queries.rows, size_t{1} << 20), 0);
  }
  SharedCopy again(rows.queries.data(), 64);
  EXPECT_NE(inode_of(current_arena_state().fd), spoilt);
}

}  // namespace
