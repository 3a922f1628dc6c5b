#pragma once
// Private: the cuBLAS functions the CUDA backend calls, opened on first use.
// Linking cuBLAS costs every process about 210 MB of resident memory and
// 0.18 s at start (libcublasLt initialises itself when loaded), whether or
// not it ever touches a GPU; a CPU-only rank of a job built with CUDA paid
// it too. So the library is opened with dlopen when the first CUDA context
// makes its handle, like OpenBLAS (openblas.hpp).
#include <cublas_v2.h>

namespace troupe::detail::cuda {

struct cublas_library {
  decltype(&::cublasCreate_v2) create;
  decltype(&::cublasDestroy_v2) destroy;
  decltype(&::cublasSetStream_v2) set_stream;
  decltype(&::cublasSgemmStridedBatched) sgemm_strided_batched;
  decltype(&::cublasDgemmStridedBatched) dgemm_strided_batched;
  decltype(&::cublasGetStatusString) status_string;

  /// Opens libcublas.so.<major> (this build's) once; throws cuda_error
  /// naming the library or the missing function.
  static const cublas_library& get();
  /// Whether this process has loaded cuBLAS (by get() or by any other
  /// library); tests check that a CPU-only program never does.
  static bool loaded();
};

} // namespace troupe::detail::cuda
