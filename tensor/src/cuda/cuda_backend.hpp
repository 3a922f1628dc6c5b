#pragma once
// Private: the CUDA backend, registered for device_kind::cuda by
// backend.cpp in builds with TROUPE_HAVE_CUDA.
//
// Implemented: device memory (stream-ordered), transfers to and from the
// CPU and between devices, fill, copy with dtype conversion, every unary and
// binary elementwise function, axpy, where, and GEMM (and so bmm) through
// cuBLAS. Every other kernel throws usage_error "<op>: not implemented by
// the cuda backend ..." — never a silently wrong result.
#include "troupe/tensor/backend.hpp"

namespace troupe::detail {

/// The process-wide instance. Constructing it touches no CUDA API.
backend& cuda_backend_instance();

} // namespace troupe::detail
