// gpu_service_client.cpp -- a backend's end of the GPU service
// (gpu_service_client.h).

#include "gpu_service_client.h"
#include "result_padding.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "entry_guard.h"
#include "gpu_service.h"

namespace knn::service {

namespace {

std::mutex settings_mutex;
ClientSettings settings;

constexpr int kPollMs = 5;


struct Socket {
  int fd = -1;
  ~Socket() {
    if (fd >= 0) close(fd);
  }
};

void copy_in(unsigned char *base, const Region &r, const void *from) {
  if (r.length > 0) std::memcpy(base + r.offset, from, r.length);
}

}  // namespace

ClientSettings client_settings() {
  std::lock_guard<std::mutex> lock(settings_mutex);
  return settings;
}

bool running(const char *lock_path) {
  const int fd = open(lock_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);
  return held;
}

bool listening(const char *path, const char *lock_path) {
  struct stat st;
  return path != nullptr && path[0] != '\0' && lock_path != nullptr && stat(path, &st) == 0 &&
         S_ISSOCK(st.st_mode) && running(lock_path);
}

int connect_to(const char *path, char *why, size_t why_len, const int32_t *cancel, int *error,
               int give_up_ms) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path == nullptr || std::strlen(path) >= sizeof addr.sun_path) {
    copy_message(why, why_len, "the GPU service's socket path is too long");
    if (error != nullptr) *error = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(addr.sun_path, path, std::strlen(path) + 1);
  Socket sock;
  sock.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int failure = sock.fd < 0 ? errno : 0;
  // A Unix socket's connect does not block but for a full backlog
  // (EAGAIN); a blocking one would then ignore the cancel.
  const auto started = std::chrono::steady_clock::now();
  while (failure == 0 && connect(sock.fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
    if (errno != EAGAIN && errno != EINTR) {
      failure = errno;
    } else if (cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) {
      failure = ECANCELED;
    } else if (std::chrono::steady_clock::now() - started >
               std::chrono::milliseconds(give_up_ms)) {
      failure = ETIMEDOUT;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
    }
  }
  // The rest polls before it reads, and sends 8 bytes to an empty buffer.
  if (failure == 0 && fcntl(sock.fd, F_SETFL, fcntl(sock.fd, F_GETFL) & ~O_NONBLOCK) != 0)
    failure = errno;
  if (failure != 0) {
    if (failure == ECANCELED)
      copy_message(why, why_len, "cancelled while connecting to the GPU service");
    else
      std::snprintf(why, why_len, "no GPU service answers at %s: %s", path,
                    std::strerror(failure));
    if (error != nullptr) *error = failure;
    return -1;
  }
  const int fd = sock.fd;
  sock.fd = -1;
  return fd;
}

bool send_job(int sock, int memfd) {
  JobRequest req{kMagic, kVersion};
  iovec iov{&req, sizeof req};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  std::memset(control, 0, sizeof control);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &memfd, sizeof memfd);
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof req);
}

