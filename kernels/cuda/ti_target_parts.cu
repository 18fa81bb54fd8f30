// ti_target_parts.cu -- the target parts of the out-of-core TI join on the
// device (TargetParts of ti_parts.cuh).
//
// A part is built once and its row numbers are global target rows (level 2
// writes them into the lists, and ties across parts are broken by them).
// Ordered: its distinct points go up with their original rows, ascending
// within a duplicate group (ti_part_upload.cu), and are clustered as in
// ti_join.cu. Row ranges: its rows go up, are deduplicated on the device
// and clustered, and the rows are shifted by the part's first row. Where
// the plan caches parts, the arrays level 1 and level 2 read
// are copied into one pinned host block per part, and later query parts
// copy them back: a copy at PCIe speed instead of a new clustering. Copies
// and kernels are ordered on the join's stream, so the host never waits
// for a part. If pinned memory cannot be had, parts are simply rebuilt.
//
// Page-locking costs about a millisecond per few megabytes (half of the
// target builds' time on kdd when each block was allocated as its part was
// stored), so for ordered sides, whose parts' sizes the plan knows ahead
// (distinct points and rows; clusters at most clusters_for), a host thread
// (Pinner) allocates the blocks one after the other while the device
// builds the parts, and store() takes them as they come. The blocks are
// registered pages of 2 MB where the kernel gives them (far fewer pages to
// lock and unlock than 4 kB ones or cudaMallocHost's), and an ordered
// part is gathered straight into its block, whose copies to the device are
// then queued, not waited for (pin_staging).
#include <algorithm>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include <sys/mman.h>

#include "../cpu/parallel_for.h"
#include "../problem_check.h"
#include "../value_range.h"
#include "ti_distance.cuh"
#include "ti_parts.cuh"
#include "../stopwatch.h"

namespace knn {
namespace cuda {
namespace ti {
namespace {

__global__ void shift_rows_kernel(int32_t *rows, int64_t n, int32_t offset) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) rows[i] += offset;
}

KnnStatus shift_rows(DeviceContext &ctx, int32_t *rows, int64_t n, int64_t offset) {
  if (n == 0 || offset == 0) return KNN_OK;
  shift_rows_kernel<<<grid_for(n, 256), 256, 0, ctx.stream>>>(rows, n, (int32_t)offset);
  CUDA_CHECK_LAUNCH(ctx, "shift_rows_kernel");
  return KNN_OK;
}

constexpr size_t kAlign = 256;
constexpr int kTouchThreads = 4;  // per pinned block (Pinner::register_block)

// Frees a block of TargetParts::Pinner (registered: posix_memalign'd pages
// page-locked by cudaHostRegister).
void free_pinned(unsigned char *block, bool registered) {
  if (block == nullptr) return;
  if (!registered) {
    (void)cudaFreeHost(block);
    return;
  }
  (void)cudaHostUnregister(block);
  std::free(block);
}

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

void *register_pages(size_t bytes, bool huge, unsigned flags, const int32_t *cancel,
                     const int32_t *stop, size_t chunk, cudaError_t *error) {
  const size_t page = 4096, huge_page = size_t(2) << 20;
  auto set = [](const int32_t *flag) {
    return flag != nullptr && __atomic_load_n(flag, __ATOMIC_RELAXED) != 0;
  };
  auto cancelled = [&] { return set(cancel) || set(stop); };
  if (error != nullptr) *error = cudaSuccess;
  // Large pages only for blocks of one at least (aligned to them, not
  // rounded up: a tail of small pages costs nothing more).
  huge = huge && bytes >= huge_page;
  void *p = nullptr;
  if (posix_memalign(&p, huge ? huge_page : page, bytes) != 0) {
    if (error != nullptr) *error = cudaErrorMemoryAllocation;
    return nullptr;
  }
  if (huge) (void)madvise(p, bytes, MADV_HUGEPAGE);
  // Pages touched (allocated and zeroed by the kernel) on a few threads:
  // most of a block's cost once the pages are large. A cancel or a stop
  // ends it between pieces of 2 MB (the pieces left are skipped).
  const size_t piece = size_t(2) << 20;
  cpu::parallel_for((int64_t)((bytes + piece - 1) / piece), kTouchThreads, cancel,
                    [&](int64_t i, int) {
                      if (set(stop)) return;
                      const size_t end = std::min(bytes, (size_t)(i + 1) * piece);
                      for (size_t at = (size_t)i * piece; at < end; at += page)
                        static_cast<volatile char *>(p)[at] = 0;
                    });
  // Locked in chunks (one where chunk is 0), a cancel seen between them.
  if (chunk == 0) chunk = bytes;
  size_t done = 0;
  while (done < bytes && !cancelled()) {
    const size_t n = std::min(chunk, bytes - done);
    const cudaError_t err = cudaHostRegister(static_cast<char *>(p) + done, n, flags);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      if (error != nullptr) *error = err;
      break;
    }
    done += n;
  }
  if (done < bytes) {  // failed or cancelled: what was locked goes
    unregister_pages(p, done, chunk);
    std::free(p);
    return nullptr;
  }
  return p;
}

void unregister_pages(void *p, size_t bytes, size_t chunk) {
  if (chunk == 0) chunk = bytes;
  for (size_t at = 0; at < bytes; at += chunk)
    (void)cudaHostUnregister(static_cast<char *>(p) + at);
}

// The arrays of one clustered part, in one pinned block: allocated by
// store() or taken from the Pinner.
struct TargetParts::HostPart {
  PinnedBuffer<unsigned char> block;
  unsigned char *prepinned = nullptr;  // from the Pinner, freed here
  bool registered = false;             // prepinned is registered malloc memory
  size_t capacity = 0;                 // bytes of prepinned where taken by pin_staging
  ~HostPart() { free_pinned(prepinned, registered); }
  unsigned char *data() const { return prepinned != nullptr ? prepinned : block.get(); }
  bool ready = false;
  int64_t first = 0, n_rows = 0, n_distinct = 0;
  int32_t m = 0;
  float max_abs = 0;

