// knn_job.cpp -- a join running on an engine-owned thread.
//
// The backend thread starts a job, polls it (so that it can notice cancel and
// statement_timeout), and finishes it. The job thread picks the engine: the
// GPU module when one is usable (loaded once with dlopen, so knn_gpu.so never
// links CUDA and loads on hosts without a driver), else the CPU engine.
// Where the server's probe record says there is no usable GPU, AUTO does
// not load the module at all; a GPU job can wait for an admission slot
// (knn_job_wants_slot / knn_job_admit) before it runs. Where this process's
// GPU runtime does not exist yet, AUTO runs joins that the CPU answers
// sooner on the CPU and creates the runtime in the background
// (gpu_cold_start.h). Before this process creates its GPU runtime, it takes
// a GPU context permit (gpu_context_permit.h, knn_gpu.max_gpu_contexts),
// given back when the module has released its last runtime. Float16 rows
// go to the module as they are where it takes them (knn_cuda_takes_float16);
// the job widens them to float32 only for an engine that needs that (the
// CPU engine, the module's TI, range and grouped paths, an older module).
// With the GPU service on (knn_engine_set_gpu_service), a k-NN join that
// would call the module here goes to the service instead (run_via_service);
// range and per-group joins stay in this process.
//
// Every extern "C" entry runs its body through knn::guarded (entry_guard.h),
// and the job thread starts with all signals blocked (signal_free_thread.h), so
// neither a C++ exception nor a PostgreSQL signal handler crosses the wall.

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "cpu/bit_join.h"
#include "cpu/cpu_engine.h"
#include "cpu/parallel_for.h"
#include "cpu/range_join.h"
#include "capped_range.h"
#include "half_float.h"
#include "problem_check.h"
#include "signal_free_thread.h"
#include "entry_guard.h"
#include "group_split.h"
#include "gpu_cold_start.h"
#include "gpu_context_permit.h"
#include "gpu_service.h"
#include "gpu_service_client.h"
#include "knn_cuda_module.h"
#include "knn_engine.h"
#include "knn_job_testing.h"
#include "pair_queue.h"

namespace {

constexpr size_t kMessageBytes = 512;

// ---- the GPU module, loaded once per process ----

// Fixed buffers only: nothing here allocates, so loading cannot throw.
struct GpuModule {
  std::mutex mutex;              // guards everything below
  char dir[PATH_MAX] = "";       // knn_engine_set_module_dir; "" = the cwd
  bool loaded = false;
  bool usable = false;           // module loaded and a GPU answered
  char description[384] = "";    // device line, or why there is none
  knn_cuda_run_fn run = nullptr;
  knn_cuda_range_fn range = nullptr;  // optional: an older module lacks it
  // The runtime entries (optional: an older module lacks them).
  knn_cuda_runtime_ready_fn runtime_ready = nullptr;
  knn_cuda_warm_up_fn warm_up = nullptr;
  knn_cuda_set_idle_release_fn set_idle_release = nullptr;
  knn_cuda_shutdown_fn shutdown = nullptr;
  knn_cuda_run_groups_fn run_groups = nullptr;  // optional: per-group joins in one call
  knn_cuda_set_release_notify_fn set_release_notify = nullptr;  // optional
  knn_cuda_takes_float16_fn takes_float16 = nullptr;  // optional: float16 rows as they are
  knn_cuda_set_concurrent_joins_fn set_concurrent_joins = nullptr;  // optional (the service's)
  // The server's probe record (knn_engine_set_probe_record); "" = none.
  char record_path[PATH_MAX] = "";
  char server_key[256] = "";
  bool record_read = false;      // looked at once per process
  bool from_record = false;      // not loaded: the record says no usable GPU
  char record_note[160] = "";    // why the record could not be written
  bool record_valid = false;     // a valid record was read: its outcome below
  bool record_usable = false;
  char record_reason[384] = "";
};

GpuModule gpu_module;

void on_gpu_runtimes_released() noexcept;  // the module's release notify, below

// Called once, under gpu_module.mutex. Signals stay blocked meanwhile so
// that the threads the CUDA driver starts inherit a blocked mask even when
// a backend thread loads the module (knn_engine_describe).
void load_gpu_module(GpuModule &m) noexcept {
  const knn::SignalsBlocked blocked;
  char path[PATH_MAX + 32];
  std::snprintf(path, sizeof path, "%s/knn_gpu_cuda.so", m.dir[0] != '\0' ? m.dir : ".");
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *why = dlerror();
    std::snprintf(m.description, sizeof m.description, "GPU module not loaded: %.350s",
                  why != nullptr ? why : path);
    return;
  }
  auto probe = reinterpret_cast<knn_cuda_probe_fn>(dlsym(handle, KNN_CUDA_PROBE_SYMBOL));
  auto run = reinterpret_cast<knn_cuda_run_fn>(dlsym(handle, KNN_CUDA_RUN_SYMBOL));
  if (probe == nullptr || run == nullptr) {
    std::snprintf(m.description, sizeof m.description, "GPU module %.300s lacks its entry points",
                  path);
    return;  // keep the handle: unloading CUDA libraries is not worth the risk
  }
  // A module of another build would read and write the structs at other
  // offsets: refused before any of its entries runs.
  auto interface = reinterpret_cast<knn_cuda_interface_fn>(dlsym(handle, KNN_CUDA_INTERFACE_SYMBOL));
  if (interface == nullptr || interface() != knn_cuda_interface_id()) {
    std::snprintf(m.description, sizeof m.description,
                  "GPU module %.300s is from another build of knn_gpu (install it with this "
                  "one)",
                  path);
    return;
  }
  m.usable = probe(m.description, sizeof m.description) != 0;
  m.run = run;
  m.range = reinterpret_cast<knn_cuda_range_fn>(dlsym(handle, KNN_CUDA_RANGE_SYMBOL));
  m.runtime_ready =
      reinterpret_cast<knn_cuda_runtime_ready_fn>(dlsym(handle, KNN_CUDA_RUNTIME_READY_SYMBOL));
  m.warm_up = reinterpret_cast<knn_cuda_warm_up_fn>(dlsym(handle, KNN_CUDA_WARM_UP_SYMBOL));
  m.set_idle_release = reinterpret_cast<knn_cuda_set_idle_release_fn>(
      dlsym(handle, KNN_CUDA_SET_IDLE_RELEASE_SYMBOL));
  m.shutdown = reinterpret_cast<knn_cuda_shutdown_fn>(dlsym(handle, KNN_CUDA_SHUTDOWN_SYMBOL));
  m.run_groups =
      reinterpret_cast<knn_cuda_run_groups_fn>(dlsym(handle, KNN_CUDA_RUN_GROUPS_SYMBOL));
  m.set_release_notify = reinterpret_cast<knn_cuda_set_release_notify_fn>(
      dlsym(handle, KNN_CUDA_SET_RELEASE_NOTIFY_SYMBOL));
  if (m.set_release_notify != nullptr) m.set_release_notify(on_gpu_runtimes_released);
  m.takes_float16 =
      reinterpret_cast<knn_cuda_takes_float16_fn>(dlsym(handle, KNN_CUDA_TAKES_FLOAT16_SYMBOL));
  m.set_concurrent_joins = reinterpret_cast<knn_cuda_set_concurrent_joins_fn>(
      dlsym(handle, KNN_CUDA_SET_CONCURRENT_JOINS_SYMBOL));
}

// ---- the server's probe record ----
//
// Loading the module (libcudart, cuBLAS) and asking the driver costs about
// 100 ms even where there is no GPU, in every new backend. The first process
// that probes writes the outcome to one small file; a later process of the
// same server run reads it and, when it says "no usable GPU", skips the
// module under AUTO. The record is trusted for that skip only: anything odd
// (missing, not a regular file of ours, too long, another server run or
// module file, a bad checksum) means "probe again". Plain POSIX calls only:
// this runs on engine threads as well as on the backend's.

constexpr char kRecordMagic[] = "knn_gpu probe record 1";
constexpr size_t kRecordMax = 2048;

uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; i++) {
    h ^= static_cast<unsigned char>(s[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// "<server key> module <dev>:<inode>:<size>:<mtime>" ("absent" without a
// module file): installing or replacing the module makes the record stale.
void record_key(const GpuModule &m, char *out, size_t len) {
  char path[PATH_MAX + 32];
  std::snprintf(path, sizeof path, "%s/knn_gpu_cuda.so", m.dir[0] != '\0' ? m.dir : ".");
  struct stat st;
  if (stat(path, &st) != 0) {
    std::snprintf(out, len, "%s module absent", m.server_key);
    return;
  }
  std::snprintf(out, len, "%s module %llu:%llu:%lld:%lld.%09ld", m.server_key,
                static_cast<unsigned long long>(st.st_dev),
                static_cast<unsigned long long>(st.st_ino), static_cast<long long>(st.st_size),
                static_cast<long long>(st.st_mtim.tv_sec), static_cast<long>(st.st_mtim.tv_nsec));
}

// Printable ASCII only, one line: the reason comes from a file.
void copy_printable(char *out, size_t len, const char *in, size_t n) {
  size_t j = 0;
  for (size_t i = 0; i < n && j + 1 < len; i++)
    out[j++] = (in[i] >= 0x20 && in[i] < 0x7f) ? in[i] : '?';
  if (len > 0) out[j] = '\0';
}

// Takes the line starting with prefix at *pos; false if it is not there.
bool take_line(const char *buf, size_t n, size_t *pos, const char *prefix, const char **value,
               size_t *value_len) {
  const size_t plen = std::strlen(prefix);
  if (n - *pos < plen || std::memcmp(buf + *pos, prefix, plen) != 0) return false;
  const char *nl = static_cast<const char *>(std::memchr(buf + *pos, '\n', n - *pos));
  if (nl == nullptr) return false;
  *value = buf + *pos + plen;
  *value_len = static_cast<size_t>(nl - *value);
  *pos = static_cast<size_t>(nl - buf) + 1;
  return true;
}

// True when the record is valid for this server run and module file;
// *usable and *reason are then what its probe found.
bool read_record(const GpuModule &m, bool *usable, char *reason, size_t reason_len) {
  if (m.record_path[0] == '\0' || m.server_key[0] == '\0') return false;
  const int fd = open(m.record_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  char buf[kRecordMax];
  ssize_t n = -1;
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      st.st_size > 0 && static_cast<size_t>(st.st_size) < sizeof buf)
    n = read(fd, buf, sizeof buf);
  close(fd);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) return false;
  const size_t len = static_cast<size_t>(n);
  char key[sizeof m.server_key + 128];
  record_key(m, key, sizeof key);
  size_t pos = 0;
  const char *v;
  size_t vl;
  const char *reason_v;
  size_t reason_l;
  if (!take_line(buf, len, &pos, kRecordMagic, &v, &vl) || vl != 0) return false;
  if (!take_line(buf, len, &pos, "key ", &v, &vl) || vl != std::strlen(key) ||
      std::memcmp(v, key, vl) != 0)
    return false;
  if (!take_line(buf, len, &pos, "usable ", &v, &vl) || vl != 1 || (v[0] != '0' && v[0] != '1'))
    return false;
  *usable = v[0] == '1';
  if (!take_line(buf, len, &pos, "reason ", &reason_v, &reason_l)) return false;
  const size_t checked = pos;
  if (!take_line(buf, len, &pos, "check ", &v, &vl) || vl != 16 || pos != len) return false;
  char want[17];
  std::snprintf(want, sizeof want, "%016llx",
                static_cast<unsigned long long>(fnv1a(buf, checked)));
  if (std::memcmp(v, want, 16) != 0) return false;
  copy_printable(reason, reason_len, reason_v, reason_l);
  return true;
}

// Writes what this process's probe found (atomically: a file of our own,
// then rename). A failure is noted for knn_engine_describe, nothing more.
void write_record(GpuModule &m) {
  if (m.record_path[0] == '\0' || m.server_key[0] == '\0') return;
  char key[sizeof m.server_key + 128];
  record_key(m, key, sizeof key);
  char reason[sizeof m.description];
  copy_printable(reason, sizeof reason, m.description, std::strlen(m.description));
  char body[kRecordMax];
  int n = std::snprintf(body, sizeof body, "%s\nkey %s\nusable %d\nreason %s\n", kRecordMagic, key,
                        m.usable ? 1 : 0, reason);
  if (n <= 0 || static_cast<size_t>(n) + 32 >= sizeof body) return;
  n += std::snprintf(body + n, sizeof body - n, "check %016llx\n",
                     static_cast<unsigned long long>(fnv1a(body, static_cast<size_t>(n))));
  char tmp[PATH_MAX + 32];
  std::snprintf(tmp, sizeof tmp, "%s.%ld.tmp", m.record_path, static_cast<long>(getpid()));
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  int why = ok ? 0 : errno;
  if (ok) {
    ok = write(fd, body, static_cast<size_t>(n)) == n;
    if (!ok) why = errno;
    if (close(fd) != 0 && ok) {
      ok = false;
      why = errno;
    }
  }
  if (ok && rename(tmp, m.record_path) != 0) {
    ok = false;
    why = errno;
  }
  if (!ok) {
    if (fd >= 0) unlink(tmp);
    std::snprintf(m.record_note, sizeof m.record_note, "probe record not written: %.120s",
                  std::strerror(why != 0 ? why : EIO));
  }
}

// What the job layer needs of the module, copied under the lock.
struct GpuView {
  bool usable = false;
  bool from_record = false;
  knn_cuda_run_fn run = nullptr;
  knn_cuda_range_fn range = nullptr;
  knn_cuda_run_groups_fn run_groups = nullptr;
  knn_cuda_set_idle_release_fn set_idle_release = nullptr;
  knn_cuda_takes_float16_fn takes_float16 = nullptr;
  char description[384] = "";
  char record_note[160] = "";
};

// knn_job_test_float16_upload (knn_job_testing.h): false makes every job
// widen float16 rows on the host, as for a module without the entry.
std::atomic<bool> float16_upload_enabled{true};

// Whether the module joins this float16 problem's rows as they are.
bool module_takes_float16(const GpuView &m, const KnnProblem &p) {
  return float16_upload_enabled.load() && m.takes_float16 != nullptr &&
         m.takes_float16(&p) != 0;
}

// Every binary16 value widened, indexed by its bits: one lookup per element
// instead of knn_half_to_float's branches (the same values, bit for bit).
const float *half_to_float_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(size_t{1} << 16);
    for (uint32_t bits = 0; bits < t.size(); bits++)
      t[bits] = knn_half_to_float(static_cast<uint16_t>(bits));
    return t;
  }();
  return table.data();
}

// float16 rows widened to float32 for the float engines: exact (every
// binary16 is a float), so a halfvec join is the vector join of the same
// values, as pgvector's halfvec operators compute it. Slices run on the
// job's CPU threads (200000 x 1536 values otherwise take a second on one).
// The buffer is not zero-filled first (every element is written here, and
// a zero fill of a large matrix is a single-threaded pass of its own).
// Returns false when cancelled on the way.
bool widen_rows(const void *rows, int64_t n, int32_t dim, int n_threads,
                const int32_t *cancel, std::unique_ptr<float[]> *out) {
  const auto *h = static_cast<const uint16_t *>(rows);
  const int64_t count = n * dim;
  out->reset(new float[static_cast<size_t>(std::max<int64_t>(count, 1))]);
  const float *table = half_to_float_table();
  float *wide = out->get();
  constexpr int64_t kSlice = int64_t{1} << 20;  // elements between looks at cancel
  knn::cpu::parallel_for((count + kSlice - 1) / kSlice, n_threads, cancel,
                         [&](int64_t slice, int) {
                           const int64_t end = std::min(count, (slice + 1) * kSlice);
                           for (int64_t i = slice * kSlice; i < end; i++) wide[i] = table[h[i]];
                         });
  return __atomic_load_n(cancel, __ATOMIC_RELAXED) == 0;
}

