// The CUDA backend (cuda_backend.hpp): turns tensors into kernel launches on
// the device's stream (cuda_kernels.hpp) and GEMMs, batched too, into cuBLAS
// calls. Every kernel of backend.hpp is here; the op-conformance test
// (tests/tensor/cuda_backend_test.cpp) checks each against the CPU.
#include "cuda_backend.hpp"

#include <algorithm>
#include <array>
#include <climits>

#include <fmt/format.h>

#include "../blas_layout.hpp"
#include "cublas_library.hpp"
#include "cuda_context.hpp"
#include "cuda_kernels.hpp"
#include "pinned_host_cache.hpp"
#ifdef TROUPE_HAVE_CUDNN
#include "cudnn_convolution.hpp"
#endif
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/storage.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::detail {

namespace {

using namespace troupe::detail::cuda;

// The kernel enums mirror the backend's (cuda_kernels.hpp cannot include
// backend.hpp); casting between them is safe only while these hold.
#define TROUPE_SAME_VALUE(a, b) static_assert(static_cast<int>(a) == static_cast<int>(b), #a " != " #b)
TROUPE_SAME_VALUE(unary_kernel::neg, unary_op::neg);
TROUPE_SAME_VALUE(unary_kernel::abs, unary_op::abs);
TROUPE_SAME_VALUE(unary_kernel::add_scalar, unary_op::add_scalar);
TROUPE_SAME_VALUE(unary_kernel::mul_scalar, unary_op::mul_scalar);
TROUPE_SAME_VALUE(unary_kernel::pow, unary_op::pow);
TROUPE_SAME_VALUE(unary_kernel::exp, unary_op::exp);
TROUPE_SAME_VALUE(unary_kernel::log, unary_op::log);
TROUPE_SAME_VALUE(unary_kernel::tanh, unary_op::tanh);
TROUPE_SAME_VALUE(unary_kernel::sqrt, unary_op::sqrt);
TROUPE_SAME_VALUE(unary_kernel::relu, unary_op::relu);
TROUPE_SAME_VALUE(unary_kernel::gelu, unary_op::gelu);
TROUPE_SAME_VALUE(unary_kernel::sigmoid, unary_op::sigmoid);
TROUPE_SAME_VALUE(unary_kernel::gelu_tanh, unary_op::gelu_tanh);
TROUPE_SAME_VALUE(binary_kernel::add, binary_op::add);
TROUPE_SAME_VALUE(binary_kernel::sub, binary_op::sub);
TROUPE_SAME_VALUE(binary_kernel::mul, binary_op::mul);
TROUPE_SAME_VALUE(binary_kernel::div, binary_op::div);
TROUPE_SAME_VALUE(binary_kernel::maximum, binary_op::maximum);
TROUPE_SAME_VALUE(binary_kernel::greater, binary_op::greater);
TROUPE_SAME_VALUE(binary_kernel::relu_backward, binary_op::relu_backward);
TROUPE_SAME_VALUE(binary_kernel::gelu_backward, binary_op::gelu_backward);
TROUPE_SAME_VALUE(binary_kernel::sigmoid_backward, binary_op::sigmoid_backward);
TROUPE_SAME_VALUE(binary_kernel::tanh_backward, binary_op::tanh_backward);
TROUPE_SAME_VALUE(binary_kernel::gelu_tanh_backward, binary_op::gelu_tanh_backward);
TROUPE_SAME_VALUE(element::float32, dtype::float32);
TROUPE_SAME_VALUE(element::float64, dtype::float64);
TROUPE_SAME_VALUE(element::int64, dtype::int64);
TROUPE_SAME_VALUE(element::int32, dtype::int32);
TROUPE_SAME_VALUE(element::uint8, dtype::uint8);
TROUPE_SAME_VALUE(element::bfloat16, dtype::bfloat16);
TROUPE_SAME_VALUE(distribution::uniform, random_distribution::uniform);
TROUPE_SAME_VALUE(distribution::normal, random_distribution::normal);
TROUPE_SAME_VALUE(distribution::integer, random_distribution::integer);
TROUPE_SAME_VALUE(distribution::dropout, random_distribution::dropout);
#undef TROUPE_SAME_VALUE

index_space space_of(const char* op, const tensor& out, bool all_contiguous) {
  require(out.rank() <= max_rank, "{}: the cuda backend handles at most {} dimensions, got shape {}", op,
          max_rank, out.shape());
  index_space s;
  s.rank = static_cast<int>(out.rank());
  for (int d = 0; d < s.rank; ++d)
    s.sizes[d] = out.shape()[static_cast<std::size_t>(d)];
  s.numel = out.numel();
  s.contiguous = all_contiguous;
  return s;
}

operand operand_of(const tensor& t) {
  operand o;
  o.data = t.raw_data();
  o.type = static_cast<element>(t.type());
  for (std::size_t d = 0; d < t.strides().size(); ++d)
    o.strides[d] = t.strides()[d];
  return o;
}

element element_of(const tensor& t) {
  return static_cast<element>(t.type());
}

/// `s` with dimension `dim` collapsed to one position: the lines along dim.
index_space collapsed(index_space s, std::int64_t dim) {
  const auto length = s.sizes[dim];
  s.numel = length == 0 ? 0 : s.numel / length;
  s.sizes[dim] = 1;
  s.contiguous = false;
  return s;
}

/// The strides of a 1-D index read along `dim` (index_select, index_add_):
/// its element stride at `dim`, zero elsewhere.
std::array<std::int64_t, max_rank> along(std::int64_t dim, const tensor& index) {
  std::array<std::int64_t, max_rank> strides{};
  strides[static_cast<std::size_t>(dim)] = index.strides()[0];
  return strides;
}

conv_shape shape_of(const conv_geometry& g) {
  return {g.channels, g.height, g.width, g.kernel_h, g.kernel_w, g.stride, g.padding, g.out_h, g.out_w};
}

/// The memory behind `t` when the CUDA backend allocated it, else nullptr
/// (foreign memory is not tracked: it is used in the caller's order).
device_memory* tracked_memory(const tensor& t) {
  if (!t.defined() || t.where().kind != device_kind::cuda)
    return nullptr;
  return static_cast<device_memory*>(t.memory()->backend_state());
}

/// Selects the calling thread's stream of copies instead of its kernels'.
struct copy_stream_t {};
constexpr copy_stream_t copy_stream;

/// One op on out's device: the device made current, the calling thread's
/// stream, and every operand's memory ordered before the op (its last user
/// waited for) and after it (cuda_context.hpp's thread model). Lists every
/// tensor the op reads or writes; undefined ones are skipped.
class on_device {
public:
  template <class... Operands>
  on_device(const char* op, const tensor& out, const Operands&... operands)
      : context_(context_for(out.where(), op)), guard_(context_.ordinal()), queue_(context_.this_thread()),
        stream_(queue_.stream) {
    track(out);
    (track(operands), ...);
    order_before();
  }

  /// A copy between `operand` and the host, on the thread's copy stream.
  on_device(copy_stream_t, const char* op, const tensor& operand)
      : context_(context_for(operand.where(), op)), guard_(context_.ordinal()), queue_(context_.this_thread()),
        stream_(queue_.copies) {
    track(operand);
    order_before();
  }

  ~on_device() {
    // A failed event call here means the device is lost; the next op
    // reports it, and a destructor must not throw.
    try {
      for (std::size_t i = 0; i < count_; ++i)
        memory_[i]->after_use(stream(), queue_.ordering.get());
    } catch (...) {
    }
  }

  on_device(const on_device&) = delete;
  on_device& operator=(const on_device&) = delete;

  execution_stream& queue() const { return queue_; }
  cudaStream_t stream() const { return stream_.get(); }
  void synchronize() const { stream_.synchronize(); }

private:
  void order_before() {
    for (std::size_t i = 0; i < count_; ++i)
      memory_[i]->before_use(stream(), queue_.ordering.get());
  }

  void track(const tensor& t) {
    auto* memory = tracked_memory(t);
    if (memory == nullptr || std::find(memory_.begin(), memory_.begin() + count_, memory) != memory_.begin() + count_)
      return;
    require(count_ < memory_.size(), "cuda backend: an op with more than {} operands", memory_.size());
    memory_[count_++] = memory;
  }

  device_context& context_;
  device_guard guard_;
  execution_stream& queue_;
  const cuda_stream& stream_;
  std::array<device_memory*, 8> memory_{};
  std::size_t count_ = 0;
};

// -- GEMM -------------------------------------------------------------------------------
//
// cuBLAS is column-major. A row-major [rows, cols] matrix with leading
// dimension ld is, read column-major, its transpose; so C = A B (row-major)
// is computed as C^T = B^T A^T with the operands passed in swapped order —
// no copies. As on the CPU, a column-major view (a transposed tensor) is
// passed with the transpose flag, and only a layout that is neither is copied.

/// Matrices as cuBLAS takes them: the tensor, whether each matrix is
/// transposed, its leading dimension and the stride between matrices of a
/// batch (0 for one matrix, or one shared by the batch).
struct blas_operand {
  tensor data;
  cublasOperation_t op = CUBLAS_OP_N;
  std::int64_t ld = 1;
  long long batch_stride = 0;
};

/// One 2-D operand: a row-major view as it is, a column-major view (a
/// transposed tensor) with the transpose flag, anything else copied.
blas_operand present(const tensor& t) {
  const auto rows = t.size(0);
  const auto cols = t.size(1);
  std::int64_t ld = 1;
  if (row_major(rows, cols, t.strides(), ld))
    return {t, CUBLAS_OP_N, ld, 0};
  if (row_major(cols, rows, {t.strides()[1], t.strides()[0]}, ld))
    return {t, CUBLAS_OP_T, ld, 0};
  return {t.contiguous(), CUBLAS_OP_N, std::max<std::int64_t>(cols, 1), 0};
}

/// A 3-D operand: every matrix presented alike, the batch stride between them.
blas_operand present_batched(const tensor& t) {
  const auto rows = t.size(1);
  const auto cols = t.size(2);
  std::int64_t ld = 1;
  const auto& s = t.strides();
  if (row_major(rows, cols, {s[1], s[2]}, ld))
    return {t, CUBLAS_OP_N, ld, s[0]};
  if (row_major(cols, rows, {s[2], s[1]}, ld))
    return {t, CUBLAS_OP_T, ld, s[0]};
  auto c = t.contiguous();
  return {c, CUBLAS_OP_N, std::max<std::int64_t>(cols, 1), rows * cols};
}

int blas_int(std::int64_t value, const char* what) {
  require(value <= INT_MAX, "matmul: {} {} exceeds cuBLAS's 32-bit limit on cuda", what, value);
  return static_cast<int>(value);
}

/// out[i] = alpha a[i] x b[i] + beta out[i] for `count` row-major [m, n]
/// matrices of `out` (leading dimension ldc, `stride_c` apart), in one
/// cuBLAS call on out's device (C^T = B^T A^T, see above).
void strided_gemm(execution_stream& queue, const blas_operand& a, const blas_operand& b, tensor& out,
                  std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t ldc, long long stride_c,
                  std::int64_t count, double alpha, double beta) {
  auto handle = queue.blas.get();
  const int cm = blas_int(n, "dimension");
  const int cn = blas_int(m, "dimension");
  const int ck = blas_int(k, "dimension");
  const int batch = blas_int(count, "batch");
  const int lda = blas_int(b.ld, "leading dimension");
  const int ldb = blas_int(a.ld, "leading dimension");
  const int ldc_ = blas_int(ldc, "leading dimension");
  if (out.type() == dtype::float32) {
    const float fa = static_cast<float>(alpha);
    const float fb = static_cast<float>(beta);
    TROUPE_CUBLAS_CHECK(cublas_library::get().sgemm_strided_batched(
      handle, b.op, a.op, cm, cn, ck, &fa, static_cast<const float*>(b.data.raw_data()), lda, b.batch_stride,
      static_cast<const float*>(a.data.raw_data()), ldb, a.batch_stride, &fb, static_cast<float*>(out.raw_data()),
      ldc_, stride_c, batch));
  } else {
    TROUPE_CUBLAS_CHECK(cublas_library::get().dgemm_strided_batched(
      handle, b.op, a.op, cm, cn, ck, &alpha, static_cast<const double*>(b.data.raw_data()), lda, b.batch_stride,
      static_cast<const double*>(a.data.raw_data()), ldb, a.batch_stride, &beta,
      static_cast<double*>(out.raw_data()), ldc_, stride_c, batch));
  }
}

/// `bytes` on `where` (context's device, current), allocated in the order
/// of `stream`, one of the calling thread's streams on it.
std::shared_ptr<storage> allocate_in_order(std::size_t bytes, device where, device_context& context,
                                           cudaStream_t stream) {
  auto memory = std::make_shared<device_memory>(bytes, context, stream);
  void* data = memory->data();
  void* state = memory.get();
  return storage::wrap(data, bytes, where, [memory](void*) mutable { memory.reset(); }, state);
}

class cuda_backend final : public backend {
public:
  std::string_view name() const override { return "cuda"; }

  // -- memory and copies ------------------------------------------------------------

  std::shared_ptr<storage> allocate(std::size_t bytes, device where) override {
    auto& context = context_for(where, "storage::allocate");
    device_guard guard(context.ordinal());
    return allocate_in_order(bytes, where, context, context.this_thread().stream.get());
  }

  void fill(tensor& out, double value) override {
    on_device d("fill", out);
    launch_fill(space_of("fill", out, out.is_contiguous()), operand_of(out), value, d.stream());
  }

  void copy(const tensor& source, tensor& out) override {
    on_device d("copy_from", out, source);
    launch_copy(space_of("copy_from", out, out.is_contiguous() && source.is_contiguous()), operand_of(out),
                operand_of(source), d.stream());
  }

  tensor transfer(const tensor& source, device target) override {
    const auto bytes = source.nbytes();
    const auto from = source.where();
    if (from.kind == device_kind::cpu) {
      // On the thread's copy stream, into memory allocated in its order
      // (cuda_context.hpp). The caller may free the host memory when we
      // return: the bytes are staged through pinned memory at once, or,
      // without pinned memory, the copy is waited for.
      auto& context = context_for(target, "to");
      device_guard guard(context.ordinal());
      auto& queue = context.this_thread();
      const auto copies = queue.copies.get();
      auto out =
        tensor::from_storage(allocate_in_order(bytes, target, context, copies), source.shape(), source.strides(), 0,
                             source.type());
      if (!queue.staging.copy_to_device(out.raw_data(), source.raw_data(), bytes, copies)) {
        TROUPE_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), source.raw_data(), bytes, cudaMemcpyHostToDevice, copies));
        queue.copies.synchronize();
      }
      return out;
    }
    auto out = tensor::empty(source.shape(), source.type(), target);
    if (target.kind == device_kind::cpu) {
      // In stream order after the kernels, of any thread, that wrote `source`.
      on_device d(copy_stream, "to", source);
      TROUPE_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), source.raw_data(), bytes, cudaMemcpyDeviceToHost, d.stream()));
      d.synchronize();
      return out;
    }
    // Device to device: the source's work must be done, the copy then runs
    // in the destination's stream order.
    cuda_synchronize(source);
    on_device d("to", out);
    TROUPE_CUDA_CHECK(
      cudaMemcpyPeerAsync(out.raw_data(), target.index, source.raw_data(), from.index, bytes, d.stream()));
    d.synchronize();
    return out;
  }

  pending_host_copy start_transfer_to_host(const tensor& source) override {
    const auto bytes = source.nbytes();
    auto block = pinned_host_cache::instance().take(bytes);
    if (block.data == nullptr)
      return backend::start_transfer_to_host(source); // copies at once, into pageable memory
    // In stream order after the kernels, of any thread, that wrote `source`.
    on_device d(copy_stream, "start_copy_to_host", source);
    // Made with the source's device current: an event is recorded only on
    // a stream of the device it was made on.
    auto copied = std::make_shared<cuda_event>();
    // The block goes back to the cache when the host tensor dies, once the
    // copy into it has run (a host tensor dropped unwaited, on an error
    // path, must not let the next copy into the block race this one). A
    // failure there was reported to whoever waited.
    auto memory = storage::wrap(block.data, bytes, device::cpu(), [block, copied](void*) {
      if (cudaEventSynchronize(copied->get()) != cudaSuccess)
        cudaGetLastError();
      pinned_host_cache::instance().give_back(block);
    });
    auto host = tensor::from_storage(memory, source.shape(), source.strides(), 0, source.type());
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(block.data, source.raw_data(), bytes, cudaMemcpyDeviceToHost, d.stream()));
    TROUPE_CUDA_CHECK(cudaEventRecord(copied->get(), d.stream()));
    return {host, [copied] { TROUPE_CUDA_CHECK(cudaEventSynchronize(copied->get())); }};
  }

  // -- elementwise --------------------------------------------------------------------

  void unary(unary_op op, const tensor& a, double scalar, tensor& out) override {
    on_device d("unary", out, a);
    launch_unary(static_cast<unary_kernel>(op), space_of("unary", out, a.is_contiguous() && out.is_contiguous()),
                 operand_of(out), operand_of(a), scalar, d.stream());
  }

  void binary(binary_op op, const tensor& a, const tensor& b, tensor& out) override {
    on_device d("binary", out, a, b);
    const bool contiguous = a.is_contiguous() && b.is_contiguous() && out.is_contiguous();
    launch_binary(static_cast<binary_kernel>(op), space_of("binary", out, contiguous), operand_of(out),
                  operand_of(a), operand_of(b), d.stream());
  }

  void axpy(tensor& a, const tensor& b, double alpha) override {
    on_device d("add_", a, b);
    launch_axpy(space_of("add_", a, a.is_contiguous() && b.is_contiguous()), operand_of(a), operand_of(b),
                alpha, d.stream());
  }

  void where(const tensor& cond, const tensor& a, const tensor& b, tensor& out) override {
    on_device d("where", out, cond, a, b);
    const bool contiguous = cond.is_contiguous() && a.is_contiguous() && b.is_contiguous() && out.is_contiguous();
    launch_where(space_of("where", out, contiguous), operand_of(out), operand_of(cond), operand_of(a),
                 operand_of(b), d.stream());
  }

  // -- linear algebra -------------------------------------------------------------------

  void gemm(const tensor& a, const tensor& b, tensor& out, double alpha, double beta) override {
    const auto m = a.size(0);
    const auto k = a.size(1);
    const auto n = b.size(1);
    if (m == 0 || n == 0)
      return;
    std::int64_t ldc = 1;
    if (!row_major(m, n, out.strides(), ldc)) {
      auto temp = beta == 0.0 ? tensor::empty(out.shape(), out.type(), out.where()) : out.clone();
      gemm(a, b, temp, alpha, beta);
      out.copy_from(temp);
      return;
    }
    if (k == 0) {
      // As on the CPU: beta == 0 clears NaNs too.
      if (beta == 0.0)
        out.fill(0.0);
      else
        unary(unary_op::mul_scalar, out, beta, out);
      return;
    }
    auto pa = present(a);
    auto pb = present(b);
    on_device d("matmul", out, pa.data, pb.data);
    strided_gemm(d.queue(), pa, pb, out, m, n, k, ldc, 0, 1, alpha, beta);
  }

  void bmm(const tensor& a, const tensor& b, tensor& out) override {
    // One cuBLAS call for the batch when every matrix of an operand is laid
    // out alike (a batch stride and a row- or column-major matrix).
    const auto batch = a.size(0);
    const auto m = a.size(1);
    const auto k = a.size(2);
    const auto n = b.size(2);
    std::int64_t ldc = 1;
    if (batch == 0 || m == 0 || n == 0)
      return;
    if (k == 0 || !out.is_contiguous() || !row_major(m, n, {out.strides()[1], out.strides()[2]}, ldc)) {
      backend::bmm(a, b, out); // per-matrix gemm handles the rare layouts
      return;
    }
    auto pa = present_batched(a);
    auto pb = present_batched(b);
    on_device d("bmm", out, pa.data, pb.data);
    strided_gemm(d.queue(), pa, pb, out, m, n, k, ldc, out.strides()[0], batch, 1.0, 0.0);
  }

  // -- reductions ------------------------------------------------------------------------

  void reduce_rows(reduce_op op, const tensor& a, tensor& values, tensor& indices) override {
    on_device d("reduce_rows", values, a, indices);
    launch_reduce_rows(op == reduce_op::max, element_of(a), a.raw_data(), a.size(0), a.size(1), a.strides()[0],
                       a.strides()[1], values.raw_data(),
                       indices.defined() ? static_cast<std::int64_t*>(indices.raw_data()) : nullptr, d.stream());
  }

  void softmax(const tensor& a, bool log, tensor& out) override {
    on_device d("softmax", out, a);
    launch_softmax(element_of(a), a.raw_data(), a.size(0), a.size(1), log, out.raw_data(), d.stream());
  }

  void softmax_backward(const tensor& grad, const tensor& output, bool log, tensor& out) override {
    on_device d("softmax_backward", out, grad, output);
    launch_softmax_backward(element_of(grad), grad.raw_data(), output.raw_data(), grad.size(0), grad.size(1), log,
                            out.raw_data(), d.stream());
  }

  void causal_softmax(const tensor& a, std::int64_t queries, double scale, tensor& out) override {
    on_device d("causal_softmax", out, a);
    launch_causal_softmax(element_of(a), a.raw_data(), a.size(0), queries, a.size(1), scale, out.raw_data(),
                          d.stream());
  }

  void causal_softmax_backward(const tensor& grad, const tensor& output, std::int64_t queries, double scale,
                               tensor& out) override {
    on_device d("causal_softmax_backward", out, grad, output);
    launch_causal_softmax_backward(element_of(grad), grad.raw_data(), output.raw_data(), grad.size(0), queries,
                                   grad.size(1), scale, out.raw_data(), d.stream());
  }

  void cross_entropy(const tensor& logits, const tensor& targets, tensor& loss, tensor& log_sum_exp) override {
    on_device d("cross_entropy", loss, logits, targets, log_sum_exp);
    launch_cross_entropy(element_of(logits), logits.raw_data(), static_cast<const std::int64_t*>(targets.raw_data()),
                         targets.strides()[0], logits.size(0), logits.size(1), loss.raw_data(),
                         log_sum_exp.raw_data(), d.stream());
  }

  void cross_entropy_backward(const tensor& grad, const tensor& logits, const tensor& targets,
                              const tensor& log_sum_exp, tensor& out) override {
    on_device d("cross_entropy_backward", out, grad, logits, targets, log_sum_exp);
    launch_cross_entropy_backward(element_of(logits), grad.raw_data(), logits.raw_data(),
                                  static_cast<const std::int64_t*>(targets.raw_data()), targets.strides()[0],
                                  log_sum_exp.raw_data(), log_sum_exp.strides()[0], logits.size(0), logits.size(1),
                                  out.raw_data(), d.stream());
  }

  // -- indexing --------------------------------------------------------------------------

  void index_select(const tensor& a, std::int64_t dim, const tensor& index, tensor& out) override {
    on_device d("index_select", out, a, index);
    launch_indexed_read(space_of("index_select", out, false), operand_of(out), operand_of(a),
                        static_cast<const std::int64_t*>(index.raw_data()), along(dim, index).data(),
                        static_cast<int>(dim),
                        a.strides()[static_cast<std::size_t>(dim)], d.stream());
  }

  void gather(const tensor& a, std::int64_t dim, const tensor& index, tensor& out) override {
    on_device d("gather", out, a, index);
    launch_indexed_read(space_of("gather", out, false), operand_of(out), operand_of(a),
                        static_cast<const std::int64_t*>(index.raw_data()), operand_of(index).strides,
                        static_cast<int>(dim), a.strides()[static_cast<std::size_t>(dim)], d.stream());
  }

  void scatter_add_(tensor& out, std::int64_t dim, const tensor& index, const tensor& src) override {
    on_device d("scatter_add", out, index, src);
    auto lines = collapsed(space_of("scatter_add", index, false), dim);
    launch_indexed_accumulate(lines, index.size(dim), operand_of(out), operand_of(src),
                              static_cast<const std::int64_t*>(index.raw_data()), operand_of(index).strides,
                              static_cast<int>(dim), out.strides()[static_cast<std::size_t>(dim)], d.stream());
  }

  void index_add_(tensor& a, std::int64_t dim, const tensor& index, const tensor& src) override {
    on_device d("index_add_", a, index, src);
    auto lines = collapsed(space_of("index_add_", src, false), dim);
    launch_indexed_accumulate(lines, src.size(dim), operand_of(a), operand_of(src),
                              static_cast<const std::int64_t*>(index.raw_data()), along(dim, index).data(),
                              static_cast<int>(dim), a.strides()[static_cast<std::size_t>(dim)], d.stream());
  }

  void embedding_bag(const tensor& weight, const tensor& indices, const tensor& offsets, bool mean,
                     tensor& out) override {
    on_device d("embedding_bag", out, weight, indices, offsets);
    launch_embedding_bag(element_of(weight), weight.raw_data(), static_cast<const std::int64_t*>(indices.raw_data()),
                         indices.numel(), static_cast<const std::int64_t*>(offsets.raw_data()), offsets.numel(),
                         weight.size(1), mean, out.raw_data(), d.stream());
  }

  void embedding_bag_backward(const tensor& grad, const tensor& indices, const tensor& offsets, bool mean,
                              tensor& grad_weight) override {
    on_device d("embedding_bag_backward", grad_weight, grad, indices, offsets);
    launch_embedding_bag_backward(element_of(grad), grad.raw_data(),
                                  static_cast<const std::int64_t*>(indices.raw_data()), indices.numel(),
                                  static_cast<const std::int64_t*>(offsets.raw_data()), offsets.numel(),
                                  grad_weight.size(1), mean, grad_weight.raw_data(), d.stream());
  }

  // -- convolution, pooling, normalisation -------------------------------------------------

  void im2col(const tensor& image, const conv_geometry& g, tensor& cols) override {
    on_device d("im2col (conv2d)", cols, image);
    launch_im2col(element_of(image), image.raw_data(), image.strides().data(), shape_of(g), cols.raw_data(),
                  d.stream());
  }

  void col2im(const tensor& cols, const conv_geometry& g, tensor& image) override {
    on_device d("col2im (conv2d)", image, cols);
    launch_col2im(element_of(cols), cols.raw_data(), shape_of(g), image.raw_data(), d.stream());
  }

  // cuDNN where it runs the convolution (cudnn_convolution.hpp), else the
  // im2col, GEMM and col2im above, image by image.
  void conv2d(const tensor& input, const tensor& weight, const conv_geometry& g, tensor& out) override {
#ifdef TROUPE_HAVE_CUDNN
    {
      on_device d("conv2d", out, input, weight);
      if (cudnn_conv2d(d.queue(), input, weight, g, out))
        return;
    }
#endif
    backend::conv2d(input, weight, g, out);
  }

  void conv2d_backward(const tensor& grad, const tensor& input, const tensor& weight, const conv_geometry& g,
                       tensor& grad_input, tensor& grad_weight) override {
#ifdef TROUPE_HAVE_CUDNN
    {
      on_device d("conv2d_backward", grad_weight, grad, input, weight, grad_input); // grad_input may be undefined
      if (cudnn_conv2d_backward(d.queue(), grad, input, weight, g, grad_input, grad_weight))
        return;
    }
#endif
    backend::conv2d_backward(grad, input, weight, g, grad_input, grad_weight);
  }

  void max_pool2d(const tensor& input, std::int64_t kernel, std::int64_t stride, tensor& output,
                  tensor& indices) override {
    on_device d("max_pool2d", output, input, indices);
    launch_max_pool2d(element_of(input), input.raw_data(), input.size(0) * input.size(1), input.size(2),
                      input.size(3), kernel, stride, output.size(2), output.size(3), output.raw_data(),
                      static_cast<std::int64_t*>(indices.raw_data()), d.stream());
  }

  void max_pool2d_backward(const tensor& grad, const tensor& indices, tensor& grad_input) override {
    on_device d("max_pool2d_backward", grad_input, grad, indices);
    launch_max_pool2d_backward(element_of(grad), grad.raw_data(), static_cast<const std::int64_t*>(indices.raw_data()),
                               grad.size(0) * grad.size(1), grad.size(2) * grad.size(3),
                               grad_input.size(2) * grad_input.size(3), grad_input.raw_data(), d.stream());
  }

  void layer_norm(const tensor& input, const tensor& weight, const tensor& bias, double eps, tensor& output,
                  tensor& mean, tensor& rstd) override {
    on_device d("layer_norm", output, input, weight, bias, mean, rstd);
    const auto dim = input.size(-1);
    const auto rows = dim == 0 ? 0 : input.numel() / dim;
    launch_layer_norm(element_of(input), input.raw_data(), weight.defined() ? weight.raw_data() : nullptr,
                      bias.defined() ? bias.raw_data() : nullptr, rows, dim, eps, output.raw_data(), mean.raw_data(),
                      rstd.raw_data(), d.stream());
  }

  void layer_norm_backward(const tensor& grad, const tensor& input, const tensor& mean, const tensor& rstd,
                           const tensor& weight, tensor& grad_input, tensor& grad_weight,
                           tensor& grad_bias) override {
    on_device d("layer_norm_backward", grad_input, grad, input, mean, rstd, weight, grad_weight, grad_bias);
    const auto dim = input.size(-1);
    const auto rows = dim == 0 ? 0 : input.numel() / dim;
    launch_layer_norm_backward(element_of(input), grad.raw_data(), input.raw_data(), mean.raw_data(), rstd.raw_data(),
                               weight.defined() ? weight.raw_data() : nullptr, rows, dim, grad_input.raw_data(),
                               grad_weight.raw_data(), grad_bias.raw_data(), d.stream());
  }

  // -- random ----------------------------------------------------------------------------

  void fill_random(random_distribution what, const generator& gen, double a, double b, tensor& out) override {
    on_device d("fill_random", out);
    launch_fill_random(static_cast<distribution>(what), element_of(out), gen.seed, gen.offset, a, b, out.raw_data(),
                       out.numel(), d.stream());
  }

  // -- optimizer steps -------------------------------------------------------------------

  void adam_step(tensor& param, const tensor& grad, tensor& m, tensor& v, const adam_step_args& s) override {
    on_device d("adam_step", param, grad, m, v);
    launch_adam_step(element_of(param), param.raw_data(), grad.raw_data(), m.raw_data(), v.raw_data(),
                     param.numel(),
                     adam_scalars{s.beta1, s.beta2, s.eps, s.step_size, s.bias_correction2_sqrt, s.l2, s.decay},
                     d.stream());
  }

  void sgd_step(tensor& param, const tensor& grad, tensor& buffer, const sgd_step_args& s) override {
    on_device d("sgd_step", param, grad, buffer);
    launch_sgd_step(element_of(param), param.raw_data(), grad.raw_data(),
                    buffer.defined() ? buffer.raw_data() : nullptr, param.numel(),
                    sgd_scalars{s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov, s.first}, d.stream());
  }
};

} // namespace

backend& cuda_backend_instance() {
  static cuda_backend instance;
  return instance;
}

} // namespace troupe::detail
