// Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
// easy as 1, 2, 3", SC'11) and the generator streams built on it.
#include "troupe/tensor/random.hpp"

#include "philox.hpp"

namespace troupe {

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key) {
  return detail::philox4x32_10(counter, key);
}

namespace {

// SplitMix64's finaliser: a cheap bijective mixer, enough to decorrelate
// forked seeds (Philox itself does the heavy lifting).
std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

} // namespace

generator generator::fork(std::uint64_t salt) const {
  return generator{mix64(seed + 0x9e3779b97f4a7c15ULL * (mix64(salt) | 1)), 0};
}

std::uint64_t stable_hash(const char* text, std::size_t length) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < length; ++i) {
    h ^= static_cast<unsigned char>(text[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

generator& default_generator() {
  // One stream per thread: ranks that run as threads in one process (the
  // multi-rank tests) each get their own, exactly as separate processes do.
  thread_local generator instance{};
  return instance;
}

void manual_seed(std::uint64_t seed) {
  default_generator() = generator{seed, 0};
}

} // namespace troupe
