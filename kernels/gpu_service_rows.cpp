// gpu_service_rows.cpp -- this process's shared row buffer for the GPU
// service (gpu_service_rows.h; the C entries knn_shared_rows_* of
// knn_engine.h).

#include "gpu_service_rows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "entry_guard.h"
#include "gpu_service_wire.h"

struct KnnSharedRows {
  std::shared_ptr<knn::service::Arena> arena;
  uint64_t offset = 0;
  uint64_t capacity = 0;
};

namespace knn::service {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kStep = uint64_t{2} << 20;  // the memfd grows by multiples of this
constexpr uint64_t kFirstBytes = uint64_t{4} << 20;
// Address space reserved for one arena (PROT_NONE until the memfd covers
// it); a smaller one where that much is refused (RLIMIT_AS).
constexpr uint64_t kReserveBytes[] = {uint64_t{1} << 40, uint64_t{1} << 36, uint64_t{1} << 32};

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

class Arena {
 public:
  static std::shared_ptr<Arena> make() {
    std::shared_ptr<Arena> a(new Arena());
    a->fd = memfd_create("knn_gpu_rows", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    // Never smaller: the service maps what it validated. Growing stays open.
    if (a->fd < 0 || fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) return nullptr;
    for (uint64_t reserve : kReserveBytes) {
      void *p = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (p == MAP_FAILED) continue;
      a->base = static_cast<unsigned char *>(p);
      a->reserved = reserve;
      return a;
    }
    return nullptr;
  }

  ~Arena() {
    if (base != nullptr) munmap(base, reserved);
    if (fd >= 0) close(fd);
  }

  // Under mutex: whether [p, p + length) lies in the memfd's pages after
  // the header's.
  bool holds(const void *p, uint64_t length) const {
    const auto *q = static_cast<const unsigned char *>(p);
    return q >= base + kPage && q <= base + size &&
           length <= static_cast<uint64_t>(base + size - q);
  }

  // Under mutex: the end of the highest live segment (the header's page
  // when none).
  uint64_t top() const { return live.empty() ? kPage : live.back()->offset + live.back()->capacity; }

  // Under mutex: pages backed and mapped up to at least end. fallocate
  // rather than faults: a lack of memory is an error, not a SIGBUS.
  bool ensure(uint64_t end) {
    if (spoilt || end > reserved) return false;
    if (end <= backed) return true;
    const uint64_t want =
        std::min(reserved, round_up(std::max({end, backed * 2, kFirstBytes}), kStep));
    if (fallocate(fd, 0, static_cast<off_t>(backed), static_cast<off_t>(want - backed)) != 0)
      return false;
    if (want > size) {
      void *p = mmap(base + size, want - size, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, static_cast<off_t>(size));
      if (p == MAP_FAILED) {
        spoilt = true;  // the reservation may have a gap now: never use it again
        return false;
      }
    }
#ifdef MADV_POPULATE_WRITE
    // Pages given back by trim() and backed again: map them now, not one fault each.
    if (backed < size)
      (void)madvise(base + backed, std::min(want, size) - backed, MADV_POPULATE_WRITE);
#endif
    size = std::max(size, want);
    backed = want;
    return true;
  }

  // Under mutex: a new segment of bytes at the top, or nullptr.
  KnnSharedRows *add(const std::shared_ptr<Arena> &self, uint64_t bytes) {
    const uint64_t offset = round_up(top(), kPage);
    if (!ensure(offset + std::max<uint64_t>(bytes, 1))) return nullptr;
    std::unique_ptr<KnnSharedRows> s(new KnnSharedRows());
    s->arena = self;
    s->offset = offset;
    s->capacity = bytes;
    live.push_back(s.get());
    high_water = std::max(high_water, offset + bytes);
    return s.release();
  }

  bool grow(KnnSharedRows *s, uint64_t bytes) {
    if (bytes <= s->capacity) return true;
    if (spoilt) return false;
    if (live.back() == s) {
      if (!ensure(s->offset + bytes)) return false;
      s->capacity = bytes;
    } else {  // another segment lies above: move to the top
      const uint64_t offset = round_up(top(), kPage);
      if (!ensure(offset + bytes)) return false;
      std::memcpy(base + offset, base + s->offset, s->capacity);
      live.erase(std::find(live.begin(), live.end(), s));
      live.push_back(s);
      s->offset = offset;
      s->capacity = bytes;
    }
    high_water = std::max(high_water, s->offset + bytes);
    return true;
  }

  void remove(KnnSharedRows *s) {
    live.erase(std::find(live.begin(), live.end(), s));
    trim_if_idle();
  }

  // Under mutex: once nothing uses the arena, pages past what the last use
  // needed (at most kKeepBytes) go back to the system; the size stays.
  void trim_if_idle() {
    if (!live.empty() || header_leased || spoilt) return;
    const uint64_t keep = std::min(round_up(high_water, kStep), kKeepBytes);
    high_water = 0;
    if (backed <= keep) return;
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(keep),
                  static_cast<off_t>(backed - keep)) == 0)
      backed = keep;
  }

