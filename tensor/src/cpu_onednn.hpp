// What troupe's oneDNN callers share (cpu_onednn_gelu.cpp,
// cpu_onednn_matmul.cpp): the CPU engine, a stream per calling thread,
// whether oneDNN runs its AVX-512 kernels here, and the cache of primitives
// made once per shape.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include <oneapi/dnnl/dnnl.hpp>

namespace troupe::detail {

const dnnl::engine& onednn_engine();

/// The calling thread's stream on onednn_engine().
dnnl::stream& onednn_thread_stream();

/// Whether oneDNN runs its AVX-512 kernels on this CPU (decided once, from
/// the CPU alone, so every process of a job chooses alike).
bool onednn_runs_avx512();

/// Primitives made once per key (a training step repeats its shapes), at
/// most 256 of them: a program with ever new shapes starts the map over,
/// while callers still running hold their primitives' shared_ptr.
template <class Key, class Primitives> class onednn_primitive_cache {
public:
  template <class Make> std::shared_ptr<const Primitives> get(const Key& key, Make make) {
    std::lock_guard lock(mutex_);
    constexpr std::size_t most_keys = 256;
    if (made_.size() >= most_keys && made_.find(key) == made_.end())
      made_.clear();
    auto& slot = made_[key];
    if (!slot)
      slot = std::make_shared<const Primitives>(make());
    return slot;
  }

private:
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Primitives>> made_;
};

} // namespace troupe::detail
