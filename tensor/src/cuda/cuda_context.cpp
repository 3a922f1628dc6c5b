// Device discovery, the RAII owners of CUDA handles, and the per-device
// contexts (cuda_context.hpp); the functions of troupe/tensor/cuda.hpp.
#include "cuda_context.hpp"

#include "cublas_library.hpp"
#ifdef TROUPE_HAVE_CUDNN
#include "cudnn_convolution.hpp"
#endif

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::detail::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  // Clears a non-sticky error so that it does not resurface in the next
  // unrelated check (a sticky one, such as a failed kernel, stays).
  cudaGetLastError();
  throw cuda_error(fmt::format("{} failed: {} ({}:{})", call, cudaGetErrorString(status), file, line));
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw cuda_error(
      fmt::format("{} failed: {} ({}:{})", call, cublas_library::get().status_string(status), file, line));
}

namespace {

struct availability {
  int count = 0;
  std::string reason;
};

// Asked once: the answer does not change during a run, and without a
// driver every call would fail again the same way.
const availability& probe() {
  static const availability answer = [] {
    int count = 0;
    auto status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      return availability{0, fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(status))};
    }
    if (count == 0)
      return availability{0, "cudaGetDeviceCount: no CUDA device"};
    return availability{count, ""};
  }();
  return answer;
}

struct context_registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<device_context>> contexts;
};

context_registry& registry() {
  // Leaked on purpose (see device_context).
  static auto* instance = new context_registry;
  return *instance;
}

} // namespace

device_guard::device_guard(int ordinal) {
  TROUPE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != ordinal)
    TROUPE_CUDA_CHECK(cudaSetDevice(ordinal));
}

device_guard::~device_guard() {
  int current = -1;
  // Restoring cannot throw from a destructor; a failure here would have
  // failed the guarded work first.
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_)
    static_cast<void>(cudaSetDevice(previous_));
}

