#pragma once
// Stands in for cuBLAS's header where the CUDA backend is built to run on
// the host (cuda_runtime_api.h says how): the types and the functions that
// tensor/src/cuda/cublas_library.hpp opens, implemented by
// cublas_on_host.cpp in a library of its own that the backend opens by
// path, as it opens cuBLAS.
#include "cuda_runtime_api.h"

// Makes the backend's first choice, the soname libcublas.so.<major>, one
// that no machine has (the real cuBLAS may be installed beside), so that it
// opens the stand-in by the path its build gives.
#define CUBLAS_VER_MAJOR on_host

// The real library's values.
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
};

enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };

struct cublasContext;
using cublasHandle_t = cublasContext*;

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
const char* cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* a, int lda,
                                         long long stride_a, const float* b, int ldb, long long stride_b,
                                         const float* beta, float* c, int ldc, long long stride_c, int batch);
cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const double* alpha, const double* a, int lda,
                                         long long stride_a, const double* b, int ldb, long long stride_b,
                                         const double* beta, double* c, int ldc, long long stride_c, int batch);
}
