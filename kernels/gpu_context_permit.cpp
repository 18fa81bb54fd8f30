// gpu_context_permit.cpp -- permits to hold GPU contexts
// (gpu_context_permit.h).
#include "gpu_context_permit.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace knn {

namespace {

// Writes the reason (printf-style) and answers kFailed.
template <typename... Args>
GpuContextPermit::Outcome failed(char *why, size_t why_len, const char *fmt, Args... args) {
  if (why != nullptr && why_len > 0) std::snprintf(why, why_len, fmt, args...);
  return GpuContextPermit::Outcome::kFailed;
}

}  // namespace

GpuContextPermit::Outcome GpuContextPermit::try_take(const char *dir, int32_t max_contexts,
                                                     char *why, size_t why_len) noexcept {
  if (why != nullptr && why_len > 0) why[0] = '\0';
  if (fd_ >= 0) return Outcome::kTaken;
  if (max_contexts <= 0) return Outcome::kNotNeeded;
  if (dir == nullptr || dir[0] == '\0')
    return failed(why, why_len, "no directory for the GPU context permits");
  for (int32_t i = 0; i < max_contexts; i++) {
    char path[PATH_MAX];
    if (std::snprintf(path, sizeof path, "%s/knn_gpu_context.%d", dir, static_cast<int>(i)) >=
        static_cast<int>(sizeof path))
      return failed(why, why_len, "GPU context permit directory name too long");
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, S_IRUSR | S_IWUSR);
    if (fd < 0)
      return failed(why, why_len, "could not open GPU context permit file \"%.300s\": %s", path,
                    std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return failed(why, why_len, "GPU context permit file \"%.300s\" is not a regular file",
                    path);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      fd_ = fd;
      index_ = i;
      return Outcome::kTaken;
    }
    const int err = errno;
    close(fd);
    if (err != EWOULDBLOCK && err != EINTR)
      return failed(why, why_len, "could not lock GPU context permit file \"%.300s\": %s", path,
                    std::strerror(err));
  }
  return Outcome::kNoneFree;
}

void GpuContextPermit::give_back() noexcept {
  if (fd_ < 0) return;
  (void)close(fd_);  // drops the lock: the permit is free for the next process
  fd_ = -1;
  index_ = -1;
}

}  // namespace knn
