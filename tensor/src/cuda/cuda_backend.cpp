// The CUDA backend (cuda_backend.hpp): turns tensors into kernel launches on
// the device's stream (cuda_kernels.cu) and GEMMs into cuBLAS calls.
#include "cuda_backend.hpp"

#include <climits>

#include <fmt/format.h>

#include "../blas_layout.hpp"
#include "cuda_context.hpp"
#include "cuda_kernels.hpp"
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
TROUPE_SAME_VALUE(element::float32, dtype::float32);
TROUPE_SAME_VALUE(element::float64, dtype::float64);
TROUPE_SAME_VALUE(element::int64, dtype::int64);
TROUPE_SAME_VALUE(element::int32, dtype::int32);
TROUPE_SAME_VALUE(element::uint8, dtype::uint8);
TROUPE_SAME_VALUE(element::bfloat16, dtype::bfloat16);
#undef TROUPE_SAME_VALUE

[[noreturn]] void not_implemented(const char* op) {
  throw usage_error(fmt::format("{}: not implemented by the cuda backend (compute it on the CPU: "
                                "t.to(device::cpu()))",
                                op));
}

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

/// The context of out's device, made current for the guard's lifetime.
struct on_device {
  device_context& context;
  device_guard guard;
  on_device(const tensor& t, const char* op) : context(context_for(t.where(), op)), guard(context.ordinal) {}
  cudaStream_t stream() const { return context.stream.get(); }
};

// -- GEMM -------------------------------------------------------------------------------
//
// cuBLAS is column-major. A row-major [rows, cols] matrix with leading
// dimension ld is, read column-major, its transpose; so C = A B (row-major)
// is computed as C^T = B^T A^T with the operands passed in swapped order —
// no copies. As on the CPU, a column-major view (a transposed tensor) is
// passed with the transpose flag, and only a layout that is neither is copied.

struct blas_operand {
  tensor data;
  cublasOperation_t op = CUBLAS_OP_N;
  std::int64_t ld = 1;
};

blas_operand present(const tensor& t) {
  const auto rows = t.size(0);
  const auto cols = t.size(1);
  std::int64_t ld = 1;
  if (row_major(rows, cols, t.strides(), ld))
    return {t, CUBLAS_OP_N, ld};
  if (row_major(cols, rows, {t.strides()[1], t.strides()[0]}, ld))
    return {t, CUBLAS_OP_T, ld};
  return {t.contiguous(), CUBLAS_OP_N, std::max<std::int64_t>(cols, 1)};
}

int blas_int(std::int64_t value, const char* what) {
  require(value <= INT_MAX, "matmul: {} {} exceeds cuBLAS's 32-bit limit on cuda", what, value);
  return static_cast<int>(value);
}

class cuda_backend final : public backend {
public:
  std::string_view name() const override { return "cuda"; }

  // -- memory and copies ------------------------------------------------------------

  std::shared_ptr<storage> allocate(std::size_t bytes, device where) override {
    auto& context = context_for(where, "storage::allocate");
    auto memory = std::make_shared<device_memory>(bytes, context);
    void* data = memory->data();
    return storage::wrap(data, bytes, where, [memory](void*) mutable { memory.reset(); });
  }

  void fill(tensor& out, double value) override {
    on_device d(out, "fill");
    launch_fill(space_of("fill", out, out.is_contiguous()), operand_of(out), value, d.stream());
  }

  void copy(const tensor& source, tensor& out) override {
    on_device d(out, "copy_from");
    launch_copy(space_of("copy_from", out, out.is_contiguous() && source.is_contiguous()), operand_of(out),
                operand_of(source), d.stream());
  }

  void transfer(const tensor& source, tensor& out) override {
    const auto bytes = source.nbytes();
    const auto from = source.where();
    const auto to = out.where();
    if (from.kind == device_kind::cpu) {
      // Synchronous: the caller may free the host memory when we return.
      on_device d(out, "to");
      TROUPE_CUDA_CHECK(
        cudaMemcpyAsync(out.raw_data(), source.raw_data(), bytes, cudaMemcpyHostToDevice, d.stream()));
      d.context.stream.synchronize();
      return;
    }
    if (to.kind == device_kind::cpu) {
      // In stream order after the kernels that wrote `source`.
      on_device d(source, "to");
      TROUPE_CUDA_CHECK(
        cudaMemcpyAsync(out.raw_data(), source.raw_data(), bytes, cudaMemcpyDeviceToHost, d.stream()));
      d.context.stream.synchronize();
      return;
    }
    // Device to device: the source's work must be done, the copy then runs
    // in the destination's stream order.
    auto& source_context = context_for(from, "to");
    {
      device_guard guard(source_context.ordinal);
      source_context.stream.synchronize();
    }
    on_device d(out, "to");
    TROUPE_CUDA_CHECK(
      cudaMemcpyPeerAsync(out.raw_data(), to.index, source.raw_data(), from.index, bytes, d.stream()));
    d.context.stream.synchronize();
  }

