// gpu_service_client.h -- a backend's end of the GPU service
// (knn_gpu.gpu_service): a k-NN join sent to the service as one sealed
// memfd (gpu_service_wire.h) instead of knn_cuda_run in this process, so
// that the backend needs no GPU context of its own. The job layer
// (knn_job.cpp) calls it from an engine thread: plain POSIX, no
// PostgreSQL; every signal is blocked on that thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include <memory>

#include "gpu_service_rows.h"
#include "gpu_service_wire.h"
#include "knn_engine.h"

namespace knn::service {

// knn_engine_set_gpu_service's values, as the next job reads them.
struct ClientSettings {
  int32_t mode = KNN_GPU_SERVICE_OFF;
  char path[108] = "";  // sockaddr_un's limit
  char lock[108] = "";  // held (flock) by a running service
};
ClientSettings client_settings();

// True when a process holds the service's lock (a shared flock taken and
// dropped at once: a starting service retries over it).
bool running(const char *lock_path);

// True when a service listens at path: its socket file exists (the
// service creates it once its GPU runtime is ready) and a process holds
// lock_path. A file that a dead service left (a crash, SIGQUIT: nothing
// clears pg_stat_tmp) is no service; the next one replaces it.
bool listening(const char *path, const char *lock_path);

// A join written into a sealed memfd (gpu_service_wire.h), made before the
// backend waits for its GPU slot, so that the slot is held only while the
// service works. Closed and unmapped with the object.
// How long a backend waits, after a cancel, for the service to answer
// (it stops its engine at its next cancel check); past it the backend
// leaves, and the end of its socket cancels the job in the service too.
constexpr int kGiveUpMs = 1000;

class PreparedJob {
 public:
  PreparedJob() = default;
  ~PreparedJob();
  PreparedJob(const PreparedJob &) = delete;
  PreparedJob &operator=(const PreparedJob &) = delete;

  // Copies the problem's rows and keys in. KNN_OK, or a status and errbuf.
  // Where the query or the target rows lie in this process's shared row
  // buffer (gpu_service_rows.h), the job is that buffer's memfd: only the
  // keys, the room for results and a side not in the buffer are written.
  KnnStatus prepare(const KnnProblem &problem, bool cpu_stand_in, char *errbuf, size_t errlen);

  // Whether the job is in the shared row buffer (for tests).
  bool in_shared_rows() const { return arena_ != nullptr; }

  // Sends it to the service at path with the join's GPU memory limit (the
  // admission slot's share, known only now) and waits for the answer, as
  // run() below.
  KnnStatus submit(const char *path, int64_t gpu_memory_limit, int64_t *neighbors,
                   double *distances, KnnStats *stats, const int32_t *cancel, char *errbuf,
                   size_t errlen, int give_up_ms = kGiveUpMs);

  // After a KNN_DEVICE_ERROR of submit(): no service accepted the
  // connection (ECONNREFUSED, ENOENT), so none saw the job: a service
  // that is starting (or replacing a dead one's socket) may still take it.
  bool refused() const { return refused_; }

 private:
  bool prepare_in_arena(const KnnProblem &p, bool shared_rows, bool self_keys,
                        bool cpu_stand_in);

  bool refused_ = false;
  std::unique_ptr<ArenaJob> arena_;  // set: fd_ and base_ are the arena's
  int fd_ = -1;
  unsigned char *base_ = nullptr;
  uint64_t size_ = 0;
  WireHeader header_{};
};

// Runs the join in the service, as knn_cuda_run would in this process:
// results into neighbors and distances, statistics, status and message.
// *cancel is forwarded to the service. A service that is not there, or
// that ends before it answers: KNN_DEVICE_ERROR with a message that says
// so. After a cancel, a service that has not answered within give_up_ms
// is left (KNN_CANCELLED; the end of the socket cancels it there too).
KnnStatus run(const char *path, bool cpu_stand_in, const KnnProblem &problem,
              int64_t *neighbors, double *distances, KnnStats *stats, const int32_t *cancel,
              char *errbuf, size_t errlen, int give_up_ms = kGiveUpMs);

// The steps of run(), for tests that send hostile jobs.
// Connects without blocking on a full backlog: retries until connected,
// *cancel (when given) is set, or give_up_ms passed. -1 on failure (why
// set; *error, when given, the errno: ECANCELED after a cancel).
int connect_to(const char *path, char *why, size_t why_len, const int32_t *cancel = nullptr,
               int *error = nullptr, int give_up_ms = 10000);
bool send_job(int sock, int memfd);
// Waits for the reply; while waiting, copies *cancel (when set) into
// *cancel_word and sends the service a byte (its watch wakes). Returns 1 with a reply, 0 when the socket ended first, -1
// when give_up_ms passed after a cancel.
int await_reply(int sock, WireReply *reply, int32_t *cancel_word, const int32_t *cancel,
                int give_up_ms);

}  // namespace knn::service