  // The arrays in the block, in this order, each aligned. The first three
  // lie where they do whatever the clusters (m): an ordered part's points
  // are gathered into them before it is clustered (pin_staging) and go up
  // from there; the stored arrays overwrite them later, in stream order.
  struct Layout {
    size_t x, rows, upload_begin, centers, begin, radius, nearest, member, dist, first_row, mult,
        rows_begin, total;
  };
  static Layout layout(int32_t m, int64_t n, int64_t n_rows, int stride) {
    Layout l;
    size_t at = 0;
    auto take = [&](size_t bytes) {
      const size_t here = at;
      at += aligned(bytes);
      return here;
    };
    l.x = take((size_t)n * stride * sizeof(float));
    l.rows = take((size_t)n_rows * sizeof(int32_t));
    l.upload_begin = take((size_t)(n + 1) * sizeof(int32_t));  // the gathered points' offsets
    l.centers = take((size_t)m * stride * sizeof(float));
    l.begin = take((size_t)(m + 1) * sizeof(int32_t));
    l.radius = take((size_t)m * sizeof(float));
    l.nearest = take((size_t)m * sizeof(float));
    l.member = take((size_t)n * sizeof(int32_t));
    l.dist = take((size_t)n * sizeof(float));
    l.first_row = take((size_t)n * sizeof(int32_t));
    l.mult = take((size_t)n * sizeof(int32_t));
    l.rows_begin = take((size_t)n * sizeof(int32_t));
    l.total = std::max<size_t>(at, 1);
    return l;
  }
};

// Pinned blocks of the given sizes, allocated in order by a host thread:
// cudaMallocHost, or (register) pages allocated and touched by the thread
// first, then page-locked by cudaHostRegister, so that the driver call
// only pins pages already there.
class TargetParts::Pinner {
 public:
  // register_pages: 1, pages of 4 kB; 2, of 2 MB where the kernel gives
  // them (madvise), far fewer pages to lock; 0: cudaMallocHost.
  Pinner(int device, std::vector<size_t> sizes, int register_pages)
      : sizes_(std::move(sizes)),
        register_(register_pages != 0),
        huge_(register_pages == 2),
        blocks_(sizes_.size(), nullptr),
        done_(sizes_.size(), 0) {
    thread_ = std::thread([this, device] { pin_all(device); });
  }
  ~Pinner() {
    stop();
    thread_.join();
    if (report_pin_seconds != nullptr) *report_pin_seconds = pin_seconds_;
    for (unsigned char *b : blocks_) free_pinned(b, register_);
  }
  bool registered() const { return register_; }
  // No more blocks wanted (the join ends, on any path): the thread stops
  // within a 2 MB piece of the block it is touching, or after the block's
  // one registration (its pages already touched), and every block not
  // taken yet is nullptr.
  void stop() { __atomic_store_n(&stop_, 1, __ATOMIC_RELAXED); }
  Pinner(const Pinner &) = delete;
  Pinner &operator=(const Pinner &) = delete;

