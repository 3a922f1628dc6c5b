// The stand-in CUDA runtime (cuda_runtime_api.h) that the CUDA backend
// runs on in CI: streams, events, device and pinned memory and copies, on
// the host.
//
// Streams are lazy on purpose. A real GPU usually runs queued work soon,
// so a missing ordering (a kernel reading memory that another stream is
// still writing, a host buffer rewritten before its DMA ran) goes unseen
// until a busy device shows it once in a thousand runs. Here queued work
// runs only when something must see its effect — a synchronisation, a
// stream waiting on an event, a copy to pageable memory — so work that is
// not ordered after what it needs runs before it, on every run, and reads
// the 0xff bytes of fresh memory or the host's newer bytes.
//
// Memory allocated in a stream's order (cudaMallocAsync) is filled with
// 0xff again when that stream reaches the allocation: a copy or kernel on
// another stream that is not ordered after it loses what it wrote.
//
// Freed memory is overwritten with 0xff when the free runs in its stream's
// order, and kept a while before it goes back to the system: work that
// reads a block after its free (a free queued on the wrong stream) reads
// those bytes.
//
// Calls check what the real runtime checks where a mistake would otherwise
// go unseen on the host: a copy's device side must lie in memory allocated
// on a device (and its host side must not), a peer copy's pointers must be
// on the devices it names, a freed pointer must have been allocated.
// Streams and events belong to the device current when they were made, as
// in CUDA's "Stream and Event Behavior": a kernel (cuBLAS's too) may be
// launched only on a stream of the current device, an event recorded only
// on a stream of its own device, and cudaMallocAsync takes the memory from
// the stream's device. With two devices (the default), a thread that
// forgot to make the right device current fails here as on a machine with
// two GPUs.
//
// One lock serialises every call and the work it runs (kernels included):
// the backend's threads may call at once, as actors do.
#include "cuda_runtime_api.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

struct cuda_on_host_stream {
  struct work {
    std::function<bool()> ready; // empty: ready at once
    std::function<void()> run;
  };
  int device = 0;
  std::deque<work> pending;
  std::uint64_t queued = 0; // work ever queued
  std::uint64_t done = 0;   // of which has run
};

struct cuda_on_host_event {
  int device = 0;
  cudaStream_t stream = nullptr; // of the last record; null: never recorded
  std::uint64_t position = 0;    // the stream's work queued at that record
};

struct cuda_on_host_pool {
  int device = 0;
};

