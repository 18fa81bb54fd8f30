// gpu_service_server.cpp -- the GPU service's socket (gpu_service_server.h).

#include "gpu_service_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/un.h>
#include <linux/magic.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "entry_guard.h"
#include "gpu_service_wire.h"
#include "problem_check.h"
#include "signal_free_thread.h"

namespace knn::service {

namespace {

// How long a connection may take to send its job, and how often a running
// job's connection looks at its socket and at stop().
constexpr int kRequestTimeoutMs = 5000;
constexpr int kWatchMs = 20;

void close_fd(int &fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Receives the request and the memfd sent with it (-1 when none came, or
// when anything about the message is odd: every descriptor that came is
// closed then). Waits at most kRequestTimeoutMs, and not at all once
// stop_fd is readable (stop()); never blocks in the receive itself: a
// peer that sends part of a request and stays is only odd.
int receive_job(int sock, int stop_fd, JobRequest *req) {
  pollfd pfds[2] = {{sock, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  if (poll(pfds, 2, kRequestTimeoutMs) < 1 || (pfds[0].revents & POLLIN) == 0 ||
      (pfds[1].revents & POLLIN) != 0)
    return -1;
  iovec iov{req, sizeof *req};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  int fd = -1;
  bool odd = n != static_cast<ssize_t>(sizeof *req) || (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC));
  for (cmsghdr *c = n < 0 ? nullptr : CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
      if (fd < 0 && !odd) fd = received;
      else { close(received); odd = true; }
    }
  }
  if (odd) close_fd(fd);
  return fd;
}

void send_reply(int sock, KnnStatus status, const char *message) {
  WireReply reply;
  std::memset(&reply, 0, sizeof reply);
  reply.magic = kMagic;
  reply.status = status;
  copy_message(reply.message, sizeof reply.message, message);
  (void)send(sock, &reply, sizeof reply, MSG_NOSIGNAL);
}

// The job's header, read (with pread, once: the peer may rewrite it) from
// a tmpfs memfd, and that file's size. Anything else (a pipe, a socket, a
// regular file, a hugetlbfs memfd) is rejected before anything else is
// asked of it: the service reads and writes the job with pread and pwrite
// only (gpu_service_wire.h), which on tmpfs fail with an error, never a
// signal.
const char *tmpfs_header(int memfd, WireHeader *h, uint64_t *size) {
  struct statfs fs;
  if (fcntl(memfd, F_GET_SEALS) < 0 || fstatfs(memfd, &fs) != 0 ||
      fs.f_type != static_cast<decltype(fs.f_type)>(TMPFS_MAGIC))
    return "the job is not a memory file";
  struct stat st;
  if (fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
    return "the job is not a memory file";
  *size = static_cast<uint64_t>(st.st_size);
  std::memset(h, 0, sizeof *h);
  const size_t want = static_cast<size_t>(std::min<uint64_t>(sizeof *h, *size));
  if (pread(memfd, h, want, 0) != static_cast<ssize_t>(want)) return "could not read the job";
  return nullptr;
}

// Whole-region pread or pwrite (io): false (errno set) on an error or a
// file that ends first (the peer cut it: its own answer is spoilt, nothing
// more).
template <typename Io, typename Byte>
bool whole_region(Io io, int memfd, Byte *bytes, uint64_t length, uint64_t offset) {
  while (length > 0) {
    const ssize_t n = io(memfd, bytes, length, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    bytes += n;
    length -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

bool read_region(int memfd, unsigned char *to, uint64_t length, uint64_t offset) {
  return whole_region(pread, memfd, to, length, offset);
}

bool write_region(int memfd, const unsigned char *from, uint64_t length, uint64_t offset) {
  return whole_region(pwrite, memfd, from, length, offset);
}

// Memory for the jobs' copies, kept between jobs: a fresh mapping per job
// costs its pages' zeroing and faults (and the unmap) on every join, on the
// service's side of the backend's GPU slot. At most kPoolBuffers mappings
// of at most kPoolBufferBytes each are kept, kPoolBytes in all; larger or
// surplus ones are unmapped after their job.
constexpr size_t kPoolBuffers = 8;
constexpr uint64_t kPoolBufferBytes = uint64_t{256} << 20;
constexpr uint64_t kPoolBytes = uint64_t{512} << 20;
constexpr uint64_t kPoolStep = uint64_t{2} << 20;

class JobMemoryPool {
 public:
  struct Buffer {
    unsigned char *base = nullptr;
    uint64_t size = 0;
  };
  // The smallest kept buffer of at least `bytes`, or a new mapping ({} when none can be made).
  Buffer take(uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto best = kept_.end();
      for (auto it = kept_.begin(); it != kept_.end(); ++it)
        if (it->size >= bytes && (best == kept_.end() || it->size < best->size)) best = it;
      if (best != kept_.end()) {
        const Buffer b = *best;
        kept_bytes_ -= b.size;
        kept_.erase(best);
        return b;
      }
    }
    const uint64_t size = (bytes + kPoolStep - 1) / kPoolStep * kPoolStep;
    // MAP_POPULATE: the pages come in one call, not one fault each.
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return {};
    return {static_cast<unsigned char *>(p), size};
  }
  void give(Buffer b) {
    if (b.base == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (b.size <= kPoolBufferBytes && kept_.size() < kPoolBuffers &&
          kept_bytes_ + b.size <= kPoolBytes) {
        kept_.push_back(b);
        kept_bytes_ += b.size;
        return;
      }
    }
    munmap(b.base, b.size);
  }

 private:
  std::mutex mutex_;
  std::vector<Buffer> kept_;
  uint64_t kept_bytes_ = 0;
};

JobMemoryPool &job_memory() {
  static JobMemoryPool *pool = new JobMemoryPool();  // never destroyed: jobs may outlive statics
  return *pool;
}

// The service's own copy of a validated job: its regions packed in memory
// of the service's (anonymous, kept between jobs), the inputs read from the
// peer's memfd.
struct JobCopy {
  WireHeader packed{};
  unsigned char *base = nullptr;
  uint64_t size = 0;
  JobMemoryPool::Buffer buffer;
  ~JobCopy() { job_memory().give(buffer); }
  // nullptr, or why not (*status: what to answer).
  const char *read(int memfd, const WireHeader &h, KnnStatus *status) {
    packed = packed_layout(h, &size);
    buffer = job_memory().take(size);
    if (buffer.base == nullptr) {
      *status = KNN_OUT_OF_MEMORY;
      return "the GPU service has no memory for the job's rows";
    }
    base = buffer.base;
    const Region *from[] = {&h.queries, &h.targets, &h.query_keys, &h.target_keys};
    const Region *to[] = {&packed.queries, &packed.targets, &packed.query_keys,
                          &packed.target_keys};
    for (int i = 0; i < 4; i++)
      if (!read_region(memfd, base + to[i]->offset, from[i]->length, from[i]->offset)) {
        *status = KNN_INVALID_ARGUMENT;
        return "could not read the job's rows";
      }
    // A kept buffer holds an earlier job's bytes: the results start as a
    // fresh mapping's would, so that no byte of another join can go back.
    std::memset(base, 0, packed.queries.offset);
    std::memset(base + packed.neighbors.offset, 0, size - packed.neighbors.offset);
    return nullptr;
  }
};

}  // namespace

struct Server::Connection {
  int fd = -1;
  std::thread thread;
  std::atomic<bool> done{false};
};

std::unique_ptr<Server> Server::listen(const char *path, RunFunction run, char *why,
                                       size_t why_len) {
  std::unique_ptr<Server> s(new Server());
  s->path_ = path != nullptr ? path : "";
  s->run_ = std::move(run);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string temporary = s->path_ + ".new";
  if (s->path_.empty() || temporary.size() >= sizeof addr.sun_path) {
    copy_message(why, why_len, "the service's socket path is empty or too long");
    return nullptr;
  }
  std::memcpy(addr.sun_path, temporary.c_str(), temporary.size() + 1);
  (void)unlink(s->path_.c_str());  // a dead service's
  (void)unlink(temporary.c_str());
  s->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0 || pipe2(s->wake_, O_CLOEXEC) != 0 ||
      bind(s->listen_fd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 ||
      chmod(temporary.c_str(), 0600) != 0 || ::listen(s->listen_fd_, 128) != 0 ||
      rename(temporary.c_str(), s->path_.c_str()) != 0) {
    std::snprintf(why, why_len, "could not listen on %s: %s", s->path_.c_str(),
                  std::strerror(errno));
    (void)unlink(temporary.c_str());
    s->stopped_ = true;  // nothing to stop but the descriptors
    close_fd(s->listen_fd_);
    close_fd(s->wake_[0]);
    close_fd(s->wake_[1]);
    return nullptr;
  }
  Server *raw = s.get();
  try {
    s->acceptor_ = start_signal_free_thread([raw] { raw->accept_loop(); });
  } catch (const std::exception &e) {
    copy_message(why, why_len, "could not start the service's thread");
    s->stopped_ = true;
    (void)unlink(s->path_.c_str());
    close_fd(s->listen_fd_);
    close_fd(s->wake_[0]);
    close_fd(s->wake_[1]);
    return nullptr;
  }
  return s;
}

Server::~Server() { stop(); }

void Server::accept_loop() noexcept {
  while (!stopping_.load()) {
    pollfd pfds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(pfds, 2, 1000) < 0 && errno != EINTR) break;
    if (stopping_.load()) break;
    reap(false);
    if ((pfds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    try {
      std::unique_ptr<Connection> c(new Connection());
      c->fd = fd;
      Connection *raw = c.get();
      std::lock_guard<std::mutex> lock(mutex_);
      c->thread = start_signal_free_thread([this, raw] { serve(raw); });
      connections_.push_back(std::move(c));
    } catch (...) {
      close(fd);  // no thread or no memory: the backend sees the end of the socket
    }
  }
}

// Joins finished connection threads (all: every one, after stop).
void Server::reap(bool all) noexcept {
  std::vector<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (all || (*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto &c : finished)
    if (c->thread.joinable()) c->thread.join();
}

void Server::serve(Connection *c) noexcept {
  JobRequest req{};
  int memfd = receive_job(c->fd, wake_[0], &req);
  const char *rejected = nullptr;
  KnnStatus rejected_status = KNN_INVALID_ARGUMENT;
  WireHeader h;
  uint64_t file_size = 0;
  JobCopy job;
  if (memfd < 0) rejected = "no job received";
  else if (req.magic != kMagic || req.version != kVersion) rejected = "not a job request of this version";
  else rejected = tmpfs_header(memfd, &h, &file_size);
  if (rejected == nullptr) rejected = validate_header(h, file_size);
  if (rejected == nullptr) rejected = job.read(memfd, h, &rejected_status);
  if (rejected == nullptr)  // the engines' own check (enums, threads), before a thread starts
    rejected = problem_invalid_reason(
        problem_of(job.packed, job.base),
        reinterpret_cast<int64_t *>(job.base + job.packed.neighbors.offset),
        reinterpret_cast<double *>(job.base + job.packed.distances.offset));
  if (rejected != nullptr) {
    send_reply(c->fd, rejected_status, rejected);
  } else {
    const WireHeader &packed = job.packed;
    // Set by the watch below (the backend's cancel word or byte, its end,
    // stop()); read by the engine.
    int32_t cancel = 0;
    const KnnProblem problem = problem_of(packed, job.base);
    auto *neighbors = reinterpret_cast<int64_t *>(job.base + packed.neighbors.offset);
    auto *distances = reinterpret_cast<double *>(job.base + packed.distances.offset);
    const bool stand_in = (h.flags & kCpuStandIn) != 0;
    KnnStats stats{};
    char message[kMessageBytes] = "";
    std::atomic<bool> ran{false};
    KnnStatus status = KNN_INTERNAL_ERROR;
    // The job's end wakes the watch below at once (not at its next look):
    // the reply, and the backend's GPU slot, come back without delay.
    int ended = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    const auto mark_ended = [&] {
      ran.store(true);
      const uint64_t one = 1;
      if (ended >= 0) (void)!write(ended, &one, sizeof one);
    };
    std::thread worker;
    try {
      worker = start_signal_free_thread([&] {
        status = guarded("GPU service job", message, sizeof message, [&] {
          return run_(problem, stand_in, neighbors, distances, &stats, &cancel, message,
                      sizeof message);
        });
        mark_ended();
      });
    } catch (...) {
      copy_message(message, sizeof message, "the GPU service could not start a thread");
      status = KNN_OUT_OF_MEMORY;
      mark_ended();
    }
    // Watch the backend while the job runs: its cancel or its end (or stop()) cancels.
    bool peer_gone = false;
    while (!ran.load()) {
      pollfd pfds[2] = {{c->fd, POLLIN, 0}, {ended, POLLIN, 0}};
      (void)poll(pfds, ended >= 0 ? 2 : 1, kWatchMs);
      const bool peer_ready = (pfds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
      bool cancelled = false;
      if (!peer_gone && peer_ready) {
        char byte;
        const ssize_t n = recv(c->fd, &byte, 1, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
            (pfds[0].revents & (POLLHUP | POLLERR)) != 0)
          peer_gone = true;
        cancelled = n == 1;  // the backend's cancel byte
      }
      int32_t word = 0;
      if (!cancelled && pread(memfd, &word, sizeof word, offsetof(WireHeader, cancel)) ==
                            static_cast<ssize_t>(sizeof word))
        cancelled = word != 0;
      if (cancelled || peer_gone || stopping_.load())
        __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
      // A gone peer's socket stays readable: look again after a pause.
      if (peer_gone && peer_ready && !ran.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(kWatchMs));
    }
    if (worker.joinable()) worker.join();
    close_fd(ended);
    // Stopping: no answer, so that the backend reads the service's end.
    if (!stopping_.load() && !peer_gone) {
      // The results and statistics go back with pwrite: a peer's memfd that
      // cannot take them (cut short, out of memory) is an error answer.
      const bool written =
          (status != KNN_OK ||
           (write_region(memfd, reinterpret_cast<const unsigned char *>(neighbors),
                         h.neighbors.length, h.neighbors.offset) &&
            write_region(memfd, reinterpret_cast<const unsigned char *>(distances),
                         h.distances.length, h.distances.offset))) &&
          write_region(memfd, reinterpret_cast<const unsigned char *>(&stats), sizeof stats,
                       offsetof(WireHeader, stats));
      if (!written) {
        std::snprintf(message, sizeof message, "the GPU service could not write the results: %s",
                      std::strerror(errno));
        status = KNN_OUT_OF_MEMORY;
      }
      answered_++;  // before the reply: a backend that has it finds the job counted
      send_reply(c->fd, status, message);
    }
  }
  close_fd(memfd);
  close_fd(c->fd);
  c->done.store(true);
}

void Server::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_.store(true);
  if (wake_[1] >= 0) {
    const char byte = 1;
    (void)!write(wake_[1], &byte, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  // No new connection comes; the running ones see stopping_ and end.
  (void)unlink(path_.c_str());
  close_fd(listen_fd_);
  reap(true);
  close_fd(wake_[0]);
  close_fd(wake_[1]);
}

}  // namespace knn::service
