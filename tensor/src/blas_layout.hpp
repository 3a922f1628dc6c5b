#pragma once
// How a 2-D strided view presents itself to a BLAS (OpenBLAS on the CPU,
// cuBLAS on CUDA): shared by both backends' GEMM.
#include <algorithm>
#include <cstdint>

#include "troupe/tensor/fwd.hpp"

namespace troupe::detail {

/// Row-major view with leading dimension ld, if the layout allows one.
/// Dimensions of size 1 never constrain their stride.
inline bool row_major(std::int64_t rows, std::int64_t cols, const dims& strides, std::int64_t& ld) {
  if (cols > 1 && strides[1] != 1)
    return false;
  const auto min_ld = std::max<std::int64_t>(cols, 1);
  if (rows > 1 && strides[0] < min_ld)
    return false;
  ld = rows > 1 ? strides[0] : min_ld;
  return true;
}

} // namespace troupe::detail