int await_reply(int sock, WireReply *reply, int32_t *cancel_word, const int32_t *cancel,
                int give_up_ms) {
  auto *bytes = reinterpret_cast<char *>(reply);
  size_t got = 0;
  bool cancelled = false;
  auto cancelled_at = std::chrono::steady_clock::now();
  while (got < sizeof *reply) {
    if (!cancelled && cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) {
      cancelled = true;
      cancelled_at = std::chrono::steady_clock::now();
      if (cancel_word != nullptr) __atomic_store_n(cancel_word, 1, __ATOMIC_RELAXED);
      const char byte = 'c';  // wakes the service's watch of this job at once
      (void)send(sock, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (cancelled && std::chrono::steady_clock::now() - cancelled_at >
                         std::chrono::milliseconds(give_up_ms))
      return -1;
    pollfd pfd{sock, POLLIN, 0};
    const int ready = poll(&pfd, 1, kPollMs);
    if (ready < 0 && errno != EINTR) return 0;
    if (ready != 1) continue;
    const ssize_t n = recv(sock, bytes + got, sizeof *reply - got, MSG_DONTWAIT);
    if (n == 0) return 0;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return 0;
    }
    got += static_cast<size_t>(n);
  }
  return reply->magic == kMagic ? 1 : 0;
}

PreparedJob::~PreparedJob() {
  if (arena_ != nullptr) return;  // the lease ends with arena_
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

bool PreparedJob::prepare_in_arena(const KnnProblem &p, bool shared_rows, bool self_keys,
                                   bool cpu_stand_in) {
  const int64_t row = row_bytes(p.element, p.dim);
  uint64_t query_bytes, target_bytes;
  if (row < 0 || p.n_queries < 0 || p.n_targets < 0 ||
      __builtin_mul_overflow(static_cast<uint64_t>(row), static_cast<uint64_t>(p.n_queries),
                             &query_bytes) ||
      __builtin_mul_overflow(static_cast<uint64_t>(row), static_cast<uint64_t>(p.n_targets),
                             &target_bytes))
    return false;
  std::unique_ptr<ArenaJob> lease =
      lease_for_job(p.queries, query_bytes, p.targets, shared_rows ? 0 : target_bytes);
  if (lease == nullptr) return false;
  // A side not in the buffer is copied into the job's segment.
  int64_t queries_at = lease->offset_of(p.queries, query_bytes);
  if (queries_at < 0) queries_at = kPlaceHere;
  int64_t targets_at = shared_rows ? kPlaceHere : lease->offset_of(p.targets, target_bytes);
  if (targets_at < 0) targets_at = kPlaceHere;
  // The job's own regions (keys, results, targets not in the buffer) go in
  // a segment of its own: its size first, then the layout at its offset.
  WireHeader h;
  uint64_t end = 0;
  const char *why = nullptr;
  if (!plan_layout_at(p, shared_rows, self_keys, queries_at, targets_at, 0, &h, &end, &why))
    return false;
  const int64_t segment = lease->add_segment(end);
  if (segment < 0 || !plan_layout_at(p, shared_rows, self_keys, queries_at, targets_at,
                                     static_cast<uint64_t>(segment), &h, &end, &why))
    return false;
  if (cpu_stand_in) h.flags |= kCpuStandIn;
  // The service's check, here first: a job it would refuse goes the copying way.
  if (validate_header(h, lease->size()) != nullptr) return false;
  unsigned char *base = lease->base();
  if (queries_at == kPlaceHere) copy_in(base, h.queries, p.queries);
  if (targets_at == kPlaceHere) copy_in(base, h.targets, p.targets);
  if (self_keys) {
    copy_in(base, h.query_keys, p.query_keys);
    copy_in(base, h.target_keys, p.target_keys);
  }
  std::memcpy(base, &h, sizeof h);
  header_ = h;
  fd_ = lease->fd();
  base_ = base;
  size_ = lease->size();
  arena_ = std::move(lease);
  count_job_in_arena();
  return true;
}

KnnStatus PreparedJob::prepare(const KnnProblem &p, bool cpu_stand_in, char *errbuf,
                               size_t errlen) {
  if (p.range != KNN_RANGE_NONE || p.query_groups != nullptr || p.target_groups != nullptr) {
    copy_message(errbuf, errlen, "the GPU service runs k-NN joins only");
    return KNN_INVALID_ARGUMENT;
  }
  const bool shared_rows = p.queries == p.targets && p.n_queries == p.n_targets;
  const bool self_keys = p.query_keys != nullptr && p.target_keys != nullptr;
  const char *why = nullptr;
  if (!plan_layout(p, shared_rows, self_keys, &header_, &size_, &why)) {
    copy_message(errbuf, errlen, why);
    return KNN_INVALID_ARGUMENT;
  }
  if (prepare_in_arena(p, shared_rows, self_keys, cpu_stand_in)) return KNN_OK;
  if (cpu_stand_in) header_.flags |= kCpuStandIn;
  // fallocate: a lack of memory is an error here, not a SIGBUS in the
  // copy; MAP_POPULATE: the pages are mapped in one call, not one fault each.
  fd_ = memfd_create("knn_gpu_job", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void *mapped = MAP_FAILED;
  if (fd_ < 0 || fallocate(fd_, 0, 0, static_cast<off_t>(size_)) != 0 ||
      (mapped = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, 0)) ==
          MAP_FAILED) {
    std::snprintf(errbuf, errlen, "could not make the GPU service's job (%llu bytes): %s",
                  static_cast<unsigned long long>(size_), std::strerror(errno));
    return KNN_OUT_OF_MEMORY;
  }
  base_ = static_cast<unsigned char *>(mapped);
  std::memcpy(base_, &header_, sizeof header_);
  copy_in(base_, header_.queries, p.queries);
  copy_in(base_, header_.targets, p.targets);
  if (self_keys) {
    copy_in(base_, header_.query_keys, p.query_keys);
    copy_in(base_, header_.target_keys, p.target_keys);
  }
  if (fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    std::snprintf(errbuf, errlen, "could not seal the GPU service's job: %s", std::strerror(errno));
    return KNN_INTERNAL_ERROR;
  }
  return KNN_OK;
}

KnnStatus PreparedJob::submit(const char *path, int64_t gpu_memory_limit, int64_t *neighbors,
                              double *distances, KnnStats *stats, const int32_t *cancel,
                              char *errbuf, size_t errlen, int give_up_ms) {
  if (base_ == nullptr) {
    copy_message(errbuf, errlen, "no job prepared for the GPU service");
    return KNN_INTERNAL_ERROR;
  }
  auto *shared = reinterpret_cast<WireHeader *>(base_);
  shared->gpu_memory_limit = gpu_memory_limit;
  Socket sock;
  int failure = 0;
  refused_ = false;
  sock.fd = connect_to(path, errbuf, errlen, cancel, &failure);
  if (sock.fd < 0) {
    if (failure == ECANCELED) return KNN_CANCELLED;
    refused_ = failure == ECONNREFUSED || failure == ENOENT;
    return KNN_DEVICE_ERROR;
  }
  if (!send_job(sock.fd, fd_)) {
    std::snprintf(errbuf, errlen, "could not send the join to the GPU service: %s",
                  std::strerror(errno));
    if (arena_ != nullptr) arena_->spoil();
    return KNN_DEVICE_ERROR;
  }
  WireReply reply;
  const int got = await_reply(sock.fd, &reply, &shared->cancel, cancel, give_up_ms);
  // Without its answer the service may still read and write the job: a
  // shared row buffer is never used again.
  if (got != 1 && arena_ != nullptr) arena_->spoil();
  if (got < 0) {
    copy_message(errbuf, errlen, "cancelled; the GPU service did not stop the join in time");
    return KNN_CANCELLED;
  }
  if (got == 0) {
    copy_message(errbuf, errlen, "the GPU service ended during the join");
    return KNN_DEVICE_ERROR;
  }
  reply.message[sizeof reply.message - 1] = '\0';
  copy_message(errbuf, errlen, reply.message);
  const KnnStatus status = reply.status >= KNN_OK && reply.status <= KNN_INTERNAL_ERROR
                               ? static_cast<KnnStatus>(reply.status)
                               : KNN_INTERNAL_ERROR;
  if (stats != nullptr) {
    std::memcpy(stats, &shared->stats, sizeof *stats);
    stats->device_name[sizeof stats->device_name - 1] = '\0';
    stats->variant[sizeof stats->variant - 1] = '\0';
    if (stats->n_devices < 0 || stats->n_devices > KNN_MAX_DEVICES) stats->n_devices = 0;
  }
  // The results' places come from this side's header, never the mapping's;
  // their rows are checked as the engine's own are never: the caller reads
  // its targets at them.
  if (status == KNN_OK) {
    std::memcpy(neighbors, base_ + header_.neighbors.offset, header_.neighbors.length);
    std::memcpy(distances, base_ + header_.distances.offset, header_.distances.length);
    const int64_t slots = static_cast<int64_t>(header_.neighbors.length / sizeof(int64_t));
    for (int64_t i = 0; i < slots; i++)
      if (neighbors[i] < kNoNeighbor || neighbors[i] >= header_.n_targets) {
        std::snprintf(errbuf, errlen, "the GPU service returned target row %lld of %lld",
                      static_cast<long long>(neighbors[i]),
                      static_cast<long long>(header_.n_targets));
        return KNN_INTERNAL_ERROR;
      }
  }
  return status;
}

KnnStatus run(const char *path, bool cpu_stand_in, const KnnProblem &p, int64_t *neighbors,
              double *distances, KnnStats *stats, const int32_t *cancel, char *errbuf,
              size_t errlen, int give_up_ms) {
  PreparedJob job;
  const KnnStatus prepared = job.prepare(p, cpu_stand_in, errbuf, errlen);
  if (prepared != KNN_OK) return prepared;
  return job.submit(path, p.gpu_memory_limit, neighbors, distances, stats, cancel, errbuf, errlen,
                    give_up_ms);
}

}  // namespace knn::service

extern "C" void knn_engine_set_gpu_service(const char *socket_path, const char *lock_path,
                                           int32_t mode) {
  knn::guarded("knn_engine_set_gpu_service", nullptr, 0, [&] {
    std::lock_guard<std::mutex> lock(knn::service::settings_mutex);
    auto &s = knn::service::settings;
    const bool fits = socket_path != nullptr && std::strlen(socket_path) < sizeof s.path &&
                      lock_path != nullptr && std::strlen(lock_path) < sizeof s.lock;
    knn::copy_message(s.path, sizeof s.path, fits ? socket_path : "");
    knn::copy_message(s.lock, sizeof s.lock, fits ? lock_path : "");
    s.mode = fits && mode >= KNN_GPU_SERVICE_OFF && mode <= KNN_GPU_SERVICE_CPU_STAND_IN
                 ? mode
                 : KNN_GPU_SERVICE_OFF;
    return KNN_OK;
  });
}

extern "C" int knn_gpu_service_running(const char *lock_path) {
  return lock_path != nullptr && knn::service::running(lock_path) ? 1 : 0;
}

extern "C" int knn_gpu_service_listening(const char *socket_path, const char *lock_path) {
  return knn::service::listening(socket_path, lock_path) ? 1 : 0;
}
