#include "troupe/tensor/storage.hpp"

#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/host_allocator.hpp"
#include "zeroed_storage.hpp"

namespace troupe {

namespace {

storage::deleter_type host_deleter(std::size_t bytes) {
  return [bytes](void* p) { host_allocator::instance().deallocate(p, bytes); };
}

} // namespace

std::shared_ptr<storage> storage::allocate(std::size_t bytes, device where) {
  if (where.kind != device_kind::cpu)
    return backend_for(where, "storage::allocate").allocate(bytes, where);
  auto& allocator = host_allocator::instance();
  void* data = allocator.allocate(bytes);
  return std::shared_ptr<storage>(new storage(data, bytes, where, host_deleter(bytes), nullptr));
}

std::shared_ptr<storage> detail::zeroed_host_storage(std::size_t bytes) {
  return storage::wrap(host_allocator::instance().allocate_zeroed(bytes), bytes, device::cpu(), host_deleter(bytes));
}

std::shared_ptr<storage> storage::wrap(void* data, std::size_t bytes, device where,
                                       deleter_type deleter) {
  return std::shared_ptr<storage>(new storage(data, bytes, where, std::move(deleter), nullptr));
}

std::shared_ptr<storage> storage::wrap(void* data, std::size_t bytes, device where, deleter_type deleter,
                                       void* backend_state) {
  return std::shared_ptr<storage>(new storage(data, bytes, where, std::move(deleter), backend_state));
}

storage::storage(void* data, std::size_t bytes, device where, deleter_type deleter, void* backend_state)
    : data_(data), bytes_(bytes), device_(where), deleter_(std::move(deleter)), backend_state_(backend_state) {}

storage::~storage() {
  if (deleter_)
    deleter_(data_);
}

} // namespace troupe