// Reads the server's probe record, once per process, before the module
// is loaded. Under gpu_module.mutex.
void read_record_once(GpuModule &m) {
  if (m.loaded || m.record_read) return;
  m.record_read = true;
  m.record_valid = read_record(m, &m.record_usable, m.record_reason, sizeof m.record_reason);
  if (m.record_valid && !m.record_usable) {  // a GPU: the module is loaded anyway
    m.from_record = true;
    std::snprintf(m.description, sizeof m.description, "%.300s; from the server's probe record",
                  m.record_reason);
  }
}

// The module as AUTO (must_load = false) or GPU (true) sees it. The first
// call of a process reads the server's probe record; AUTO then skips the
// module where the record says no GPU is usable; GPU always loads it
// (probing again, and rewriting the record). Once loaded, usable,
// description and run never change again.
GpuView gpu(bool must_load) {
  GpuView view;
  std::lock_guard<std::mutex> lock(gpu_module.mutex);
  GpuModule &m = gpu_module;
  read_record_once(m);
  if (!m.loaded && (must_load || !m.from_record)) {
    m.description[0] = '\0';
    m.from_record = false;
    load_gpu_module(m);
    m.loaded = true;
    char reason[sizeof m.description];
    copy_printable(reason, sizeof reason, m.description, std::strlen(m.description));
    // Rewritten only when it says something else (or nothing valid).
    if (!m.record_valid || m.record_usable != m.usable || std::strcmp(reason, m.record_reason) != 0)
      write_record(m);
  }
  view.usable = m.usable;
  view.from_record = m.from_record;
  view.run = m.run;
  view.range = m.range;
  view.run_groups = m.run_groups;
  view.set_idle_release = m.set_idle_release;
  view.takes_float16 = m.takes_float16;
  static_assert(sizeof view.description == sizeof m.description, "");
  static_assert(sizeof view.record_note == sizeof m.record_note, "");
  std::memcpy(view.description, m.description, sizeof view.description);
  std::memcpy(view.record_note, m.record_note, sizeof view.record_note);
  return view;
}

// ---- the GPU context permit (knn_engine_set_gpu_contexts) ----
//
// A process takes a permit before its first call into the module that may
// create a GPU runtime (a join, the warm-up) and keeps it while a runtime
// exists; the module's release notify gives it back. A call into the
// module in progress counts as a user: a release notified meanwhile keeps
// the permit, as that call creates the runtime again.

struct ContextPermits {
  std::mutex mutex;  // guards everything below
  char dir[PATH_MAX] = "";
  int32_t max_contexts = 0;  // 0 = no limit
  knn::GpuContextPermit permit;
  bool runtime_held = false;  // a runtime exists (or is being made): no permit needed
  int users = 0;              // calls into the module now
};

ContextPermits &context_permits() {
  static ContextPermits *p = new ContextPermits();  // never destroyed: the module's thread calls in
  return *p;
}

enum class GpuEntry { kGo, kNoneFree, kFailed };

// One look, never blocking: kGo counts the caller as a user (leave with
// GpuUse); kFailed: why says why the permit files failed.
GpuEntry try_enter_gpu(char *why, size_t why_len) {
  ContextPermits &p = context_permits();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (!p.runtime_held) {
    const auto outcome = p.permit.try_take(p.dir, p.max_contexts, why, why_len);
    if (outcome == knn::GpuContextPermit::Outcome::kNoneFree) return GpuEntry::kNoneFree;
    if (outcome == knn::GpuContextPermit::Outcome::kFailed) return GpuEntry::kFailed;
    p.runtime_held = true;
  }
  p.users++;
  return GpuEntry::kGo;
}

// A call into the module, from its try_enter_gpu's kGo to its end.
struct GpuUse {
  GpuUse() = default;
  GpuUse(const GpuUse &) = delete;
  GpuUse &operator=(const GpuUse &) = delete;
  ~GpuUse() {
    ContextPermits &p = context_permits();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.users--;
  }
};

void on_gpu_runtimes_released() noexcept {
  try {
    ContextPermits &p = context_permits();
    std::lock_guard<std::mutex> lock(p.mutex);
    if (p.users > 0) return;
    p.permit.give_back();
    p.runtime_held = false;
  } catch (...) {
    // No lock: the permit stays until the next release or the process exit.
  }
}

// ---- the GPU runtime, created ahead of the first GPU join ----
//
// Under AUTO a process whose GPU runtime does not exist yet runs joins that
// the CPU engine answers sooner than the runtime's creation
// (gpu_cold_start.h) on the CPU, and creates the runtime meanwhile on a
// background thread (signals blocked, never calling PostgreSQL): loading
// the module and probing, then knn_cuda_warm_up. knn_engine_shutdown waits
// for that thread before the process exits.

std::atomic<int64_t> gpu_idle_release_ms{0};  // knn_engine_set_gpu_idle_release

struct WarmUp {
  std::mutex mutex;
  std::condition_variable done;
  bool running = false;
  bool shut_down = false;  // knn_engine_shutdown: no new warm-up
};

WarmUp &warm_up_state() {
  static WarmUp *w = new WarmUp();  // never destroyed: a detached thread uses it
  return *w;
}

void shutdown_at_exit() { knn_engine_shutdown(); }

// Hands the idle release setting to the module, whose timer thread it may
// start. The first time, registers knn_engine_shutdown with atexit: the
// CUDA runtime registered its own teardown when it started (before this),
// so ours runs first and stops the thread before the teardown.
void push_idle_release(knn_cuda_set_idle_release_fn set_idle_release) {
  if (set_idle_release == nullptr) return;
  static std::once_flag registered;
  std::call_once(registered, [] { (void)std::atexit(shutdown_at_exit); });
  set_idle_release(gpu_idle_release_ms.load());
}

void warm_up_gpu() noexcept {
  knn::guarded("GPU warm-up", nullptr, 0, [] {
    const GpuView view = gpu(false);
    knn_cuda_warm_up_fn warm_up = nullptr;
    {
      std::lock_guard<std::mutex> lock(gpu_module.mutex);
      warm_up = gpu_module.warm_up;
    }
    char error[kMessageBytes];
    // Without a context permit free, no warm-up: the next join decides.
    if (view.usable && warm_up != nullptr &&
        try_enter_gpu(error, sizeof error) == GpuEntry::kGo) {
      const GpuUse use;
      (void)warm_up(error, sizeof error);  // a failure shows in the next GPU join
      push_idle_release(view.set_idle_release);
    }
    return KNN_OK;
  });
  WarmUp &w = warm_up_state();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.running = false;
  w.done.notify_all();
}

// Starts the background warm-up unless one runs (or the process exits).
void start_warm_up() {
  WarmUp &w = warm_up_state();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.running || w.shut_down) return;
  try {
    knn::start_signal_free_thread(warm_up_gpu).detach();
    w.running = true;
  } catch (const std::system_error &) {
    // No thread: the first GPU join creates the runtime itself.
  }
}

// Under AUTO: true when this join should run on the CPU because the GPU
// runtime is not ready and the CPU answers sooner than its creation (the
// caller then starts the creation, start_warm_up). Never waits for the
// module.
bool gpu_cold_prefers_cpu(const KnnProblem &p) {
  {
    std::unique_lock<std::mutex> lock(gpu_module.mutex, std::try_to_lock);
    if (lock.owns_lock()) {
      GpuModule &m = gpu_module;
      read_record_once(m);
      if (!m.loaded && m.from_record) return false;  // no GPU: the CPU path follows anyway
      if (m.loaded && !m.usable) return false;
      if (m.loaded && (m.runtime_ready == nullptr || m.warm_up == nullptr || m.runtime_ready() != 0))
        return false;  // ready (or a module that cannot warm up ahead)
    }
    // Not locked: a background load holds the module: not ready.
  }
  return knn::cpu_answers_before_cold_gpu(p);
}

}  // namespace

