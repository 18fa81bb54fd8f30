// blas_buffers.h -- OpenBLAS's work buffers, made sure of before any SGEMM
// runs. Internal to kernels/cpu/.
//
// OpenBLAS gives every sgemm_ running at one time a work buffer of its own
// (BUFFER_SIZE: 128 MiB on x86-64), which it maps the first time that many
// calls run at once and keeps for the life of the process. When that mmap
// fails, its blas_memory_alloc retries forever (0.3.21, Debian 12's, and
// still 0.3.28): under `ulimit -v`, or with vm.overcommit_memory = 2 on a
// host short of memory, the engine thread spun there and no cancel or
// SIGTERM could end the backend's wait for it.
//
// So every SGEMM runs under a lease. A lease has OpenBLAS map the buffers
// it lacks itself, one at a time (blas_memory_alloc, holding the ones it
// already has so that each call takes the next one), each only right after
// a trial mmap of that size, and some to spare, succeeded; and it grants
// as many SGEMMs at once as there are buffers. OpenBLAS takes the first
// free buffer, so while no more SGEMMs run at once than a lease granted,
// none of them maps anything. New buffers are mapped only while no other
// lease is held: no SGEMM runs during it. What remains: under overcommit 2
// another process may take the room between the trial and OpenBLAS's mmap
// (microseconds, the first time only); an OpenBLAS built with a larger
// BUFFERSIZE than its default is not known here.
#pragma once

namespace knn {
namespace cpu {

class BlasBufferLease {
 public:
  // Asks for `wanted` SGEMMs at once; never throws.
  explicit BlasBufferLease(int wanted) noexcept;
  ~BlasBufferLease();
  BlasBufferLease(const BlasBufferLease &) = delete;
  BlasBufferLease &operator=(const BlasBufferLease &) = delete;

  // How many SGEMMs may run at once under this lease: 0 (no BLAS, or no
  // room for even one buffer) to `wanted`.
  int granted() const { return granted_; }

 private:
  int granted_ = 0;
};

}  // namespace cpu
}  // namespace knn