namespace cuda_on_host {
namespace {

constexpr std::size_t alignment = 256; // cudaMalloc's
constexpr std::size_t quarantine_bytes = std::size_t{512} << 20;

struct block {
  std::size_t bytes = 0;
  int device = -1; // -1: pinned host memory
};

struct runtime {
  std::recursive_mutex mutex;
  int device_count = 0;
  bool memory_pools = true;
  bool pinned_memory = true;
  std::vector<std::unique_ptr<cuda_on_host_pool>> pools;
  // Streams are kept after cudaStreamDestroy: a wait queued elsewhere may
  // still name them.
  std::vector<std::unique_ptr<cuda_on_host_stream>> streams;
  std::map<const std::byte*, block> blocks; // by first byte
  std::deque<std::pair<void*, std::size_t>> quarantine;
  std::size_t quarantined = 0;
};

// Leaked: tensors in static objects are freed after main returns.
runtime& state() {
  static runtime* instance = [] {
    auto* r = new runtime;
    // TROUPE_CUDA_ON_HOST_DEVICES: how many devices to have (default 2, so
    // that the two-device cases run); 0 is a machine without one.
    const char* count = std::getenv("TROUPE_CUDA_ON_HOST_DEVICES");
    r->device_count = count != nullptr ? std::atoi(count) : 2;
    // TROUPE_CUDA_ON_HOST_POOLS=0: a device without stream-ordered
    // allocation (the backend then uses cudaMalloc/cudaFree).
    const char* pools = std::getenv("TROUPE_CUDA_ON_HOST_POOLS");
    r->memory_pools = pools == nullptr || std::string(pools) != "0";
    // TROUPE_CUDA_ON_HOST_PINNED=0: cudaHostAlloc fails, as on a machine
    // out of pinned memory (the backend then copies from pageable memory).
    const char* pinned = std::getenv("TROUPE_CUDA_ON_HOST_PINNED");
    r->pinned_memory = pinned == nullptr || std::string(pinned) != "0";
    for (int d = 0; d < r->device_count; ++d)
      r->pools.push_back(std::make_unique<cuda_on_host_pool>(cuda_on_host_pool{d}));
    return r;
  }();
  return *instance;
}

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local std::uint64_t work_run_here = 0;
std::atomic<std::uint64_t> events_created{0};
std::atomic<std::uint64_t> library_passes_queued{0};

cudaError_t fail(cudaError_t status) {
  last_error = status;
  return status;
}

/// The block holding [pointer, pointer + bytes), or null.
const block* find_block(const void* pointer, std::size_t bytes) {
  auto& blocks = state().blocks;
  const auto* p = static_cast<const std::byte*>(pointer);
  auto after = blocks.upper_bound(p);
  if (after == blocks.begin())
    return nullptr;
  auto it = std::prev(after);
  if (p + bytes > it->first + it->second.bytes)
    return nullptr;
  return &it->second;
}

bool on_device(const void* pointer, std::size_t bytes) {
  const auto* found = find_block(pointer, bytes);
  return found != nullptr && found->device >= 0;
}

bool pinned(const void* pointer, std::size_t bytes) {
  const auto* found = find_block(pointer, bytes);
  return found != nullptr && found->device < 0;
}

/// Runs `stream`'s work until `position` of it has run. The work being run
/// is counted only once it returns: a wait inside it on another stream
/// that in turn waits on this one asks only for work queued before it.
void run_until(cudaStream_t stream, std::uint64_t position) {
  while (stream->done < position) {
    auto& front = stream->pending.front();
    if (front.ready && !front.ready()) {
      std::fputs("cuda_on_host: work that waits for another thread (a NCCL collective whose members have not all "
                 "called) was waited for under the runtime's lock, which would wait forever\n",
                 stderr);
      std::abort();
    }
    auto work = std::move(front.run);
    stream->pending.pop_front();
    work();
    ++stream->done;
    ++work_run_here;
  }
}

void drain(cudaStream_t stream) {
  run_until(stream, stream->queued);
}

void drain_all() {
  for (auto& stream : state().streams)
    drain(stream.get());
}

void* allocate(std::size_t bytes, int device) {
  const auto rounded = (bytes + alignment - 1) / alignment * alignment;
  void* pointer = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (pointer == nullptr)
    return nullptr;
  std::memset(pointer, 0xff, rounded == 0 ? alignment : rounded);
  state().blocks[static_cast<const std::byte*>(pointer)] = block{bytes == 0 ? 1 : bytes, device};
  return pointer;
}

/// Forgets a block allocated on a device (or pinned), overwriting it so
/// that a late reader sees 0xff rather than the old data. The memory itself
/// is kept a while (the last quarantine_bytes freed), so that such a read
/// finds those bytes instead of memory returned to the system.
bool release(void* pointer, bool pinned_memory) {
  auto& r = state();
  auto it = r.blocks.find(static_cast<const std::byte*>(pointer));
  if (it == r.blocks.end() || (it->second.device < 0) != pinned_memory)
    return false;
  std::memset(pointer, 0xff, it->second.bytes);
  r.quarantine.emplace_back(pointer, it->second.bytes);
  r.quarantined += it->second.bytes;
  r.blocks.erase(it);
  while (r.quarantined > quarantine_bytes) {
    std::free(r.quarantine.front().first);
    r.quarantined -= r.quarantine.front().second;
    r.quarantine.pop_front();
  }
  return true;
}

bool valid_device(int device) {
  return device >= 0 && device < state().device_count;
}

} // namespace

void enqueue(cudaStream_t stream, std::function<void()> work) {
  std::lock_guard lock(state().mutex);
  if (stream == nullptr) {
    work();
    return;
  }
  stream->pending.push_back({nullptr, std::move(work)});
  ++stream->queued;
}

void enqueue_when(cudaStream_t stream, std::function<bool()> ready, std::function<void()> work) {
  std::lock_guard lock(state().mutex);
  stream->pending.push_back({std::move(ready), std::move(work)});
  ++stream->queued;
}

namespace {
thread_local std::function<void()> next_launch_hook;
} // namespace

void before_next_launch(std::function<void()> hook) {
  next_launch_hook = std::move(hook);
}

void launching() {
  // Outside the runtime's lock: the hook may start threads that call in.
  if (auto hook = std::exchange(next_launch_hook, nullptr))
    hook();
}

std::uint64_t waiting_work() {
  std::lock_guard lock(state().mutex);
  std::uint64_t waiting = 0;
  for (const auto& stream : state().streams)
    waiting += stream->queued - stream->done;
  return waiting;
}

int device_of(cudaStream_t stream) {
  return stream != nullptr ? stream->device : current_device;
}

int device_of_memory(const void* pointer) {
  std::lock_guard lock(state().mutex);
  const auto* found = find_block(pointer, 1);
  return found != nullptr ? found->device : -2;
}

bool device_memory_holds(int device, const void* pointer, std::size_t bytes) {
  std::lock_guard lock(state().mutex);
  const auto* found = pointer != nullptr ? find_block(pointer, bytes) : nullptr;
  return found != nullptr && found->device == device && device >= 0;
}

bool may_launch_on(cudaStream_t stream) {
  if (device_of(stream) == current_device)
    return true;
  last_error = cudaErrorInvalidResourceHandle;
  return false;
}

bool may_access_from(cudaStream_t stream, std::initializer_list<const void*> pointers) {
  std::lock_guard lock(state().mutex);
  const int device = device_of(stream);
  for (const void* pointer : pointers) {
    const auto* found = pointer != nullptr ? find_block(pointer, 1) : nullptr;
    if (found != nullptr && found->device >= 0 && found->device != device) {
      std::fprintf(stderr,
                   "cuda_on_host: a kernel queued on a stream of cuda:%d was given a pointer into cuda:%d's memory: "
                   "without peer access, a GPU faults there (cudaErrorIllegalAddress)\n",
                   device, found->device);
      last_error = cudaErrorIllegalAddress;
      return false;
    }
  }
  return true;
}

std::uint64_t events_made() {
  return events_created.load();
}

void count_library_pass() {
  ++library_passes_queued;
}

std::uint64_t library_passes() {
  return library_passes_queued.load();
}

std::uint64_t work_run_on_this_thread() {
  return work_run_here;
}

std::recursive_mutex& runtime_lock() {
  return state().mutex;
}

void set_last_error(cudaError_t status) {
  last_error = status;
}

} // namespace cuda_on_host