  std::mutex mutex;
  int fd = -1;
  unsigned char *base = nullptr;
  uint64_t reserved = 0;
  uint64_t size = 0;    // the memfd's size, all of it mapped at base
  uint64_t backed = 0;  // pages allocated (fallocate) from 0 up to here
  uint64_t high_water = 0;
  std::vector<KnnSharedRows *> live;  // by offset
  bool header_leased = false;
  bool spoilt = false;

 private:
  Arena() = default;
};

namespace {

std::mutex current_mutex;
std::shared_ptr<Arena> current;  // where new segments go; reset when spoilt

std::shared_ptr<Arena> current_arena(bool make) {
  std::lock_guard<std::mutex> lock(current_mutex);
  if (current == nullptr && make) current = Arena::make();
  return current;
}

}  // namespace

std::unique_ptr<ArenaJob> lease_for_job(const void *queries, uint64_t query_bytes,
                                        const void *targets, uint64_t target_bytes) {
  std::shared_ptr<Arena> arena = current_arena(false);
  if (arena == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(arena->mutex);
  if (arena->spoilt || arena->header_leased ||
      (!arena->holds(queries, query_bytes) && !arena->holds(targets, target_bytes)))
    return nullptr;
  arena->header_leased = true;
  return std::unique_ptr<ArenaJob>(new ArenaJob(arena));
}

ArenaJob::~ArenaJob() {
  std::lock_guard<std::mutex> lock(arena_->mutex);
  arena_->header_leased = false;
  if (segment_ != nullptr) {
    arena_->remove(segment_);
    delete segment_;  // its reference to the arena goes after the lock
  } else {
    arena_->trim_if_idle();
  }
}

int ArenaJob::fd() const { return arena_->fd; }
unsigned char *ArenaJob::base() const { return arena_->base; }

uint64_t ArenaJob::size() const {
  std::lock_guard<std::mutex> lock(arena_->mutex);
  return arena_->size;
}

int64_t ArenaJob::offset_of(const void *p, uint64_t length) const {
  std::lock_guard<std::mutex> lock(arena_->mutex);
  if (!arena_->holds(p, length)) return -1;
  return static_cast<const unsigned char *>(p) - arena_->base;
}

int64_t ArenaJob::add_segment(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(arena_->mutex);
  if (segment_ != nullptr) return -1;
  segment_ = arena_->add(arena_, bytes);
  return segment_ == nullptr ? -1 : static_cast<int64_t>(segment_->offset);
}

void ArenaJob::spoil() {
  {
    std::lock_guard<std::mutex> lock(arena_->mutex);
    arena_->spoilt = true;
  }
  std::lock_guard<std::mutex> lock(current_mutex);
  if (current == arena_) current.reset();
}

ArenaState current_arena_state() {
  ArenaState st;
  std::shared_ptr<Arena> arena = current_arena(false);
  if (arena == nullptr) return st;
  std::lock_guard<std::mutex> lock(arena->mutex);
  st.fd = arena->fd;
  st.size = arena->size;
  st.live_segments = arena->live.size();
  st.spoilt = arena->spoilt;
  return st;
}

}  // namespace knn::service

extern "C" {

KnnSharedRows *knn_shared_rows_create(size_t bytes) {
  KnnSharedRows *made = nullptr;
  knn::guarded("knn_shared_rows_create", nullptr, 0, [&] {
    std::shared_ptr<knn::service::Arena> arena = knn::service::current_arena(true);
    if (arena == nullptr) return KNN_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> lock(arena->mutex);
    made = arena->add(arena, bytes);
    return made != nullptr ? KNN_OK : KNN_OUT_OF_MEMORY;
  });
  return made;
}

int knn_shared_rows_grow(KnnSharedRows *rows, size_t bytes) {
  if (rows == nullptr) return 0;
  return knn::guarded("knn_shared_rows_grow", nullptr, 0, [&] {
           std::lock_guard<std::mutex> lock(rows->arena->mutex);
           return rows->arena->grow(rows, bytes) ? KNN_OK : KNN_OUT_OF_MEMORY;
         }) == KNN_OK
             ? 1
             : 0;
}

void *knn_shared_rows_data(const KnnSharedRows *rows) {
  void *data = nullptr;
  if (rows == nullptr) return nullptr;
  knn::guarded("knn_shared_rows_data", nullptr, 0, [&] {
    std::lock_guard<std::mutex> lock(rows->arena->mutex);
    data = rows->arena->base + rows->offset;
    return KNN_OK;
  });
  return data;
}

void knn_shared_rows_free(KnnSharedRows *rows) {
  if (rows == nullptr) return;
  knn::guarded("knn_shared_rows_free", nullptr, 0, [&] {
    std::shared_ptr<knn::service::Arena> arena = rows->arena;  // outlives the segment
    {
      std::lock_guard<std::mutex> lock(arena->mutex);
      arena->remove(rows);
    }
    delete rows;
    return KNN_OK;
  });
}

}  // extern "C"
