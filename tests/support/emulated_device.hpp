#pragma once
// A stand-in for the CUDA backend where a test has no GPU: tensors on
// `cuda:N` live in host memory, and every kernel is the CPU backend's, run
// on host views of that memory. It lets a test run the code that decides
// where tensors go and moves them (pipeline stages on CUDA places, the
// tensor router's device maps, a hybrid's host ring for replicas sharing a
// GPU) on any machine. It says nothing about CUDA itself (kernels, streams,
// cuBLAS, NCCL): the same tests run against the real backend where a device
// is present (scripts/gpu_check.sh).
//
// Device pointers are not host pointers. A tensor on an emulated device
// carries an address in a reserved range that no host access may touch
// (PROT_NONE), as a real device pointer would be; only the backend's kernels
// and copies translate it to the host memory behind it. So host code that
// reads or writes a device tensor's bytes (raw_data(), data<T>()) faults
// here as it would on a GPU, and the fault is said, with a backtrace, on
// stderr before the test aborts.
//
//   test::cuda_or_emulated devices(1); // cuda:0: the real one, or emulated until `devices` goes
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/tensor/storage.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::test {

/// Addresses for emulated device memory: a range of address space reserved
/// with no access, handed out in power-of-two blocks (reused once freed),
/// each standing for a block of host memory that only the backend reaches.
/// One per process, never destroyed: tensors may outlive the emulated scope.
class emulated_address_space {
public:
  static emulated_address_space& instance() {
    static auto* space = new emulated_address_space;
    return *space;
  }

  /// A device address for a new block of `bytes` of host memory (the
  /// address range is a power of two, the host block only what is asked).
  void* allocate(std::size_t bytes) {
    const auto host_bytes = std::max<std::size_t>((bytes + storage::alignment - 1) / storage::alignment, 1) *
                            storage::alignment;
    const auto size = std::bit_ceil(host_bytes);
    void* host = std::aligned_alloc(storage::alignment, host_bytes);
    if (host == nullptr)
      throw std::bad_alloc();
    std::lock_guard lock(mutex_);
    std::uintptr_t address;
    if (auto& free = free_[size]; !free.empty()) {
      address = free.back();
      free.pop_back();
    } else {
      if (next_ + size > reserved_bytes) {
        std::free(host);
        throw usage_error(fmt::format("emulated cuda: {} bytes more exceed the reserved address space", size));
      }
      address = base_ + next_;
      next_ += size;
    }
    blocks_.emplace(address, block{static_cast<std::byte*>(host), host_bytes, size});
    return reinterpret_cast<void*>(address);
  }

  void release(void* device_address) {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(device_address));
    if (it == blocks_.end())
      return;
    std::free(it->second.host);
    free_[it->second.size].push_back(it->first);
    blocks_.erase(it);
  }

  /// The host memory behind `device_address` (any byte of a live block).
  void* host_of(const void* device_address) const {
    const auto address = reinterpret_cast<std::uintptr_t>(device_address);
    std::lock_guard lock(mutex_);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin() || address >= std::prev(it)->first + std::prev(it)->second.host_bytes)
      throw usage_error(fmt::format("emulated cuda: {} is not emulated device memory", device_address));
    --it;
    return it->second.host + (address - it->first);
  }

  bool contains(const void* address) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    return a >= base_ && a < base_ + reserved_bytes;
  }