  // Block i, once allocated (the caller frees it), if it holds `bytes`;
  // else nullptr (it could not be had, or is too small: freed here).
  unsigned char *take(int i, size_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[i] != 0; });
    unsigned char *b = blocks_[i];
    blocks_[i] = nullptr;
    lock.unlock();
    if (b != nullptr && bytes > sizes_[i]) {
      free_pinned(b, register_);
      b = nullptr;
    }
    return b;
  }

 private:
  void pin_all(int device) {
    const bool on_device = cudaSetDevice(device) == cudaSuccess;
    for (size_t i = 0; i < sizes_.size(); i++) {
      void *p = nullptr;
      const Clock::time_point t0 = Clock::now();
      if (on_device && __atomic_load_n(&stop_, __ATOMIC_RELAXED) == 0)
        p = register_ ? register_block(sizes_[i], huge_, &stop_) : malloc_block(sizes_[i]);
      (void)cudaGetLastError();  // (this thread's error state only)
      pin_seconds_ += seconds_since(t0);
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[i] = static_cast<unsigned char *>(p);
      done_[i] = 1;
      cv_.notify_all();
    }
  }

  static void *malloc_block(size_t bytes) {
    void *p = nullptr;
    return cudaMallocHost(&p, bytes) == cudaSuccess ? p : nullptr;
  }
  static void *register_block(size_t bytes, bool huge, const int32_t *stop) {
    return register_pages(bytes, huge, cudaHostRegisterDefault, nullptr, stop, 0, nullptr);
  }

  const std::vector<size_t> sizes_;
  const bool register_, huge_;
  std::vector<unsigned char *> blocks_;
  std::vector<char> done_;
  std::mutex mu_;
  std::condition_variable cv_;
  int32_t stop_ = 0;  // (atomic accesses: register_pages reads it as a flag)
  double pin_seconds_ = 0;  // (the thread's; read once it is joined)
  std::thread thread_;

 public:
  // Seconds the thread spent allocating and locking (after ~Pinner's join:
  // the destructor reports it through *out).
  double *report_pin_seconds = nullptr;
};

TargetParts::TargetParts(const KnnProblem &p, const TiOptions &options, const PartPlan &plan,
                         const SpatialOrder *order, DeviceContext &ctx)
    : p_(p),
      options_(options),
      plan_(plan),
      order_(order != nullptr && order->ordered() ? order : nullptr),
      ctx_(ctx),
      cache_(plan.cache_targets) {
  host_.assign(plan.target_parts(), nullptr);
  if (cache_ && order_ != nullptr) {
    const int stride = padded_stride(p.dim);
    std::vector<size_t> sizes(plan.target_parts());
    for (int i = 0; i < plan.target_parts(); i++) {
      const int64_t n = plan.target_distinct_count(i);
      sizes[i] = HostPart::layout(plan.clusters_for(n), n, plan.target_count(i), stride).total;
    }
    // KNN_TI_PIN_AHEAD=0: each block allocated as its part is stored;
    // 1: cudaMallocHost ahead; 2: registered pages; else (3, the default)
    // registered 2 MB pages where the kernel gives them, which lock several
    // times faster: on an H200, the 5M x 8 set's 29 blocks (300 MB) took
    // 0.08 s against 0.11-0.15 s by cudaMallocHost (whose calls also held
    // up the join's own CUDA calls) and were freed in 0.008 s against
    // 0.03-0.05 s; kdd's builds 0.009-0.013 s against 0.016-0.020 s.
    const char *ahead = std::getenv("KNN_TI_PIN_AHEAD");
    const int mode = ahead != nullptr ? std::atoi(ahead) : 3;
    try {
      if (mode != 0)
        pinner_.reset(new Pinner(ctx.device, std::move(sizes), mode == 1 ? 0 : mode == 2 ? 1 : 2));
      if (pinner_) pinner_->report_pin_seconds = &pin_seconds_;
    } catch (const std::system_error &) {
      // No thread: store() allocates each block itself.
    }
  }
}

