// Row kernels of softmax, causal softmax, cross-entropy and layer norm over
// contiguous rows in vector lanes (cpu_vector_math.hpp has the contract).
// Softmax takes a row's maximum, then writes exp(x - max) while it sums
// them, then scales in place (the row is in L1 by then); the causal one does
// so over the row's unmasked prefix only; log-softmax and cross-entropy only
// sum the exponentials. Layer
// norm takes mean and variance in one Welford pass, then writes the row;
// its backward takes its two sums and the parameters' gradients in one
// pass, then writes dx.
//
// Compiled twice like cpu_vector_math.cpp (for AVX2 and FMA, and for
// AVX-512) and run only once vector_math::available() said so;
// cpu_vector_lanes.hpp says why it includes no C++ standard header.
#include "cpu_vector_lanes.hpp"
#include "cpu_vector_math.hpp"

#ifndef TROUPE_VECTOR_ISA
#error "tensor/CMakeLists.txt compiles this file once per instruction set and names it in TROUPE_VECTOR_ISA"
#endif

namespace troupe::detail::vector_math::TROUPE_VECTOR_ISA {

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
inline float sqrt_of(float v) { return __builtin_sqrtf(v); }
inline double sqrt_of(double v) { return __builtin_sqrt(v); }

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

/// Causal (masked) scaled softmax: row r of each [queries, n] matrix keeps
/// its first min(r % queries + 1, n) elements, y = softmax(scale x) over
/// them and 0 after them; the masked tail is never read.
template <class L>
void causal_softmax_rows_of(const typename L::scalar* x, typename L::scalar* y, std::int64_t rows,
                            std::int64_t queries, std::int64_t n, typename L::scalar scale) {
  using T = typename L::scalar;
  const auto s = L::splat(scale);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const std::int64_t kept = r % queries + 1 < n ? r % queries + 1 : n;
    // scale > 0, so the row's maximum of scale x is scale max(x).
    const auto top = L::splat(max_of<L>(xr, kept));
    const T total = sum_over<L>(kept, [&](std::int64_t i, std::int64_t count) {
      const auto e = L::exp(L::mul(L::sub(load_n<L>(xr + i, count), top), s));
      store_n<L>(yr + i, e, count);
      return e;
    });
    const auto inv = L::splat(T(1) / total);
    for_vectors<L>(kept, [&](std::int64_t i, std::int64_t count) {
      store_n<L>(yr + i, L::mul(load_n<L>(yr + i, count), inv), count);
    });
    for (std::int64_t j = kept; j < n; ++j)
      yr[j] = 0;
  }
}

/// dx = scale y (g - <g, y>) over each row's kept prefix, 0 after it (y is
/// 0 there, so the full row's formula gives the same).
template <class L>
void causal_softmax_backward_rows_of(const typename L::scalar* g, const typename L::scalar* y,
                                     typename L::scalar* dx, std::int64_t rows, std::int64_t queries,
                                     std::int64_t n, typename L::scalar scale) {
  using T = typename L::scalar;
  const auto s = L::splat(scale);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    T* dr = dx + r * n;
    const std::int64_t kept = r % queries + 1 < n ? r % queries + 1 : n;
    const auto dot = L::splat(sum_over<L>(kept, [&](std::int64_t i, std::int64_t count) {
      return L::mul(load_n<L>(gr + i, count), load_n<L>(yr + i, count));
    }));
    for_vectors<L>(kept, [&](std::int64_t i, std::int64_t count) {
      const auto inner = L::mul(load_n<L>(yr + i, count), L::sub(load_n<L>(gr + i, count), dot));
      store_n<L>(dr + i, L::mul(inner, s), count);
    });
    for (std::int64_t j = kept; j < n; ++j)
      dr[j] = 0;
  }
}

template <class L>
void log_sum_exp_rows_of(const typename L::scalar* x, typename L::scalar* lse, std::int64_t rows, std::int64_t n) {
  using T = typename L::scalar;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T top = max_of<L>(xr, n);
    lse[r] = top + log_of(exp_sum<L>(xr, top, nullptr, n));
  }
}

