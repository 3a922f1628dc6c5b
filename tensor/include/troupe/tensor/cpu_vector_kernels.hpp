#pragma once
// Which vector kernels the CPU backend's elementwise, softmax and layer-norm
// ops run: troupe builds them for AVX2 and for AVX-512 and picks one from
// the CPU's features when the process starts (TROUPE_VECTOR_MATH=avx2 keeps
// AVX2 on a CPU with AVX-512; TROUPE_VECTOR_MATH=off keeps the scalar
// loops). Benchmarks print it beside the OpenBLAS kernel.
#include <string_view>

namespace troupe {

/// "AVX-512", "AVX2" or "scalar".
std::string_view cpu_vector_kernels();

} // namespace troupe
