// gpu_service_server.h -- the GPU service's end of the socket: accepts the
// backends' jobs (gpu_service_wire.h) and runs each on a thread of its own
// with all signals blocked, through a run function (the service's engine,
// or a test's fake).
//
// One connection carries one job. While a job runs, its connection thread
// watches the socket: an end of it (the backend died, or gave up) sets the
// job's cancel word. stop() cancels every running job, closes every
// connection without an answer (the backend reads that as the service's
// death), waits for the threads and removes the socket file.
//
// Plain C++ and POSIX: no PostgreSQL, no CUDA.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "knn_engine.h"

namespace knn::service {

// Runs one validated job. cpu_stand_in: the job's kCpuStandIn flag (tests).
// Polls *cancel as the engines do; never throws (the server guards it too).
using RunFunction = std::function<KnnStatus(const KnnProblem &problem, bool cpu_stand_in,
                                            int64_t *neighbors, double *distances,
                                            KnnStats *stats, const int32_t *cancel,
                                            char *errbuf, size_t errlen)>;

class Server {
 public:
  // Binds path (a stale file there is removed first: the caller holds the
  // service's lock), mode 0600, under a temporary name that is renamed to
  // path once it listens, so that the path appears only when jobs can come.
  // Returns nullptr (why set) on failure.
  static std::unique_ptr<Server> listen(const char *path, RunFunction run, char *why,
                                        size_t why_len);
  ~Server();
  Server(const Server &) = delete;
  Server &operator=(const Server &) = delete;

  void stop() noexcept;
  int64_t jobs_answered() const { return answered_.load(); }

 private:
  struct Connection;
  Server() = default;
  void accept_loop() noexcept;
  void serve(Connection *c) noexcept;
  void reap(bool all) noexcept;

  std::string path_;
  RunFunction run_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: stop() wakes the accept loop
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> answered_{0};
  std::thread acceptor_;
  std::mutex mutex_;  // guards connections_
  std::vector<std::unique_ptr<Connection>> connections_;
  bool stopped_ = false;
};

}  // namespace knn::service
