// The small products of attention's heads (a block of 32 query rows times a
// head of 32 columns, keys up to the sequence): row-major C = op(A) B with
// one shape called thousands of times per op.
//
// Why not OpenBLAS for these. Each cblas_sgemm call goes through argument
// checks, a choice of kernel and, above its small-matrix limit, packing of
// both operands; at these sizes that costs as much as the multiply-adds.
// LIBXSMM (libxsmm-dev) generates a kernel for one shape once, with the
// leading dimensions built in, and a call is a jump into it. float32 only:
// LIBXSMM's generator does no double, so float64 (the gradient checks) stays
// with OpenBLAS, as does any shape LIBXSMM declines.
#pragma once

#include <cstdint>

namespace troupe::detail {

/// C[m, n] = op(A) B with beta 0, all row-major; op(A) is A [m, k] or, when
/// `a_transposed`, A stored as [k, m]. B is never transposed: LIBXSMM's
/// kernels cannot transpose the operand that B becomes in their
/// column-major terms.
template <class T> class small_gemm {
public:
  small_gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, bool a_transposed, std::int64_t ldb,
             std::int64_t ldc);

  void operator()(const T* a, const T* b, T* c) const;

  /// Whether a generated kernel runs this shape (false: OpenBLAS does).
  bool generated() const { return kernel_ != nullptr; }

private:
  std::int64_t m_, n_, k_, lda_, ldb_, ldc_;
  bool a_transposed_;
  /// LIBXSMM's kernel type (libxsmm_smmfunction), null where OpenBLAS runs.
  void (*kernel_)(const float*, const float*, float*, ...) = nullptr;
};

/// out [cols, rows] (leading dimension rows) = the transpose of the
/// row-major [rows, cols] at `in` with leading dimension ld.
template <class T> void transpose_small(const T* in, std::int64_t ld, std::int64_t rows, std::int64_t cols, T* out);

extern template class small_gemm<float>;
extern template class small_gemm<double>;

} // namespace troupe::detail
