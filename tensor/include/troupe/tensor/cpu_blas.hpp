#pragma once
// Which OpenBLAS kernel the CPU backend's GEMM runs. troupe loads OpenBLAS
// itself and names the kernel from the CPU's features (tensor/src/openblas.hpp
// says why: OpenBLAS 0.3.21 runs its slowest kernel on CPUs newer than
// itself). Setting OPENBLAS_CORETYPE before the process starts overrides the
// choice. Benchmarks print the kernel and pass it to their peers (PyTorch
// uses the same OpenBLAS), and print what runs troupe's float32 GEMM.
#include <string_view>

namespace troupe {

/// The kernel OpenBLAS is running in this process ("Cooperlake",
/// "SkylakeX", "Haswell", ...).
std::string_view blas_kernel();

/// The OPENBLAS_CORETYPE troupe chooses for this CPU when the user set none:
/// the newest kernel whose instructions the CPU has; empty when none of the
/// known ones applies (OpenBLAS then decides).
std::string_view blas_kernel_for_this_cpu();

/// What runs float32 GEMM in this process, for benchmarks to print beside
/// their peers' figures: oneDNN's matmul for products of 2^19 to 2^30
/// multiply-adds on a CPU where oneDNN runs AVX-512 (faster there than
/// OpenBLAS; TROUPE_GEMM=openblas turns it off), OpenBLAS otherwise.
std::string_view float32_gemm();

} // namespace troupe