cuda_event::cuda_event() {
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

cuda_event::~cuda_event() {
  // Waits already queued on it keep what they need.
  static_cast<void>(cudaEventDestroy(event_));
}

cuda_stream::cuda_stream() {
  TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

cuda_stream::~cuda_stream() {
  // Errors here (a driver already shut down at process exit) have nobody to
  // report to.
  if (stream_ != nullptr)
    static_cast<void>(cudaStreamDestroy(stream_));
}

void cuda_stream::synchronize() const {
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

cublas_handle::cublas_handle(cudaStream_t stream) {
  const auto& cublas = cublas_library::get();
  TROUPE_CUBLAS_CHECK(cublas.create(&handle_));
  auto status = cublas.set_stream(handle_, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    cublas.destroy(handle_);
    TROUPE_CUBLAS_CHECK(status);
  }
}

cublas_handle::~cublas_handle() {
  if (handle_ != nullptr)
    static_cast<void>(cublas_library::get().destroy(handle_));
}

host_staging::~host_staging() {
  if (pinned_ != nullptr)
    static_cast<void>(cudaFreeHost(pinned_));
}

bool host_staging::copy_to_device(void* destination, const void* source, std::size_t bytes, cudaStream_t stream) {
  if (unavailable_)
    return false;
  if (pinned_ == nullptr) {
    // Pinned memory is a limited resource of the machine: without it the
    // copies still work, only slower.
    if (cudaHostAlloc(&pinned_, slot_bytes * slot_count, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      pinned_ = nullptr;
      unavailable_ = true;
      return false;
    }
  }
  for (std::size_t done = 0; done < bytes; done += slot_bytes) {
    const auto piece = std::min(slot_bytes, bytes - done);
    const auto slot = next_;
    next_ = (next_ + 1) % slot_count;
    // The slot's previous DMA must have read it (usually long ago).
    TROUPE_CUDA_CHECK(cudaEventSynchronize(drained_[slot].get()));
    auto* staged = static_cast<std::byte*>(pinned_) + slot * slot_bytes;
    std::memcpy(staged, static_cast<const std::byte*>(source) + done, piece);
    TROUPE_CUDA_CHECK(
      cudaMemcpyAsync(static_cast<std::byte*>(destination) + done, staged, piece, cudaMemcpyHostToDevice, stream));
    TROUPE_CUDA_CHECK(cudaEventRecord(drained_[slot].get(), stream));
  }
  return true;
}

device_context::device_context(int device_ordinal) : ordinal_(device_ordinal) {
  int pools = 0;
  TROUPE_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal_));
  stream_ordered_allocation_ = pools != 0;
  if (stream_ordered_allocation_) {
    // Keep freed blocks in the pool instead of returning them to the driver
    // at every synchronisation: a training step allocates the same sizes
    // every iteration (host_allocator.hpp does the same on the CPU).
    cudaMemPool_t pool = nullptr;
    TROUPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal_));
    auto threshold = std::numeric_limits<std::uint64_t>::max();
    TROUPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
}

namespace {

/// The streams the calling thread holds, one per device it has used; gives
/// them back to their devices' pools when the thread ends. The pools outlive
/// every thread (contexts are never destroyed).
struct thread_streams {
  std::vector<std::pair<device_context*, execution_stream*>> held;
  ~thread_streams() {
    for (auto [context, stream] : held)
      context->give_back(stream);
  }
};

thread_local thread_streams this_threads_streams;

} // namespace

execution_stream& device_context::this_thread() {
  for (auto [context, stream] : this_threads_streams.held)
    if (context == this)
      return *stream;
  execution_stream* stream = nullptr;
  {
    std::lock_guard lock(pool_mutex_);
    if (!idle_.empty()) {
      stream = idle_.back();
      idle_.pop_back();
    } else {
      streams_.push_back(std::make_unique<execution_stream>());
      stream = streams_.back().get();
    }
  }
  this_threads_streams.held.emplace_back(this, stream);
  return *stream;
}

void device_context::give_back(execution_stream* stream) {
  // Work still queued on it stays in order: the next thread to take the
  // stream queues behind it.
  std::lock_guard lock(pool_mutex_);
  idle_.push_back(stream);
}

std::string unavailable_reason(device where) {
  if (where.kind != device_kind::cuda)
    return fmt::format("{} is not a CUDA device", where);
  const auto& found = probe();
  if (found.count == 0)
    return found.reason;
  if (where.index < 0 || where.index >= found.count)
    return fmt::format("this machine has {} CUDA device(s)", found.count);
  return {};
}

device_context& context_for(device where, const char* op) {
  if (auto reason = unavailable_reason(where); !reason.empty())
    throw usage_error(fmt::format("{}: device {} is not available: {}", op, where, reason));
  const auto& found = probe();
  auto& table = registry();
  std::lock_guard lock(table.mutex);
  if (table.contexts.empty())
    table.contexts.resize(static_cast<std::size_t>(found.count));
  auto& slot = table.contexts[static_cast<std::size_t>(where.index)];
  if (!slot) {
    device_guard guard(where.index);
    slot = std::make_unique<device_context>(where.index);
  }
  return *slot;
}

void order_after(cudaStream_t waiter, cudaStream_t producer, cudaEvent_t event) {
  TROUPE_CUDA_CHECK(cudaEventRecord(event, producer));
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
}

device_memory::device_memory(std::size_t bytes, device_context& context, cudaStream_t stream) : context_(context) {
  last_user_.store(stream, std::memory_order_relaxed);
  if (bytes == 0)
    return;
  if (context.stream_ordered_allocation())
    TROUPE_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
  else
    TROUPE_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

device_memory::~device_memory() {
  if (data_ == nullptr)
    return;
  // Stream-ordered on the last user's stream, which is ordered after every
  // earlier user: the block returns to the pool once the work that may
  // still read it has run. cudaFree waits for the whole device instead.
  // Failures (a driver gone at exit) cannot be reported.
  int previous = -1;
  static_cast<void>(cudaGetDevice(&previous));
  static_cast<void>(cudaSetDevice(context_.ordinal()));
  if (context_.stream_ordered_allocation())
    static_cast<void>(cudaFreeAsync(data_, last_user_.load(std::memory_order_acquire)));
  else
    static_cast<void>(cudaFree(data_));
  if (previous >= 0)
    static_cast<void>(cudaSetDevice(previous));
}

// The fast paths read last_user_ without the lock: a tensor handed to
// another thread arrives through a message, whose queue orders the sender's
// store before the receiver's load.
void device_memory::before_use(cudaStream_t stream, cudaEvent_t ordering) {
  if (last_user_.load(std::memory_order_acquire) == stream)
    return;
  std::lock_guard lock(mutex_);
  auto last = last_user_.load(std::memory_order_relaxed);
  if (last == stream)
    return;
  order_after(stream, last, ordering);
  last_user_.store(stream, std::memory_order_release);
}

void device_memory::after_use(cudaStream_t stream, cudaEvent_t ordering) {
  if (last_user_.load(std::memory_order_acquire) == stream)
    return;
  std::lock_guard lock(mutex_);
  auto last = last_user_.load(std::memory_order_relaxed);
  if (last != stream)
    order_after(last, stream, ordering);
}

void device_memory::synchronize() {
  cudaStream_t last = nullptr;
  {
    std::lock_guard lock(mutex_);
    last = last_user_.load(std::memory_order_relaxed);
  }
  device_guard guard(context_.ordinal());
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(last));
}

} // namespace troupe::detail::cuda

namespace troupe {

bool cuda_backend_built() noexcept {
  return true;
}

int cuda_device_count() noexcept {
  try {
    return detail::cuda::probe().count;
  } catch (...) {
    return 0;
  }
}

std::string cuda_unavailable_reason() {
  return detail::cuda::probe().reason;
}

std::string cuda_convolution() {
#ifdef TROUPE_HAVE_CUDNN
  try {
    return detail::cuda::cudnn_convolution_summary();
  } catch (...) {
    return "troupe's kernels (im2col, cuBLAS GEMM, col2im): asking cuDNN failed";
  }
#else
  return "troupe's kernels (im2col, cuBLAS GEMM, col2im): this build has no cuDNN (cudnn.h or libcudnn was not found)";
#endif
}

void cuda_synchronize(device where) {
  auto& context = detail::cuda::context_for(where, "cuda_synchronize");
  detail::cuda::device_guard guard(context.ordinal());
  auto& queue = context.this_thread();
  queue.copies.synchronize();
  queue.stream.synchronize();
}

void cuda_synchronize(const tensor& t) {
  if (!t.defined() || t.where().kind != device_kind::cuda)
    return;
  detail::cuda::context_for(t.where(), "cuda_synchronize");
  if (auto* memory = static_cast<detail::cuda::device_memory*>(t.memory()->backend_state()))
    memory->synchronize();
  else
    cuda_synchronize(t.where());
}

} // namespace troupe