private:
  static constexpr std::uintptr_t reserved_bytes = std::uintptr_t{1} << 40; // address space only

  struct block {
    std::byte* host;
    std::size_t host_bytes; ///< what the device address may reach
    std::size_t size;       ///< the address range, a power of two
  };

  emulated_address_space() {
    void* reserved = mmap(nullptr, reserved_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserved == MAP_FAILED)
      throw std::runtime_error("emulated cuda: cannot reserve address space for device memory");
    base_ = reinterpret_cast<std::uintptr_t>(reserved);
    install_fault_report();
  }

  // A host access of device memory is a segmentation fault, as on a GPU;
  // this says what it was and where before the default action ends the test.
  static void install_fault_report() {
    void* warm[1];
    (void)backtrace(warm, 1); // loads the unwinder now: the handler must not
    struct sigaction report {};
    report.sa_sigaction = &on_fault;
    report.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER;
    sigemptyset(&report.sa_mask);
    sigaction(SIGSEGV, &report, &previous_handler());
  }
  static struct sigaction& previous_handler() {
    static struct sigaction previous {};
    return previous;
  }
  static void on_fault(int signal, siginfo_t* info, void* context) {
    if (instance().contains(info->si_addr)) {
      static constexpr char said[] = "\nemulated cuda: host code read or wrote device memory (a CUDA device pointer "
                                     "dereferenced on the host), at:\n";
      (void)!write(STDERR_FILENO, said, sizeof said - 1);
      void* frames[48];
      backtrace_symbols_fd(frames, backtrace(frames, 48), STDERR_FILENO);
      std::abort();
    }
    // Not ours: whatever handled it before (SA_RESETHAND left the default).
    auto& previous = previous_handler();
    if (previous.sa_flags & SA_SIGINFO && previous.sa_sigaction != nullptr)
      previous.sa_sigaction(signal, info, context);
    else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN && previous.sa_handler != nullptr)
      previous.sa_handler(signal);
    else
      sigaction(SIGSEGV, &previous, nullptr); // returns and faults again, into the default action
  }

  mutable std::mutex mutex_;
  std::uintptr_t base_ = 0;
  std::uintptr_t next_ = 0;
  std::map<std::uintptr_t, block> blocks_;
  std::map<std::size_t, std::vector<std::uintptr_t>> free_;
};

class emulated_cuda_backend final : public backend {
public:
  explicit emulated_cuda_backend(int devices) : devices_(devices) {}

  std::string_view name() const override { return "emulated cuda"; }

  // -- memory: host memory that says cuda:N ------------------------------------
  std::shared_ptr<storage> allocate(std::size_t bytes, device where) override {
    if (where.index < 0 || where.index >= devices_)
      throw usage_error(fmt::format("storage::allocate: device {} is not available: the emulated device has {} "
                                    "ordinals",
                                    where, devices_));
    void* data = emulated_address_space::instance().allocate(bytes);
    ++allocations_;
    return storage::wrap(data, bytes, where, [](void* p) { emulated_address_space::instance().release(p); });
  }
  void fill(tensor& out, double value) override {
    auto view = on_host(out);
    view.fill(value);
  }
  void copy(const tensor& source, tensor& out) override {
    auto view = on_host(out);
    view.copy_from(on_host(source));
  }
  tensor transfer(const tensor& source, device target) override {
    auto out = tensor::empty(source.shape(), source.type(), target);
    std::memcpy(host_address(out), host_address(source), source.nbytes()); // both contiguous, same size
    ++transfers_;
    return out;
  }
  /// The bytes are copied at once; the wait returns once the copies are
  /// not held (hold_copies_to_host), as a device still copying would.
  pending_host_copy start_transfer_to_host(const tensor& source) override {
    auto host = transfer(source, device::cpu());
    return {std::move(host), [this] {
              std::unique_lock guard(hold_mutex_);
              ++held_waits_;
              if (!released_.wait_for(guard, std::chrono::seconds(60), [this] { return !held_; }))
                throw usage_error("emulated cuda: a copy to the host was held for 60 s and never released");
            }};
  }

  /// Until release_copies_to_host(), whoever waits for a copy to the host
  /// started with start_copy_to_host waits on: a device that is slow to
  /// copy, for a test of what must go on meanwhile.
  void hold_copies_to_host() {
    std::lock_guard guard(hold_mutex_);
    held_ = true;
  }
  void release_copies_to_host() {
    {
      std::lock_guard guard(hold_mutex_);
      held_ = false;
    }
    released_.notify_all();
  }
  /// How many waits for such copies have begun.
  int copy_waits_begun() {
    std::lock_guard guard(hold_mutex_);
    return held_waits_;
  }

