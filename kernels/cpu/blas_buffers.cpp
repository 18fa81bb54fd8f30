// blas_buffers.cpp -- leases of OpenBLAS's work buffers (blas_buffers.h).
#include "blas_buffers.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <mutex>

#include "blas_library.h"
#include "../knn_engine.h"

namespace knn {
namespace cpu {
namespace {

// OpenBLAS's BUFFER_SIZE on x86-64 (32 << 22; on ARM64 it is 32 MiB).
constexpr size_t kOpenblasBufferBytes = size_t{128} << 20;
// A trial asks for this much more, so that what else the process or the
// host allocates meanwhile does not take the room it found.
constexpr size_t kSpareBytes = size_t{32} << 20;

struct Buffers {
  std::mutex mutex;
  int mapped = 0;  // buffers OpenBLAS has mapped under a lease
  int leased = 0;  // SGEMMs granted by the leases held now
};

Buffers &buffers() {
  static Buffers b;
  return b;
}

// Could a buffer be mapped now? The same kind of mapping as OpenBLAS's
// (private, writable: it counts against RLIMIT_AS and the commit limit).
bool room_for_a_buffer() {
  const size_t bytes = kOpenblasBufferBytes + kSpareBytes;
  void *trial = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (trial == MAP_FAILED) return false;
  munmap(trial, bytes);
  return true;
}

// Has OpenBLAS map buffers until it holds `wanted` (or no room is left).
// With no SGEMM running, the i-th call of blas_memory_alloc while the
// earlier ones are held takes the i-th buffer: the ones past `mapped` are
// new, and each is asked for only after a trial found room for it.
void map_buffers(const BlasLibrary &lib, Buffers &b, int wanted) {
  void *held[KNN_MAX_THREADS];
  int n_held = 0;
  while (n_held < wanted) {
    if (n_held >= b.mapped && !room_for_a_buffer()) break;
    void *buffer = lib.buffer_alloc(0);
    if (buffer == nullptr) break;  // OpenBLAS's table of buffers is full
    held[n_held++] = buffer;
    b.mapped = std::max(b.mapped, n_held);
  }
  for (int i = 0; i < n_held; i++) lib.buffer_free(held[i]);
}

}  // namespace

BlasBufferLease::BlasBufferLease(int wanted) noexcept {
  const BlasLibrary &lib = blas_library();
  wanted = std::max(0, std::min(wanted, KNN_MAX_THREADS));
  if (!lib.usable() || wanted == 0) return;
  if (lib.buffer_alloc == nullptr) {
    granted_ = wanted;  // BLIS: no such buffers
    return;
  }
  Buffers &b = buffers();
  try {
    std::lock_guard<std::mutex> lock(b.mutex);
    if (b.leased == 0 && b.mapped < wanted) map_buffers(lib, b, wanted);
    granted_ = std::max(0, std::min(wanted, b.mapped - b.leased));
    b.leased += granted_;
  } catch (...) {
    granted_ = 0;  // the mutex could not be taken: no SGEMM
  }
}

BlasBufferLease::~BlasBufferLease() {
  if (granted_ == 0 || blas_library().buffer_alloc == nullptr) return;
  Buffers &b = buffers();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.leased -= granted_;
}

}  // namespace cpu
}  // namespace knn
