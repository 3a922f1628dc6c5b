// Row kernels of softmax over contiguous rows with AVX2 lanes
// (cpu_vector_math.hpp has the contract): softmax takes a row's maximum,
// then writes exp(x - max) while it sums them, then scales in place (the
// row is in L1 by then); log-softmax only sums the exponentials.
//
// Compiled with -mavx2 -mfma like cpu_vector_math.cpp and run only once
// vector_math::available() said so; cpu_vector_lanes.hpp says why it
// includes no C++ standard header.
#include "cpu_vector_lanes.hpp"
#include "cpu_vector_math.hpp"

namespace troupe::detail::vector_math {

namespace {

using lanes::double_lanes;
using lanes::float_lanes;
using lanes::sum_lanes;

/// The first `count` (< width) elements at p, the other lanes zero.
template <class L> typename L::vector load_first(const typename L::scalar* p, std::int64_t count) {
  typename L::scalar buffer[L::width] = {};
  for (std::int64_t j = 0; j < count; ++j)
    buffer[j] = p[j];
  return L::load(buffer);
}

/// Stores the first `count` (< width) lanes of v at p.
template <class L> void store_first(typename L::scalar* p, typename L::vector v, std::int64_t count) {
  typename L::scalar buffer[L::width];
  L::store(buffer, v);
  for (std::int64_t j = 0; j < count; ++j)
    p[j] = buffer[j];
}

/// v with the lanes from `count` on set to zero.
template <class L> typename L::vector zero_from(typename L::vector v, std::int64_t count) {
  typename L::scalar buffer[L::width];
  L::store(buffer, v);
  for (std::int64_t j = count; j < L::width; ++j)
    buffer[j] = 0;
  return L::load(buffer);
}

/// Runs body(i, count) over [0, n) a vector at a time: count is the width
/// for every vector but the last partial one (count < width), whose
/// operands the body loads with load_first and stores with store_first.
template <class L, class Body> void for_vectors(std::int64_t n, Body body) {
  std::int64_t i = 0;
  for (; i + L::width <= n; i += L::width)
    body(i, std::int64_t{L::width});
  if (i < n)
    body(i, n - i);
}

template <class L> typename L::vector load_n(const typename L::scalar* p, std::int64_t count) {
  return count == L::width ? L::load(p) : load_first<L>(p, count);
}

template <class L> void store_n(typename L::scalar* p, typename L::vector v, std::int64_t count) {
  if (count == L::width)
    L::store(p, v);
  else
    store_first<L>(p, v, count);
}

/// Sum of the vectors term(i, count) gives over [0, n) (see for_vectors;
/// the lanes a partial vector does not cover are dropped). Vectors are
/// summed lane-wise in blocks of 128 elements and the blocks added up, so
/// the error grows with 16 + n / 128 rather than n / width, and the order
/// depends only on n.
template <class L, class Term> typename L::scalar sum_over(std::int64_t n, Term term) {
  using V = typename L::vector;
  constexpr std::int64_t block = 128;
  V total = L::splat(0);
  V part = L::splat(0);
  std::int64_t in_part = 0;
  for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
    const V v = term(i, count);
    part = L::add(part, count == L::width ? v : zero_from<L>(v, count));
    in_part += L::width;
    if (in_part == block) {
      total = L::add(total, part);
      part = L::splat(0);
      in_part = 0;
    }
  });
  return sum_lanes<L>(L::add(total, part));
}

/// The largest element of x[0, n), n >= 1; a NaN other than x[0] is
/// skipped, as std::max(top, x) skips it (the softmax comes out NaN anyway).
template <class L> typename L::scalar max_of(const typename L::scalar* x, std::int64_t n) {
  using T = typename L::scalar;
  auto top = L::splat(x[0]);
  auto top2 = top;
  std::int64_t i = 0;
  for (; i + 2 * L::width <= n; i += 2 * L::width) {
    top = L::max(L::load(x + i), top);
    top2 = L::max(L::load(x + i + L::width), top2);
  }
  for (; i + L::width <= n; i += L::width)
    top = L::max(L::load(x + i), top);
  top = L::max(top2, top);
  T lanes[L::width];
  L::store(lanes, top);
  T best = lanes[0];
  for (int j = 1; j < L::width; ++j)
    best = lanes[j] > best ? lanes[j] : best;
  for (; i < n; ++i)
    best = x[i] > best ? x[i] : best;
  return best;
}

