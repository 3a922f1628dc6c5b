#pragma once
// Private: RAII owners of the CUDA handles the backend uses, and the
// per-device context (one stream, one cuBLAS handle) every kernel of that
// device runs on.
//
// Thread model. Any thread may run ops on any device: every entry point
// makes its device current with a device_guard and restores the caller's.
// All work of a device goes, in order, onto its context's stream, so a
// kernel always sees the results of the ones queued before it and memory
// allocated and freed stream-ordered (cudaMallocAsync/cudaFreeAsync) is
// never reused while in flight. Transfers to and from other devices
// synchronise that stream before they return.
#include <cstddef>
#include <mutex>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda_check.hpp"
#include "troupe/tensor/device.hpp"

namespace troupe::detail::cuda {

/// Throws cuda_error naming a failed cuBLAS call and cublasGetStatusString.
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
#define TROUPE_CUBLAS_CHECK(call) ::troupe::detail::cuda::check_cublas((call), #call, __FILE__, __LINE__)

/// Makes `ordinal` the calling thread's current device for its lifetime,
/// then restores the previous one.
class device_guard {
public:
  explicit device_guard(int ordinal);
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

private:
  int previous_ = -1;
};

/// A non-blocking stream (it does not synchronise with the legacy default
/// stream) on the current device.
class cuda_stream {
public:
  cuda_stream();
  ~cuda_stream();
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  cudaStream_t get() const noexcept { return stream_; }
  /// Waits for all queued work; throws cuda_error when it failed.
  void synchronize() const;

private:
  cudaStream_t stream_ = nullptr;
};

/// A cuBLAS handle on the current device, issuing its work to `stream`.
class cublas_handle {
public:
  explicit cublas_handle(cudaStream_t stream);
  ~cublas_handle();
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  cublasHandle_t get() const noexcept { return handle_; }

private:
  cublasHandle_t handle_ = nullptr;
};

/// Everything the backend keeps per device. Created on first use of the
/// device and never destroyed: tensors in static objects may be freed
/// after main returns, and their deleters still need the stream.
struct device_context {
  explicit device_context(int device_ordinal);

  int ordinal;
  cuda_stream stream;
  cublas_handle blas;
  /// cuBLAS handles must not be used by two threads at once.
  std::mutex blas_mutex;
  /// Whether the device has memory pools (cudaMallocAsync); else plain
  /// cudaMalloc/cudaFree.
  bool stream_ordered_allocation = false;
};

/// Why `where` cannot be used ("" when it can): no driver or device (the
/// runtime's answer), or an ordinal beyond this machine's devices.
std::string unavailable_reason(device where);

/// The context of `where`; throws usage_error "<op>: device cuda:3 is not
/// available: ..." when `where` is not a CUDA device this process can use.
device_context& context_for(device where, const char* op);

/// Owns `bytes` of memory on a context's device, allocated and freed in
/// that device's stream order.
class device_memory {
public:
  device_memory(std::size_t bytes, device_context& context);
  ~device_memory();
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
  void* data() const noexcept { return data_; }

private:
  void* data_ = nullptr;
  device_context& context_;
};

} // namespace troupe::detail::cuda