template <class L>
void exp_scaled_of(const typename L::scalar* x, typename L::scalar shift, typename L::scalar scale,
                   typename L::scalar* y, std::int64_t n) {
  const auto s = L::splat(shift);
  const auto c = L::splat(scale);
  for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
    store_n<L>(y + i, L::mul(L::exp(L::sub(load_n<L>(x + i, count), s)), c), count);
  });
}

/// Welford's running mean and sum of squared deviations of `count` values
/// per lane.
template <class L> struct welford {
  using T = typename L::scalar;
  typename L::vector mean = L::splat(0);
  typename L::vector m2 = L::splat(0);
  T count = 0;

  /// Adds one value per lane, `inv` being 1 / (count + 1).
  void add(typename L::vector v, typename L::vector inv) {
    const auto d = L::sub(v, mean);
    mean = L::fma(d, inv, mean);
    m2 = L::fma(d, L::sub(v, mean), m2);
    count += 1;
  }

  /// Chan's merge of two lane sets.
  static welford merge(const welford& a, const welford& b) {
    if (b.count == 0)
      return a;
    if (a.count == 0)
      return b;
    welford out;
    out.count = a.count + b.count;
    const auto delta = L::sub(b.mean, a.mean);
    out.mean = L::fma(delta, L::splat(b.count / out.count), a.mean);
    out.m2 = L::fma(L::mul(delta, delta), L::splat(a.count * b.count / out.count), L::add(a.m2, b.m2));
    return out;
  }
};

/// Mean and biased variance of x[0, n), n >= 1, in one pass: four Welford
/// lane sets (independent dependency chains), merged by Chan's formula, the
/// lanes merged, then the last elements added one by one. The values are
/// taken relative to x[0]: the running means then stay within sqrt(n)
/// standard deviations of zero, so float32's rounding of them costs no more
/// than that relative to the spread, however large the row's mean (1e4 with
/// a spread of 1 lost 4e-5 of rstd without the shift). As accurate as two
/// passes (mean, then squared deviations), unlike E[x^2] - E[x]^2.
template <class L>
void mean_and_variance(const typename L::scalar* x, std::int64_t n, typename L::scalar& mean,
                       typename L::scalar& variance) {
  using T = typename L::scalar;
  constexpr std::int64_t w = L::width;
  const T shift = x[0];
  const auto shift_v = L::splat(shift);
  welford<L> set[4];
  std::int64_t i = 0;
  for (; i + 4 * w <= n; i += 4 * w) {
    const auto inv = L::splat(T(1) / (set[0].count + 1));
    for (int k = 0; k < 4; ++k)
      set[k].add(L::sub(L::load(x + i + k * w), shift_v), inv);
  }
  for (int k = 0; i + w <= n; i += w, ++k)
    set[k].add(L::sub(L::load(x + i), shift_v), L::splat(T(1) / (set[k].count + 1)));
  const auto all = welford<L>::merge(welford<L>::merge(set[0], set[1]), welford<L>::merge(set[2], set[3]));
  T m = 0;
  T m2 = 0;
  T count = 0;
  if (all.count > 0) {
    // Every lane holds all.count values: the mean is the lanes' mean, and
    // M2 adds each lane's squared offset from it.
    T means[w];
    T m2s[w];
    L::store(means, all.mean);
    L::store(m2s, all.m2);
    m = sum_lanes<L>(all.mean) / T(w);
    T spread = 0;
    for (int j = 0; j < w; ++j)
      spread += (means[j] - m) * (means[j] - m);
    m2 = sum_lanes<L>(all.m2) + all.count * spread;
    count = all.count * T(w);
  }
  for (; i < n; ++i) {
    const T v = x[i] - shift;
    count += 1;
    const T d = v - m;
    m += d / count;
    m2 += d * (v - m);
  }
  mean = shift + m;
  variance = m2 / count;
}

