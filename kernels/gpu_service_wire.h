// gpu_service_wire.h -- what a backend and the GPU service exchange
// (knn_gpu.gpu_service; the service: gpu_service_server.h, the backend's
// side: gpu_service_client.h).
//
// A job is one memfd, passed over the service's Unix-domain socket with
// SCM_RIGHTS after an 8-byte request (JobRequest): a WireHeader (the
// KnnProblem without pointers, and where each array lies in the memfd),
// then the query rows, the target rows (absent when both sides are one
// matrix), the keys of a self-join, and room for the results, each at the
// offset the header gives (aligned, after the header, in any order, gaps
// allowed: a backend's shared row buffer, gpu_service_rows.h, sends the
// memfd it read its rows into, the same one for each of its joins, with
// the rows where they lie). The service answers with one WireReply on the
// socket once the job has ended (status and message); the results and the
// statistics are in the memfd then.
//
// The service never maps a peer's memfd: a mapping of a file the peer can
// still change faults (SIGBUS) once its pages are gone -- F_SEAL_SHRINK
// stops neither fallocate(FALLOC_FL_PUNCH_HOLE) nor growth, and a refault
// of a tmpfs page can fail (vm.overcommit_memory=2, a memory cgroup), a
// hugetlbfs one whenever its pool is empty -- and a service that dies on a
// signal takes every backend's session with it. So it accepts only tmpfs
// memfds (fstatfs), reads the header once (pread) and checks every offset
// and length against the file's size (validate_header) before it reads
// anything else, reads the input regions with pread into memory of its
// own (a hole reads as zeros; a file cut short is an error), and writes
// the results and statistics back with pwrite (a failure is an error
// return). A peer that rewrites, punches or grows its memfd mid-join
// spoils only its own answer. The backend cancels by setting the header's
// cancel word (which the service reads with pread while the job runs) and
// by sending a byte on the socket; the end of its socket cancels too.
//
// The socket (mode 0600 in pg_stat_tmp) admits only the server's OS user;
// the service still trusts nothing in the memfd but its validated copy of
// the header.
//
// Plain C++ and POSIX: no PostgreSQL, no CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "knn_engine.h"

namespace knn::service {

constexpr uint32_t kMagic = 0x4a4e4e4b;  // "KNNJ"
constexpr uint32_t kVersion = 1;
constexpr size_t kMessageBytes = 512;
// Regions start at multiples of this (the widest element, int64/double).
constexpr uint64_t kAlign = 64;

struct Region {
  uint64_t offset;
  uint64_t length;  // bytes; 0 = absent
};

enum JobFlags : uint32_t {
  kSharedRows = 1u,   // the targets are the query rows (one matrix)
  kSelfKeys = 2u,     // query_keys and target_keys are present
  kCpuStandIn = 4u,   // test only: the service runs the job on the CPU engine
};

struct WireHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t header_bytes;  // sizeof(WireHeader) of the writer
  int32_t element, metric, method, device, k, dim, n_threads, n_devices;
  int32_t devices[KNN_MAX_DEVICES];
  int64_t n_queries, n_targets, gpu_memory_limit;
  uint32_t flags;
  uint32_t reserved;
  Region queries, targets, query_keys, target_keys, neighbors, distances;
  int32_t cancel;  // non-zero: stop (the backend's cancel, or its death)
  int32_t reserved2;
  KnnStats stats;  // written by the service
};

// Sent with the memfd.
struct JobRequest {
  uint32_t magic;
  uint32_t version;
};

// The service's answer on the socket.
struct WireReply {
  uint32_t magic;
  int32_t status;  // KnnStatus
  char message[kMessageBytes];
};

// Bytes of one row of dim elements, or -1 when the element or dim is invalid.
int64_t row_bytes(int32_t element, int32_t dim);

// The layout of a job: every region placed after the header, aligned.
// Returns false (why set) when the problem's sizes overflow.
bool plan_layout(const KnnProblem &p, bool shared_rows, bool self_keys, WireHeader *header,
                 uint64_t *total_bytes, const char **why);

// The same for a job in a shared row buffer (gpu_service_rows.h): the query
// rows (and the target rows, unless targets_at is kPlaceHere) already lie
// at the given offsets; the other regions are placed from start on.
// *total_bytes: the end of the last placed region.
constexpr int64_t kPlaceHere = -1;
bool plan_layout_at(const KnnProblem &p, bool shared_rows, bool self_keys, int64_t queries_at,
                    int64_t targets_at, uint64_t start, WireHeader *header,
                    uint64_t *total_bytes, const char **why);

// Checks a copy of a header against the memfd's size: magic, version,
// counts, every region inside the memfd, aligned, of the length its
// counts need, no output overlapping another region, and all of them
// within what packed_layout can place. Returns nullptr when it is sound,
// else why not.
const char *validate_header(const WireHeader &h, uint64_t memfd_bytes);

// The bytes of the job that a validated header uses (the header and its
// regions), whatever the memfd's size.
uint64_t used_bytes(const WireHeader &h);

// The same job with its regions packed one after another (aligned) from
// the end of the header: where the service places its own copy of a job.
// *total_bytes: the end of the last region.
WireHeader packed_layout(const WireHeader &h, uint64_t *total_bytes);

// The problem the header describes, its pointers into the mapping at base
// (after validate_header).
KnnProblem problem_of(const WireHeader &h, unsigned char *base);

}  // namespace knn::service
