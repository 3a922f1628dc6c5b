#pragma once
// Splits a loop over independent elements or rows across the intra-op
// threads (intra_op_threads.hpp). For kernels: the CPU backend and the
// optimizers' element loops, not for programs.
#include <cstdint>
#include <functional>

#include "troupe/tensor/intra_op_threads.hpp"

namespace troupe::detail {

/// Runs body(begin, end) over ranges tiling [0, count) on up to `threads`
/// OpenMP threads, each range at least `grain` long and starting at a
/// multiple of `align`; rethrows the first exception a range threw.
void run_split(std::int64_t count, std::int64_t grain, std::int64_t align, int threads,
               const std::function<void(std::int64_t, std::int64_t)>& body);

/// body(begin, end) once over [0, count) when one thread is set or the loop
/// is shorter than two grains (no call to OpenMP, no std::function); else
/// split as run_split does. `grain` is in units of the loop (elements or
/// rows): about 32K cheap elements are worth a thread's wake-up. `align`
/// keeps ranges on multiples of it (a vector width, or a matrix of rows).
template <class Body>
void parallel_for(std::int64_t count, std::int64_t grain, Body&& body, std::int64_t align = 1) {
  const int threads = intra_op_threads();
  if (threads <= 1 || count < 2 * grain) {
    if (count > 0)
      body(std::int64_t{0}, count);
    return;
  }
  run_split(count, grain, align, threads, std::forward<Body>(body));
}

} // namespace troupe::detail
