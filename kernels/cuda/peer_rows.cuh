// peer_rows.cuh -- the engines of a brute-force join split across GPUs
// upload the target rows once between them and copy each other's parts
// over the GPUs' peer links (multi_device.cuh, brute_force.cu).
//
// Every engine of a split needs every target row on its own GPU. Uploaded
// from the host by each engine, the host's links carry the targets once per
// GPU (four GPUs: four times 3 GB for 1000000 x 768), and they, not the
// GPUs, bound the join. Here each member -- an engine with query rows --
// uploads only its slice of the target rows (member m of M: rows
// [n m / M, n (m + 1) / M)) into its own resident buffer, and copies the
// other slices from the other members' buffers, GPU to GPU.
//
// The same rows, bit for bit, end up in every buffer, so the results are
// those of an upload from the host. Sharing is all or nothing: each member
// offers its buffer once, or declines (its plan keeps no resident buffer
// of the whole targets, a GPU of the split cannot reach its own, or it
// failed first); the offer closes when all have offered, and the members
// share only if all offered buffers of the same shape and every GPU can
// read every other's memory. Otherwise each uploads everything itself.
// An offering engine never waits for long (patient_wait.cuh): after a
// cancel, a failure or kPatience the offer closes without sharing.
//
// Once shared, a member's buffer is read by the others: a member marks its
// slice done (or failed: the join fails with it, and the readers stop),
// and never frees its buffer before every member has said it reads no
// more (wait_for_readers, after each reader drained its stream).
// PeerRowsTurn does this in that order on every path of an engine.
//
// A split has two more instances for a TI self-join: the upload of its
// points (ti_join.cu: upload_points_shared, DeviceContext::peer_points;
// rows of the padded stride) and its cluster assignment
// (ti_clustering.cu: assign_shared, DeviceContext::peer_assign), where the
// "rows" are each distinct point's picked centre (int32 words in the float
// buffer, one a row) and "dim" is the number of centres, which the engines
// must agree on too. Their patience is shorter (kAssignPatience), as they
// come before the share vote's own.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "../knn_engine.h"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"
#include "device_runtime.cuh"
#include "patient_wait.cuh"

namespace knn {
namespace cuda {

class PeerRows {
 public:
  static constexpr std::chrono::milliseconds kPatience{3000};
  static constexpr std::chrono::milliseconds kAssignPatience{1000};

  // members: the engine indices that will offer or decline, ascending;
  // patience: how long an offer waits for the others.
  PeerRows(const int *members, int n_members,
           std::chrono::milliseconds patience = kPatience)
      : n_members_(n_members), patience_(patience) {
    for (int i = 0; i < KNN_MAX_DEVICES; i++) member_of_[i] = -1;
    for (int m = 0; m < n_members && m < KNN_MAX_DEVICES; m++) member_of_[members[m]] = m;
  }
  PeerRows(const PeerRows &) = delete;
  PeerRows &operator=(const PeerRows &) = delete;

  // Offers `rows` (n_rows x dim floats on ctx's GPU, to hold the host rows
  // `host` of element type `element` with keys `keys`) and waits for the
  // outcome (*shared). KNN_CANCELLED when the cancel came first (the offer
  // then closes without sharing). pool: the pool `rows` came from (a pool
  // of shared rows, device_runtime.cuh: shared_rows_pool), null for the
  // GPU's default pool; access is granted to that pool.
  KnnStatus offer(DeviceContext &ctx, int engine, float *rows, int64_t n_rows, int dim,
                  const void *host, int element, const int64_t *keys, bool *shared,
                  cudaMemPool_t pool = nullptr) {
    std::unique_lock<std::mutex> lock(mutex_);
    *shared = false;
    const int m = member(engine);
    if (m < 0 || offered_[m] || closed_) {
      if (m >= 0) offered_[m] = true;
      return KNN_OK;
    }
    offered_[m] = true;
    buffer_[m] = Buffer{ctx.device, rows, pool};
    if (offers_ == 0) {
      n_rows_ = n_rows;
      dim_ = dim;
      host_ = host;
      element_ = element;
      keys_ = keys;
    }
    same_ = same_ && n_rows == n_rows_ && dim == dim_ && host == host_ && element == element_ &&
            keys == keys_;
    if (++offers_ == n_members_) close(n_members_ > 1 && same_ && reachable());
    KNN_TRY(wait_until_closed(lock, changed_, closed_, patience_, ctx, [this] { close(false); }));
    *shared = shared_;
    return KNN_OK;
  }

