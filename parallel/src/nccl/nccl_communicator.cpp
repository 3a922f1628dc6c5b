// The NCCL communicator of a reducer ring (nccl_communicator.hpp). Built
// only with CUDA and NCCL (parallel/CMakeLists.txt).
#include "troupe/parallel/nccl_communicator.hpp"

#include <array>
#include <cstring>
#include <thread>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "troupe/parallel/broadcast.hpp"
#include "troupe/tensor/cuda.hpp"

namespace troupe::parallel {

namespace {

using clock = std::chrono::steady_clock;

/// Makes a device current for the guard's lifetime (restores the caller's).
class device_guard {
public:
  explicit device_guard(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess)
      previous_ = -1;
    ok_ = cudaSetDevice(ordinal) == cudaSuccess;
  }
  ~device_guard() {
    if (previous_ >= 0)
      static_cast<void>(cudaSetDevice(previous_));
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  bool ok() const noexcept { return ok_; }

private:
  int previous_ = -1;
  bool ok_ = false;
};

/// The communicator's own stream: collectives never queue behind tensor
/// kernels (they wait for them explicitly, see the header).
class owned_stream {
public:
  owned_stream() = default;
  ~owned_stream() {
    if (stream_ != nullptr)
      static_cast<void>(cudaStreamDestroy(stream_));
  }
  owned_stream(const owned_stream&) = delete;
  owned_stream& operator=(const owned_stream&) = delete;
  cudaError_t create() { return cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  cudaStream_t get() const noexcept { return stream_; }

private:
  cudaStream_t stream_ = nullptr;
};

expected<ncclDataType_t> nccl_type_of(dtype type) {
  switch (type) {
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
    case dtype::int64: return ncclInt64;
    case dtype::int32: return ncclInt32;
    case dtype::uint8: return ncclUint8;
    case dtype::bfloat16: return ncclBfloat16;
  }
  return make_error(errc::unsupported_dtype, "nccl_communicator: dtype {} has no NCCL type", type);
}

ncclRedOp_t nccl_op_of(reduce_op op) {
  return op == reduce_op::average ? ncclAvg : ncclSum;
}

/// Polling interval of the bounded waits: short next to any collective
/// worth running on a GPU, long enough not to burn a core.
constexpr auto poll_interval = std::chrono::microseconds(50);

} // namespace

struct nccl_communicator::impl {
  ncclComm_t comm = nullptr;
  owned_stream stream;
  device where;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::chrono::milliseconds timeout{0};
  /// Set once the communicator is aborted: every later call fails at once.
  bool aborted = false;

  ~impl() {
    if (comm == nullptr || aborted)
      return;
    device_guard guard(where.index);
    // Finalize flushes outstanding work; in non-blocking mode it returns
    // ncclInProgress and is polled like any other call.
    auto state = ncclCommFinalize(comm);
    if ((state == ncclSuccess || state == ncclInProgress) && wait_ready("ncclCommFinalize", state))
      static_cast<void>(ncclCommDestroy(comm));
    else if (!aborted)
      static_cast<void>(ncclCommAbort(comm));
  }

  /// "rank 1 (cuda:1)" for messages.
  std::string who() const { return fmt::format("rank {} ({})", rank, where); }

  error nccl_error(const char* call, ncclResult_t result) const {
    const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    return make_error(errc::io_error, "nccl_communicator: {} failed on {}: {}{}{}", call, who(),
                      ncclGetErrorString(result), detail != nullptr && *detail != '\0' ? ": " : "",
                      detail != nullptr ? detail : "");
  }

  error cuda_error_of(const char* call, cudaError_t result) const {
    cudaGetLastError();
    return make_error(errc::io_error, "nccl_communicator: {} failed on {}: {}", call, who(),
                      cudaGetErrorString(result));
  }

  void abort() {
    if (comm != nullptr && !aborted)
      static_cast<void>(ncclCommAbort(comm));
    aborted = true;
  }

  /// After a non-blocking call that returned ncclInProgress: polls the
  /// communicator until the call has finished (true), failed or run past
  /// the timeout (false; the communicator is then aborted and `failure`
  /// says why).
  bool wait_ready(const char* call, ncclResult_t state, error* failure = nullptr) {
    const auto deadline = clock::now() + timeout;
    while (state == ncclInProgress) {
      if (auto polled = ncclCommGetAsyncError(comm, &state); polled != ncclSuccess)
        state = polled;
      else if (state == ncclInProgress && clock::now() > deadline)
        break;
      else if (state == ncclInProgress)
        std::this_thread::sleep_for(poll_interval);
    }
    if (state == ncclSuccess)
      return true;
    if (failure != nullptr)
      *failure = state == ncclInProgress
                   ? make_error(errc::io_error,
                                "nccl_communicator: {} on {} did not finish within {} ms (a member missing or "
                                "hung?); the communicator is aborted",
                                call, who(), timeout.count())
                   : nccl_error(call, state);
    abort();
    return false;
  }