TargetParts::~TargetParts() {
  // No block is wanted any more: the Pinner stops within a piece (a gather
  // ahead waiting for its block then gets none).
  stop_pinning();
  // A gather ahead (an error path) may still write into a block.
  if (gather_.valid()) gather_.wait();
  const bool pinned = cache_ && pinner_ != nullptr && pinned_parts_;
  // Copies into or out of the pinned blocks may still be queued (an error
  // path): let them finish before the blocks go.
  if (ctx_.stream != nullptr) (void)cudaStreamSynchronize(ctx_.stream);
  (void)cudaGetLastError();
  const Clock::time_point t0 = Clock::now();
  pinner_.reset();
  for (HostPart *h : host_) delete h;
  if (trace_ && clusters_ > 0)
    std::fprintf(stderr,
                 "[ti target parts] builds %.4f s: uploads %.4f (waits for the gathers ahead "
                 "%.4f, sends %.4f, stream waits %.4f), pinned copies %.4f; %s stagings; blocks "
                 "pinned in %.4f s (thread), freed in %.4f s\n",
                 cluster_seconds_, upload_seconds_, gather_wait_seconds_, send_seconds_,
                 upload_wait_seconds_, store_seconds_, pinned ? "pinned" : "pageable",
                 pin_seconds_, seconds_since(t0));
}

KnnStatus TargetParts::build(int index, float query_max_abs, TargetPart &out, bool *finite,
                             MemoryBudget &mem) {
  const Clock::time_point t0 = Clock::now();
  const int stride = padded_stride(p_.dim);
  const int64_t first = plan_.target_first(index), count = plan_.target_count(index);
  out.first = first;
  if (order_ != nullptr) {
    // Distinct points gathered on the host, with original rows; where the
    // parts are cached (built one after the other, first to last), a host
    // thread gathers the next part's while the device clusters this one.
    // Cached parts are gathered straight into their pinned blocks, so that
    // their copies to the device are queued, not waited for
    // (KNN_TI_PINNED_PARTS=0: the pageable stagings, A/B).
    const Clock::time_point t_wait = Clock::now();
    if (gather_.valid()) gather_.get();
    gather_wait_seconds_ += seconds_since(t_wait);
    const bool pin = cache_ && pinner_ != nullptr && pinned_parts_;
    PartStaging &staging = part_staging_[index % 2];
    const int64_t distinct_first = plan_.target_distinct_first(index);
    if (staging.first != distinct_first ||
        staging.count != plan_.target_distinct_count(index)) {
      // (Here, the first part: not pinned, as its block may not be yet.)
      pin_staging(index, false, staging);
      gather_ordered_part(*order_, float_rows(p_.targets), distinct_first,
                          plan_.target_distinct_count(index), stride, staging, ctx_.cancel);
    }
    const int next = index + 1;
    if (cache_ && next < plan_.target_parts() &&
        (host_[next] == nullptr || !host_[next]->ready)) {
      PartStaging &ahead = part_staging_[next % 2];
      ahead.first = -1;  // not gathered until the thread is done
      try {
        gather_ = std::async(std::launch::async, [this, next, stride, pin, &ahead] {
          pin_staging(next, pin, ahead);
          gather_ordered_part(*order_, float_rows(p_.targets), plan_.target_distinct_first(next),
                              plan_.target_distinct_count(next), stride, ahead, ctx_.cancel);
        });
      } catch (const std::system_error &) {
        // No thread: the next part gathers its own rows.
      }
    }
    KNN_TRY(ctx_.cancel_point());  // a cancelled gather leaves its staging unfilled
    const Clock::time_point t_send = Clock::now();
    KNN_TRY(send_ordered_part(staging, stride, out.set, &out.max_abs, mem, ctx_));
    send_seconds_ += seconds_since(t_send);
  } else {
    DeviceBuffer<unsigned> max_abs;
    KNN_TRY(mem.allocate(ctx_, max_abs, 1, "value range"));
    CUDA_CHECK(ctx_, cudaMemsetAsync(max_abs.get(), 0, sizeof(unsigned), ctx_.stream));
    UploadedSet upload;
    KNN_TRY(upload_points(float_rows(p_.targets) + first * p_.dim, count, p_.dim, stride, upload,
                          max_abs.get(), mem, ctx_));
    KNN_TRY(read_max_abs(max_abs.get(), &out.max_abs, ctx_));
    mem.release(max_abs);
    if (distances_stay_finite(p_.metric, p_.dim, std::max(query_max_abs, out.max_abs)))
      KNN_TRY(build_distinct_set(upload.points, options_.dedup, out.set, mem, ctx_));
    mem.release(upload.padded);  // (freed in stream order, after the set is built)
  }
  if (trace_) {
    // (KNN_TI_TRACE=1: the upload's own time, the stream waited for.)
    const Clock::time_point t_wait = Clock::now();
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
    upload_wait_seconds_ += seconds_since(t_wait);
    upload_seconds_ += seconds_since(t0);
  }
  // The bounds need finite distances: stop before clustering otherwise.
  *finite = distances_stay_finite(p_.metric, p_.dim, std::max(query_max_abs, out.max_abs));
  if (!*finite) return KNN_OK;
  KNN_TRY(ctx_.cancel_point());
  KNN_TRY(build_clusters(out.set, p_.metric, plan_.clusters_for(out.set.n_distinct),
                         options_.landmark_candidate_sets, options_.gemm_assign_min_stride,
                         out.clusters, mem, ctx_));
  mem.release(out.set.x);
  if (order_ == nullptr) {
    KNN_TRY(shift_rows(ctx_, out.set.rows.get(), out.set.n_rows, first));
    KNN_TRY(shift_rows(ctx_, out.clusters.first_row.get(), out.clusters.n, first));
  }
  clusters_ += out.clusters.m;
  // The host goes on (storing the part, gathering the next) while the
  // device clusters; only the trace waits, for the phase's own time.
  if (trace_) CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
  cluster_seconds_ += seconds_since(t0);
  return KNN_OK;
}

