#include "troupe/tensor/storage.hpp"

#include <cstdlib>
#include <new>

#include "troupe/tensor/error.hpp"

namespace troupe {

std::shared_ptr<storage> storage::allocate(std::size_t bytes, device where) {
  require(where.kind == device_kind::cpu,
          "storage::allocate: no allocator for device {} in this build", where);
  // aligned_alloc needs a size that is a multiple of the alignment; round up
  // and always allocate at least one block so data() is never null.
  auto rounded = (bytes + alignment - 1) / alignment * alignment;
  if (rounded == 0)
    rounded = alignment;
  void* data = std::aligned_alloc(alignment, rounded);
  if (data == nullptr)
    throw std::bad_alloc();
  return std::shared_ptr<storage>(new storage(data, bytes, where, [](void* p) { std::free(p); }));
}

std::shared_ptr<storage> storage::wrap(void* data, std::size_t bytes, device where,
                                       deleter_type deleter) {
  return std::shared_ptr<storage>(new storage(data, bytes, where, std::move(deleter)));
}

storage::storage(void* data, std::size_t bytes, device where, deleter_type deleter)
    : data_(data), bytes_(bytes), device_(where), deleter_(std::move(deleter)) {}

storage::~storage() {
  if (deleter_)
    deleter_(data_);
}

} // namespace troupe
