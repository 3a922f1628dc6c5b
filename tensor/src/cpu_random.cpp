// CPU random fills. Element i depends only on (seed, offset + i), never on
// earlier draws or on how a draw is split: drawing 10 then 10 equals
// drawing 20, and a shard can draw its slice without drawing the rest.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "cpu_backend.hpp"
#include "cpu_vector_math.hpp"
#include "dispatch.hpp"
#include "philox.hpp"

namespace troupe::detail {

namespace {

/// Uniform [0, 1) in T's precision from the element's first two words.
template <class T> T unit_uniform(std::uint32_t w0, std::uint32_t w1) {
  if constexpr (std::is_same_v<T, float>)
    return uniform24(w0);
  else
    return uniform53(w0, w1);
}

/// Calls f(i, w0, w1) for i in [0, n) with the first two Philox words of
/// counter start + i (w1 only when `second`, else 0): eight or sixteen
/// counters at a time in AVX2 or AVX-512 lanes where the CPU has them, the
/// same bits either way.
template <class F> void for_each_counter(std::uint64_t seed, std::uint64_t start, std::uint64_t n, bool second, F&& f) {
  if (!vector_math::available()) {
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto w = philox_at(seed, start + i);
      f(i, w[0], second ? w[1] : 0u);
    }
    return;
  }
  constexpr std::uint64_t chunk = 1024;
  std::uint32_t w0[chunk], w1[chunk] = {};
  for (std::uint64_t base = 0; base < n; base += chunk) {
    const auto count = std::min(chunk, n - base);
    vector_math::philox_words(seed, start + base, static_cast<std::int64_t>(count), w0, second ? w1 : nullptr);
    for (std::uint64_t j = 0; j < count; ++j)
      f(base + j, w0[j], w1[j]);
  }
}

} // namespace

void cpu_backend::fill_random(random_distribution what, const generator& gen, double a, double b,
                              tensor& out) {
  const auto n = static_cast<std::uint64_t>(out.numel());
  const auto seed = gen.seed;
  const auto start = gen.offset;
  if (what == random_distribution::integer) {
    auto* y = out.data<std::int64_t>();
    const auto low = static_cast<std::int64_t>(a);
    const auto range = static_cast<std::uint64_t>(static_cast<std::int64_t>(b) - low);
    for_each_counter(seed, start, n, true, [&](std::uint64_t i, std::uint32_t w0, std::uint32_t w1) {
      const auto bits = (static_cast<std::uint64_t>(w0) << 32) | w1;
      // Modulo bias is at most range / 2^64 (ranges are capped at 2^54).
      y[i] = low + static_cast<std::int64_t>(bits % range);
    });
    return;
  }
  dispatch_floating(out.type(), "fill_random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* y = out.data<T>();
    constexpr bool is_double = !std::is_same_v<T, float>;
    switch (what) {
      case random_distribution::uniform: {
        const auto low = static_cast<T>(a);
        const auto high = static_cast<T>(b);
        const auto width = static_cast<T>(b - a);
        const T below_high = std::nextafter(high, low);
        for_each_counter(seed, start, n, is_double, [&](std::uint64_t i, std::uint32_t w0, std::uint32_t w1) {
          T v = low + width * unit_uniform<T>(w0, w1);
          // Rounding may land exactly on `high`; keep the interval half-open.
          y[i] = v < high ? v : below_high;
        });
        break;
      }
      case random_distribution::normal:
        for (std::uint64_t i = 0; i < n; ++i) {
          const auto w = philox_at(seed, start + i);
          // Box-Muller, cosine branch; 1 - u1 lies in (0, 1] so the log is finite.
          const double u1 = uniform53(w[0], w[1]);
          const double u2 = uniform53(w[2], w[3]);
          const double radius = std::sqrt(-2.0 * std::log(1.0 - u1));
          y[i] = static_cast<T>(a + b * radius * std::cos(2.0 * std::numbers::pi * u2));
        }
        break;
      case random_distribution::dropout: {
        const auto p = static_cast<T>(a);
        const auto scale = static_cast<T>(b);
        if constexpr (!is_double) {
          if (vector_math::available()) {
            vector_math::dropout_mask(seed, start, static_cast<std::int64_t>(n), p, scale, y);
            break;
          }
        }
        for_each_counter(seed, start, n, is_double, [&](std::uint64_t i, std::uint32_t w0, std::uint32_t w1) {
          y[i] = unit_uniform<T>(w0, w1) >= p ? scale : T(0);
        });
        break;
      }
      case random_distribution::integer: break;
    }
  });
}

} // namespace troupe::detail