using namespace cuda_on_host;

cudaError_t cudaGetLastError() {
  auto status = last_error;
  last_error = cudaSuccess;
  return status;
}

const char* cudaGetErrorString(cudaError_t status) {
  switch (status) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInvalidValue:
    return "invalid argument";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorInvalidConfiguration:
    return "invalid configuration argument";
  case cudaErrorNoDevice:
    return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice:
    return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle:
    return "invalid resource handle";
  case cudaErrorNotReady:
    return "device not ready";
  case cudaErrorIllegalAddress:
    return "an illegal memory access was encountered";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int* count) {
  std::lock_guard lock(state().mutex);
  *count = state().device_count;
  return *count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  std::lock_guard lock(state().mutex);
  if (!valid_device(device))
    return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  std::lock_guard lock(state().mutex);
  if (!valid_device(device))
    return fail(cudaErrorInvalidDevice);
  if (attribute != cudaDevAttrMemoryPoolsSupported)
    return fail(cudaErrorInvalidValue);
  *value = state().memory_pools ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  std::lock_guard lock(state().mutex);
  if (!valid_device(device) || !state().memory_pools)
    return fail(cudaErrorInvalidDevice);
  *pool = state().pools[static_cast<std::size_t>(device)].get();
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attribute, void* value) {
  if (pool == nullptr || value == nullptr || attribute != cudaMemPoolAttrReleaseThreshold)
    return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  std::lock_guard lock(state().mutex);
  state().streams.push_back(std::make_unique<cuda_on_host_stream>());
  *stream = state().streams.back().get();
  (*stream)->device = current_device;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  // CUDA lets queued work finish after the call returns; it is run now.
  std::lock_guard lock(state().mutex);
  if (stream == nullptr)
    return fail(cudaErrorInvalidResourceHandle);
  drain(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::lock_guard lock(state().mutex);
  if (stream == nullptr)
    drain_all();
  else
    drain(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  // Runs what is ready, as a device makes progress, and says whether all is.
  std::lock_guard lock(state().mutex);
  if (stream == nullptr)
    return fail(cudaErrorInvalidResourceHandle);
  while (!stream->pending.empty() && (!stream->pending.front().ready || stream->pending.front().ready()))
    run_until(stream, stream->done + 1);
  return stream->pending.empty() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  std::lock_guard lock(state().mutex);
  if (stream == nullptr || event == nullptr)
    return fail(cudaErrorInvalidResourceHandle);
  // The wait is for the event's last record as of now, not a later one.
  auto* producer = event->stream;
  const auto position = event->position;
  if (producer == nullptr || producer == stream)
    return cudaSuccess;
  enqueue(stream, [producer, position] { run_until(producer, position); });
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new cuda_on_host_event;
  (*event)->device = current_device;
  ++events_created;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  // Waits already queued on it keep what they need (they copied it).
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard lock(state().mutex);
  if (event == nullptr || event->device != device_of(stream))
    return fail(cudaErrorInvalidResourceHandle);
  event->stream = stream;
  event->position = stream != nullptr ? stream->queued : 0;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::lock_guard lock(state().mutex);
  if (event == nullptr)
    return fail(cudaErrorInvalidResourceHandle);
  if (event->stream != nullptr)
    run_until(event->stream, event->position);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** pointer, std::size_t bytes) {
  std::lock_guard lock(state().mutex);
  *pointer = allocate(bytes, current_device);
  return *pointer != nullptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* pointer) {
  // cudaFree waits for the whole device.
  std::lock_guard lock(state().mutex);
  if (pointer == nullptr)
    return cudaSuccess;
  drain_all();
  return release(pointer, false) ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaMallocAsync(void** pointer, std::size_t bytes, cudaStream_t stream) {
  std::lock_guard lock(state().mutex);
  *pointer = allocate(bytes, device_of(stream));
  if (*pointer == nullptr)
    return fail(cudaErrorMemoryAllocation);
  // The block is the caller's only in `stream`'s order (a real pool may
  // hand out a block that work queued earlier on that stream still reads):
  // it is filled again when the stream reaches this point, undoing what
  // work on another stream, not ordered after it, wrote first.
  if (stream != nullptr)
    enqueue(stream, [p = *pointer, bytes] { std::memset(p, 0xff, bytes); });
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream) {
  std::lock_guard lock(state().mutex);
  if (pointer == nullptr)
    return cudaSuccess;
  if (!on_device(pointer, 1))
    return fail(cudaErrorInvalidValue);
  // In stream order: work queued before it may still read the block.
  enqueue(stream, [pointer] { release(pointer, false); });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pointer, std::size_t bytes, unsigned) {
  std::lock_guard lock(state().mutex);
  if (!state().pinned_memory)
    return fail(cudaErrorMemoryAllocation);
  *pointer = allocate(bytes, -1);
  return *pointer != nullptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void* pointer) {
  // Like cudaFree, it waits for the device: a queued DMA may read it.
  std::lock_guard lock(state().mutex);
  drain_all();
  return release(pointer, true) ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  std::lock_guard lock(state().mutex);
  if (bytes == 0)
    return cudaSuccess;
  const bool to_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool from_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost || on_device(destination, bytes) != to_device ||
      on_device(source, bytes) != from_device)
    return fail(cudaErrorInvalidValue);
  auto copy = [destination, source, bytes] { std::memcpy(destination, source, bytes); };
  if (kind == cudaMemcpyHostToDevice && !pinned(source, bytes)) {
    // Pageable source: CUDA stages it before returning; the caller may
    // then reuse it.
    auto staged = std::make_shared<std::vector<std::byte>>(static_cast<const std::byte*>(source),
                                                           static_cast<const std::byte*>(source) + bytes);
    enqueue(stream, [destination, staged] { std::memcpy(destination, staged->data(), staged->size()); });
  } else if (kind == cudaMemcpyDeviceToHost && !pinned(destination, bytes)) {
    // Pageable destination: the call returns once the copy has run.
    if (stream == nullptr)
      drain_all();
    else
      drain(stream);
    copy();
  } else {
    enqueue(stream, copy);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void* destination, int destination_device, const void* source,
                                int source_device, std::size_t bytes, cudaStream_t stream) {
  std::lock_guard lock(state().mutex);
  if (bytes == 0)
    return cudaSuccess;
  const auto* to = find_block(destination, bytes);
  const auto* from = find_block(source, bytes);
  if (to == nullptr || from == nullptr || to->device != destination_device || from->device != source_device)
    return fail(cudaErrorInvalidValue);
  enqueue(stream, [destination, source, bytes] { std::memcpy(destination, source, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* pointer, int value, std::size_t bytes, cudaStream_t stream) {
  std::lock_guard lock(state().mutex);
  if (bytes == 0)
    return cudaSuccess;
  // The kernel tests set host memory on the null stream.
  if (stream != nullptr && !on_device(pointer, bytes))
    return fail(cudaErrorInvalidValue);
  enqueue(stream, [pointer, value, bytes] { std::memset(pointer, value, bytes); });
  return cudaSuccess;
}
