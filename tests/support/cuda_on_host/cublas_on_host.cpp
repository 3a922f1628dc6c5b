// The stand-in cuBLAS (cublas_v2.h): handles that issue to a stream of the
// stand-in runtime, and batched GEMM queued there as OpenBLAS's, matrix by
// matrix (the backend's tests keep a stream busy with 2048-wide products).
// Column major, as cuBLAS; the arguments cuBLAS checks are checked, so that
// a leading dimension the backend got wrong is an error here as on a GPU,
// and each matrix batch must lie within one block of the handle's
// device's memory, where a GPU would read past its buffer.
#include "cublas_v2.h"

#include <cblas.h>

#include <algorithm>

struct cublasContext {
  int device = 0; // current when it was made: the handle works only there
  cudaStream_t stream = nullptr;
};

namespace {

CBLAS_TRANSPOSE transpose_of(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
}

// With beta zero, C is not read (BLAS's rule, and cuBLAS's): it may hold
// anything, the 0xff bytes of fresh device memory included.
void product(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a, int lda,
             const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void product(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a, int lda,
             const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// Whether the `batch` matrices of `rows` x `cols` (leading dimension `ld`,
/// `stride` apart) from `first` lie in one block of `device`'s memory.
template <class T>
bool within_device_block(const T* first, int rows, int cols, int ld, long long stride, int batch, int device) {
  if (rows == 0 || cols == 0 || batch == 0)
    return true;
  const long long last = (batch - 1LL) * stride + (cols - 1LL) * ld + (rows - 1LL);
  return cuda_on_host::device_memory_holds(device, first, static_cast<std::size_t>(last + 1) * sizeof(T));
}

template <class T>
cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                    const T* alpha, const T* a, int lda, long long stride_a, const T* b, int ldb, long long stride_b,
                    const T* beta, T* c, int ldc, long long stride_c, int batch) {
  if (handle == nullptr)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool a_plain = transa == CUBLAS_OP_N;
  const bool b_plain = transb == CUBLAS_OP_N;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_plain ? m : k) ||
      ldb < std::max(1, b_plain ? k : n) || ldc < std::max(1, m) || transa == CUBLAS_OP_C || transb == CUBLAS_OP_C)
    return CUBLAS_STATUS_INVALID_VALUE;
  // alpha and beta are read now (host pointer mode); the matrices when the
  // stream runs the product.
  const T scale = *alpha;
  const T keep = *beta;
  // Its kernels go to the handle's stream: a launch on a stream of another
  // device than the current one fails, as does a handle used on another
  // device than its own, or matrices in another device's memory.
  if (!cuda_on_host::may_launch_on(handle->stream) || cuda_on_host::device_of(handle->stream) != handle->device ||
      !cuda_on_host::may_access_from(handle->stream, {a, b, c}))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!within_device_block(a, a_plain ? m : k, a_plain ? k : m, lda, stride_a, batch, handle->device) ||
      !within_device_block(b, b_plain ? k : n, b_plain ? n : k, ldb, stride_b, batch, handle->device) ||
      !within_device_block(c, m, n, ldc, stride_c, batch, handle->device))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  cuda_on_host::enqueue(handle->stream, [=] {
    if (m == 0 || n == 0)
      return;
    for (int i = 0; i < batch; ++i)
      product(transpose_of(transa), transpose_of(transb), m, n, k, scale, a + i * stride_a, lda, b + i * stride_b,
              ldb, keep, c + i * stride_c, ldc);
  });
  return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  if (cudaGetDevice(&(*handle)->device) != cudaSuccess)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS:
    return "the operation completed successfully";
  case CUBLAS_STATUS_NOT_INITIALIZED:
    return "the library was not initialized";
  case CUBLAS_STATUS_ALLOC_FAILED:
    return "the resource allocation failed";
  case CUBLAS_STATUS_INVALID_VALUE:
    return "an invalid numeric value was used as an argument";
  case CUBLAS_STATUS_EXECUTION_FAILED:
    return "the GPU program failed to execute";
  }
  return "unknown error";
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* a, int lda,
                                         long long stride_a, const float* b, int ldb, long long stride_b,
                                         const float* beta, float* c, int ldc, long long stride_c, int batch) {
  return gemm(handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
              batch);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const double* alpha, const double* a, int lda,
                                         long long stride_a, const double* b, int ldb, long long stride_b,
                                         const double* beta, double* c, int ldc, long long stride_c, int batch) {
  return gemm(handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
              batch);
}
}
