#include "cpu_small_gemm.hpp"

#include <type_traits>

#include <libxsmm.h>

#include "openblas.hpp"

namespace troupe::detail {

// LIBXSMM is column-major. A row-major [r, c] with leading dimension ld is
// the column-major [c, r] with the same ld, so C = op(A) B row-major is
// C^T = B^T op(A)^T column-major: the kernel's first operand is B (never
// transposed) and its second is A, transposed in the kernel exactly when A
// is here.
template <class T>
small_gemm<T>::small_gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, bool a_transposed,
                          std::int64_t ldb, std::int64_t ldc)
    : m_(m), n_(n), k_(k), lda_(lda), ldb_(ldb), ldc_(ldc), a_transposed_(a_transposed) {
  if constexpr (std::is_same_v<T, float>) {
    const auto bi = [](std::int64_t v) { return static_cast<libxsmm_blasint>(v); };
    const libxsmm_blasint first_ld = bi(ldb), second_ld = bi(lda), out_ld = bi(ldc);
    const float alpha = 1.0f, beta = 0.0f;
    const int flags = a_transposed ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
    kernel_ = libxsmm_smmdispatch(bi(n), bi(m), bi(k), &first_ld, &second_ld, &out_ld, &alpha, &beta, &flags,
                                  nullptr);
  }
}

template <class T> void small_gemm<T>::operator()(const T* a, const T* b, T* c) const {
  if constexpr (std::is_same_v<T, float>) {
    if (kernel_ != nullptr) {
      kernel_(b, a, c);
      return;
    }
  }
  const auto ta = a_transposed_ ? CblasTrans : CblasNoTrans;
  const auto bi = [](std::int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>)
    openblas().sgemm(CblasRowMajor, ta, CblasNoTrans, bi(m_), bi(n_), bi(k_), 1.0f, a, bi(lda_), b, bi(ldb_), 0.0f,
                     c, bi(ldc_));
  else
    openblas().dgemm(CblasRowMajor, ta, CblasNoTrans, bi(m_), bi(n_), bi(k_), 1.0, a, bi(lda_), b, bi(ldb_), 0.0, c,
                     bi(ldc_));
}

template <class T> void transpose_small(const T* in, std::int64_t ld, std::int64_t rows, std::int64_t cols, T* out) {
  // Column-major, in is [cols, rows] and out [rows, cols].
  libxsmm_otrans(out, in, sizeof(T), static_cast<libxsmm_blasint>(cols), static_cast<libxsmm_blasint>(rows),
                 static_cast<libxsmm_blasint>(ld), static_cast<libxsmm_blasint>(rows));
}

template void transpose_small(const float*, std::int64_t, std::int64_t, std::int64_t, float*);
template void transpose_small(const double*, std::int64_t, std::int64_t, std::int64_t, double*);
template class small_gemm<float>;
template class small_gemm<double>;

} // namespace troupe::detail