  // -- every kernel: the CPU backend's, on host views ----------------------------
  void unary(unary_op op, const tensor& a, double scalar, tensor& out) override {
    auto o = on_host(out);
    cpu().unary(op, on_host(a), scalar, o);
  }
  void binary(binary_op op, const tensor& a, const tensor& b, tensor& out) override {
    auto o = on_host(out);
    cpu().binary(op, on_host(a), on_host(b), o);
  }
  void axpy(tensor& a, const tensor& b, double alpha) override {
    auto h = on_host(a);
    cpu().axpy(h, on_host(b), alpha);
  }
  void where(const tensor& cond, const tensor& a, const tensor& b, tensor& out) override {
    auto o = on_host(out);
    cpu().where(on_host(cond), on_host(a), on_host(b), o);
  }
  void reduce_rows(reduce_op op, const tensor& a, tensor& values, tensor& indices) override {
    auto v = on_host(values);
    auto i = on_host(indices);
    cpu().reduce_rows(op, on_host(a), v, i);
  }
  void softmax(const tensor& a, bool log, tensor& out) override {
    auto o = on_host(out);
    cpu().softmax(on_host(a), log, o);
  }
  void softmax_backward(const tensor& grad, const tensor& output, bool log, tensor& out) override {
    auto o = on_host(out);
    cpu().softmax_backward(on_host(grad), on_host(output), log, o);
  }
  void causal_softmax(const tensor& a, std::int64_t queries, double scale, tensor& out) override {
    auto o = on_host(out);
    cpu().causal_softmax(on_host(a), queries, scale, o);
  }
  void causal_softmax_backward(const tensor& grad, const tensor& output, std::int64_t queries, double scale,
                               tensor& out) override {
    auto o = on_host(out);
    cpu().causal_softmax_backward(on_host(grad), on_host(output), queries, scale, o);
  }
  void causal_attention(const tensor& qkv, std::int64_t heads, double scale, const tensor& dropout_mask,
                        tensor& output, tensor& weights) override {
    auto o = on_host(output);
    auto w = on_host(weights);
    cpu().causal_attention(on_host(qkv), heads, scale, on_host(dropout_mask), o, w);
  }
  void causal_attention_backward(const tensor& grad, const tensor& qkv, const tensor& weights,
                                 const tensor& dropout_mask, std::int64_t heads, double scale,
                                 tensor& grad_qkv) override {
    auto g = on_host(grad_qkv);
    cpu().causal_attention_backward(on_host(grad), on_host(qkv), on_host(weights), on_host(dropout_mask), heads,
                                    scale, g);
  }
  void cross_entropy(const tensor& logits, const tensor& targets, tensor& loss, tensor& log_sum_exp) override {
    auto l = on_host(loss);
    auto s = on_host(log_sum_exp);
    cpu().cross_entropy(on_host(logits), on_host(targets), l, s);
  }
  void cross_entropy_backward(const tensor& grad, const tensor& logits, const tensor& targets,
                              const tensor& log_sum_exp, tensor& out) override {
    auto o = on_host(out);
    cpu().cross_entropy_backward(on_host(grad), on_host(logits), on_host(targets), on_host(log_sum_exp), o);
  }
  void gemm(const tensor& a, const tensor& b, tensor& out, double alpha, double beta) override {
    auto o = on_host(out);
    cpu().gemm(on_host(a), on_host(b), o, alpha, beta);
  }
  void bmm(const tensor& a, const tensor& b, tensor& out) override {
    auto o = on_host(out);
    cpu().bmm(on_host(a), on_host(b), o);
  }
  void index_select(const tensor& a, std::int64_t dim, const tensor& index, tensor& out) override {
    auto o = on_host(out);
    cpu().index_select(on_host(a), dim, on_host(index), o);
  }
  void gather(const tensor& a, std::int64_t dim, const tensor& index, tensor& out) override {
    auto o = on_host(out);
    cpu().gather(on_host(a), dim, on_host(index), o);
  }
  void scatter_add_(tensor& out, std::int64_t dim, const tensor& index, const tensor& src) override {
    auto o = on_host(out);
    cpu().scatter_add_(o, dim, on_host(index), on_host(src));
  }
  void index_add_(tensor& a, std::int64_t dim, const tensor& index, const tensor& src) override {
    auto h = on_host(a);
    cpu().index_add_(h, dim, on_host(index), on_host(src));
  }
  void embedding_bag(const tensor& weight, const tensor& indices, const tensor& offsets, bool mean,
                     tensor& out) override {
    auto o = on_host(out);
    cpu().embedding_bag(on_host(weight), on_host(indices), on_host(offsets), mean, o);
  }
  void embedding_bag_backward(const tensor& grad, const tensor& indices, const tensor& offsets, bool mean,
                              tensor& grad_weight) override {
    auto g = on_host(grad_weight);
    cpu().embedding_bag_backward(on_host(grad), on_host(indices), on_host(offsets), mean, g);
  }
  void im2col(const tensor& image, const conv_geometry& geometry, tensor& cols) override {
    auto c = on_host(cols);
    cpu().im2col(on_host(image), geometry, c);
  }
  void col2im(const tensor& cols, const conv_geometry& geometry, tensor& image) override {
    auto i = on_host(image);
    cpu().col2im(on_host(cols), geometry, i);
  }
  void conv2d(const tensor& input, const tensor& weight, const conv_geometry& geometry, tensor& out) override {
    auto o = on_host(out);
    cpu().conv2d(on_host(input), on_host(weight), geometry, o);
  }
  void conv2d_backward(const tensor& grad, const tensor& input, const tensor& weight, const conv_geometry& geometry,
                       tensor& grad_input, tensor& grad_weight) override {
    auto gi = grad_input.defined() ? on_host(grad_input) : tensor();
    auto gw = on_host(grad_weight);
    cpu().conv2d_backward(on_host(grad), on_host(input), on_host(weight), geometry, gi, gw);
  }
  void max_pool2d(const tensor& input, std::int64_t kernel, std::int64_t stride, tensor& output,
                  tensor& indices) override {
    auto o = on_host(output);
    auto i = on_host(indices);
    cpu().max_pool2d(on_host(input), kernel, stride, o, i);
  }
  void max_pool2d_backward(const tensor& grad, const tensor& indices, tensor& grad_input) override {
    auto g = on_host(grad_input);
    cpu().max_pool2d_backward(on_host(grad), on_host(indices), g);
  }
  void layer_norm(const tensor& input, const tensor& weight, const tensor& bias, double eps, tensor& output,
                  tensor& mean, tensor& rstd) override {
    auto o = on_host(output);
    auto m = on_host(mean);
    auto r = on_host(rstd);
    cpu().layer_norm(on_host(input), on_host(weight), on_host(bias), eps, o, m, r);
  }
  void layer_norm_backward(const tensor& grad, const tensor& input, const tensor& mean, const tensor& rstd,
                           const tensor& weight, tensor& grad_input, tensor& grad_weight,
                           tensor& grad_bias) override {
    auto gi = on_host(grad_input);
    auto gw = on_host(grad_weight);
    auto gb = on_host(grad_bias);
    cpu().layer_norm_backward(on_host(grad), on_host(input), on_host(mean), on_host(rstd), on_host(weight), gi, gw,
                              gb);
  }
  void fill_random(random_distribution what, const generator& gen, double a, double b, tensor& out) override {
    auto o = on_host(out);
    cpu().fill_random(what, gen, a, b, o);
  }
  void adam_step(tensor& param, const tensor& grad, tensor& m, tensor& v, const adam_step_args& step) override {
    auto p = on_host(param);
    auto hm = on_host(m);
    auto hv = on_host(v);
    cpu().adam_step(p, on_host(grad), hm, hv, step);
  }
  void sgd_step(tensor& param, const tensor& grad, tensor& momentum_buffer, const sgd_step_args& step) override {
    auto p = on_host(param);
    auto b = on_host(momentum_buffer);
    cpu().sgd_step(p, on_host(grad), b, step);
  }

