// gpu_service_rows.cpp -- this process's shared row buffer for the GPU
// service (gpu_service_rows.h; the C entries knn_shared_rows_* of
// knn_engine.h).

#include "gpu_service_rows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "entry_guard.h"
#include "gpu_service_wire.h"

struct KnnSharedRows {
  std::shared_ptr<knn::service::Arena> arena;
  uint64_t offset = 0;
  uint64_t capacity = 0;  // bytes the owner may write (all backed)
  uint64_t backed = 0;    // bytes from offset allocated (fallocate), >= capacity
  uint64_t room = 0;      // bytes from offset that belong to it (address space)
};

namespace knn::service {

namespace {

constexpr uint64_t kPage = 4096;
// Backing (fallocate) goes in steps of this past what a segment's owner
// asked for; the file's size and the mapping grow ahead, for free.
constexpr uint64_t kStep = uint64_t{2} << 20;
constexpr uint64_t kFirstBytes = uint64_t{4} << 20;
constexpr uint64_t kMostReserved = uint64_t{1} << 40;
constexpr uint64_t kLeastReserved = uint64_t{256} << 20;

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

void forget_current(const Arena *spoilt);

// knn_shared_rows_live, _jobs and _fail_growth (tests).
std::atomic<int64_t> live_segments{0};
std::atomic<int64_t> jobs_in_arena{0};
std::atomic<bool> growth_fails{false};

}  // namespace

void count_job_in_arena() { jobs_in_arena++; }

uint64_t reservation_bytes(uint64_t address_space_limit) {
  // A quarter of the limit at most: the rest is the backend's.
  const uint64_t quarter = address_space_limit / 4 / kStep * kStep;
  if (quarter < kLeastReserved) return 0;
  return std::min(kMostReserved, quarter);
}

class Arena {
 public:
  static std::shared_ptr<Arena> make() {
    std::shared_ptr<Arena> a(new Arena());
    a->fd = memfd_create("knn_gpu_rows", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (a->fd < 0 || fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) return nullptr;
    // The reservation counts against RLIMIT_AS (ulimit -v): sized from it,
    // or no buffer at all under a small one (the rows go elsewhere).
    rlimit limit{};
    const uint64_t most =
        getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY
            ? kMostReserved
            : reservation_bytes(static_cast<uint64_t>(limit.rlim_cur));
    for (uint64_t reserve = most; reserve >= kLeastReserved; reserve /= 16) {
      void *p = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (p == MAP_FAILED) continue;
      a->base = static_cast<unsigned char *>(p);
      a->reserved = reserve;
      // The header's page, written by every job.
      if (!a->extend(kPage) || !a->back(0, kPage)) return nullptr;
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

  // Under mutex: the memfd's size (and the mapping) up to at least end:
  // address space and a sparse file, nothing allocated.
  bool extend(uint64_t end) {
    if (spoilt || end > reserved) return false;
    if (end <= size) return true;
    const uint64_t want =
        std::min(reserved, round_up(std::max({end, size * 2, kFirstBytes}), kStep));
    if (ftruncate(fd, static_cast<off_t>(want)) != 0) return false;
    void *p = mmap(base + size, want - size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                   static_cast<off_t>(size));
    if (p == MAP_FAILED) {
      // The reservation may have a gap now: never use it again, and the
      // next segment starts a new arena rather than the memory of its own.
      spoilt = true;
      forget_current(this);
      return false;
    }
    size = want;
    return true;
  }

  // Under mutex: pages [from, to) allocated -- fallocate, so that a lack of
  // memory is an error here, not a SIGBUS when they are written -- and
  // mapped in one call rather than one fault each.
  bool back(uint64_t from, uint64_t to) {
    if (to <= from) return true;
    if (fallocate(fd, 0, static_cast<off_t>(from), static_cast<off_t>(to - from)) != 0)
      return false;
#ifdef MADV_POPULATE_WRITE
    (void)madvise(base + from, to - from, MADV_POPULATE_WRITE);
#endif
    return true;
  }

  // Under mutex: pages [from, to) given back (a hole; the size stays).
  void give_back(uint64_t from, uint64_t to) {
    if (to > from)
      (void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                      static_cast<off_t>(to - from));
  }

  // Under mutex: s's first bytes writable: backed up to the next step
  // (within its room), the file extended first.
  bool back_segment(KnnSharedRows *s, uint64_t bytes) {
    if (bytes <= s->backed) return true;
    if (bytes > s->room) return false;
    const uint64_t to = std::min(s->room, round_up(bytes, kStep));
    if (!extend(s->offset + to) || !back(s->offset + s->backed, s->offset + to)) return false;
    s->backed = to;
    return true;
  }

  // Under mutex: where a segment of room bytes goes: the first gap between
  // live segments that holds it, else the top (live stays by offset);
  // *gap: the bytes free from *offset on (the rest of the reservation at
  // the top).
  std::vector<KnnSharedRows *>::iterator place(uint64_t room, uint64_t *offset, uint64_t *gap) {
    uint64_t from = kPage;
    for (auto it = live.begin(); it != live.end(); ++it) {
      if ((*it)->offset >= from + room) {
        *offset = from;
        *gap = (*it)->offset - from;
        return it;
      }
      from = round_up((*it)->offset + (*it)->room, kPage);
    }
    *offset = from;
    *gap = reserved - std::min(reserved, from);
    return live.end();
  }

  // Under mutex: s (not in live) placed with room for at least room bytes
  // and its first bytes backed; false (s unchanged) on failure. A segment
  // at the top keeps room bytes of address space (more than it backs)
  // until it grows again.
  bool settle(KnnSharedRows *s, uint64_t bytes, uint64_t room) {
    uint64_t offset = 0, gap = 0;
    const auto at = place(room, &offset, &gap);
    KnnSharedRows placed;
    placed.offset = offset;
    placed.room = gap;
    if (!back_segment(&placed, bytes)) return false;
    if (at == live.end()) placed.room = std::max(placed.backed, room);
    s->offset = placed.offset;
    s->backed = placed.backed;
    s->room = placed.room;
    live.insert(at, s);
    high_water = std::max(high_water, s->offset + s->backed);
    return true;
  }

  // Under mutex: a new segment of bytes, or nullptr.
  KnnSharedRows *add(const std::shared_ptr<Arena> &self, uint64_t bytes) {
    if (spoilt) return nullptr;
    std::unique_ptr<KnnSharedRows> s(new KnnSharedRows());
    if (!settle(s.get(), bytes, round_up(std::max<uint64_t>(bytes, 1), kPage))) return nullptr;
    s->arena = self;
    s->capacity = bytes;
    live_segments++;
    return s.release();
  }

  bool grow(KnnSharedRows *s, uint64_t bytes) {
    if (bytes <= s->capacity) return true;
    if (spoilt || growth_fails.load()) return false;
    const auto it = std::find(live.begin(), live.end(), s);
    const bool top = it + 1 == live.end();
    if (top || bytes <= s->room) {  // in place
      const uint64_t room = s->room;
      if (top) s->room = reserved - std::min(reserved, s->offset);
      const bool backed = back_segment(s, bytes);
      if (top) s->room = std::max(room, s->backed);
      if (!backed) return false;
    } else {  // another segment lies above: move where twice this fits
      live.erase(it);
      KnnSharedRows old = *s;
      if (!settle(s, bytes, round_up(std::max<uint64_t>(bytes, 2 * s->capacity), kPage))) {
        live.insert(std::upper_bound(live.begin(), live.end(), s, by_offset), s);
        return false;
      }
      std::memcpy(base + s->offset, base + old.offset, old.capacity);
      give_back(std::max(old.offset, kept), old.offset + old.backed);  // a gap now
    }
    s->capacity = bytes;
    high_water = std::max(high_water, s->offset + s->backed);
    return true;
  }

  void remove(KnnSharedRows *s) {
    live.erase(std::find(live.begin(), live.end(), s));
    live_segments--;
    if (!live.empty()) give_back(std::max(s->offset, kept), s->offset + s->backed);
    trim_if_idle();
  }

  // Under mutex: once nothing uses the arena, pages past what the last use
  // needed (at most kKeepBytes) go back to the system; the size stays.
  void trim_if_idle() {
    if (!live.empty() || header_leased || spoilt) return;
    kept = std::max(kPage, std::min(round_up(high_water, kStep), kKeepBytes));
    high_water = 0;
    give_back(kept, size);
  }

  static bool by_offset(const KnnSharedRows *a, const KnnSharedRows *b) {
    return a->offset < b->offset;
  }

  std::mutex mutex;
  int fd = -1;
  unsigned char *base = nullptr;
  uint64_t reserved = 0;
  uint64_t size = 0;  // the memfd's size, all of it mapped at base (mostly holes)
  uint64_t kept = 0;  // pages below this stay allocated for the next join
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

void forget_current(const Arena *spoilt) {
  std::lock_guard<std::mutex> lock(current_mutex);  // after the arena's: that order only
  if (current.get() == spoilt) current.reset();
}

std::shared_ptr<Arena> current_arena(bool make) {
  {
    std::lock_guard<std::mutex> lock(current_mutex);
    if (current != nullptr || !make) return current;
  }
  // Made outside current_mutex: a failing mmap in it calls forget_current.
  std::shared_ptr<Arena> made = Arena::make();
  std::lock_guard<std::mutex> lock(current_mutex);
  if (current == nullptr) current = std::move(made);
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

int64_t knn_shared_rows_live(void) { return knn::service::live_segments.load(); }
int64_t knn_shared_rows_jobs(void) { return knn::service::jobs_in_arena.load(); }
void knn_shared_rows_fail_growth(int fail) { knn::service::growth_fails.store(fail != 0); }

}  // extern "C"
