// Lending and tracking receive buffers (data_plane_receive_pool.hpp).
#include "data_plane_receive_pool.hpp"

#include <algorithm>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/host_allocator.hpp"

namespace troupe::actors::detail {

std::shared_ptr<storage> receive_buffer_pool::lend(std::shared_ptr<receive_buffer_pool> pool,
                                                   std::size_t bytes) {
  auto* memory = host_allocator::instance().allocate(bytes);
  {
    std::lock_guard guard(pool->mutex_);
    pool->lent_[reinterpret_cast<std::uintptr_t>(memory)] = bytes;
  }
  return storage::wrap(memory, bytes, device::cpu(), [pool = std::move(pool), bytes](void* p) {
    {
      std::lock_guard guard(pool->mutex_);
      pool->lent_.erase(reinterpret_cast<std::uintptr_t>(p));
    }
    host_allocator::instance().deallocate(p, bytes);
  });
}

bool receive_buffer_pool::contains(const void* p) const {
  auto address = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard guard(mutex_);
  auto it = lent_.upper_bound(address);
  if (it == lent_.begin())
    return false;
  --it;
  return address < it->first + std::max<std::size_t>(it->second, 1);
}

} // namespace troupe::actors::detail