struct KnnJob {
  KnnProblem problem;
  int64_t *neighbors = nullptr;
  double *distances = nullptr;
  int32_t cancel = 0;  // written with __atomic_store_n, read by the engines

  std::mutex mutex;
  std::condition_variable finished_cv;
  std::atomic<bool> finished{false};
  KnnStatus status = KNN_INTERNAL_ERROR;
  KnnStats stats{};
  char error[kMessageBytes] = "";  // failure, or notice of an OK status
  std::thread thread;
  std::unique_ptr<float[]> wide_queries;  // float16 rows widened (FLOAT16 problems)
  std::unique_ptr<float[]> wide_targets;
  // Admission (knn_job_wants_slot / knn_job_admit), under mutex.
  enum class Slot { kNone, kWanted, kGranted } slot = Slot::kNone;
  int64_t granted_memory_limit = 0;
  std::condition_variable admitted_cv;
  // Range jobs: the pairs on their way to knn_job_take_pairs.
  std::unique_ptr<knn::PairQueue> pairs;
  double seconds_context_wait = 0;  // for a GPU context permit (KnnStats.seconds_queued)
  bool service_allowed = true;  // false: per-group sub-problems, or the service left

  void run() noexcept;

 private:
  KnnStatus run_engines();
  KnnStatus run_one();
  KnnStatus run_groups();
  KnnStatus run_groups_split(const knn::GroupPartition &part);
  KnnStatus run_groups_gpu(const GpuView &m, const knn::GroupPartition &part);
  KnnStatus run_float_engines();
  KnnStatus run_bit();
  KnnStatus run_gpu_or_cpu();
  KnnStatus run_via_service(const knn::service::ClientSettings &s);
  KnnStatus run_range();
  KnnStatus run_range_cpu(const char *note);
  KnnStatus run_range_gpu(const GpuView &m);
  KnnStatus run_range_by_top_k();
  KnnStatus widen();
  bool widen_problem_rows();
  KnnStatus run_cpu(const char *note);
  KnnStatus run_gpu(const GpuView &m);
  template <class CpuRun>
  KnnStatus cpu_after_gpu_failure(KnnStatus gpu_status, CpuRun run_on_cpu);
  KnnStatus await_slot();
  template <class GpuRun, class CpuRun>
  KnnStatus with_context_permit(GpuRun run_on_gpu, CpuRun run_on_cpu);
  void announce_finished() noexcept;
};

// Appends " [note]" to the name of the engine that ran (why it ran).
static void note_engine(KnnStats *stats, const char *note) {
  if (note == nullptr) return;
  const size_t used = std::strlen(stats->device_name);
  std::snprintf(stats->device_name + used, sizeof stats->device_name - used, " [%s]", note);
}

// The CPU engine of the problem's rows: the bit engine or the float one
// (float16 rows widened first: it takes float32 rows).
KnnStatus KnnJob::run_cpu(const char *note) {
  if (problem.element == KNN_ELEMENT_FLOAT16) {
    const KnnStatus widened = widen();
    if (widened != KNN_OK) return widened;
  }
  const KnnStatus st =
      problem.element == KNN_ELEMENT_BIT
          ? knn::cpu::bit_run(problem, neighbors, distances, &stats, &cancel, error, sizeof error)
          : knn::cpu_run(problem, neighbors, distances, &stats, &cancel, error, sizeof error);
  note_engine(&stats, note);
  return st;
}

// Asks the caller for a slot and waits for it (once per job: the groups of
// a per-group join share it), looking at cancel every few milliseconds.
KnnStatus KnnJob::await_slot() {
  std::unique_lock<std::mutex> lock(mutex);
  if (slot == Slot::kNone) {
    slot = Slot::kWanted;
    finished_cv.notify_all();  // knn_job_wait returns: the caller sees the request
  }
  while (slot != Slot::kGranted) {
    if (__atomic_load_n(&cancel, __ATOMIC_RELAXED) != 0) {
      knn::copy_message(error, sizeof error, "cancelled while waiting for a GPU slot");
      return KNN_CANCELLED;
    }
    admitted_cv.wait_for(lock, std::chrono::milliseconds(5));
  }
  if (granted_memory_limit > 0) problem.gpu_memory_limit = granted_memory_limit;
  return KNN_OK;
}

