#pragma once
// Private: host memory that reads as zeros, for tensor::zeros.
#include <cstddef>
#include <memory>

#include "troupe/tensor/storage.hpp"

namespace troupe::detail {

/// `bytes` of zeros on the host (host_allocator::allocate_zeroed): a block
/// mapped for it is not written, so a zero parameter that is never
/// initialised (a layer a pipeline stage drops) costs no memory.
std::shared_ptr<storage> zeroed_host_storage(std::size_t bytes);

} // namespace troupe::detail
