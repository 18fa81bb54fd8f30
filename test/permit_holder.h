// permit_holder.h -- the tests' other process holding a GPU context permit
// (gpu_context_permit.h): a forked child that takes one, says so, and
// keeps it until told to exit or killed. The child touches no GPU.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "gpu_context_permit.h"

namespace permit_test {

// A fresh directory for permit files, removed with them at the end.
struct PermitDir {
  std::string path;
  PermitDir() {
    char tmpl[] = "/tmp/knn_permit_test.XXXXXX";
    const char *made = mkdtemp(tmpl);
    if (made != nullptr) path = made;
  }
  ~PermitDir() {
    for (int i = 0; i < 8; i++) {
      const std::string f = path + "/knn_gpu_context." + std::to_string(i);
      (void)unlink(f.c_str());
      (void)rmdir(f.c_str());
    }
    (void)rmdir(path.c_str());
  }
};

class PermitHolder {
 public:
  PermitHolder() = default;
  PermitHolder(const PermitHolder &) = delete;
  PermitHolder &operator=(const PermitHolder &) = delete;
  ~PermitHolder() {
    if (pid_ > 0) {
      (void)kill(pid_, SIGKILL);
      (void)wait_exit();
    }
    close_fds();
  }

  // Forks the child and waits until it says whether it took a permit of
  // dir (max_contexts of them); true when it holds one.
  bool start(const std::string &dir, int32_t max_contexts) {
    int ready[2], release[2];
    if (pipe(ready) != 0) return false;
    if (pipe(release) != 0) {
      close(ready[0]);
      close(ready[1]);
      return false;
    }
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      close(release[1]);
      knn::GpuContextPermit permit;
      const char answer =
          permit.try_take(dir.c_str(), max_contexts, nullptr, 0) ==
                  knn::GpuContextPermit::Outcome::kTaken
              ? 'T'
              : 'N';
      if (write(ready[1], &answer, 1) != 1) _exit(2);
      char c;
      (void)!read(release[0], &c, 1);  // EOF: the parent lets go
      _exit(0);
    }
    close(ready[1]);
    close(release[0]);
    ready_fd_ = ready[0];
    release_fd_ = release[1];
    if (pid_ < 0) return false;
    char answer = 0;
    return read(ready_fd_, &answer, 1) == 1 && answer == 'T';
  }

  // Tells the child to exit; its wait status.
  int let_go() {
    if (release_fd_ >= 0) close(release_fd_);
    release_fd_ = -1;
    return wait_exit();
  }

  // Kills the child; its wait status.
  int kill_it() {
    (void)kill(pid_, SIGKILL);
    return wait_exit();
  }

 private:
  int wait_exit() {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, 0) == pid_) pid_ = -1;
    return status;
  }
  void close_fds() {
    if (ready_fd_ >= 0) close(ready_fd_);
    if (release_fd_ >= 0) close(release_fd_);
    ready_fd_ = release_fd_ = -1;
  }
  pid_t pid_ = -1;
  int ready_fd_ = -1;
  int release_fd_ = -1;
};

}  // namespace permit_test
