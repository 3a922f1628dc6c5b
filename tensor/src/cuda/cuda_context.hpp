#pragma once
// Private: RAII owners of the CUDA handles the backend uses, the per-device
// context, and the per-thread streams every kernel runs on.
//
// Thread model. Any thread may run ops on any device: every entry point
// makes its device current with a device_guard and restores the caller's.
// Each thread queues its work on a device onto a stream of its own, with a
// cuBLAS handle of its own (execution_stream), so actors on one GPU — a
// stage, a reducer, the router staging tensors to the host — overlap instead
// of queueing behind each other, and no handle is shared between threads.
//
// A tensor handed from one thread to another (a message between actors)
// carries no event: the memory keeps, in its memory_state, the stream that
// used it last. An op on another stream first makes its stream wait for
// that one (an event), then becomes the last user; the memory is freed on
// its last user's stream. So a kernel always sees the writes queued before
// it by any thread that handed the tensor on, and memory allocated and freed
// stream-ordered (cudaMallocAsync/cudaFreeAsync) is never reused while a
// kernel of any stream may still read it. Streams are pooled and never
// destroyed, because memory may name them after their thread has ended.
//
// Copies between the host and a device run on a second stream of the
// thread's. One to the device goes into memory allocated in that stream's
// order: the copy is then the memory's last user, so the DMA starts at
// once instead of queueing behind the kernels the thread queued before,
// and the first kernel that reads the tensor waits for the copy alone (the
// event of the rule above). A stage thus receives its next micro-batch
// while it still computes on the last one.
#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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

/// An event (without timing) of the current device.
class cuda_event {
public:
  cuda_event();
  ~cuda_event();
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  cudaEvent_t get() const noexcept { return event_; }

private:
  cudaEvent_t event_ = nullptr;
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

/// Pinned host memory that host-to-device copies go through, so that they
/// return without waiting for the DMA: the caller's bytes are copied into a
/// slot at once (the caller may free them), the DMA out of the slot is
/// queued, and a slot is refilled only after its last DMA ran (an event per
/// slot). A copy larger than a slot goes through the slots in turn, so the
/// host fills one while the device reads another; the call returns once the
/// last piece is staged. Without it a copy from pageable memory returns
/// only once its DMA has run.
class host_staging {
public:
  static constexpr std::size_t slot_bytes = std::size_t{4} << 20;
  static constexpr std::size_t slot_count = 4;

  host_staging() = default;
  ~host_staging();
  host_staging(const host_staging&) = delete;
  host_staging& operator=(const host_staging&) = delete;

  /// Queues the copy of `bytes` from `source` to `destination` on `stream`;
  /// false when no pinned memory could be had (the caller copies another
  /// way).
  bool copy_to_device(void* destination, const void* source, std::size_t bytes, cudaStream_t stream);

private:
  void* pinned_ = nullptr;
  bool unavailable_ = false;
  std::array<cuda_event, slot_count> drained_; // an event never recorded counts as done
  std::size_t next_ = 0;
};

/// A stream with the cuBLAS handle that issues to it, the stream of copies
/// between the host and the device, and the pinned staging of copies to
/// the device: what one thread uses for its work on one device.
struct execution_stream {
  cuda_stream stream;
  cublas_handle blas{stream.get()};
  cuda_stream copies;
  host_staging staging;
  /// Recorded anew for each ordering of one of these streams after
  /// another thread's (order_after): one event per thread and device
  /// rather than one made and destroyed each time.
  cuda_event ordering;
  /// The cuDNN handle issuing to `stream`, made by the stream's first
  /// convolution (cudnn_convolution.cpp); held without its type so that
  /// this header needs no cuDNN.
  std::shared_ptr<void> dnn;
};

/// Everything the backend keeps per device. Created on first use of the
/// device and never destroyed: tensors in static objects may be freed
/// after main returns, and their deleters still need the streams.
class device_context {
public:
  explicit device_context(int device_ordinal);

  int ordinal() const noexcept { return ordinal_; }
  /// Whether the device has memory pools (cudaMallocAsync); else plain
  /// cudaMalloc/cudaFree.
  bool stream_ordered_allocation() const noexcept { return stream_ordered_allocation_; }

  /// The calling thread's stream on this device: taken from the pool on
  /// its first use, given back when the thread ends. Call with the device
  /// current.
  execution_stream& this_thread();
  /// Returns a stream to the pool (when its thread ends).
  void give_back(execution_stream* stream);

private:
  int ordinal_;
  bool stream_ordered_allocation_ = false;
  std::mutex pool_mutex_;
  std::vector<std::unique_ptr<execution_stream>> streams_;
  std::vector<execution_stream*> idle_;
};

/// Why `where` cannot be used ("" when it can): no driver or device (the
/// runtime's answer), or an ordinal beyond this machine's devices.
std::string unavailable_reason(device where);

/// The context of `where`; throws usage_error "<op>: device cuda:3 is not
/// available: ..." when `where` is not a CUDA device this process can use.
device_context& context_for(device where, const char* op);

/// Makes `waiter` wait (on the device, not the host) for everything queued
/// on `producer` so far, through `event` (of their device). A wait is for
/// the event's record as of the wait call, so the caller may record the
/// same event again at once: the calling thread passes its own.
void order_after(cudaStream_t waiter, cudaStream_t producer, cudaEvent_t event);

/// Owns `bytes` of memory on a context's device, allocated in the order of
/// `stream` (a stream of the calling thread's on that device), and tracks
/// the stream that used it last (see the thread model above). Made with
/// the device current (the caller took `stream` under its device_guard).
class device_memory {
public:
  device_memory(std::size_t bytes, device_context& context, cudaStream_t stream);
  ~device_memory();
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
  void* data() const noexcept { return data_; }

  /// Before `stream` queues work on this memory: orders it after the last
  /// user's work and makes `stream` the last user. `ordering` is the
  /// calling thread's event for order_after.
  void before_use(cudaStream_t stream, cudaEvent_t ordering);
  /// After `stream` queued its work: when another thread became the last
  /// user meanwhile (two threads reading one tensor at once), orders that
  /// stream after this work too, so the memory is freed after both.
  void after_use(cudaStream_t stream, cudaEvent_t ordering);
  /// Blocks the calling thread until the work queued on this memory so far
  /// has run.
  void synchronize();

private:
  void* data_ = nullptr;
  device_context& context_;
  std::atomic<cudaStream_t> last_user_{nullptr};
  std::mutex mutex_;
};

} // namespace troupe::detail::cuda
