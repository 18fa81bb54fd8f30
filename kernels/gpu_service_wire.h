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
// the rows where they lie). The memfd is sealed against shrinking (not
// against growing: that buffer grows), so that no peer can make a mapping
// of what the service validated fault, and the service maps only up to
// the end of the last region it validated (used_bytes). The
// service answers with one WireReply on the socket once the job has ended
// (status and message); the results and the statistics are in the memfd.
// The service reads nothing of the memfd before validate_header() has
// checked every offset and length against its size, and it reads the
// header once, from a copy, so that a peer that rewrites it meanwhile
// cannot move a region. The backend cancels by setting the header's
// cancel word; the service sets it itself when the backend's socket ends.
//
// The input regions stay writable by the backend during the join (the
// memfd is sealed against SHRINK, not WRITE): a peer that rewrites
// its rows or keys mid-join spoils only its own answer. That is enough
// because the socket (mode 0600 in pg_stat_tmp) admits only the server's
// OS user, which could already do anything to the service's process; the
// service never takes a size or offset from the mapping, only from its
// validated copy of the header. Sealing the inputs against writes would
// need a second memfd for results and cancel word and a copy per job.
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
// counts need, and no output overlapping another region. Returns nullptr
// when it is sound, else why not.
const char *validate_header(const WireHeader &h, uint64_t memfd_bytes);

// The bytes of the job that a validated header uses (the header and its
// regions): all the service maps, whatever the memfd's size.
uint64_t used_bytes(const WireHeader &h);

// The problem the header describes, its pointers into the mapping at base
// (after validate_header).
KnnProblem problem_of(const WireHeader &h, unsigned char *base);

}  // namespace knn::service
