// share_vote.cuh -- how the engines of a TI self-join split across GPUs
// agree to divide the work by whole query clusters (ti_query_share.cu).
//
// Every engine clusters the whole set on its own GPU. Dividing by clusters
// (each engine filters and writes the rows of its own clusters, scattered
// over the output) is exact only when every engine runs so and all of them
// built the same clusters: otherwise a row would be answered twice or not
// at all. So each engine votes once, with a fingerprint of its clusters, or
// declines (its join cannot run on the whole set's clusters, or failed
// first); the vote closes when every engine has voted, and the clusters
// divide the work only if all voted with one fingerprint. Otherwise every
// engine falls back to its range of query rows, which is exact whatever the
// others do.
//
// A waiting engine never blocks for long: the caller's cancel (or another
// engine's failure) ends the wait, and after kPatience the vote closes
// without agreement (an engine held up, e.g. by another join holding its
// runtime, must not hold the others: later voters then see the closed
// vote). Once closed the outcome never changes, so every engine follows
// the same one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "../knn_engine.h"
#include "cuda_check.cuh"
#include "cuda_engine.cuh"
#include "patient_wait.cuh"

namespace knn {
namespace cuda {

class ShareVote {
 public:
  // How long an engine that has voted waits for the others.
  static constexpr std::chrono::milliseconds kPatience{3000};

  explicit ShareVote(int voters) : voters_(voters) {}
  ShareVote(const ShareVote &) = delete;
  ShareVote &operator=(const ShareVote &) = delete;

  // Votes for dividing by clusters with `fingerprint` and waits for the
  // outcome (*agreed). KNN_CANCELLED when ctx's cancel came first (the vote
  // then closes without agreement).
  KnnStatus agree(DeviceContext &ctx, int voter, uint64_t fingerprint, bool *agreed) {
    std::unique_lock<std::mutex> lock(mutex_);
    *agreed = false;
    if (!cast(voter, true, fingerprint)) return KNN_OK;
    KNN_TRY(wait_until_closed(lock, changed_, closed_, kPatience, ctx, [this] { close(false); }));
    *agreed = agreed_;
    return KNN_OK;
  }

  // Declines (no wait), unless this voter has voted already.
  void decline(int voter) {
    std::lock_guard<std::mutex> lock(mutex_);
    cast(voter, false, 0);
  }

  // Whether the engines divide by clusters (false until the vote closed so).
  bool agreed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_ && agreed_;
  }

 private:
  // Records a vote (false if this voter voted before, or it closed); closes
  // the vote at the last one or at a decline.
  bool cast(int voter, bool ready, uint64_t fingerprint) {
    if (voter < 0 || voter >= KNN_MAX_DEVICES || voted_[voter]) return false;
    voted_[voter] = true;
    if (closed_) return false;
    if (!ready) {
      close(false);
      return false;
    }
    if (votes_ == 0) fingerprint_ = fingerprint;
    same_ = same_ && fingerprint == fingerprint_;
    if (++votes_ == voters_) close(same_);
    return true;
  }

  void close(bool agreed) {
    closed_ = true;
    agreed_ = agreed;
    changed_.notify_all();
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  const int voters_;
  int votes_ = 0;
  bool voted_[KNN_MAX_DEVICES] = {};
  bool closed_ = false, agreed_ = false, same_ = true;
  uint64_t fingerprint_ = 0;
};

}  // namespace cuda
}  // namespace knn