/// Σ exp(x - shift); with y non-null also writes y = exp(x - shift).
template <class L>
typename L::scalar exp_sum(const typename L::scalar* x, typename L::scalar shift, typename L::scalar* y,
                           std::int64_t n) {
  const auto s = L::splat(shift);
  return sum_over<L>(n, [&](std::int64_t i, std::int64_t count) {
    const auto e = L::exp(L::sub(load_n<L>(x + i, count), s));
    if (y != nullptr)
      store_n<L>(y + i, e, count);
    return e;
  });
}

inline float log_of(float v) { return __builtin_logf(v); }
inline double log_of(double v) { return __builtin_log(v); }

template <class L>
void softmax_rows_of(const typename L::scalar* x, typename L::scalar* y, std::int64_t rows, std::int64_t n,
                     bool log) {
  using T = typename L::scalar;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const T top = max_of<L>(xr, n);
    if (log) {
      // log softmax = x - (max + log Σ exp(x - max)); the exponentials are
      // only summed.
      const auto shift = L::splat(top + log_of(exp_sum<L>(xr, top, nullptr, n)));
      for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
        store_n<L>(yr + i, L::sub(load_n<L>(xr + i, count), shift), count);
      });
    } else {
      const auto inv = L::splat(T(1) / exp_sum<L>(xr, top, yr, n));
      for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
        store_n<L>(yr + i, L::mul(load_n<L>(yr + i, count), inv), count);
      });
    }
  }
}

template <class L>
void softmax_backward_rows_of(const typename L::scalar* g, const typename L::scalar* y, typename L::scalar* dx,
                              std::int64_t rows, std::int64_t n, bool log) {
  using T = typename L::scalar;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    T* dr = dx + r * n;
    if (log) {
      // y = log softmax(x): dx = g - exp(y) Σ g.
      const auto total = L::splat(sum_over<L>(n, [&](std::int64_t i, std::int64_t count) { return load_n<L>(gr + i, count); }));
      for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
        const auto e = L::exp(load_n<L>(yr + i, count));
        store_n<L>(dr + i, L::sub(load_n<L>(gr + i, count), L::mul(e, total)), count);
      });
    } else {
      // y = softmax(x): dx = y (g - <g, y>).
      const auto dot = L::splat(sum_over<L>(n, [&](std::int64_t i, std::int64_t count) {
        return L::mul(load_n<L>(gr + i, count), load_n<L>(yr + i, count));
      }));
      for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
        store_n<L>(dr + i, L::mul(load_n<L>(yr + i, count), L::sub(load_n<L>(gr + i, count), dot)), count);
      });
    }
  }
}

} // namespace

void softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t n, bool log) {
  softmax_rows_of<float_lanes>(x, y, rows, n, log);
}
void softmax_rows(const double* x, double* y, std::int64_t rows, std::int64_t n, bool log) {
  softmax_rows_of<double_lanes>(x, y, rows, n, log);
}
void softmax_backward_rows(const float* grad, const float* y, float* dx, std::int64_t rows, std::int64_t n,
                           bool log) {
  softmax_backward_rows_of<float_lanes>(grad, y, dx, rows, n, log);
}
void softmax_backward_rows(const double* grad, const double* y, double* dx, std::int64_t rows, std::int64_t n,
                           bool log) {
  softmax_backward_rows_of<double_lanes>(grad, y, dx, rows, n, log);
}

} // namespace troupe::detail::vector_math
