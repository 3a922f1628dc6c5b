#pragma once
// Stands in for CUDA's runtime API where the CUDA backend is built to run
// on the host (troupe_tensor_cuda_on_host, tests/support/cuda_on_host/):
// the types and calls the backend and its kernels use, implemented by
// cuda_runtime_on_host.cpp. Declared with C++ linkage, so that they never
// meet the real runtime's C symbols in a process that has both.
//
// How it behaves (cuda_runtime_on_host.cpp says why):
// - "device" memory is host memory, known to the runtime by its device;
//   a fresh allocation is filled with 0xff bytes (a NaN in every float);
// - work queued on a stream runs only when something waits for it: a
//   stream or event synchronisation, a wait of another stream that runs,
//   or a copy to pageable host memory. So work ordered wrongly runs in
//   the wrong order, every time;
// - the null stream runs its work at once (the kernel tests launch there);
// - with TROUPE_CUDA_ON_HOST_PINNED=0, cudaHostAlloc fails (a machine out
//   of pinned memory).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The real runtime's values.
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr { cudaDevAttrMemoryPoolsSupported = 115 };
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };

inline constexpr unsigned cudaStreamNonBlocking = 0x01;
inline constexpr unsigned cudaEventDisableTiming = 0x02;
inline constexpr unsigned cudaHostAllocDefault = 0x00;

struct cuda_on_host_stream;
struct cuda_on_host_event;
struct cuda_on_host_pool;
using cudaStream_t = cuda_on_host_stream*;
using cudaEvent_t = cuda_on_host_event*;
using cudaMemPool_t = cuda_on_host_pool*;

cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t status);

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attribute, void* value);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

cudaError_t cudaMalloc(void** pointer, std::size_t bytes);
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMallocAsync(void** pointer, std::size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream);
cudaError_t cudaHostAlloc(void** pointer, std::size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* pointer);

cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemcpyPeerAsync(void* destination, int destination_device, const void* source,
                                int source_device, std::size_t bytes, cudaStream_t stream);
cudaError_t cudaMemsetAsync(void* pointer, int value, std::size_t bytes, cudaStream_t stream);

// The template of CUDA's C++ header (cuda_runtime.h) that the kernels use.
template <class T> cudaError_t cudaMallocAsync(T** pointer, std::size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(pointer), bytes, stream);
}

namespace cuda_on_host {

/// Queues `work` on `stream` (the kernel launches of cuda_on_host.hpp and
/// the stand-in cuBLAS); the null stream runs it at once.
void enqueue(cudaStream_t stream, std::function<void()> work);
/// Queues `work` on `stream`, to run only once `ready()` holds (the stand-in
/// NCCL's collectives, which wait for the other members). Waiting for it
/// under the runtime's lock before then would wait forever: that aborts,
/// saying so; cudaStreamQuery instead reports it not ready.
void enqueue_when(cudaStream_t stream, std::function<bool()> ready, std::function<void()> work);
/// The device `stream` belongs to (the null stream: the current device's).
int device_of(cudaStream_t stream);
/// The device whose memory holds `pointer`; -1: pinned host memory; -2:
/// neither (pageable host memory, or nothing allocated).
int device_of_memory(const void* pointer);
/// Whether [pointer, pointer + bytes) lies within one block of `device`'s
/// memory (what a stand-in library checks a buffer against).
bool device_memory_holds(int device, const void* pointer, std::size_t bytes);
/// Whether a kernel may be launched on `stream`: only on a stream of the
/// current device, as CUDA says; if not, cudaGetLastError then reports
/// cudaErrorInvalidResourceHandle.
bool may_launch_on(cudaStream_t stream);
/// Whether a kernel on `stream` may be given `pointers` (its arguments'
/// memory; null ones are skipped): not into another device's memory. The
/// backend enables no peer access, so on a machine with two GPUs such a
/// kernel faults; here it is refused, saying so on stderr, and
/// cudaGetLastError reports cudaErrorIllegalAddress.
bool may_access_from(cudaStream_t stream, std::initializer_list<const void*> pointers);
/// Makes cudaGetLastError report `status` (a refused launch).
void set_last_error(cudaError_t status);
/// The lock that serialises every call and the work it runs, for stand-ins
/// of other libraries to share.
std::recursive_mutex& runtime_lock();
/// Runs `hook` on the calling thread when it next launches a kernel, just
/// before the kernel is queued (once): for tests that make another thread
/// act between an op's ordering and its launch.
void before_next_launch(std::function<void()> hook);
/// Called by each launch (cuda_on_host.hpp): runs and clears the hook.
void launching();
/// How many pieces of work (kernels, copies, waits, frees) are queued on
/// every stream and have not run: what a test asks to see which work a
/// synchronisation ran.
std::uint64_t waiting_work();
/// How many pieces of queued work the calling thread has run (waiting for
/// them): what a test asks to see that a thread did not wait for its
/// kernels.
std::uint64_t work_run_on_this_thread();
/// How many events have been made (cudaEventCreateWithFlags) so far.
std::uint64_t events_made();
/// Counts one queued pass of a stand-in library (the stand-in cuDNN's
/// convolutions), for a test to see that it ran the op, not a fallback.
void count_library_pass();
/// How many passes count_library_pass has counted so far.
std::uint64_t library_passes();

} // namespace cuda_on_host