// Runs run_on_gpu() holding this process's GPU context permit (taken
// first where no runtime exists; see try_enter_gpu) and then the job's
// admission slot (when it asks for one). Where no permit is free:
// under AUTO run_on_cpu(note), under GPU a cancellable wait for one, every
// few milliseconds. Permit files that fail: under AUTO the CPU engine with
// a notice, under GPU the job's error.
template <class GpuRun, class CpuRun>
KnnStatus KnnJob::with_context_permit(GpuRun run_on_gpu, CpuRun run_on_cpu) {
  const auto started = std::chrono::steady_clock::now();
  char why[kMessageBytes];
  for (;;) {
    const GpuEntry entry = try_enter_gpu(why, sizeof why);
    if (entry == GpuEntry::kGo) break;
    if (entry == GpuEntry::kFailed) {
      if (problem.device != KNN_DEVICE_AUTO) {
        knn::copy_message(error, sizeof error, why);
        return KNN_DEVICE_ERROR;
      }
      const KnnStatus st = run_on_cpu("GPU context permit failed: CPU engine");
      if (st == KNN_OK) std::snprintf(error, sizeof error, "%.400s; the CPU engine ran", why);
      return st;
    }
    if (problem.device == KNN_DEVICE_AUTO) return run_on_cpu("no GPU context free: CPU engine");
    if (__atomic_load_n(&cancel, __ATOMIC_RELAXED) != 0) {
      knn::copy_message(error, sizeof error, "cancelled while waiting for a GPU context permit");
      return KNN_CANCELLED;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    seconds_context_wait =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  const GpuUse use;
  if (problem.admission != KNN_ADMISSION_NONE) {
    const KnnStatus admitted = await_slot();
    if (admitted != KNN_OK) return admitted;
  }
  return run_on_gpu();
}

// Float16 rows go to the module as they are where it takes them
// (knn_cuda_takes_float16), else widened first, before the job waits for
// the GPU; the CPU engine widens them itself when it runs instead.
KnnStatus KnnJob::run_gpu(const GpuView &m) {
  if (problem.element == KNN_ELEMENT_FLOAT16 && !module_takes_float16(m, problem)) {
    const KnnStatus widened = widen();
    if (widened != KNN_OK) return widened;
  }
  return with_context_permit(
      [this, &m] {
        const KnnStatus st =
            m.run(&problem, neighbors, distances, &stats, &cancel, error, sizeof error);
        push_idle_release(m.set_idle_release);
        return cpu_after_gpu_failure(st,
                                     [this] { return run_cpu("GPU failed, CPU engine ran"); });
      },
      [this](const char *note) { return run_cpu(note); });
}

// Under AUTO a GPU that could not take the job (out of memory, a device
// error) hands it to the CPU engine (run_on_cpu), with a notice that says
// why; any other outcome, and any outcome under GPU, stands.
template <class CpuRun>
KnnStatus KnnJob::cpu_after_gpu_failure(KnnStatus gpu_status, CpuRun run_on_cpu) {
  if (problem.device != KNN_DEVICE_AUTO ||
      (gpu_status != KNN_OUT_OF_MEMORY && gpu_status != KNN_DEVICE_ERROR))
    return gpu_status;
  char gpu_error[kMessageBytes];
  knn::copy_message(gpu_error, sizeof gpu_error, error);
  stats = KnnStats{};
  error[0] = '\0';
  const KnnStatus cpu_st = run_on_cpu();
  if (cpu_st == KNN_OK)
    std::snprintf(error, sizeof error, "the GPU engine failed (%.400s); the CPU engine ran",
                  gpu_error);
  return cpu_st;
}

// Bit rows: the GPU bit join (k up to KNN_CUDA_BIT_MAX_K) under GPU, and
// under AUTO where a GPU is usable and ready (as float rows); else the CPU
// bit engine, and a notice says why when the GPU was asked for.
KnnStatus KnnJob::run_bit() {
  if (problem.device == KNN_DEVICE_CPU) return run_cpu(nullptr);
  if (problem.k > KNN_CUDA_BIT_MAX_K) {
    const KnnStatus st = run_cpu("k above the GPU bit join's 256");
    if (problem.device == KNN_DEVICE_GPU && st == KNN_OK)
      std::snprintf(error, sizeof error,
                    "the GPU bit join takes k up to %d; the CPU engine ran", KNN_CUDA_BIT_MAX_K);
    return st;
  }
  return run_gpu_or_cpu();
}

// Turns a FLOAT16 problem into the FLOAT32 problem of the same values.
KnnStatus KnnJob::widen() {
  if (const char *why = knn::problem_invalid_reason(problem, neighbors, distances)) {
    knn::copy_message(error, sizeof error, why);
    return KNN_INVALID_ARGUMENT;
  }
  if (!widen_problem_rows()) {
    knn::copy_message(error, sizeof error, "cancelled");
    return KNN_CANCELLED;
  }
  return KNN_OK;
}

// The problem's float16 rows replaced by float32 ones (one matrix when
// both sides share it); false when cancelled on the way.
bool KnnJob::widen_problem_rows() {
  const bool shared = problem.queries == problem.targets && problem.n_queries == problem.n_targets;
  const int threads = knn::cpu::resolve_threads(problem.n_threads);
  if (!widen_rows(problem.queries, problem.n_queries, problem.dim, threads, &cancel, &wide_queries) ||
      (!shared &&
       !widen_rows(problem.targets, problem.n_targets, problem.dim, threads, &cancel, &wide_targets)))
    return false;
  problem.element = KNN_ELEMENT_FLOAT32;
  problem.queries = wide_queries.get();
  problem.targets = shared ? wide_queries.get() : wide_targets.get();
  return true;
}

KnnStatus KnnJob::run_engines() {
  if (problem.fault == KNN_FAULT_RUN) throw std::runtime_error("fault injection");
  if (problem.fault == KNN_FAULT_BAD_ALLOC) throw std::bad_alloc();
  if (problem.range != KNN_RANGE_NONE) return run_range();
  if (problem.query_groups != nullptr || problem.target_groups != nullptr) return run_groups();
  return run_one();
}

// ---- range jobs ----
//
// A capped range job whose radius a sample says holds more pairs a query
// than the cap, or whose range bounds would barely prune (the cost rule),
// runs as the top-k join (capped_range.h), on the engine the k-NN path
// chooses. Otherwise the engine of a range job: the GPU range join (knn_cuda_range) under
// GPU, and under AUTO where a GPU is usable and would answer sooner:
//  * the job has at least kGpuRangeMinPairs candidate pairs (|Q| x |T|;
//    below that the CPU range engine answers within milliseconds, about
//    what the GPU's uploads and launches cost), and
//  * the GPU runtime exists, or the CPU would not answer before its
//    creation (gpu_cold_start.h, the rule of k-NN joins, on the CPU's
//    brute-force estimate at k = 1, an upper bound of its range join).
// Else the CPU range engine (cpu/range_join.h); under GPU a notice says
// why. Either way the pairs go through the job's queue, and the statistics
// name the engine that ran. Groups are a filter of the join itself, not
// split here.
namespace {

constexpr double kGpuRangeMinPairs = 1e7;

// The GPU range join's sink: the job's queue, whose put waits while it is
// full and gives up on a cancel. Nothing is thrown into the module.
struct GpuRangeSink {
  knn::PairQueue *queue;
  const int32_t *cancel;
  bool handed_over = false;  // pairs reached the queue: no CPU rerun after a failure

  static int put(void *context, int64_t query_row, const int64_t *target_rows,
                 const double *distances, int64_t n) {
    auto *sink = static_cast<GpuRangeSink *>(context);
    sink->handed_over = true;
    try {
      return sink->queue->put(query_row, target_rows, distances, n, sink->cancel) ? 1 : 0;
    } catch (...) {
      return 0;  // the join stops as cancelled
    }
  }
};

}  // namespace

KnnStatus KnnJob::run_range() {
  if (pairs == nullptr) {
    knn::copy_message(error, sizeof error, "a range job needs its pair queue");
    return KNN_INTERNAL_ERROR;
  }
  // Test mode: CPU range joins take a slot as GPU ones do (no GPU in CI).
  if (problem.admission == KNN_ADMISSION_ALL) {
    const KnnStatus admitted = await_slot();
    if (admitted != KNN_OK) return admitted;
  }
  if (problem.element == KNN_ELEMENT_FLOAT16) {
    if (problem.dim < 1 || problem.n_queries < 0 || problem.n_targets < 0 ||
        problem.n_queries > INT64_MAX / 16 / problem.dim ||
        problem.n_targets > INT64_MAX / 16 / problem.dim) {
      knn::copy_message(error, sizeof error, "bad dimensions or row counts");
      return KNN_INVALID_ARGUMENT;
    }
    if (!widen_problem_rows()) {
      knn::copy_message(error, sizeof error, "cancelled");
      return KNN_CANCELLED;
    }
  }
  // A cap the radius is expected to overfill, or bounds that barely prune:
  // the top-k join, either engine.
  if (problem.k > 0) {
    if (const char *why = knn::range_problem_invalid_reason(problem)) {
      knn::copy_message(error, sizeof error, why);
      return KNN_INVALID_ARGUMENT;
    }
    // (not where a GPU request would then leave the GPU: bit rows past the
    // GPU bit join's k, which the GPU range join takes)
    const bool gpu_bits_past_k = problem.device == KNN_DEVICE_GPU &&
                                 problem.element == KNN_ELEMENT_BIT &&
                                 problem.k > KNN_CUDA_BIT_MAX_K;
    if (!gpu_bits_past_k && knn::capped_range_prefers_top_k(problem, &cancel))
      return run_range_by_top_k();
  }
  if (problem.device == KNN_DEVICE_CPU) return run_range_cpu(nullptr);
  if (problem.device == KNN_DEVICE_AUTO) {
    const double candidates =
        static_cast<double>(problem.n_queries) * static_cast<double>(problem.n_targets);
    if (candidates < kGpuRangeMinPairs) return run_range_cpu("small, CPU answers sooner");
    KnnProblem as_join = problem;
    as_join.k = 1;
    if (gpu_cold_prefers_cpu(as_join)) {
      const KnnStatus st = run_range_cpu("GPU not ready, CPU answers sooner");
      start_warm_up();
      return st;
    }
  }
  const char *why_not = nullptr;
  char reason[kMessageBytes] = "";
  GpuView m;
  if (problem.n_targets > KNN_CUDA_RANGE_MAX_TARGETS) {
    why_not = "too many targets for the GPU";
    std::snprintf(reason, sizeof reason, "the GPU range join takes fewer than 2^31 - 1 targets");
  } else {
    m = gpu(problem.device == KNN_DEVICE_GPU);
    if (m.usable && m.range != nullptr) return run_range_gpu(m);
    why_not = !m.usable ? (m.from_record ? "no GPU: server's probe record" : "no GPU")
                        : "GPU module without range join";
    if (!m.usable)
      std::snprintf(reason, sizeof reason, "no usable GPU (%s)", m.description);
    else
      std::snprintf(reason, sizeof reason, "the GPU module has no range join (an older build)");
  }
  const KnnStatus st = run_range_cpu(why_not);
  if (problem.device == KNN_DEVICE_GPU && st == KNN_OK)
    std::snprintf(error, sizeof error, "%.400s; the CPU engine ran", reason);
  return st;
}

// The CPU range engine, its pairs into the job's queue; note: why it ran
// instead of the GPU (nullptr: it was asked for).
KnnStatus KnnJob::run_range_cpu(const char *note) {
  knn::PairQueue &queue = *pairs;
  const KnnStatus st = knn::cpu::range_run(
      problem,
      [this, &queue](int64_t q, const int64_t *t, const double *d, int64_t n) {
        return queue.put(q, t, d, n, &cancel);
      },
      &stats, &cancel, error, sizeof error);
  note_engine(&stats, note);
  return st;
}

// The GPU range join (after the job's admission slot, as run_gpu). Under
// AUTO a GPU that fails before any pair reached the queue hands the job to
// the CPU engine; after that, a rerun would repeat pairs, so the failure
// stands.
KnnStatus KnnJob::run_range_gpu(const GpuView &m) {
  return with_context_permit(
      [this, &m] {
        GpuRangeSink sink{pairs.get(), &cancel};
        const KnnStatus st =
            m.range(&problem, &GpuRangeSink::put, &sink, &stats, &cancel, error, sizeof error);
        push_idle_release(m.set_idle_release);
        if (sink.handed_over) return st;
        return cpu_after_gpu_failure(
            st, [this] { return run_range_cpu("GPU failed, CPU engine ran"); });
      },
      [this](const char *note) { return run_range_cpu(note); });
}

// A capped range job as top-k joins of slices of its queries
// (capped_range.h), each through the k-NN path of a job of its own problem
// (run_groups or run_one: the engine, admission and notices as there), the
// pairs within the radius into the job's queue.
KnnStatus KnnJob::run_range_by_top_k() {
  const KnnProblem whole = problem;
  knn::PairQueue &queue = *pairs;
  KnnStats summed{};
  const KnnStatus st = knn::capped_range_by_top_k(
      whole,
      [this](const KnnProblem &slice, int64_t *n, double *d, KnnStats *s) {
        problem = slice;
        neighbors = n;
        distances = d;
        stats = KnnStats{};
        const KnnStatus slice_st = slice.query_groups != nullptr ? run_groups() : run_one();
        *s = stats;
        return slice_st;
      },
      [this, &queue](int64_t q, const int64_t *t, const double *d, int64_t n) {
        return queue.put(q, t, d, n, &cancel);
      },
      &summed, &cancel, error, sizeof error);
  problem = whole;
  neighbors = nullptr;
  distances = nullptr;
  stats = summed;
  return st;
}

// One plain problem through the engine its rows and device call for.
// Float16 rows are widened only where the engine that runs needs float32
// rows (run_cpu, run_gpu).
KnnStatus KnnJob::run_one() {
  if (problem.element == KNN_ELEMENT_BIT) return run_bit();
  if (problem.element == KNN_ELEMENT_FLOAT16) {
    if (const char *why = knn::problem_invalid_reason(problem, neighbors, distances)) {
      knn::copy_message(error, sizeof error, why);
      return KNN_INVALID_ARGUMENT;
    }
  }
  return run_float_engines();
}

// A per-group problem: float16 rows are widened once and the rows
// partitioned by group once (group_split.h). Where the GPU runs it and the
// module has the grouped entry, the whole problem goes to the GPU in one
// call; otherwise every group's sub-problem runs through run_one() in
// place of the whole problem.
KnnStatus KnnJob::run_groups() {
  if (problem.query_groups == nullptr || problem.target_groups == nullptr) {
    knn::copy_message(error, sizeof error, "query_groups and target_groups must be given together");
    return KNN_INVALID_ARGUMENT;
  }
  if (const char *why = knn::problem_invalid_reason(problem, neighbors, distances)) {
    knn::copy_message(error, sizeof error, why);
    return KNN_INVALID_ARGUMENT;
  }
  if (problem.element == KNN_ELEMENT_FLOAT16) {
    const KnnStatus st = widen();
    if (st != KNN_OK) return st;
  }
  service_allowed = false;  // per-group joins stay in this process
  knn::GroupPartition part;
  if (!knn::partition_groups(problem, &cancel, &part)) {
    knn::copy_message(error, sizeof error, "cancelled");
    return KNN_CANCELLED;
  }
  // The GPU as run_bit and run_gpu_or_cpu would choose it for a problem
  // of the groups' queries and pairs.
  const bool gpu_rows = problem.element != KNN_ELEMENT_BIT || problem.k <= KNN_CUDA_BIT_MAX_K;
  if (problem.device != KNN_DEVICE_CPU && gpu_rows) {
    KnnProblem grouped = problem;
    grouped.n_queries = static_cast<int64_t>(part.query_rows.size());
    int64_t pairs = 0;
    for (int64_t g = 0; g < part.groups(); g++)
      pairs += (part.query_begin[g + 1] - part.query_begin[g]) *
               (part.target_begin[g + 1] - part.target_begin[g]);
    grouped.n_targets =
        grouped.n_queries > 0 ? (pairs + grouped.n_queries - 1) / grouped.n_queries : 0;
    if (problem.device == KNN_DEVICE_GPU || !gpu_cold_prefers_cpu(grouped)) {
      const GpuView m = gpu(problem.device == KNN_DEVICE_GPU);
      if (m.usable && m.run_groups != nullptr) return run_groups_gpu(m, part);
    }
  }
  return run_groups_split(part);
}

// The whole grouped problem in one call of the module's grouped entry
// (after the job's admission slot, as run_gpu); under AUTO a GPU that
// cannot take it hands it to the CPU engine, group by group.
KnnStatus KnnJob::run_groups_gpu(const GpuView &m, const knn::GroupPartition &part) {
  const auto on_cpu = [this, &part](const char *note) {
    problem.device = KNN_DEVICE_CPU;  // every group on the CPU engine
    const KnnStatus cpu_st = run_groups_split(part);
    problem.device = KNN_DEVICE_AUTO;
    note_engine(&stats, note);
    return cpu_st;
  };
  return with_context_permit(
      [this, &m, &part, &on_cpu] {
        const KnnGroupLayout layout{part.groups(), part.query_rows.data(),
                                    part.query_begin.data(), part.target_rows.data(),
                                    part.target_begin.data()};
        const KnnStatus st = m.run_groups(&problem, &layout, neighbors, distances, &stats,
                                          &cancel, error, sizeof error);
        push_idle_release(m.set_idle_release);
        return cpu_after_gpu_failure(st, [&on_cpu] { return on_cpu(nullptr); });
      },
      on_cpu);
}

// One engine call per group (group_split.h maps the rows back and sums
// the statistics).
KnnStatus KnnJob::run_groups_split(const knn::GroupPartition &part) {
  const KnnProblem whole = problem;
  int64_t *const whole_neighbors = neighbors;
  double *const whole_distances = distances;
  KnnStats summed{};
  const KnnStatus st = knn::run_grouped(
      whole, part, whole_neighbors, whole_distances, &summed, &cancel, error, sizeof error,
      [this](const KnnProblem &sub, int64_t *n, double *d, KnnStats *s) {
        problem = sub;
        neighbors = n;
        distances = d;
        stats = KnnStats{};
        const KnnStatus sub_st = run_one();
        *s = stats;
        return sub_st;
      });
  problem = whole;
  neighbors = whole_neighbors;
  distances = whole_distances;
  stats = summed;
  return st;
}

KnnStatus KnnJob::run_float_engines() {
  // Test mode: CPU joins take a slot as GPU joins do (no GPU in CI).
  if (problem.admission == KNN_ADMISSION_ALL) {
    const KnnStatus admitted = await_slot();
    if (admitted != KNN_OK) return admitted;
  }
  if (problem.device == KNN_DEVICE_CPU) return run_cpu(nullptr);
  return run_gpu_or_cpu();
}

// GPU or AUTO: the GPU where it is usable, except that under AUTO a
// process whose GPU runtime is not ready yet lets the CPU answer when that
// is sooner (and warms the GPU up for the next join).
KnnStatus KnnJob::run_gpu_or_cpu() {
  if (service_allowed) {
    const knn::service::ClientSettings service = knn::service::client_settings();
    if (service.mode != KNN_GPU_SERVICE_OFF) return run_via_service(service);
  }
  if (problem.device == KNN_DEVICE_AUTO && gpu_cold_prefers_cpu(problem)) {
    // The warm-up starts after the CPU join: loading CUDA meanwhile slowed
    // the join itself (an H200 host: 0.19 s instead of 0.08 s).
    const KnnStatus st = run_cpu("GPU not ready, CPU answers sooner");
    start_warm_up();
    return st;
  }
  const GpuView m = gpu(problem.device == KNN_DEVICE_GPU);
  if (m.usable) return run_gpu(m);
  // The CPU engine answers; when a GPU was asked for, the caller is told
  // why (the message of an OK status is a notice).
  const KnnStatus st = run_cpu(m.from_record ? "no GPU: server's probe record" : "no GPU");
  if (problem.device == KNN_DEVICE_GPU && st == KNN_OK)
    std::snprintf(error, sizeof error, "no usable GPU (%s); the CPU engine ran", m.description);
  return st;
}

// How long a join waits for a GPU service that is starting (its GPU
// runtime is created before it listens: a fraction of a second), and for
// one to hold the service's lock (the backend registers the worker just
// before the job starts; the worker takes the lock as it starts).
constexpr auto kServiceStartWait = std::chrono::seconds(30);
constexpr auto kServiceLockWait = std::chrono::seconds(2);

// The join through the GPU service (gpu_service_client.h) instead of this
// process's GPU module: no GPU context here. Under AUTO the server's probe
// record saying "no GPU" means the CPU engine, as without the service, and
// a service that does not listen yet is a GPU that is not ready (the cold
// rule of gpu_cold_start.h); otherwise the join waits for it, cancellably.
// The admission slot is taken once the service listens. A service without
// a GPU hands the join back to the CPU engine; a service that fails or
// dies hands it back under AUTO (cpu_after_gpu_failure).
KnnStatus KnnJob::run_via_service(const knn::service::ClientSettings &s) {
  const bool stand_in = s.mode == KNN_GPU_SERVICE_CPU_STAND_IN;
  if (!stand_in && problem.device == KNN_DEVICE_AUTO && knn_engine_gpu_ruled_out() != 0)
    return run_cpu("no GPU: server's probe record");
  if (!knn::service::listening(s.path, s.lock)) {
    if (problem.device == KNN_DEVICE_AUTO && knn::cpu_answers_before_cold_gpu(problem))
      return run_cpu("GPU service starting, CPU answers sooner");
    const auto started = std::chrono::steady_clock::now();
    auto last_running = started;
    while (!knn::service::listening(s.path, s.lock)) {
      const auto now = std::chrono::steady_clock::now();
      if (knn::service::running(s.lock)) last_running = now;
      if (__atomic_load_n(&cancel, __ATOMIC_RELAXED) != 0) {
        knn::copy_message(error, sizeof error, "cancelled while waiting for the GPU service");
        return KNN_CANCELLED;
      }
      if (!stand_in && knn_engine_gpu_ruled_out() != 0) {
        service_allowed = false;  // the service found no GPU and left: as without it
        return run_gpu_or_cpu();
      }
      const bool none = now - last_running > kServiceLockWait;
      if (none || now - started > kServiceStartWait) {
        if (problem.device == KNN_DEVICE_AUTO)
          return run_cpu(none ? "no GPU service runs: CPU engine"
                              : "GPU service did not start: CPU engine");
        knn::copy_message(error, sizeof error,
                          none ? "no GPU service runs (the next join starts one)"
                               : "the GPU service did not start within 30 s");
        return KNN_DEVICE_ERROR;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    seconds_context_wait =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  // The rows go into the job before the slot is taken: the slot then
  // covers the service's work only.
  knn::service::PreparedJob job;
  KnnStatus st = job.prepare(problem, stand_in, error, sizeof error);
  if (st != KNN_OK)
    return cpu_after_gpu_failure(st, [this] { return run_cpu("GPU service failed, CPU engine ran"); });
  if (problem.admission != KNN_ADMISSION_NONE) {
    const KnnStatus admitted = await_slot();
    if (admitted != KNN_OK) return admitted;
  }
  // A service that holds its lock but refuses the connection is starting
  // (a dead one's socket is still there until it replaces it): wait for
  // it as above, cancellably.
  const auto submitted = std::chrono::steady_clock::now();
  while ((st = job.submit(s.path, problem.gpu_memory_limit, neighbors, distances, &stats, &cancel,
                          error, sizeof error)) == KNN_DEVICE_ERROR &&
         job.refused() && knn::service::running(s.lock) &&
         std::chrono::steady_clock::now() - submitted < kServiceStartWait)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (st == KNN_NO_DEVICE) {
    char why[kMessageBytes];
    knn::copy_message(why, sizeof why, error);
    stats = KnnStats{};
    error[0] = '\0';
    st = run_cpu("no GPU in the GPU service");
    if (problem.device == KNN_DEVICE_GPU && st == KNN_OK)
      std::snprintf(error, sizeof error, "%.400s; the CPU engine ran", why);
    return st;
  }
  if (st == KNN_OK) {
    const size_t used = std::strlen(stats.device_name);
    std::snprintf(stats.device_name + used, sizeof stats.device_name - used, " via GPU service");
  }
  return cpu_after_gpu_failure(st, [this] { return run_cpu("GPU service failed, CPU engine ran"); });
}

void KnnJob::announce_finished() noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex);
    finished.store(true);
  } catch (...) {
    finished.store(true);  // without the lock a waiter wakes at its timeout
  }
  finished_cv.notify_all();
}

void KnnJob::run() noexcept {
  status = knn::guarded("engine", error, sizeof error, [this] { return run_engines(); });
  stats.seconds_queued = seconds_context_wait;
  if (pairs != nullptr) pairs->close();
  announce_finished();
}

extern "C" {

KnnJob *knn_job_start(const KnnProblem *problem, int64_t *neighbors, double *distances,
                      char *errbuf, size_t errlen) {
  KnnJob *started = nullptr;
  knn::guarded("knn_job_start", errbuf, errlen, [&] {
    if (problem == nullptr) throw std::invalid_argument("no problem");
    std::unique_ptr<KnnJob> job(new KnnJob());
    job->problem = *problem;
    job->neighbors = neighbors;
    job->distances = distances;
    // A range job's pairs: the engine works at most this many ahead.
    if (problem->range != KNN_RANGE_NONE) job->pairs.reset(new knn::PairQueue(int64_t{1} << 16));
    if (problem->fault == KNN_FAULT_START) throw std::runtime_error("fault injection");
    KnnJob *raw = job.get();
    job->thread = knn::start_signal_free_thread([raw] { raw->run(); });
    started = job.release();
    return KNN_OK;
  });
  return started;
}

int knn_job_wait(KnnJob *job, int timeout_ms) {
  if (job == nullptr) return 1;
  // A wait that fails only returns early: the caller polls again.
  knn::guarded("knn_job_wait", nullptr, 0, [&] {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->finished_cv.wait_for(lock, std::chrono::milliseconds(std::max(0, timeout_ms)),
                              [job] {
                                return job->finished.load() ||
                                       job->slot == KnnJob::Slot::kWanted;
                              });
    return KNN_OK;
  });
  return job->finished.load() ? 1 : 0;
}

int64_t knn_job_take_pairs(KnnJob *job, int64_t *query_rows, int64_t *target_rows,
                           double *distances, int64_t capacity, int timeout_ms) {
  if (job == nullptr || job->pairs == nullptr) return -1;
  if (capacity < 1 || query_rows == nullptr || target_rows == nullptr || distances == nullptr)
    return 0;
  int64_t taken = -1;
  const KnnStatus st = knn::guarded("knn_job_take_pairs", nullptr, 0, [&] {
    taken = job->pairs->take(query_rows, target_rows, distances, capacity, timeout_ms);
    return KNN_OK;
  });
  // Pairs that cannot be taken must not keep the engine waiting for room.
  if (st != KNN_OK) {
    knn_job_cancel(job);
    return -1;
  }
  return taken;
}

void knn_job_cancel(KnnJob *job) {
  if (job != nullptr) {
    __atomic_store_n(&job->cancel, 1, __ATOMIC_RELAXED);
    job->admitted_cv.notify_all();  // a job waiting for a slot stops now
  }
}

int knn_job_wants_slot(KnnJob *job) {
  if (job == nullptr) return 0;
  int wanted = 0;
  knn::guarded("knn_job_wants_slot", nullptr, 0, [&] {
    std::lock_guard<std::mutex> lock(job->mutex);
    wanted = job->slot == KnnJob::Slot::kWanted ? 1 : 0;
    return KNN_OK;
  });
  return wanted;
}

void knn_job_admit(KnnJob *job, int64_t gpu_memory_limit) {
  if (job == nullptr) return;
  knn::guarded("knn_job_admit", nullptr, 0, [&] {
    {
      std::lock_guard<std::mutex> lock(job->mutex);
      job->granted_memory_limit = std::max<int64_t>(0, gpu_memory_limit);
      job->slot = KnnJob::Slot::kGranted;
    }
    job->admitted_cv.notify_all();
    return KNN_OK;
  });
}

KnnStatus knn_job_finish(KnnJob *job, KnnStats *stats, char *errbuf, size_t errlen) {
  if (job == nullptr) {
    knn::copy_message(errbuf, errlen, "knn_job_finish: no job");
    return KNN_INVALID_ARGUMENT;
  }
  bool joined = false;
  const KnnStatus status = knn::guarded("knn_job_finish", errbuf, errlen, [&] {
    if (job->thread.joinable()) job->thread.join();
    joined = true;
    if (job->problem.fault == KNN_FAULT_FINISH) throw std::runtime_error("fault injection");
    if (stats != nullptr) *stats = job->stats;
    knn::copy_message(errbuf, errlen, job->error);
    return job->status;
  });
  // A thread that could not be joined may still use the job: leak it
  // rather than free memory under it.
  if (joined) delete job;
  return status;
}

void knn_engine_set_probe_record(const char *path, const char *server_key) {
  knn::guarded("knn_engine_set_probe_record", nullptr, 0, [&] {
    std::lock_guard<std::mutex> lock(gpu_module.mutex);
    // Too long a name is no record at all, rather than another file's.
    const bool fits = path != nullptr && server_key != nullptr &&
                      std::strlen(path) < sizeof gpu_module.record_path &&
                      std::strlen(server_key) < sizeof gpu_module.server_key &&
                      std::strchr(server_key, '\n') == nullptr;
    knn::copy_message(gpu_module.record_path, sizeof gpu_module.record_path, fits ? path : "");
    knn::copy_message(gpu_module.server_key, sizeof gpu_module.server_key,
                      fits ? server_key : "");
    return KNN_OK;
  });
}

void knn_engine_set_gpu_contexts(const char *dir, int32_t max_contexts) {
  knn::guarded("knn_engine_set_gpu_contexts", nullptr, 0, [&] {
    ContextPermits &p = context_permits();
    std::lock_guard<std::mutex> lock(p.mutex);
    // Too long a name is none at all (a clear error when a permit is needed).
    const bool fits = dir != nullptr && std::strlen(dir) < sizeof p.dir;
    knn::copy_message(p.dir, sizeof p.dir, fits ? dir : "");
    p.max_contexts = std::max<int32_t>(0, max_contexts);
    return KNN_OK;
  });
}

int knn_engine_gpu_ruled_out(void) {
  int ruled_out = 0;
  knn::guarded("knn_engine_gpu_ruled_out", nullptr, 0, [&] {
    // Never waits: a background warm-up may hold the module (a backend's
    // main thread calls this), and one that does has not ruled it out yet.
    std::unique_lock<std::mutex> lock(gpu_module.mutex, std::try_to_lock);
    if (!lock.owns_lock()) return KNN_OK;
    if (gpu_module.loaded) {
      ruled_out = gpu_module.usable ? 0 : 1;
      return KNN_OK;
    }
    bool usable = false;
    char reason[sizeof gpu_module.record_reason];
    if (read_record(gpu_module, &usable, reason, sizeof reason) && !usable) ruled_out = 1;
    return KNN_OK;
  });
  return ruled_out;
}

int knn_engine_prepare_gpu(char *description, size_t len) {
  // The service's main thread runs this with its signals open (a
  // background worker): the threads the driver starts while the context,
  // cuBLAS and the pinned staging are created inherit this mask, so it is
  // blocked meanwhile, or PostgreSQL's handlers could run on them.
  const knn::SignalsBlocked blocked;
  int usable = 0;
  knn::guarded("knn_engine_prepare_gpu", description, len, [&] {
    const GpuView view = gpu(true);
    knn::copy_message(description, len, view.description);
    if (!view.usable) return KNN_OK;
    usable = 1;
    knn_cuda_warm_up_fn warm_up = nullptr;
    {
      std::lock_guard<std::mutex> lock(gpu_module.mutex);
      warm_up = gpu_module.warm_up;
      // The service's joins (one per backend holding a max_gpu_jobs slot)
      // run side by side, each on a runtime replica of its own.
      if (gpu_module.set_concurrent_joins != nullptr)
        gpu_module.set_concurrent_joins(KNN_MAX_DEVICES);
    }
    char error[kMessageBytes];
    if (warm_up != nullptr && try_enter_gpu(error, sizeof error) == GpuEntry::kGo) {
      const GpuUse use;
      (void)warm_up(error, sizeof error);  // a failure shows in the first join
      push_idle_release(view.set_idle_release);
    }
    return KNN_OK;
  });
  return usable;
}

void knn_job_test_float16_upload(int enabled) { float16_upload_enabled.store(enabled != 0); }

void knn_engine_set_gpu_idle_release(int64_t idle_ms) {
  gpu_idle_release_ms.store(std::max<int64_t>(0, idle_ms));
}

void knn_engine_shutdown(void) {
  knn::guarded("knn_engine_shutdown", nullptr, 0, [] {
    WarmUp &w = warm_up_state();
    {
      std::unique_lock<std::mutex> lock(w.mutex);
      w.shut_down = true;
      // Bounded: a driver that hangs must not keep the process from exiting.
      w.done.wait_for(lock, std::chrono::seconds(10), [&w] { return !w.running; });
    }
    std::unique_lock<std::mutex> lock(gpu_module.mutex, std::try_to_lock);
    if (lock.owns_lock() && gpu_module.shutdown != nullptr) gpu_module.shutdown();
    return KNN_OK;
  });
}

void knn_engine_set_module_dir(const char *dir) {
  knn::guarded("knn_engine_set_module_dir", nullptr, 0, [&] {
    std::lock_guard<std::mutex> lock(gpu_module.mutex);
    knn::copy_message(gpu_module.dir, sizeof gpu_module.dir, dir);
    return KNN_OK;
  });
}

int knn_engine_describe(char *buf, size_t len) {
  if (buf == nullptr) len = 0;
  int usable = 0;
  knn::guarded("knn_engine_describe", buf, len, [&] {
    const GpuView m = gpu(false);
    usable = m.usable ? 1 : 0;
    if (len == 0) return KNN_OK;
    if (m.usable) {
      std::snprintf(buf, len, "gpu: %s", m.description);
    } else {
      knn_engine_describe_cpu(buf, len);
      const size_t used = std::strlen(buf);
      std::snprintf(buf + used, len - used, " (%s)", m.description);
    }
    if (m.record_note[0] != '\0') {
      const size_t used = std::strlen(buf);
      std::snprintf(buf + used, len - used, " [%s]", m.record_note);
    }
    return KNN_OK;
  });
  return usable;
}

void knn_engine_describe_cpu(char *buf, size_t len) {
  if (buf == nullptr || len == 0) return;
  knn::guarded("knn_engine_describe_cpu", buf, len, [&] {
    const unsigned threads =
        std::min(std::thread::hardware_concurrency(), unsigned{KNN_MAX_THREADS});
    std::snprintf(buf, len, "cpu: %u threads, BLAS: %s", std::max(threads, 1u),
                  knn::cpu_blas_description());
    return KNN_OK;
  });
}

}  // extern "C"