  int ordinals() const noexcept { return devices_; }
  /// Blocks handed out and host <-> device copies made so far.
  int allocations() const noexcept { return allocations_; }
  int transfers() const noexcept { return transfers_; }

private:
  static backend& cpu() { return backend_for(device::cpu()); }
  /// The same bytes seen as a CPU tensor (the storage stays alive with it);
  /// undefined stays undefined (optional operands). An operand that is not
  /// on an emulated device is refused: the real backend would take its host
  /// address for device memory.
  static tensor on_host(const tensor& t) {
    if (!t.defined())
      return t;
    if (t.where().kind != device_kind::cuda)
      throw usage_error(fmt::format("emulated cuda: a kernel was given a {} tensor of shape {} on {} among CUDA "
                                    "operands",
                                    t.type(), t.shape(), t.where()));
    auto memory = t.memory();
    auto alias = storage::wrap(emulated_address_space::instance().host_of(memory->data()), memory->bytes(),
                               device::cpu(), [memory](void*) {});
    return tensor::from_storage(std::move(alias), t.shape(), t.strides(), t.offset(), t.type());
  }
  /// Where a copy reads or writes `t`'s first byte: its own address on the
  /// host, the host memory behind it on an emulated device.
  static void* host_address(const tensor& t) {
    return t.where().kind == device_kind::cuda ? emulated_address_space::instance().host_of(t.raw_data())
                                               : t.raw_data();
  }

