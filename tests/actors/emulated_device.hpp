#pragma once
// A stand-in for the CUDA backend where a test has no GPU: tensors on
// `cuda:N` live in host memory, and only memory is emulated (allocate, fill,
// copy, transfer); every kernel throws. It lets a test run the code that
// decides where tensors go (the tensor router's device maps) on any machine.
// It says nothing about CUDA itself: the same tests run against the real
// backend where a device is present (gpu_check.sh).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/storage.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::test {

class emulated_device_memory final : public backend {
public:
  explicit emulated_device_memory(int devices) : devices_(devices) {}

  std::string_view name() const override { return "emulated cuda"; }

  std::shared_ptr<storage> allocate(std::size_t bytes, device where) override {
    if (where.index < 0 || where.index >= devices_)
      throw usage_error(fmt::format("storage::allocate: device {} is not available: the emulated device has {} "
                                    "ordinals",
                                    where, devices_));
    const auto rounded = (bytes + storage::alignment - 1) / storage::alignment * storage::alignment;
    void* data = std::aligned_alloc(storage::alignment, rounded == 0 ? storage::alignment : rounded);
    ++allocations_;
    return storage::wrap(data, bytes, where, [](void* p) { std::free(p); });
  }
  void fill(tensor& out, double value) override {
    auto view = on_host(out);
    view.fill(value);
  }
  void copy(const tensor& source, tensor& out) override {
    auto view = on_host(out);
    view.copy_from(on_host(source));
  }
  void transfer(const tensor& source, tensor& out) override {
    std::memcpy(out.raw_data(), source.raw_data(), source.nbytes()); // both contiguous, same size
    ++transfers_;
  }

  void unary(unary_op, const tensor&, double, tensor&) override { kernel("unary"); }
  void binary(binary_op, const tensor&, const tensor&, tensor&) override { kernel("binary"); }
  void axpy(tensor&, const tensor&, double) override { kernel("axpy"); }
  void where(const tensor&, const tensor&, const tensor&, tensor&) override { kernel("where"); }
  void reduce_rows(reduce_op, const tensor&, tensor&, tensor&) override { kernel("reduce_rows"); }
  void softmax(const tensor&, bool, tensor&) override { kernel("softmax"); }
  void softmax_backward(const tensor&, const tensor&, bool, tensor&) override { kernel("softmax_backward"); }
  void gemm(const tensor&, const tensor&, tensor&, double, double) override { kernel("gemm"); }
  void index_select(const tensor&, std::int64_t, const tensor&, tensor&) override { kernel("index_select"); }
  void gather(const tensor&, std::int64_t, const tensor&, tensor&) override { kernel("gather"); }
  void scatter_add_(tensor&, std::int64_t, const tensor&, const tensor&) override { kernel("scatter_add_"); }
  void index_add_(tensor&, std::int64_t, const tensor&, const tensor&) override { kernel("index_add_"); }
  void embedding_bag(const tensor&, const tensor&, const tensor&, bool, tensor&) override { kernel("embedding_bag"); }
  void embedding_bag_backward(const tensor&, const tensor&, const tensor&, bool, tensor&) override {
    kernel("embedding_bag_backward");
  }
  void im2col(const tensor&, const conv_geometry&, tensor&) override { kernel("im2col"); }
  void col2im(const tensor&, const conv_geometry&, tensor&) override { kernel("col2im"); }
  void max_pool2d(const tensor&, std::int64_t, std::int64_t, tensor&, tensor&) override { kernel("max_pool2d"); }
  void max_pool2d_backward(const tensor&, const tensor&, tensor&) override { kernel("max_pool2d_backward"); }
  void layer_norm(const tensor&, const tensor&, const tensor&, double, tensor&, tensor&, tensor&) override {
    kernel("layer_norm");
  }
  void layer_norm_backward(const tensor&, const tensor&, const tensor&, const tensor&, const tensor&, tensor&,
                           tensor&, tensor&) override {
    kernel("layer_norm_backward");
  }
  void fill_random(random_distribution, const generator&, double, double, tensor&) override {
    kernel("fill_random");
  }

  /// Blocks handed out and host <-> device copies made so far.
  int allocations() const noexcept { return allocations_; }
  int transfers() const noexcept { return transfers_; }

private:
  [[noreturn]] static void kernel(const char* op) {
    throw usage_error(fmt::format("{}: the emulated device keeps memory only, it runs no kernels", op));
  }
  /// The same bytes seen as a CPU tensor (the storage stays alive with it).
  static tensor on_host(const tensor& t) {
    auto memory = t.memory();
    auto alias = storage::wrap(memory->data(), memory->bytes(), device::cpu(), [memory](void*) {});
    return tensor::from_storage(std::move(alias), t.shape(), t.strides(), t.offset(), t.type());
  }

  int devices_;
  std::atomic<int> allocations_{0};
  std::atomic<int> transfers_{0}; // the router delivers on the data plane's thread
};

} // namespace troupe::test
