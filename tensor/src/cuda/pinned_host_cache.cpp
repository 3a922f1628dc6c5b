// Pinned host blocks kept for reuse (pinned_host_cache.hpp).
#include "pinned_host_cache.hpp"

#include <cuda_runtime_api.h>

namespace troupe::detail::cuda {

namespace {

// Sizes are rounded up to 64 KiB, so tensors of nearly the same size share
// blocks; a kept block is taken for a request of at least half its size.
constexpr std::size_t granule = std::size_t{64} << 10;

std::size_t rounded(std::size_t bytes) {
  return (bytes + granule - 1) / granule * granule;
}

} // namespace

pinned_host_cache& pinned_host_cache::instance() {
  static auto* cache = new pinned_host_cache;
  return *cache;
}

pinned_block pinned_host_cache::take(std::size_t bytes) {
  const auto capacity = rounded(bytes == 0 ? 1 : bytes);
  {
    std::lock_guard lock(mutex_);
    auto it = kept_.lower_bound(capacity);
    if (it != kept_.end() && it->first <= 2 * capacity) {
      pinned_block block{it->second, it->first};
      kept_bytes_ -= it->first;
      kept_.erase(it);
      return block;
    }
  }
  void* data = nullptr;
  if (cudaHostAlloc(&data, capacity, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError(); // not sticky: pinned memory is a limit of the machine
    return {};
  }
  return {data, capacity};
}

void pinned_host_cache::give_back(pinned_block block) {
  if (block.data == nullptr)
    return;
  {
    std::lock_guard lock(mutex_);
    if (kept_bytes_ + block.capacity <= kept_bytes_limit) {
      kept_.emplace(block.capacity, block.data);
      kept_bytes_ += block.capacity;
      return;
    }
  }
  static_cast<void>(cudaFreeHost(block.data));
}

} // namespace troupe::detail::cuda
