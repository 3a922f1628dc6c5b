// Device discovery, the RAII owners of CUDA handles, and the per-device
// contexts (cuda_context.hpp); the functions of troupe/tensor/cuda.hpp.
#include "cuda_context.hpp"

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::detail::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  // Clears a non-sticky error so that it does not resurface in the next
  // unrelated check (a sticky one, such as a failed kernel, stays).
  cudaGetLastError();
  throw cuda_error(fmt::format("{} failed: {} ({}:{})", call, cudaGetErrorString(status), file, line));
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw cuda_error(fmt::format("{} failed: {} ({}:{})", call, cublasGetStatusString(status), file, line));
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
  TROUPE_CUBLAS_CHECK(cublasCreate(&handle_));
  auto status = cublasSetStream(handle_, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(handle_);
    TROUPE_CUBLAS_CHECK(status);
  }
}

cublas_handle::~cublas_handle() {
  if (handle_ != nullptr)
    static_cast<void>(cublasDestroy(handle_));
}

namespace {

// Makes the device current before its members (stream, handle) are created.
int make_current(int ordinal) {
  TROUPE_CUDA_CHECK(cudaSetDevice(ordinal));
  return ordinal;
}

} // namespace

device_context::device_context(int device_ordinal)
    : ordinal(make_current(device_ordinal)), stream(), blas(stream.get()) {
  int pools = 0;
  TROUPE_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal));
  stream_ordered_allocation = pools != 0;
  if (stream_ordered_allocation) {
    // Keep freed blocks in the pool instead of returning them to the driver
    // at every synchronisation: a training step allocates the same sizes
    // every iteration (host_allocator.hpp does the same on the CPU).
    cudaMemPool_t pool = nullptr;
    TROUPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal));
    auto threshold = std::numeric_limits<std::uint64_t>::max();
    TROUPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
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

device_memory::device_memory(std::size_t bytes, device_context& context) : context_(context) {
  if (bytes == 0)
    return;
  device_guard guard(context.ordinal);
  if (context.stream_ordered_allocation)
    TROUPE_CUDA_CHECK(cudaMallocAsync(&data_, bytes, context.stream.get()));
  else
    TROUPE_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

device_memory::~device_memory() {
  if (data_ == nullptr)
    return;
  // Stream-ordered: the block returns to the pool once the work queued
  // before (which may still read it) has run. cudaFree waits for the whole
  // device instead. Failures (a driver gone at exit) cannot be reported.
  int previous = -1;
  static_cast<void>(cudaGetDevice(&previous));
  static_cast<void>(cudaSetDevice(context_.ordinal));
  if (context_.stream_ordered_allocation)
    static_cast<void>(cudaFreeAsync(data_, context_.stream.get()));
  else
    static_cast<void>(cudaFree(data_));
  if (previous >= 0)
    static_cast<void>(cudaSetDevice(previous));
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

void cuda_synchronize(device where) {
  auto& context = detail::cuda::context_for(where, "cuda_synchronize");
  detail::cuda::device_guard guard(context.ordinal);
  context.stream.synchronize();
}

} // namespace troupe
