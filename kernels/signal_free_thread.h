// signal_free_thread.h -- starting a thread on which no signal handler can
// run. The engine lives inside a PostgreSQL backend, whose signal handlers
// must only ever run on the backend's own thread; a new thread inherits the
// creating thread's signal mask, so every signal is blocked while the
// thread is created and the creator's mask is restored afterwards. Used by
// the job layer and both engines.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace knn {

// Blocks every signal on the calling thread for its lifetime; any thread
// started meanwhile, a driver's included, inherits that mask.
class SignalsBlocked {
 public:
  SignalsBlocked() noexcept {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved_);
  }
  ~SignalsBlocked() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  SignalsBlocked(const SignalsBlocked &) = delete;
  SignalsBlocked &operator=(const SignalsBlocked &) = delete;

 private:
  sigset_t saved_;
};

// std::thread(f), with all signals blocked on the new thread. Throws what
// std::thread throws (std::system_error when no thread can be started).
template <class F>
std::thread start_signal_free_thread(F &&f) {
  const SignalsBlocked blocked;
  return std::thread(std::forward<F>(f));
}

}  // namespace knn
