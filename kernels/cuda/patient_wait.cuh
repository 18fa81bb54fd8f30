// patient_wait.cuh -- the wait of an engine of a split join for the others
// to reach an agreement (share_vote.cuh, peer_rows.cuh).
//
// An engine never waits for long: the caller's cancel (or another engine's
// failure, which the split turns into a cancel) ends the wait, and so does
// the patience running out, so that an engine held up elsewhere never holds
// the others. Either way the agreement closes unagreed (close()), and every
// engine then follows that outcome.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "cuda_engine.cuh"

namespace knn {
namespace cuda {

// Waits, holding `lock` between looks, until `closed`; KNN_OK then, or the
// cancel's status after close() where the cancel or the patience came first.
template <class Close>
KnnStatus wait_until_closed(std::unique_lock<std::mutex> &lock, std::condition_variable &changed,
                            const bool &closed, std::chrono::milliseconds patience,
                            DeviceContext &ctx, Close close) {
  const auto until = std::chrono::steady_clock::now() + patience;
  while (!closed) {
    if (ctx.cancelled() || std::chrono::steady_clock::now() >= until) {
      close();
      return ctx.cancel_point();
    }
    changed.wait_for(lock, std::chrono::milliseconds(1));
  }
  return KNN_OK;
}

}  // namespace cuda
}  // namespace knn