  int devices_;
  std::atomic<int> allocations_{0};
  std::atomic<int> transfers_{0}; // a tensor router delivers on the data plane's thread
  std::mutex hold_mutex_;
  std::condition_variable released_;
  bool held_ = false;
  int held_waits_ = 0;
};

/// Installs an emulated CUDA backend of `devices` ordinals for its lifetime,
/// then puts back what was there (the real backend, or none).
class emulated_cuda_scope {
public:
  explicit emulated_cuda_scope(int devices) : emulated_(devices) {
    try {
      previous_ = &backend_for(device::cuda(0));
    } catch (const usage_error&) { // a build without the CUDA backend
      previous_ = nullptr;
    }
    register_backend(device_kind::cuda, &emulated_);
  }
  ~emulated_cuda_scope() { register_backend(device_kind::cuda, previous_); }
  emulated_cuda_scope(const emulated_cuda_scope&) = delete;
  emulated_cuda_scope& operator=(const emulated_cuda_scope&) = delete;

  emulated_cuda_backend& backend() noexcept { return emulated_; }
  const emulated_cuda_backend& backend() const noexcept { return emulated_; }

private:
  emulated_cuda_backend emulated_;
  troupe::backend* previous_ = nullptr;
};

/// The real CUDA backend where this machine has a device; otherwise an
/// emulated device of `ordinals` ordinals for this object's lifetime, said
/// on stdout so that a test's output shows which one it ran on.
class cuda_or_emulated {
public:
  explicit cuda_or_emulated(int ordinals) {
    if (cuda_device_count() > 0)
      return;
    std::printf("no CUDA device (%s): on an emulated device of %d ordinals (host memory, the CPU's kernels), "
                "which checks placement, not CUDA\n",
                cuda_unavailable_reason().c_str(), ordinals);
    emulated_.emplace(ordinals);
  }
  bool emulated() const noexcept { return emulated_.has_value(); }
  /// cuda:0 .. cuda:(ordinals() - 1) are usable.
  int ordinals() const noexcept { return emulated_ ? emulated_->backend().ordinals() : cuda_device_count(); }
  /// Blocks the emulated device has handed out so far; -1 on a real device.
  int emulated_allocations() const noexcept { return emulated_ ? emulated_->backend().allocations() : -1; }
  /// The emulated backend; only where emulated().
  emulated_cuda_backend& emulated_backend() { return emulated_->backend(); }

private:
  std::optional<emulated_cuda_scope> emulated_;
};

} // namespace troupe::test