  // Declines (no wait), unless this engine offered already.
  void decline(int engine) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int m = member(engine);
    if (m < 0 || offered_[m]) return;
    offered_[m] = true;
    close(false);
  }

  int members() const { return n_members_; }
  int member(int engine) const {
    return engine >= 0 && engine < KNN_MAX_DEVICES ? member_of_[engine] : -1;
  }

  // Member m's slice of the target rows.
  void slice(int m, int64_t *first, int64_t *count) const {
    const int64_t lo = n_rows_ * m / n_members_, hi = n_rows_ * (m + 1) / n_members_;
    *first = lo;
    *count = hi - lo;
  }

  // Member m's buffer (valid once shared).
  float *rows_of(int m) const { return buffer_[m].rows; }
  int device_of(int m) const { return buffer_[m].device; }

  // Member m's slice is complete on its GPU (ok), or will never be.
  void slice_done(int m, bool ok) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (slice_state_[m] != kPending) return;
    slice_state_[m] = ok ? kReady : kFailed;
    changed_.notify_all();
  }

  // Waits for member m's slice: *ready when it can be copied from m's
  // buffer, false when it will not come (m failed: so does the join).
  KnnStatus wait_slice(DeviceContext &ctx, int m, bool *ready) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (slice_state_[m] == kPending) {
      if (ctx.cancelled()) return ctx.cancel_point();
      changed_.wait_for(lock, std::chrono::milliseconds(1));
    }
    *ready = slice_state_[m] == kReady;
    return KNN_OK;
  }

  // Member m reads the others' buffers no more (its copies completed).
  void done_reading(int m) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_reading_[m]) return;
    done_reading_[m] = true;
    readers_left_--;
    changed_.notify_all();
  }

  // Waits until no member reads any buffer. Not cancellable: what it waits
  // for are copies already queued and members on their way out
  // (PeerRowsTurn). A member may still be in wait_slice for another's
  // slice, but every member marks its own slice (done or failed) before it
  // waits for anything, so those waits end.
  void wait_for_readers() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return readers_left_ == 0; });
  }

 private:
  enum SliceState { kPending, kReady, kFailed };
  struct Buffer {
    int device = -1;
    float *rows = nullptr;
    cudaMemPool_t pool = nullptr;  // null: the device's default pool
  };

  void close(bool shared) {
    if (closed_) return;
    closed_ = true;
    shared_ = shared;
    readers_left_ = shared ? n_members_ : 0;
    changed_.notify_all();
  }

  // Whether every member's GPU can read every other's buffer.
  bool reachable() const {
    for (int a = 0; a < n_members_; a++)
      for (int b = 0; b < n_members_; b++)
        if (!grant_access(buffer_[b].device, buffer_[b].pool, buffer_[a].device)) return false;
    return true;
  }

  // Lets `reader` read `pool` of `owner`, the pool the offered buffer came
  // from (null: the owner's default pool; true on the same GPU). The
  // default pool's own answer is asked each time: a GPU reset (the idle
  // keeper's) makes a new one, mapped nowhere else. The grant stays with
  // the pool: its later allocations are mapped on the reader too (the
  // price of peer copies from stream-ordered memory).
  static bool grant_access(int owner, cudaMemPool_t pool, int reader) {
    if (owner == reader) return true;
    int can = 0;
    cudaMemLocation where{};
    where.type = cudaMemLocationTypeDevice;
    where.id = reader;
    cudaMemAccessFlags now = cudaMemAccessFlagsProtNone;
    if (cudaDeviceCanAccessPeer(&can, reader, owner) != cudaSuccess || !can ||
        (pool == nullptr && cudaDeviceGetDefaultMemPool(&pool, owner) != cudaSuccess) ||
        cudaMemPoolGetAccess(&now, pool, &where) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    if (now == cudaMemAccessFlagsProtReadWrite) return true;
    cudaMemAccessDesc desc{};
    desc.location = where;
    desc.flags = cudaMemAccessFlagsProtReadWrite;
    if (cudaMemPoolSetAccess(pool, &desc, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return true;
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  const int n_members_;
  const std::chrono::milliseconds patience_;
  int member_of_[KNN_MAX_DEVICES];
  int offers_ = 0;
  bool offered_[KNN_MAX_DEVICES] = {};
  Buffer buffer_[KNN_MAX_DEVICES];
  int64_t n_rows_ = 0;
  int dim_ = 0;
  const void *host_ = nullptr;
  int element_ = 0;
  const int64_t *keys_ = nullptr;
  bool same_ = true, closed_ = false, shared_ = false;
  SliceState slice_state_[KNN_MAX_DEVICES] = {};
  bool done_reading_[KNN_MAX_DEVICES] = {};
  int readers_left_ = 0;
};

// One engine's part in a shared upload, released in the safe order on
// every path: its slice marked (failed, if not done), its stream drained
// (its copies from the others' buffers complete), then it reads no more,
// then it waits until nobody reads its buffer, which its owner frees
// after this.
class PeerRowsTurn {
 public:
  PeerRowsTurn() = default;
  PeerRowsTurn(const PeerRowsTurn &) = delete;
  PeerRowsTurn &operator=(const PeerRowsTurn &) = delete;
  ~PeerRowsTurn() { release(); }

  void take(PeerRows *rows, int member, cudaStream_t stream) {
    rows_ = rows;
    member_ = member;
    stream_ = stream;
  }
  PeerRows *rows() const { return rows_; }
  int member() const { return member_; }

  // The engine's copies from the others are complete: they may free theirs.
  void finished_reading() {
    if (rows_ != nullptr) rows_->done_reading(member_);
  }

  void release() {
    if (rows_ == nullptr) return;
    rows_->slice_done(member_, false);
    if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
    rows_->done_reading(member_);
    rows_->wait_for_readers();
    rows_ = nullptr;
  }

 private:
  PeerRows *rows_ = nullptr;
  int member_ = -1;
  cudaStream_t stream_ = nullptr;
};

// A sharing member `me`'s copies of every other member's slice from that
// member's buffer into the same rows of `dst` (rows of `row_bytes`, the
// layout of the offered buffers), queued on ctx.stream as each slice is
// ready, each member starting at another's; waits for them. A slice that
// will not come (its engine failed) goes to missing(first, count), which
// may make the rows itself; KNN_CANCELLED on a cancel.
template <class Missing>
KnnStatus copy_other_slices(DeviceContext &ctx, PeerRows &peers, int me, void *dst,
                            size_t row_bytes, Missing &&missing) {
  for (int step = 1; step < peers.members(); step++) {
    const int other = (me + step) % peers.members();
    int64_t first, count;
    peers.slice(other, &first, &count);
    if (count == 0) continue;
    bool ready = false;
    KNN_TRY(peers.wait_slice(ctx, other, &ready));
    if (!ready) {
      KNN_TRY(missing(first, count));
      continue;
    }
    const size_t offset = static_cast<size_t>(first) * row_bytes;
    CUDA_CHECK(ctx, cudaMemcpyPeerAsync(static_cast<unsigned char *>(dst) + offset, ctx.device,
                                        reinterpret_cast<unsigned char *>(peers.rows_of(other)) +
                                            offset,
                                        peers.device_of(other), static_cast<size_t>(count) * row_bytes,
                                        ctx.stream));
  }
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  return KNN_OK;
}

// The same where a slice that will not come ends the copies with
// KNN_CANCELLED (its engine failed, and the join with it).
inline KnnStatus copy_other_slices(DeviceContext &ctx, PeerRows &peers, int me, void *dst,
                                   size_t row_bytes) {
  return copy_other_slices(ctx, peers, me, dst, row_bytes, [&ctx](int64_t, int64_t) {
    if (ctx.error.empty()) ctx.error = "canceled";
    return KNN_CANCELLED;
  });
}

// Says, for an engine that will not offer its targets, that it will not.
inline void decline_peer_rows(DeviceContext &ctx) {
  if (ctx.peer_rows != nullptr) ctx.peer_rows->decline(ctx.share_voter);
}

// Says, for an engine that will not share a TI clustering's assignment,
// that it will not.
inline void decline_peer_assign(DeviceContext &ctx) {
  if (ctx.peer_assign != nullptr) ctx.peer_assign->decline(ctx.share_voter);
}

// Says, for an engine that will not share a TI self-join's upload of the
// points, that it will not.
inline void decline_peer_points(DeviceContext &ctx) {
  if (ctx.peer_points != nullptr) ctx.peer_points->decline(ctx.share_voter);
}

}  // namespace cuda
}  // namespace knn