  /// Runs one collective: waits for the tensor backend's work on `input`
  /// (queued by any thread) and for the calling thread's (which allocated
  /// the output), enqueues `call_nccl()` on the communicator's stream, and
  /// waits (bounded) until the stream has run it.
  template <class Enqueue> expected<void> run(const char* call, const tensor& input, Enqueue&& call_nccl) {
    if (aborted)
      return make_error(errc::io_error, "nccl_communicator: {} on {}: the communicator was aborted after an "
                                        "earlier failure", call, who());
    device_guard guard(where.index);
    if (!guard.ok())
      return make_error(errc::io_error, "nccl_communicator: {} on {}: cannot make the device current", call, who());
    try {
      cuda_synchronize(input);
      cuda_synchronize(where);
    } catch (const std::exception& e) {
      return make_error(errc::io_error, "nccl_communicator: {} on {}: {}", call, who(), e.what());
    }
    auto state = call_nccl();
    if (state != ncclSuccess && state != ncclInProgress) {
      abort();
      return nccl_error(call, state);
    }
    error failure{errc::io_error, {}};
    if (state == ncclInProgress && !wait_ready(call, state, &failure))
      return failure;
    // The collective is queued; wait until the stream has run it, checking
    // the communicator for asynchronous errors (a peer gone) meanwhile.
    const auto deadline = clock::now() + timeout;
    while (true) {
      auto done = cudaStreamQuery(stream.get());
      if (done == cudaSuccess)
        return {};
      if (done != cudaErrorNotReady) {
        abort();
        return cuda_error_of("cudaStreamQuery (after the collective)", done);
      }
      ncclResult_t async = ncclSuccess;
      if (auto polled = ncclCommGetAsyncError(comm, &async); polled != ncclSuccess || async != ncclSuccess) {
        auto result = polled != ncclSuccess ? polled : async;
        if (result != ncclInProgress) {
          auto reason = nccl_error(call, result);
          abort();
          return reason;
        }
      }
      if (clock::now() > deadline) {
        abort();
        return make_error(errc::io_error,
                          "nccl_communicator: {} on {} did not complete within {} ms (a member missing or hung?); "
                          "the communicator is aborted",
                          call, who(), timeout.count());
      }
      std::this_thread::sleep_for(poll_interval);
    }
  }

  /// A fresh result tensor on the device, or why not (out of memory).
  expected<tensor> allocate(std::int64_t numel, dtype type, const char* call) const {
    try {
      return tensor::empty({numel}, type, where);
    } catch (const std::exception& e) {
      return make_error(errc::io_error, "nccl_communicator: {} on {}: allocating the result: {}", call, who(),
                        e.what());
    }
  }

  /// A contiguous tensor on this communicator's device, or why not.
  expected<ncclDataType_t> check(const tensor& t, const char* call) const {
    if (!t.defined() || !t.is_contiguous() || t.where() != where)
      return make_error(errc::invalid_argument,
                        "nccl_communicator: {}: the tensor must be a defined, contiguous tensor on {}, got {}", call,
                        where, t.defined() ? fmt::format("{}", t) : std::string("an undefined tensor"));
    return nccl_type_of(t.type());
  }
};

nccl_communicator::nccl_communicator(std::unique_ptr<impl> state) : impl_(std::move(state)) {}

nccl_communicator::~nccl_communicator() = default;
nccl_communicator::nccl_communicator(nccl_communicator&&) noexcept = default;
nccl_communicator& nccl_communicator::operator=(nccl_communicator&&) noexcept = default;

std::uint32_t nccl_communicator::rank() const noexcept {
  return impl_->rank;
}
std::uint32_t nccl_communicator::size() const noexcept {
  return impl_->size;
}
device nccl_communicator::where() const noexcept {
  return impl_->where;
}

expected<nccl_communicator> nccl_communicator::create(reducer_group& group, nccl_options options) {
  const auto rank = group.rank();
  const auto where = options.where;
  if (where.kind != device_kind::cuda)
    return make_error(errc::invalid_argument, "nccl_communicator: rank {}: {} is not a CUDA device", rank, where);
  if (const auto count = cuda_device_count(); where.index >= count)
    return make_error(errc::invalid_argument, "nccl_communicator: rank {}: device {} is not available: {}", rank,
                      where,
                      count == 0 ? cuda_unavailable_reason()
                                 : fmt::format("this process sees {} CUDA device(s)", count));

  auto state = std::make_unique<impl>();
  state->where = where;
  state->rank = rank;
  state->size = group.size();
  state->timeout = options.timeout;

  // 1. Rank 0 draws the unique id (it names rank 0's bootstrap socket).
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0)
    if (auto result = ncclGetUniqueId(&id); result != ncclSuccess)
      return state->nccl_error("ncclGetUniqueId", result);

