// CPU random fills. Element i depends only on (seed, offset + i), never on
// earlier draws or on how a draw is split: drawing 10 then 10 equals
// drawing 20, and a shard can draw its slice without drawing the rest.
#include <cmath>
#include <numbers>

#include "cpu_backend.hpp"
#include "dispatch.hpp"
#include "philox.hpp"

namespace troupe::detail {

namespace {

/// Uniform [0, 1) in T's precision from the element's words.
template <class T> T unit_uniform(const std::array<std::uint32_t, 4>& w) {
  if constexpr (std::is_same_v<T, float>)
    return uniform24(w[0]);
  else
    return uniform53(w[0], w[1]);
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
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto w = philox_at(seed, start + i);
      const auto bits = (static_cast<std::uint64_t>(w[0]) << 32) | w[1];
      // Modulo bias is at most range / 2^64 (ranges are capped at 2^54).
      y[i] = low + static_cast<std::int64_t>(bits % range);
    }
    return;
  }
  dispatch_floating(out.type(), "fill_random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* y = out.data<T>();
    switch (what) {
      case random_distribution::uniform: {
        const auto low = static_cast<T>(a);
        const auto high = static_cast<T>(b);
        const auto width = static_cast<T>(b - a);
        for (std::uint64_t i = 0; i < n; ++i) {
          T v = low + width * unit_uniform<T>(philox_at(seed, start + i));
          // Rounding may land exactly on `high`; keep the interval half-open.
          y[i] = v < high ? v : std::nextafter(high, low);
        }
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
        for (std::uint64_t i = 0; i < n; ++i)
          y[i] = unit_uniform<T>(philox_at(seed, start + i)) >= p ? scale : T(0);
        break;
      }
      case random_distribution::integer: break;
    }
  });
}

} // namespace troupe::detail