void TargetParts::pin_staging(int index, bool pin, PartStaging &staging) {
  staging.pinned_x = nullptr;
  staging.pinned_begin = staging.pinned_rows = nullptr;
  if (!pin) return;
  const int64_t n = plan_.target_distinct_count(index), n_rows = plan_.target_count(index);
  const int stride = padded_stride(p_.dim);
  const HostPart::Layout l = HostPart::layout(plan_.clusters_for(n), n, n_rows, stride);
  HostPart *h = host_[index];
  if (h == nullptr) {
    // Made before the block is taken, which it then owns (and frees).
    std::unique_ptr<HostPart> made(new HostPart);
    unsigned char *block = pinner_->take(index, l.total);
    if (block == nullptr) return;  // store() tries again, else the part is not cached
    made->prepinned = block;
    made->registered = pinner_->registered();
    made->capacity = l.total;
    h = host_[index] = made.release();
  }
  unsigned char *b = h->data();
  staging.pinned_x = reinterpret_cast<float *>(b + l.x);
  staging.pinned_begin = reinterpret_cast<int32_t *>(b + l.upload_begin);
  staging.pinned_rows = reinterpret_cast<int32_t *>(b + l.rows);
}

// Queues copies of the part's arrays into a pinned block (a failed pinned
// allocation turns caching off; nothing else is lost).
KnnStatus TargetParts::store(int index, const TargetPart &part) {
  const int stride = padded_stride(p_.dim);
  const ClusterSet &c = part.clusters;
  const HostPart::Layout l = HostPart::layout(c.m, c.n, part.set.n_rows, stride);
  // The block the part was gathered into (pin_staging), if any: it holds
  // l.total bytes, as the Pinner's sizes take the most clusters.
  HostPart *h = host_[index];
  if (h != nullptr && h->capacity < l.total) {
    // (More clusters than the plan's most: never expected.) The block may
    // still be read by the part's upload: waited for before it goes.
    CUDA_CHECK(ctx_, cudaStreamSynchronize(ctx_.stream));
    delete h;
    h = host_[index] = nullptr;
    // The part's staging pointed into that block: never reused.
    PartStaging &staging = part_staging_[index % 2];
    staging.first = -1;
    staging.pinned_x = nullptr;
    staging.pinned_begin = staging.pinned_rows = nullptr;
  }
  if (h == nullptr) {
    h = new HostPart;
    if (pinner_) {
      h->prepinned = pinner_->take(index, l.total);
      h->registered = pinner_->registered();
    }
    if (h->prepinned == nullptr && h->block.allocate(ctx_, l.total) != KNN_OK) {
      ctx_.error.clear();  // (allocate has cleared the CUDA error)
      delete h;
      cache_ = false;
      return KNN_OK;
    }
    host_[index] = h;
  }
  unsigned char *b = h->data();
  auto down = [&](size_t at, const void *src, size_t bytes) -> KnnStatus {
    if (bytes == 0) return KNN_OK;
    CUDA_CHECK(ctx_, cudaMemcpyAsync(b + at, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream));
    return KNN_OK;
  };
  const size_t f = sizeof(float), i = sizeof(int32_t);
  KNN_TRY(down(l.centers, c.centers.get(), (size_t)c.m * stride * f));
  KNN_TRY(down(l.begin, c.begin.get(), (size_t)(c.m + 1) * i));
  KNN_TRY(down(l.radius, c.radius.get(), (size_t)c.m * f));
  KNN_TRY(down(l.nearest, c.nearest.get(), (size_t)c.m * f));
  KNN_TRY(down(l.member, c.member.get(), (size_t)c.n * i));
  KNN_TRY(down(l.dist, c.dist.get(), (size_t)c.n * f));
  KNN_TRY(down(l.x, c.x.get(), (size_t)c.n * stride * f));
  KNN_TRY(down(l.first_row, c.first_row.get(), (size_t)c.n * i));
  KNN_TRY(down(l.mult, c.mult.get(), (size_t)c.n * i));
  KNN_TRY(down(l.rows_begin, c.rows_begin.get(), (size_t)c.n * i));
  KNN_TRY(down(l.rows, part.set.rows.get(), (size_t)part.set.n_rows * i));
  h->first = part.first;
  h->n_rows = part.set.n_rows;
  h->n_distinct = part.set.n_distinct;
  h->m = c.m;
  h->max_abs = part.max_abs;
  h->ready = true;
  return KNN_OK;
}