  // 2. Its 128 bytes travel around the actor ring. The ring's broadcast
  // carries floating tensors only, so each byte rides as one float32 (small
  // integers are exact): 512 bytes, once per communicator.
  std::array<float, sizeof id.internal> carried{};
  for (std::size_t i = 0; i < carried.size(); ++i)
    carried[i] = static_cast<float>(static_cast<unsigned char>(id.internal[i]));
  auto message = tensor::from(std::span<const float>(carried), {static_cast<std::int64_t>(carried.size())});
  if (auto sent = parallel::broadcast(group, message, {.root = 0}); !sent)
    return make_error(sent.error().code(), "nccl_communicator: rank {}: exchanging the NCCL unique id: {}", rank,
                      sent.error().message());
  const auto* received = message.data<float>();
  for (std::size_t i = 0; i < carried.size(); ++i)
    id.internal[i] = static_cast<char>(static_cast<unsigned char>(received[i]));

  // 3. Every rank joins on its device, non-blocking so that the wait for
  // the others is bounded.
  device_guard guard(where.index);
  if (!guard.ok())
    return make_error(errc::io_error, "nccl_communicator: {}: cannot make the device current", state->who());
  if (auto made = state->stream.create(); made != cudaSuccess)
    return state->cuda_error_of("cudaStreamCreateWithFlags", made);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  auto joined = ncclCommInitRankConfig(&state->comm, static_cast<int>(state->size), id, static_cast<int>(rank),
                                       &config);
  if (joined != ncclSuccess && joined != ncclInProgress) {
    auto reason = state->nccl_error("ncclCommInitRankConfig", joined);
    state->abort();
    return reason;
  }
  error failure{errc::io_error, {}};
  if (!state->wait_ready("ncclCommInitRankConfig", joined, &failure))
    return failure;
  return nccl_communicator(std::move(state));
}

expected<void> nccl_communicator::allreduce(const tensor& data, reduce_op op) {
  auto type = impl_->check(data, "allreduce");
  if (!type)
    return type.error();
  return impl_->run("ncclAllReduce", data, [&] {
    return ncclAllReduce(data.raw_data(), data.raw_data(), static_cast<std::size_t>(data.numel()), *type,
                         nccl_op_of(op), impl_->comm, impl_->stream.get());
  });
}

expected<tensor> nccl_communicator::reduce_scatter(const tensor& input, reduce_op op) {
  auto type = impl_->check(input, "reduce_scatter");
  if (!type)
    return type.error();
  const auto n = static_cast<std::int64_t>(impl_->size);
  if (input.numel() % n != 0)
    return make_error(errc::invalid_argument,
                      "nccl_communicator: reduce_scatter: {} elements do not split into {} equal blocks",
                      input.numel(), n);
  auto out = impl_->allocate(input.numel() / n, input.type(), "reduce_scatter");
  if (!out)
    return out.error();
  auto ok = impl_->run("ncclReduceScatter", input, [&] {
    return ncclReduceScatter(input.raw_data(), out->raw_data(), static_cast<std::size_t>(out->numel()), *type,
                             nccl_op_of(op), impl_->comm, impl_->stream.get());
  });
  if (!ok)
    return ok.error();
  return out;
}

expected<tensor> nccl_communicator::all_gather(const tensor& mine) {
  auto type = impl_->check(mine, "all_gather");
  if (!type)
    return type.error();
  auto out = impl_->allocate(mine.numel() * static_cast<std::int64_t>(impl_->size), mine.type(), "all_gather");
  if (!out)
    return out.error();
  auto ok = impl_->run("ncclAllGather", mine, [&] {
    return ncclAllGather(mine.raw_data(), out->raw_data(), static_cast<std::size_t>(mine.numel()), *type,
                         impl_->comm, impl_->stream.get());
  });
  if (!ok)
    return ok.error();
  return out;
}

expected<void> nccl_communicator::broadcast(const tensor& data, std::uint32_t root) {
  auto type = impl_->check(data, "broadcast");
  if (!type)
    return type.error();
  if (root >= impl_->size)
    return make_error(errc::invalid_argument, "nccl_communicator: broadcast: root {} is outside the group of {}",
                      root, impl_->size);
  return impl_->run("ncclBroadcast", data, [&] {
    return ncclBroadcast(data.raw_data(), data.raw_data(), static_cast<std::size_t>(data.numel()), *type,
                         static_cast<int>(root), impl_->comm, impl_->stream.get());
  });
}

} // namespace troupe::parallel