template <class L>
void layer_norm_rows_of(const layer_norm_rows<typename L::scalar>& a) {
  using T = typename L::scalar;
  const auto n = a.d;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* xr = a.x + r * n;
    T* yr = a.y + r * n;
    T m;
    T var;
    mean_and_variance<L>(xr, n, m, var);
    const T inv = T(1) / sqrt_of(var + a.eps);
    a.mean[r] = m;
    a.rstd[r] = inv;
    const auto mv = L::splat(m);
    const auto sv = L::splat(inv);
    // One loop per affine case, chosen once per row.
    const auto normalize = [&](auto affine) {
      for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
        const auto xhat = L::mul(L::sub(load_n<L>(xr + i, count), mv), sv);
        store_n<L>(yr + i, affine(xhat, i, count), count);
      });
    };
    if (a.weight != nullptr && a.bias != nullptr)
      normalize([&](auto xhat, std::int64_t i, std::int64_t count) {
        return L::fma(xhat, load_n<L>(a.weight + i, count), load_n<L>(a.bias + i, count));
      });
    else if (a.weight != nullptr)
      normalize([&](auto xhat, std::int64_t i, std::int64_t count) { return L::mul(xhat, load_n<L>(a.weight + i, count)); });
    else if (a.bias != nullptr)
      normalize([&](auto xhat, std::int64_t i, std::int64_t count) { return L::add(xhat, load_n<L>(a.bias + i, count)); });
    else
      normalize([](auto xhat, std::int64_t, std::int64_t) { return xhat; });
  }
}

template <class L>
void layer_norm_backward_rows_of(const layer_norm_backward_rows<typename L::scalar>& a) {
  using T = typename L::scalar;
  using V = typename L::vector;
  const auto n = a.d;
  for (std::int64_t j = 0; j < n; ++j) {
    a.grad_weight[j] = 0;
    a.grad_bias[j] = 0;
  }
  const auto gxhat_at = [&](const T* gr, std::int64_t i, std::int64_t count) {
    const V g = load_n<L>(gr + i, count);
    return a.weight != nullptr ? L::mul(g, load_n<L>(a.weight + i, count)) : g;
  };
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* gr = a.grad + r * n;
    const T* xr = a.x + r * n;
    T* dr = a.grad_input + r * n;
    const auto mv = L::splat(a.mean[r]);
    const auto sv = L::splat(a.rstd[r]);
    // One pass: Σ gxhat and Σ gxhat * xhat for dx, and the parameters'
    // gradients, with xhat = (x - mean) rstd and gxhat = grad * weight.
    V sum_g = L::splat(0);
    V sum_gx = L::splat(0);
    V part_g = L::splat(0);
    V part_gx = L::splat(0);
    std::int64_t in_part = 0;
    for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
      const V g = load_n<L>(gr + i, count); // zero beyond count, so are the terms
      const V xhat = L::mul(L::sub(load_n<L>(xr + i, count), mv), sv);
      const V gh = gxhat_at(gr, i, count);
      part_g = L::add(part_g, gh);
      part_gx = L::fma(gh, xhat, part_gx);
      store_n<L>(a.grad_weight + i, L::fma(g, xhat, load_n<L>(a.grad_weight + i, count)), count);
      store_n<L>(a.grad_bias + i, L::add(g, load_n<L>(a.grad_bias + i, count)), count);
      in_part += L::width;
      if (in_part == 128) {
        sum_g = L::add(sum_g, part_g);
        sum_gx = L::add(sum_gx, part_gx);
        part_g = part_gx = L::splat(0);
        in_part = 0;
      }
    });
    const T inv_n = T(1) / static_cast<T>(n);
    // dx = rstd (gxhat - mean(gxhat) - xhat mean(gxhat xhat)).
    const auto mean_g = L::splat(sum_lanes<L>(L::add(sum_g, part_g)) * inv_n);
    const auto mean_gx = L::splat(sum_lanes<L>(L::add(sum_gx, part_gx)) * inv_n);
    for_vectors<L>(n, [&](std::int64_t i, std::int64_t count) {
      const V xhat = L::mul(L::sub(load_n<L>(xr + i, count), mv), sv);
      const V inner = L::sub(L::sub(gxhat_at(gr, i, count), mean_g), L::mul(xhat, mean_gx));
      store_n<L>(dr + i, L::mul(sv, inner), count);
    });
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
void causal_softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t queries, std::int64_t n,
                         float scale) {
  causal_softmax_rows_of<float_lanes>(x, y, rows, queries, n, scale);
}
void causal_softmax_rows(const double* x, double* y, std::int64_t rows, std::int64_t queries, std::int64_t n,
                         double scale) {
  causal_softmax_rows_of<double_lanes>(x, y, rows, queries, n, scale);
}
void causal_softmax_backward_rows(const float* grad, const float* y, float* dx, std::int64_t rows,
                                  std::int64_t queries, std::int64_t n, float scale) {
  causal_softmax_backward_rows_of<float_lanes>(grad, y, dx, rows, queries, n, scale);
}
void causal_softmax_backward_rows(const double* grad, const double* y, double* dx, std::int64_t rows,
                                  std::int64_t queries, std::int64_t n, double scale) {
  causal_softmax_backward_rows_of<double_lanes>(grad, y, dx, rows, queries, n, scale);
}
void log_sum_exp_rows(const float* x, float* lse, std::int64_t rows, std::int64_t n) {
  log_sum_exp_rows_of<float_lanes>(x, lse, rows, n);
}
void log_sum_exp_rows(const double* x, double* lse, std::int64_t rows, std::int64_t n) {
  log_sum_exp_rows_of<double_lanes>(x, lse, rows, n);
}
void exp_scaled(const float* x, float shift, float scale, float* y, std::int64_t n) {
  exp_scaled_of<float_lanes>(x, shift, scale, y, n);
}
void exp_scaled(const double* x, double shift, double scale, double* y, std::int64_t n) {
  exp_scaled_of<double_lanes>(x, shift, scale, y, n);
}
void layer_norm(const layer_norm_rows<float>& rows) { layer_norm_rows_of<float_lanes>(rows); }
void layer_norm(const layer_norm_rows<double>& rows) { layer_norm_rows_of<double_lanes>(rows); }
void layer_norm_backward(const layer_norm_backward_rows<float>& rows) {
  layer_norm_backward_rows_of<float_lanes>(rows);
}
void layer_norm_backward(const layer_norm_backward_rows<double>& rows) {
  layer_norm_backward_rows_of<double_lanes>(rows);
}

