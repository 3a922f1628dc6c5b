// float32 GEMM through oneDNN's matmul primitive, for cpu_linalg.cpp, where
// it beats OpenBLAS: on a CPU with oneDNN's AVX-512 kernels
// (brg:avx512_core), at the shapes of a small transformer's linear layers,
// forward and backward (docs/design.md gives the figures).
// Elsewhere, and for float64, OpenBLAS runs.
#pragma once

#include <cstdint>

namespace troupe::detail {

/// C[m, n] = alpha op(A) op(B) + beta C, all row-major with the given
/// leading dimensions (op transposes where asked). Returns false, having
/// done nothing, where OpenBLAS is to run instead: a CPU without oneDNN's
/// AVX-512 kernels, a product of fewer than 2^19 or more than 2^30
/// multiply-adds (outside the window where it was measured faster), or
/// TROUPE_GEMM=openblas in
/// the environment (read once), which keeps every product on OpenBLAS.
bool onednn_sgemm(bool a_transposed, bool b_transposed, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc);

} // namespace troupe::detail
