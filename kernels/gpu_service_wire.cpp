// gpu_service_wire.cpp -- the job layout of the GPU service and its checks
// (gpu_service_wire.h).

#include "gpu_service_wire.h"

#include <algorithm>
#include <cstring>

namespace knn::service {

namespace {

constexpr int32_t kMaxDim = 1 << 24;  // far above any vector type's limit

bool mul(int64_t a, int64_t b, uint64_t *out) {
  if (a < 0 || b < 0) return false;
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = static_cast<uint64_t>(r);
  return true;
}

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Places a region of length bytes at *cursor (0 bytes: absent).
bool place(uint64_t length, uint64_t *cursor, Region *r) {
  r->offset = length == 0 ? 0 : *cursor;
  r->length = length;
  if (length == 0) return true;
  uint64_t end;
  if (__builtin_add_overflow(*cursor, length, &end) || end > (uint64_t{1} << 62)) return false;
  *cursor = align_up(end);
  return true;
}

// The lengths the counts of a header call for.
struct Lengths {
  uint64_t queries = 0, targets = 0, query_keys = 0, target_keys = 0, results = 0, distances = 0;
};

const char *lengths_of(int32_t element, int32_t dim, int64_t n_queries, int64_t n_targets,
                       int32_t k, bool shared_rows, bool self_keys, Lengths *l) {
  const int64_t row = row_bytes(element, dim);
  if (row < 0) return "invalid element type or dimension";
  if (n_queries < 0 || n_targets < 0) return "negative row count";
  if (k < 1) return "k must be at least 1";
  if (shared_rows && n_queries != n_targets) return "one matrix for both sides needs equal counts";
  uint64_t entries;
  if (!mul(row, n_queries, &l->queries) || !mul(row, n_targets, &l->targets) ||
      !mul(n_queries, k, &entries) || !mul(static_cast<int64_t>(entries), 8, &l->results))
    return "job too large";
  l->distances = l->results;
  if (shared_rows) l->targets = 0;
  if (self_keys) {
    if (!mul(n_queries, 8, &l->query_keys) || !mul(n_targets, 8, &l->target_keys))
      return "job too large";
  }
  return nullptr;
}

bool inside(const Region &r, uint64_t size) {
  if (r.length == 0) return r.offset == 0;
  uint64_t end;
  return r.offset % kAlign == 0 && r.offset >= sizeof(WireHeader) &&
         !__builtin_add_overflow(r.offset, r.length, &end) && end <= size;
}

bool overlap(const Region &a, const Region &b) {
  if (a.length == 0 || b.length == 0) return false;
  return a.offset < b.offset + b.length && b.offset < a.offset + a.length;
}

}  // namespace

int64_t row_bytes(int32_t element, int32_t dim) {
  if (dim < 1 || dim > kMaxDim) return -1;
  switch (element) {
    case KNN_ELEMENT_FLOAT32: return int64_t{4} * dim;
    case KNN_ELEMENT_FLOAT16: return int64_t{2} * dim;
    case KNN_ELEMENT_BIT: return (int64_t{dim} + 7) / 8;
    default: return -1;
  }
}

bool plan_layout_at(const KnnProblem &p, bool shared_rows, bool self_keys, int64_t queries_at,
                    int64_t targets_at, uint64_t start, WireHeader *h, uint64_t *total_bytes,
                    const char **why) {
  std::memset(h, 0, sizeof *h);
  h->magic = kMagic;
  h->version = kVersion;
  h->header_bytes = sizeof(WireHeader);
  h->element = p.element;
  h->metric = p.metric;
  h->method = p.method;
  h->device = p.device;
  h->k = p.k;
  h->dim = p.dim;
  h->n_threads = p.n_threads;
  h->n_devices = p.n_devices;
  std::memcpy(h->devices, p.devices, sizeof h->devices);
  h->n_queries = p.n_queries;
  h->n_targets = p.n_targets;
  h->gpu_memory_limit = p.gpu_memory_limit;
  h->flags = (shared_rows ? kSharedRows : 0u) | (self_keys ? kSelfKeys : 0u);
  Lengths l;
  *why = lengths_of(p.element, p.dim, p.n_queries, p.n_targets, p.k, shared_rows, self_keys, &l);
  if (*why != nullptr) return false;
  // Rows already in place keep their offsets (an empty side: absent).
  const auto at = [](uint64_t length, int64_t offset, Region *r) {
    r->offset = length == 0 ? 0 : static_cast<uint64_t>(offset);
    r->length = length;
  };
  uint64_t cursor = align_up(std::max<uint64_t>(start, sizeof(WireHeader)));
  bool placed = true;
  if (queries_at != kPlaceHere) at(l.queries, queries_at, &h->queries);
  else placed = place(l.queries, &cursor, &h->queries);
  if (targets_at != kPlaceHere) at(l.targets, targets_at, &h->targets);
  else placed = placed && place(l.targets, &cursor, &h->targets);
  if (!placed || !place(l.query_keys, &cursor, &h->query_keys) ||
      !place(l.target_keys, &cursor, &h->target_keys) ||
      !place(l.results, &cursor, &h->neighbors) || !place(l.distances, &cursor, &h->distances)) {
    *why = "job too large";
    return false;
  }
  *total_bytes = cursor;
  return true;
}

bool plan_layout(const KnnProblem &p, bool shared_rows, bool self_keys, WireHeader *h,
                 uint64_t *total_bytes, const char **why) {
  return plan_layout_at(p, shared_rows, self_keys, kPlaceHere, kPlaceHere, 0, h, total_bytes,
                        why);
}

const char *validate_header(const WireHeader &h, uint64_t size) {
  if (size < sizeof(WireHeader)) return "job smaller than its header";
  if (h.magic != kMagic || h.version != kVersion || h.header_bytes != sizeof(WireHeader))
    return "not a job of this version";
  if ((h.flags & ~(kSharedRows | kSelfKeys | kCpuStandIn)) != 0) return "unknown job flags";
  if (h.gpu_memory_limit < 0) return "negative GPU memory limit";
  if (h.n_devices < 0 || h.n_devices > KNN_MAX_DEVICES) return "invalid device count";
  for (int i = 0; i < h.n_devices; i++)
    if (h.devices[i] < 0) return "invalid device ordinal";
  Lengths l;
  if (const char *why = lengths_of(h.element, h.dim, h.n_queries, h.n_targets, h.k,
                                   (h.flags & kSharedRows) != 0, (h.flags & kSelfKeys) != 0, &l))
    return why;
  const Region *regions[] = {&h.queries,     &h.targets,   &h.query_keys,
                             &h.target_keys, &h.neighbors, &h.distances};
  const uint64_t wanted[] = {l.queries,     l.targets,  l.query_keys,
                             l.target_keys, l.results, l.distances};
  for (int i = 0; i < 6; i++) {
    if (regions[i]->length != wanted[i]) return "a region's length does not match the counts";
    if (!inside(*regions[i], size)) return "a region lies outside the job";
  }
  // Results are written while the rows are read: no output may overlap.
  for (int out = 4; out < 6; out++)
    for (int i = 0; i < 6; i++)
      if (i != out && overlap(*regions[out], *regions[i])) return "regions overlap";
  // The service copies the regions one after another (packed_layout): all
  // of them must fit there too, however the sender laid them out.
  uint64_t cursor = align_up(sizeof(WireHeader));
  for (int i = 0; i < 6; i++) {
    Region packed;
    if (!place(regions[i]->length, &cursor, &packed)) return "job too large";
  }
  return nullptr;
}

uint64_t used_bytes(const WireHeader &h) {
  uint64_t used = sizeof(WireHeader);
  for (const Region *r : {&h.queries, &h.targets, &h.query_keys, &h.target_keys, &h.neighbors,
                          &h.distances})
    if (r->length > 0) used = std::max(used, r->offset + r->length);  // validated: no overflow
  return used;
}

WireHeader packed_layout(const WireHeader &h, uint64_t *total_bytes) {
  WireHeader packed = h;
  uint64_t cursor = align_up(sizeof(WireHeader));
  for (Region *r : {&packed.queries, &packed.targets, &packed.query_keys, &packed.target_keys,
                    &packed.neighbors, &packed.distances})
    (void)place(r->length, &cursor, r);  // validate_header placed them all
  *total_bytes = cursor;
  return packed;
}

KnnProblem problem_of(const WireHeader &h, unsigned char *base) {
  KnnProblem p;
  std::memset(&p, 0, sizeof p);
  p.element = static_cast<KnnElement>(h.element);
  p.metric = static_cast<KnnMetric>(h.metric);
  p.method = static_cast<KnnMethod>(h.method);
  p.device = static_cast<KnnDevice>(h.device);
  p.k = h.k;
  p.dim = h.dim;
  p.n_threads = h.n_threads;
  p.n_devices = h.n_devices;
  std::memcpy(p.devices, h.devices, sizeof p.devices);
  p.n_queries = h.n_queries;
  p.n_targets = h.n_targets;
  p.gpu_memory_limit = h.gpu_memory_limit;
  // A zero-length region still needs a valid pointer (an empty side).
  p.queries = base + (h.queries.length > 0 ? h.queries.offset : sizeof(WireHeader));
  p.targets = (h.flags & kSharedRows) != 0
                  ? p.queries
                  : base + (h.targets.length > 0 ? h.targets.offset : sizeof(WireHeader));
  if ((h.flags & kSelfKeys) != 0) {
    p.query_keys = reinterpret_cast<const int64_t *>(
        base + (h.query_keys.length > 0 ? h.query_keys.offset : sizeof(WireHeader)));
    p.target_keys = reinterpret_cast<const int64_t *>(
        base + (h.target_keys.length > 0 ? h.target_keys.offset : sizeof(WireHeader)));
  }
  return p;
}

}  // namespace knn::service
