#pragma once
// Reference-counted memory that tensors view.
#include <cstddef>
#include <functional>
#include <memory>

#include "troupe/tensor/device.hpp"

namespace troupe {

/// A block of device memory shared by every tensor that views it (held by
/// std::shared_ptr, so copying a tensor only bumps a reference count).
/// Memory troupe allocates is aligned to `alignment` bytes. Foreign memory
/// (a received network buffer, a shared-memory arena slice) is wrapped with a
/// deleter that runs when the last view goes away.
class storage {
public:
  static constexpr std::size_t alignment = 64;
  using deleter_type = std::function<void(void*)>;

  /// Allocates `bytes` (zero allowed) aligned to `alignment`; contents are
  /// uninitialised.
  static std::shared_ptr<storage> allocate(std::size_t bytes, device where = device::cpu());

  /// Adopts foreign memory; `deleter(data)` runs once, when the last
  /// reference is dropped. `deleter` may be empty for memory that outlives
  /// every view.
  static std::shared_ptr<storage> wrap(void* data, std::size_t bytes, device where,
                                       deleter_type deleter);

  /// As above, with `backend_state`: bookkeeping the allocating backend
  /// keeps beside the memory for as long as it lives (the CUDA backend:
  /// which stream used the memory last). Only that backend reads it.
  static std::shared_ptr<storage> wrap(void* data, std::size_t bytes, device where,
                                       deleter_type deleter, void* backend_state);

  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage();

  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  device where() const noexcept { return device_; }
  /// The allocating backend's bookkeeping (see wrap), or nullptr.
  void* backend_state() const noexcept { return backend_state_; }

private:
  storage(void* data, std::size_t bytes, device where, deleter_type deleter, void* backend_state);

  void* data_;
  std::size_t bytes_;
  device device_;
  deleter_type deleter_;
  void* backend_state_;
};

} // namespace troupe
