// stepwise::parallel_for(begin, end, grain, f): at::parallel_for where the compiler has OpenMP, else the same split
// on threads of our own. Every kernel that calls it gives each index its own result (no partial sums shared), so
// the split over threads never changes a bit: OpenMP, our threads or one thread, the output is the same.
//
// Why our own threads: torch's at::parallel_for is header code that runs on OpenMP threads only where the kernel
// itself is compiled with OpenMP; without it (Apple clang with no libomp, a clang without libomp-dev) it runs the
// whole range on one thread. The pool below starts torch's thread count - 1 workers once and reuses them.
#pragma once

#include <ATen/Parallel.h>

#if !defined(_OPENMP)
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
#endif

namespace stepwise {

#if !defined(_OPENMP)
class Pool {
 public:
  explicit Pool(int workers) {
    for (int w = 0; w < workers; ++w) std::thread([this] { serve(); }).detach();
  }

  // job(c) for c in 0..count-1, this thread taking its share; returns when all are done, rethrowing the first error.
  // A second caller while the pool is busy (another Python thread, or a job calling run) runs its chunks alone.
  void run(int count, const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) {
      for (int c = 0; c < count; ++c) job(c);
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &job, count_ = count, next_ = 0, done_ = 0, error_ = nullptr;
    ++generation_;
    wake_.notify_all();
    take(lock);
    finished_.wait(lock, [&] { return done_ == count_; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void serve() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (uint64_t seen = generation_;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      take(lock);
    }
  }
  void take(std::unique_lock<std::mutex>& lock) {  // run chunks until none is left
    while (job_ != nullptr && next_ < count_) {
      const int c = next_++;
      const auto* job = job_;
      lock.unlock();
      std::exception_ptr error;
      try { (*job)(c); } catch (...) { error = std::current_exception(); }
      lock.lock();
      if (error && !error_) error_ = error;
      if (++done_ == count_) finished_.notify_all();
    }
  }
  std::mutex busy_, mutex_;
  std::condition_variable wake_, finished_;
  const std::function<void(int)>* job_ = nullptr;
  int count_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
};

// One pool per process, never destroyed (its threads may still wait when the process exits); a forked child,
// which has none of its parent's threads, starts its own.
inline Pool& pool(int threads) {
  static std::mutex mutex;
  static Pool* current = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (current == nullptr || owner != getpid()) current = new Pool(std::max(threads - 1, 0)), owner = getpid();
  return *current;
}
#endif

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#if defined(_OPENMP)
  at::parallel_for(begin, end, grain, f);
#else
  if (begin >= end) return;
  const int threads = at::get_num_threads();
  const int64_t chunks = std::min<int64_t>(threads, (end - begin + std::max<int64_t>(grain, 1) - 1) /
                                                        std::max<int64_t>(grain, 1));
  if (chunks <= 1 || threads <= 1) return f(begin, end);
  const int64_t size = (end - begin + chunks - 1) / chunks;  // at::parallel_for's split: equal chunks in order
  pool(threads).run(static_cast<int>(chunks), [&](int c) {
    const int64_t b = begin + c * size;
    if (b < end) f(b, std::min(end, b + size));
  });
#endif
}

}  // namespace stepwise
