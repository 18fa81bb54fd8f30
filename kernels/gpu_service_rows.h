// gpu_service_rows.h -- this process's shared row buffer for the GPU
// service (knn_gpu.gpu_service): one memfd, kept mapped across joins,
// into which a backend reads its join's rows (knn_shared_rows_* of
// knn_engine.h, used by extension/knn_matrix.c), so that the job sent to
// the service (gpu_service_client.h) is that memfd itself: no copy of the
// rows into a fresh memfd per join, no pages made and faulted per join.
//
// The memfd is mapped over one reservation of address space, so that a
// segment's rows never move while the memfd grows (a matrix keeps its
// pointer); only the last segment grows in place (a segment below another
// one that grows moves to the top, as a realloc would). Offset 0 holds a
// job's WireHeader (gpu_service_wire.h), one job at a time. The memfd is
// sealed against shrinking (not against growing: it grows); that seal
// keeps nothing safe -- a hole can still be punched -- which is why the
// service never maps it (it reads and writes the job with pread and
// pwrite, gpu_service_wire.h). Pages are backed with fallocate before
// they are written, so that a lack of memory is an error here, not a
// SIGBUS in this process.
// The memfd's size and the mapping grow ahead of need (address space and
// a sparse file cost nothing); only what a segment's owner asked to write
// is backed (fallocate), in steps of 2 MB, so that the pages allocated
// stay close to the rows read (knn_matrix.c asks in such steps). A segment
// that moves leaves a hole (its pages go back), which a later segment may
// fill. Once no segment is live, pages past what the last join used (at
// most kKeepBytes) are given back (a hole punched; the size stays).
//
// A job that ended without the service's answer (a backend that gave up
// after a cancel, a service that died) spoils the arena: the service may
// still write into it, so no new segment is made in it; it is unmapped
// once its last segment is freed, and the next segment starts a new one.
//
// Plain C++ and POSIX: no PostgreSQL, no CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "knn_engine.h"

namespace knn::service {

// Pages an empty arena keeps for the next join (what the last one used, up
// to this much); the rest goes back to the system. Per backend that used
// the service: 200 idle connections keep at most 200 x 64 MB = 12.5 GB
// (README, knn_gpu.gpu_service); a join of 100000 x 128 float rows (51 MB,
// the sessions benchmark's) reuses its pages join after join.
constexpr uint64_t kKeepBytes = uint64_t{64} << 20;

class Arena;

// One job's lease of the arena that holds its rows: the header at offset 0
// and a segment of its own (keys, results, and any side not in the arena).
// Made by lease_for_job, which returns nullptr when neither side lies in
// the arena, its header is leased to another job, or it is spoilt.
class ArenaJob {
 public:
  ~ArenaJob();
  ArenaJob(const ArenaJob &) = delete;
  ArenaJob &operator=(const ArenaJob &) = delete;

  int fd() const;
  unsigned char *base() const;
  // The memfd's size now (validate_header's bound).
  uint64_t size() const;
  // The offset of p in the memfd, or -1 when [p, p + length) is not inside
  // the arena's memfd.
  int64_t offset_of(const void *p, uint64_t length) const;
  // A segment of this job (made at most once): its offset, or -1 on failure.
  int64_t add_segment(uint64_t bytes);
  // The service may still use the memfd: the arena is never used again.
  void spoil();

 private:
  friend std::unique_ptr<ArenaJob> lease_for_job(const void *queries, uint64_t query_bytes,
                                                 const void *targets, uint64_t target_bytes);
  explicit ArenaJob(std::shared_ptr<Arena> arena) : arena_(std::move(arena)) {}
  std::shared_ptr<Arena> arena_;
  KnnSharedRows *segment_ = nullptr;
};

// The lease of the arena that holds the query rows or the target rows
// (a side not in it is copied into the job's segment), or nullptr (then
// the job copies its rows into a memfd of its own).
std::unique_ptr<ArenaJob> lease_for_job(const void *queries, uint64_t query_bytes,
                                        const void *targets, uint64_t target_bytes);

// The address space an arena reserves under an RLIMIT_AS of this many
// bytes (a quarter of it, up to 1 TB), or 0: no shared row buffer.
uint64_t reservation_bytes(uint64_t address_space_limit);

// Counts a job sent in the shared row buffer (knn_shared_rows_jobs).
void count_job_in_arena();

// For tests: the arena of the current segments' process (fd, size), and
// whether a new segment would start a new arena.
struct ArenaState {
  int fd = -1;
  uint64_t size = 0;
  uint64_t live_segments = 0;
  bool spoilt = false;
};
ArenaState current_arena_state();

}  // namespace knn::service
