#pragma once
// The tensor value handle: a typed, strided view of shared storage.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/storage.hpp"

namespace troupe {

/// Number of elements of a shape (1 for rank 0). Throws usage_error on a
/// negative size or on overflow of int64.
std::int64_t numel_of(const dims& shape);

/// Row-major (C-contiguous) strides for a shape, in elements.
dims contiguous_strides(const dims& shape);

/// A tensor is a value handle: copying it shares the storage (like
/// torch.Tensor). Shape, strides and offset are in elements. Views (view,
/// transpose, narrow, expand, ...) share storage; `contiguous()` and
/// `clone()` copy. A default-constructed tensor is undefined (`!defined()`).
///
/// Autograd lives in its own module (autograd/variable.hpp) and wraps
/// tensors; nothing here records a graph.
class tensor {
public:
  tensor() = default;

  // -- factories -----------------------------------------------------------

  /// Uninitialised contiguous tensor.
  static tensor empty(const dims& shape, dtype type = dtype::float32,
                      device where = device::cpu());
  static tensor zeros(const dims& shape, dtype type = dtype::float32,
                      device where = device::cpu());
  static tensor ones(const dims& shape, dtype type = dtype::float32,
                     device where = device::cpu());
  static tensor full(const dims& shape, double value, dtype type = dtype::float32,
                     device where = device::cpu());
  /// A contiguous CPU tensor holding a copy of `values`, shaped `shape`;
  /// the count must equal the shape's element count.
  template <class T>
  static tensor from(std::span<const T> values, const dims& shape) {
    auto out = empty(shape, dtype_of_v<T>);
    require(static_cast<std::size_t>(out.numel()) == values.size(),
            "tensor::from: {} values do not fill shape {}", values.size(), shape);
    std::copy(values.begin(), values.end(), out.template data<T>());
    return out;
  }
  template <class T>
  static tensor from(std::initializer_list<T> values, const dims& shape) {
    return from(std::span<const T>(values.begin(), values.size()), shape);
  }
  template <class T>
  static tensor from(const std::vector<T>& values, const dims& shape) {
    return from(std::span<const T>(values.data(), values.size()), shape);
  }
  /// A rank-0 tensor.
  static tensor scalar(double value, dtype type = dtype::float32);

  /// A view of existing storage. Checks that every addressable element lies
  /// inside the storage; throws usage_error otherwise.
  static tensor from_storage(std::shared_ptr<storage> memory, const dims& shape,
                             const dims& strides, std::int64_t offset, dtype type);

  // -- properties ----------------------------------------------------------