namespace {

/// acc[r] = acc[r] + src[r] for r < rows, a vector at a time.
template <class L> void add_into(typename L::scalar* acc, const typename L::scalar* src, std::int64_t rows) {
  std::int64_t r = 0;
  for (; r + L::width <= rows; r += L::width)
    L::store(acc + r, L::add(L::load(acc + r), L::load(src + r)));
  for (; r < rows; ++r)
    acc[r] = acc[r] + src[r];
}

template <class L>
void side_by_side_block_of(const typename L::scalar* x, std::int64_t rows, std::int64_t n, std::int64_t step,
                           typename L::scalar* lanes, typename L::scalar* out) {
  using T = typename L::scalar;
  for (std::int64_t k = 0; k < 8 * rows; ++k)
    lanes[k] = T(0);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::int64_t j = 0; j < 8; ++j)
      add_into<L>(lanes + j * rows, x + (i + j) * step, rows);
  const T* l = lanes;
  std::int64_t r = 0;
  for (; r + L::width <= rows; r += L::width) {
    auto at = [&](std::int64_t j) { return L::load(l + j * rows + r); };
    L::store(out + r, L::add(L::add(L::add(at(0), at(1)), L::add(at(2), at(3))),
                             L::add(L::add(at(4), at(5)), L::add(at(6), at(7)))));
  }
  for (; r < rows; ++r) {
    auto at = [&](std::int64_t j) { return l[j * rows + r]; };
    out[r] = ((at(0) + at(1)) + (at(2) + at(3))) + ((at(4) + at(5)) + (at(6) + at(7)));
  }
  for (; i < n; ++i)
    add_into<L>(out, x + i * step, rows);
}

} // namespace

void side_by_side_block(const float* x, std::int64_t rows, std::int64_t n, std::int64_t step, float* lanes,
                        float* out) {
  side_by_side_block_of<float_lanes>(x, rows, n, step, lanes, out);
}

void side_by_side_block(const double* x, std::int64_t rows, std::int64_t n, std::int64_t step, double* lanes,
                        double* out) {
  side_by_side_block_of<double_lanes>(x, rows, n, step, lanes, out);
}

} // namespace troupe::detail::vector_math::TROUPE_VECTOR_ISA
