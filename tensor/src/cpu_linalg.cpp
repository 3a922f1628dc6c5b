// CPU GEMM through OpenBLAS (loaded as openblas.hpp says), or for float32
// through oneDNN where cpu_onednn_matmul.hpp says it is faster. A 2-D view is
// handed to BLAS as it lies in memory: row-major (strides [ld, 1]) as NoTrans, column-major (strides
// [1, ld], e.g. a transposed view) as Trans. Only a layout that is neither
// (a broadcast, a doubly strided slice) is copied first.
#include <algorithm>

#include "blas_layout.hpp"
#include "cpu_onednn_matmul.hpp"
#include "cpu_backend.hpp"
#include "dispatch.hpp"
#include "openblas.hpp"

namespace troupe::detail {

namespace {

/// How a [rows, cols] operand is presented to BLAS.
struct blas_operand {
  tensor data; // the operand itself, or a contiguous copy
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  blasint ld = 1;
};

blas_operand present(const tensor& t) {
  const auto rows = t.size(0);
  const auto cols = t.size(1);
  std::int64_t ld = 1;
  if (row_major(rows, cols, t.strides(), ld))
    return {t, CblasNoTrans, static_cast<blasint>(ld)};
  // Column-major is row-major of the transpose: swap the roles of the dims.
  if (row_major(cols, rows, {t.strides()[1], t.strides()[0]}, ld))
    return {t, CblasTrans, static_cast<blasint>(ld)};
  auto copy = t.contiguous();
  return {copy, CblasNoTrans, static_cast<blasint>(std::max<std::int64_t>(cols, 1))};
}

} // namespace

void cpu_backend::gemm(const tensor& a, const tensor& b, tensor& out, double alpha, double beta) {
  const auto m = a.size(0);
  const auto k = a.size(1);
  const auto n = b.size(1);
  if (m == 0 || n == 0)
    return;
  // The result must be row-major for BLAS; otherwise compute into a
  // temporary (carrying out's old values when beta reads them) and copy back.
  std::int64_t ldc = 1;
  if (!row_major(m, n, out.strides(), ldc)) {
    auto temp = beta == 0.0 ? tensor::empty(out.shape(), out.type()) : out.clone();
    gemm(a, b, temp, alpha, beta);
    out.copy_from(temp);
    return;
  }
  if (k == 0) {
    // BLAS would scale C by beta; do it here so beta == 0 clears NaNs too.
    if (beta == 0.0)
      out.fill(0.0);
    else
      unary(unary_op::mul_scalar, out, beta, out);
    return;
  }
  auto pa = present(a);
  auto pb = present(b);
  dispatch_floating(out.type(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) {
      if (onednn_sgemm(pa.trans == CblasTrans, pb.trans == CblasTrans, m, n, k, static_cast<float>(alpha),
                       pa.data.template data<float>(), pa.ld, pb.data.template data<float>(), pb.ld,
                       static_cast<float>(beta), out.template data<float>(), ldc))
        return;
      openblas().sgemm(CblasRowMajor, pa.trans, pb.trans, static_cast<blasint>(m),
                  static_cast<blasint>(n), static_cast<blasint>(k), static_cast<float>(alpha),
                  pa.data.template data<float>(), pa.ld, pb.data.template data<float>(), pb.ld,
                  static_cast<float>(beta), out.template data<float>(), static_cast<blasint>(ldc));
    } else {
      openblas().dgemm(CblasRowMajor, pa.trans, pb.trans, static_cast<blasint>(m),
                  static_cast<blasint>(n), static_cast<blasint>(k), alpha,
                  pa.data.template data<double>(), pa.ld, pb.data.template data<double>(), pb.ld,
                  beta, out.template data<double>(), static_cast<blasint>(ldc));
    }
  });
}

} // namespace troupe::detail