  bool defined() const noexcept { return storage_ != nullptr; }
  dtype type() const noexcept { return dtype_; }
  device where() const noexcept { return storage_ ? storage_->where() : device::cpu(); }
  const dims& shape() const noexcept { return shape_; }
  const dims& strides() const noexcept { return strides_; }
  std::int64_t offset() const noexcept { return offset_; }
  std::int64_t rank() const noexcept { return static_cast<std::int64_t>(shape_.size()); }
  /// Size of dimension `dim`; negative dims count from the end.
  std::int64_t size(std::int64_t dim) const;
  std::int64_t numel() const noexcept { return numel_; }
  std::size_t element_size() const noexcept { return size_of(dtype_); }
  /// Bytes covered by the elements (numel * element size).
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel_) * size_of(dtype_); }
  bool is_contiguous() const noexcept;
  const std::shared_ptr<storage>& memory() const noexcept { return storage_; }
  bool shares_storage_with(const tensor& other) const noexcept {
    return storage_ && storage_ == other.storage_;
  }

  /// Pointer to the first element (storage base + offset).
  void* raw_data() const noexcept;
  /// Typed pointer to the first element; throws usage_error when T does not
  /// match the dtype.
  template <class T> T* data() const {
    require(dtype_of_v<T> == dtype_, "tensor::data: requested {} but tensor is {}",
            dtype_of_v<T>, dtype_);
    return static_cast<T*>(raw_data());
  }

  /// Element at a multi-index, converted to double (slow; for tests and
  /// scalars). `item()` requires exactly one element.
  double at(std::initializer_list<std::int64_t> index) const;
  double item() const;
  /// All elements in row-major order, converted to T (slow; for tests).
  /// Tensors on another device are copied to the CPU first.
  template <class T> std::vector<T> to_vector() const;

  // -- views (share storage) -----------------------------------------------

  /// Same elements, new shape; one dimension may be -1. Requires a layout
  /// expressible without copying (throws usage_error otherwise).
  tensor view(const dims& shape) const;
  /// view() when possible, otherwise a contiguous copy.
  tensor reshape(const dims& shape) const;
  tensor flatten() const { return reshape({-1}); }
  tensor transpose(std::int64_t dim0, std::int64_t dim1) const;
  /// 2-D transpose.
  tensor t() const;
  tensor permute(const dims& order) const;
  /// Elements [start, start + length) of `dim`.
  tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  /// Python-style slice of `dim` with a positive step; end is clamped.
  tensor slice(std::int64_t dim, std::int64_t start, std::int64_t end,
               std::int64_t step = 1) const;
  /// Removes `dim`, keeping index `index`.
  tensor select(std::int64_t dim, std::int64_t index) const;
  /// Broadcasts size-1 dimensions (stride 0) and prepends new ones.
  tensor expand(const dims& shape) const;
  tensor unsqueeze(std::int64_t dim) const;
  tensor squeeze(std::int64_t dim) const;

  // -- copies ----------------------------------------------------------------

  /// This tensor when already contiguous, else a contiguous copy.
  tensor contiguous() const;
  /// Always a fresh contiguous copy.
  tensor clone() const;
  /// Converted to `type` (a copy; this tensor when the dtype already matches).
  tensor to(dtype type) const;
  /// A contiguous copy on `where` (this tensor when already there), for
  /// example `t.to(device::cuda(0))` and back with `t.to(device::cpu())`.
  /// Returns once the copy has landed. Throws usage_error naming the device
  /// when this build or this machine has no such device.
  tensor to(device where) const;
  /// Copies `source` (broadcast to this shape, converted to this dtype) into
  /// this tensor's elements, in place.
  void copy_from(const tensor& source);
  /// Sets every element to `value`, in place.
  void fill(double value);

private:
  std::shared_ptr<storage> storage_;
  dims shape_;
  dims strides_;
  std::int64_t offset_ = 0;
  std::int64_t numel_ = 0;
  dtype dtype_ = dtype::float32;
};

/// A copy of a tensor on the host that may still be running: `host` holds
/// the bytes once `wait()` has returned (until then they must not be read,
/// and `host` must stay alive). Made by start_copy_to_host.
struct pending_host_copy {
  tensor host;
  std::function<void()> wait;
};

/// Starts copying `t` to a new contiguous host tensor without waiting for
/// the device: the copy is queued after the work, of any thread, that
/// writes `t`, and `wait()` blocks until it has run. A thread that must not
/// wait for its own kernels (a stage sending its output to another process)
/// hands the waiting to another thread. For a CPU tensor: `t` itself (made
/// contiguous) and a wait that returns at once.
pending_host_copy start_copy_to_host(const tensor& t);

/// Normalises a possibly negative dimension index for a tensor of `rank`;
/// throws usage_error naming `op` when out of range.
std::int64_t normalize_dim(std::int64_t dim, std::int64_t rank, const char* op);

} // namespace troupe

template <> struct fmt::formatter<troupe::tensor> : fmt::formatter<std::string_view> {
  auto format(const troupe::tensor& t, format_context& ctx) const {
    return fmt::format_to(ctx.out(), "tensor({}, {}, {})", t.shape(), t.type(), t.where());
  }
};