// Queues the copies of a cached part back to the device.
KnnStatus TargetParts::load(int index, TargetPart &out, MemoryBudget &mem) {
  const int stride = padded_stride(p_.dim);
  const HostPart &h = *host_[index];
  const HostPart::Layout l = HostPart::layout(h.m, h.n_distinct, h.n_rows, stride);
  const unsigned char *b = h.data();
  ClusterSet &c = out.clusters;
  c.m = h.m;
  c.n = h.n_distinct;
  c.stride = stride;
  out.set.n_rows = h.n_rows;
  out.set.n_distinct = h.n_distinct;
  out.set.stride = stride;
  out.first = h.first;
  out.max_abs = h.max_abs;
  auto up = [&](auto &buffer, size_t count, size_t at, const char *what) -> KnnStatus {
    KNN_TRY(mem.allocate(ctx_, buffer, count, what));
    if (count == 0) return KNN_OK;
    CUDA_CHECK(ctx_, cudaMemcpyAsync(buffer.get(), b + at, buffer.bytes(), cudaMemcpyHostToDevice,
                                     ctx_.stream));
    return KNN_OK;
  };
  KNN_TRY(up(c.centers, (size_t)h.m * stride, l.centers, "cluster centres"));
  KNN_TRY(up(c.begin, (size_t)h.m + 1, l.begin, "cluster offsets"));
  KNN_TRY(up(c.radius, (size_t)h.m, l.radius, "cluster extents"));
  KNN_TRY(up(c.nearest, (size_t)h.m, l.nearest, "cluster extents"));
  KNN_TRY(up(c.member, (size_t)h.n_distinct, l.member, "cluster members"));
  KNN_TRY(up(c.dist, (size_t)h.n_distinct, l.dist, "cluster members"));
  KNN_TRY(up(c.x, (size_t)h.n_distinct * stride, l.x, "clustered points"));
  KNN_TRY(up(c.first_row, (size_t)h.n_distinct, l.first_row, "cluster members"));
  KNN_TRY(up(c.mult, (size_t)h.n_distinct, l.mult, "cluster members"));
  KNN_TRY(up(c.rows_begin, (size_t)h.n_distinct, l.rows_begin, "cluster members"));
  KNN_TRY(up(out.set.rows, (size_t)h.n_rows, l.rows, "duplicate groups"));
  return KNN_OK;
}