  // -- elementwise --------------------------------------------------------------------

  void unary(unary_op op, const tensor& a, double scalar, tensor& out) override {
    on_device d(out, "unary");
    launch_unary(static_cast<unary_kernel>(op), space_of("unary", out, a.is_contiguous() && out.is_contiguous()),
                 operand_of(out), operand_of(a), scalar, d.stream());
  }

  void binary(binary_op op, const tensor& a, const tensor& b, tensor& out) override {
    on_device d(out, "binary");
    const bool contiguous = a.is_contiguous() && b.is_contiguous() && out.is_contiguous();
    launch_binary(static_cast<binary_kernel>(op), space_of("binary", out, contiguous), operand_of(out),
                  operand_of(a), operand_of(b), d.stream());
  }

  void axpy(tensor& a, const tensor& b, double alpha) override {
    on_device d(a, "add_");
    launch_axpy(space_of("add_", a, a.is_contiguous() && b.is_contiguous()), operand_of(a), operand_of(b),
                alpha, d.stream());
  }

  void where(const tensor& cond, const tensor& a, const tensor& b, tensor& out) override {
    on_device d(out, "where");
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
    on_device d(out, "matmul");
    std::lock_guard lock(d.context.blas_mutex);
    auto handle = d.context.blas.get();
    // C^T [n, m] = op(B)^T-side [n, k] x op(A)^T-side [k, m], column-major.
    const int cm = blas_int(n, "dimension");
    const int cn = blas_int(m, "dimension");
    const int ck = blas_int(k, "dimension");
    const int lda = blas_int(pb.ld, "leading dimension");
    const int ldb = blas_int(pa.ld, "leading dimension");
    const int ldc_ = blas_int(ldc, "leading dimension");
    if (out.type() == dtype::float32) {
      const float fa = static_cast<float>(alpha);
      const float fb = static_cast<float>(beta);
      TROUPE_CUBLAS_CHECK(cublasSgemm(handle, pb.op, pa.op, cm, cn, ck, &fa,
                                      static_cast<const float*>(pb.data.raw_data()), lda,
                                      static_cast<const float*>(pa.data.raw_data()), ldb, &fb,
                                      static_cast<float*>(out.raw_data()), ldc_));
    } else {
      TROUPE_CUBLAS_CHECK(cublasDgemm(handle, pb.op, pa.op, cm, cn, ck, &alpha,
                                      static_cast<const double*>(pb.data.raw_data()), lda,
                                      static_cast<const double*>(pa.data.raw_data()), ldb, &beta,
                                      static_cast<double*>(out.raw_data()), ldc_));
    }
  }

  // -- not implemented on CUDA yet: a clear error, never a wrong result ---------------------

  void reduce_rows(reduce_op, const tensor&, tensor&, tensor&) override { not_implemented("reduce_rows (sum, mean, max)"); }
  void softmax(const tensor&, bool, tensor&) override { not_implemented("softmax"); }
  void softmax_backward(const tensor&, const tensor&, bool, tensor&) override {
    not_implemented("softmax_backward");
  }
  void index_select(const tensor&, std::int64_t, const tensor&, tensor&) override {
    not_implemented("index_select");
  }
  void gather(const tensor&, std::int64_t, const tensor&, tensor&) override { not_implemented("gather"); }
  void scatter_add_(tensor&, std::int64_t, const tensor&, const tensor&) override {
    not_implemented("scatter_add");
  }
  void index_add_(tensor&, std::int64_t, const tensor&, const tensor&) override { not_implemented("index_add_"); }
  void embedding_bag(const tensor&, const tensor&, const tensor&, bool, tensor&) override {
    not_implemented("embedding_bag");
  }
  void embedding_bag_backward(const tensor&, const tensor&, const tensor&, bool, tensor&) override {
    not_implemented("embedding_bag_backward");
  }
  void im2col(const tensor&, const conv_geometry&, tensor&) override { not_implemented("im2col (conv2d)"); }
  void col2im(const tensor&, const conv_geometry&, tensor&) override { not_implemented("col2im (conv2d)"); }
  void max_pool2d(const tensor&, std::int64_t, std::int64_t, tensor&, tensor&) override {
    not_implemented("max_pool2d");
  }
  void max_pool2d_backward(const tensor&, const tensor&, tensor&) override {
    not_implemented("max_pool2d_backward");
  }
  void layer_norm(const tensor&, const tensor&, const tensor&, double, tensor&, tensor&, tensor&) override {
    not_implemented("layer_norm");
  }
  void layer_norm_backward(const tensor&, const tensor&, const tensor&, const tensor&, const tensor&, tensor&,
                           tensor&, tensor&) override {
    not_implemented("layer_norm_backward");
  }
  void fill_random(random_distribution, const generator&, double, double, tensor&) override {
    not_implemented("fill_random (rand, randn, randint, dropout_mask)");
  }
};

} // namespace

backend& cuda_backend_instance() {
  static cuda_backend instance;
  return instance;
}

} // namespace troupe::detail
