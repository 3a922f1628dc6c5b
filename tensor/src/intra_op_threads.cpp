// Intra-op threads: OpenMP teams for troupe's own loops (oneDNN already
// brings the runtime, and OpenMP's pool is what PyTorch's parallel_for
// uses), OpenBLAS's own threads for GEMM.
#include "troupe/tensor/intra_op_threads.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>

#include "openblas.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/parallel_for.hpp"

namespace troupe {

namespace {

std::atomic<int>& threads_set() {
  static std::atomic<int> count{1};
  return count;
}

} // namespace

void set_intra_op_threads(int threads) {
  require(threads >= 1, "set_intra_op_threads: {} threads; an op needs at least 1", threads);
  // OpenBLAS keeps one process-wide count; it starts its workers on the
  // first increase (troupe loads it with none).
  detail::openblas().set_num_threads(threads);
  threads_set().store(threads, std::memory_order_relaxed);
}

int intra_op_threads() noexcept {
  return threads_set().load(std::memory_order_relaxed);
}

namespace detail {

void run_split(std::int64_t count, std::int64_t grain, std::int64_t align, int threads,
               const std::function<void(std::int64_t, std::int64_t)>& body) {
  // Inside another team (a kernel called from a parallel region), nesting
  // would multiply the threads: run here.
  const std::int64_t most = std::max<std::int64_t>(1, count / std::max<std::int64_t>(grain, 1));
  const int parts = static_cast<int>(std::min<std::int64_t>(threads, most));
  if (parts <= 1 || omp_in_parallel()) {
    body(0, count);
    return;
  }
  const std::int64_t step = std::max<std::int64_t>(align, 1);
  // Ranges of equal length rounded up to `align`; the last takes the rest.
  const std::int64_t length = ((count + parts - 1) / parts + step - 1) / step * step;
  std::exception_ptr first_error;
  std::once_flag keep_first;
#pragma omp parallel num_threads(parts)
  {
    const std::int64_t begin = omp_get_thread_num() * length;
    const std::int64_t end = std::min(count, begin + length);
    if (begin < end) {
      try {
        body(begin, end);
      } catch (...) {
        std::call_once(keep_first, [&] { first_error = std::current_exception(); });
      }
    }
  }
  if (first_error)
    std::rethrow_exception(first_error);
}

} // namespace detail

} // namespace troupe