bool TargetParts::cached_arrays(int index, CachedArrays *out) const {
  const HostPart *h = host_[index];
  if (h == nullptr || !h->ready) return false;
  // Pinned blocks are mapped where the device has unified addressing
  // (cudaHostRegisterDefault, cudaMallocHost); the device's address of
  // one may still differ from the host's.
  void *device = nullptr;
  if (cudaHostGetDevicePointer(&device, h->data(), 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const HostPart::Layout l =
      HostPart::layout(h->m, h->n_distinct, h->n_rows, padded_stride(p_.dim));
  const unsigned char *d = static_cast<const unsigned char *>(device);
  const unsigned char *b = h->data();
  auto f = [&](size_t at) { return reinterpret_cast<const float *>(d + at); };
  auto i = [&](size_t at) { return reinterpret_cast<const int32_t *>(d + at); };
  out->m = h->m;
  out->n_distinct = h->n_distinct;
  out->n_rows = h->n_rows;
  out->max_abs = h->max_abs;
  out->x = f(l.x);
  out->dist = f(l.dist);
  out->centers = f(l.centers);
  out->radius = f(l.radius);
  out->nearest = f(l.nearest);
  out->begin = i(l.begin);
  out->first_row = i(l.first_row);
  out->mult = i(l.mult);
  out->rows_begin = i(l.rows_begin);
  out->rows = i(l.rows);
  out->host_centers = reinterpret_cast<const float *>(b + l.centers);
  out->host_radius = reinterpret_cast<const float *>(b + l.radius);
  out->host_begin = reinterpret_cast<const int32_t *>(b + l.begin);
  out->host_mult = reinterpret_cast<const int32_t *>(b + l.mult);
  out->host_rows_begin = reinterpret_cast<const int32_t *>(b + l.rows_begin);
  out->host_rows = reinterpret_cast<const int32_t *>(b + l.rows);
  return true;
}

void TargetParts::stop_pinning() {
  if (pinner_) pinner_->stop();
}

bool TargetParts::summary(int index, ClusterSummary *out) const {
  const HostPart *h = host_[index];
  if (h == nullptr || !h->ready) return false;
  const HostPart::Layout l =
      HostPart::layout(h->m, h->n_distinct, h->n_rows, padded_stride(p_.dim));
  const unsigned char *b = h->data();
  out->m = h->m;
  out->centers = reinterpret_cast<const float *>(b + l.centers);
  out->radius = reinterpret_cast<const float *>(b + l.radius);
  out->begin = reinterpret_cast<const int32_t *>(b + l.begin);
  return true;
}

KnnStatus TargetParts::get(int index, float query_max_abs, TargetPart &out, bool *finite,
                           MemoryBudget &mem) {
  // The gather ahead started by the build before may be making
  // host_[index] (pin_staging): it is done before host_ is read here.
  if (gather_.valid()) {
    const Clock::time_point t_wait = Clock::now();
    gather_.get();
    gather_wait_seconds_ += seconds_since(t_wait);
  }
  if (host_[index] != nullptr && host_[index]->ready) {
    KNN_TRY(load(index, out, mem));
    *finite = distances_stay_finite(p_.metric, p_.dim, std::max(query_max_abs, out.max_abs));
    return KNN_OK;
  }
  KNN_TRY(build(index, query_max_abs, out, finite, mem));
  const Clock::time_point t0 = Clock::now();
  if (*finite && cache_) KNN_TRY(store(index, out));
  store_seconds_ += seconds_since(t0);
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
