// The stand-in NCCL (nccl.h): communicators of members that are threads of
// one process, on devices of the stand-in runtime.
//
// A collective is matched across members by its place in each member's
// sequence of calls, as NCCL matches them. Each call records its buffers;
// the last member to call runs the whole collective at once, under the
// runtime's lock, and every member's stream holds a marker that is ready
// once it has. troupe's communicator waits for its input before the call
// and polls its stream (cudaStreamQuery) after it, so the buffers are final
// when the last member arrives, and nobody waits for a marker under the
// runtime's lock (which would wait forever, and aborts instead). The
// runtime's lock guards the communicators too.
// Members that differ in a collective's kind, count or type fail it with
// ncclInvalidUsage; an aborted member leaves the others a remote error.
// A communicator belongs to the device current at its initialisation: a
// collective's stream and buffers must be on it (ncclInvalidArgument).
#include "nccl.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

enum class kind { all_reduce, reduce_scatter, all_gather, broadcast };

struct contribution {
  const void* send = nullptr;
  void* receive = nullptr;
};

/// What a member asks for; every member must ask the same.
struct call {
  kind what;
  std::size_t count; // per member: its receive count (all_gather: its send count)
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  bool operator==(const call&) const = default;
};

struct collective {
  call asked;
  std::vector<contribution> parts;
  std::vector<bool> released; // per member: its marker is ready
  int arrived = 0;
  bool mismatched = false;
};

struct group {
  int ranks = 0;
  std::vector<ncclComm*> members;
  int joined = 0;
  std::map<std::uint64_t, std::shared_ptr<collective>> pending; // by sequence
};

} // namespace

struct ncclComm {
  std::shared_ptr<group> members;
  int rank = 0;
  int device = 0; // current at its initialisation
  std::uint64_t sequence = 0; // of this member's next collective
  ncclResult_t async = ncclSuccess;
  std::string last_error;
  bool aborted = false;
};

namespace {

std::map<std::string, std::shared_ptr<group>>& groups() {
  static auto* all = new std::map<std::string, std::shared_ptr<group>>;
  return *all;
}

std::size_t element_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}

bool supported(ncclDataType_t type) {
  return type == ncclUint8 || type == ncclInt32 || type == ncclInt64 || type == ncclFloat32 || type == ncclFloat64 ||
         type == ncclBfloat16;
}

double load(const void* base, std::size_t i, ncclDataType_t type) {
  switch (type) {
    case ncclUint8: return static_cast<const std::uint8_t*>(base)[i];
    case ncclInt32: return static_cast<const std::int32_t*>(base)[i];
    case ncclInt64: return static_cast<double>(static_cast<const std::int64_t*>(base)[i]);
    case ncclFloat32: return static_cast<const float*>(base)[i];
    case ncclBfloat16: {
      std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(base)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    default: return static_cast<const double*>(base)[i];
  }
}

void store(void* base, std::size_t i, ncclDataType_t type, double value) {
  switch (type) {
    case ncclUint8: static_cast<std::uint8_t*>(base)[i] = static_cast<std::uint8_t>(value); return;
    case ncclInt32: static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(value); return;
    case ncclInt64: static_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(value); return;
    case ncclFloat32: static_cast<float*>(base)[i] = static_cast<float>(value); return;
    case ncclBfloat16: {
      // Rounded to nearest, ties to even, from float.
      const float f = static_cast<float>(value);
      std::uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      bits += 0x7fffu + ((bits >> 16) & 1u);
      static_cast<std::uint16_t*>(base)[i] = static_cast<std::uint16_t>(bits >> 16);
      return;
    }
    default: static_cast<double*>(base)[i] = value; return;
  }
}

/// Reduces element `i` of every member's send buffer (at `offset` blocks).
double reduced(const collective& c, std::size_t i) {
  double sum = 0;
  for (const auto& part : c.parts)
    sum += load(part.send, i, c.asked.type);
  return c.asked.op == ncclAvg ? sum / static_cast<double>(c.parts.size()) : sum;
}

/// Runs a collective every member has called. Results go to a copy first:
/// a member's receive buffer may be its send buffer, or another's input.
void perform(const collective& c) {
  const auto n = c.parts.size();
  const auto count = c.asked.count;
  const auto type = c.asked.type;
  const auto bytes = element_bytes(type);
  switch (c.asked.what) {
    case kind::all_reduce: {
      std::vector<double> result(count);
      for (std::size_t i = 0; i < count; ++i)
        result[i] = reduced(c, i);
      for (const auto& part : c.parts)
        for (std::size_t i = 0; i < count; ++i)
          store(part.receive, i, type, result[i]);
      return;
    }
    case kind::reduce_scatter: {
      std::vector<double> result(count * n);
      for (std::size_t i = 0; i < count * n; ++i)
        result[i] = reduced(c, i);
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t i = 0; i < count; ++i)
          store(c.parts[r].receive, i, type, result[r * count + i]);
      return;
    }
    case kind::all_gather: {
      std::vector<char> gathered(count * n * bytes);
      for (std::size_t q = 0; q < n; ++q)
        std::memcpy(gathered.data() + q * count * bytes, c.parts[q].send, count * bytes);
      for (const auto& part : c.parts)
        std::memcpy(part.receive, gathered.data(), gathered.size());
      return;
    }
    case kind::broadcast: {
      std::vector<char> root(count * bytes);
      std::memcpy(root.data(), c.parts[static_cast<std::size_t>(c.asked.root)].send, root.size());
      for (const auto& part : c.parts)
        std::memcpy(part.receive, root.data(), root.size());
      return;
    }
  }
}

bool fully_released(const collective& c) {
  for (bool released : c.released)
    if (!released)
      return false;
  return true;
}

ncclResult_t refuse(ncclComm_t comm, ncclResult_t result, std::string why) {
  if (comm != nullptr)
    comm->last_error = std::move(why);
  return result;
}

/// Records this member's part of its next collective; the last member to
/// arrive runs it. The member's stream gets a marker, ready when it ran.
ncclResult_t join_collective(ncclComm_t comm, call asked, contribution part, cudaStream_t stream) {
  std::lock_guard lock(cuda_on_host::runtime_lock());
  if (comm == nullptr)
    return ncclInvalidArgument;
  if (comm->aborted)
    return refuse(comm, ncclInvalidUsage, "the communicator was aborted");
  if (!supported(asked.type))
    return refuse(comm, ncclInvalidArgument, "unsupported data type");
  // NCCL's argument checks: the stream and the buffers on the
  // communicator's device.
  if (cuda_on_host::device_of(stream) != comm->device)
    return refuse(comm, ncclInvalidArgument, "the stream is not on the communicator's device");
  for (const void* buffer : {part.send, static_cast<const void*>(part.receive)})
    if (buffer != nullptr && cuda_on_host::device_of_memory(buffer) != comm->device)
      return refuse(comm, ncclInvalidArgument, "a buffer is not on the communicator's device");
  auto& g = *comm->members;
  if (g.joined < g.ranks)
    return refuse(comm, ncclInvalidUsage, "the communicator is not initialised");
  auto& slot = g.pending[comm->sequence++];
  if (!slot) {
    slot = std::make_shared<collective>();
    slot->asked = asked;
    slot->parts.resize(static_cast<std::size_t>(g.ranks));
    slot->released.assign(static_cast<std::size_t>(g.ranks), false);
  } else if (!(slot->asked == asked)) {
    slot->mismatched = true;
  }
  auto c = slot;
  c->parts[static_cast<std::size_t>(comm->rank)] = part;
  const int rank = comm->rank;
  cuda_on_host::enqueue_when(stream, [c, rank] { return static_cast<bool>(c->released[static_cast<std::size_t>(rank)]); },
                             [] {});
  if (++c->arrived < g.ranks)
    return ncclSuccess;
  if (c->mismatched) {
    // Not released: each member learns it from its asynchronous error and
    // aborts, which releases its marker.
    for (auto* member : g.members)
      if (member != nullptr) {
        member->async = ncclInvalidUsage;
        member->last_error = "members called different collectives (kind, count, type, operation or root)";
      }
    return ncclSuccess;
  }
  perform(*c);
  c->released.assign(c->released.size(), true);
  for (auto it = g.pending.begin(); it != g.pending.end();)
    it = fully_released(*it->second) ? g.pending.erase(it) : std::next(it);
  return ncclSuccess;
}

} // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<std::uint64_t> drawn{0};
  std::memset(id->internal, 0, sizeof id->internal);
  const auto name = "troupe-nccl-on-host-" + std::to_string(::getpid()) + "-" + std::to_string(++drawn);
  std::memcpy(id->internal, name.data(), name.size());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int ranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  std::lock_guard lock(cuda_on_host::runtime_lock());
  *comm = nullptr;
  if (ranks < 1 || rank < 0 || rank >= ranks)
    return ncclInvalidArgument;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess)
    return ncclUnhandledCudaError;
  auto& g = groups()[std::string(id.internal, sizeof id.internal)];
  if (!g) {
    g = std::make_shared<group>();
    g->ranks = ranks;
    g->members.assign(static_cast<std::size_t>(ranks), nullptr);
  }
  if (g->ranks != ranks || g->members[static_cast<std::size_t>(rank)] != nullptr)
    return ncclInvalidUsage;
  auto* made = new ncclComm;
  made->members = g;
  made->rank = rank;
  made->device = device;
  g->members[static_cast<std::size_t>(rank)] = made;
  ++g->joined;
  *comm = made;
  // Non-blocking, as troupe asks: the others are waited for by polling.
  const bool blocking = config == nullptr || config->blocking != 0;
  if (blocking && g->joined < g->ranks)
    return refuse(made, ncclInvalidUsage, "a blocking join is not emulated (members are threads)");
  return g->joined < g->ranks ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  std::lock_guard lock(cuda_on_host::runtime_lock());
  if (comm == nullptr)
    return ncclInvalidArgument;
  if (comm->async != ncclSuccess)
    *state = comm->async;
  else
    *state = comm->members->joined < comm->members->ranks ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm != nullptr ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  std::lock_guard lock(cuda_on_host::runtime_lock());
  if (comm == nullptr)
    return ncclInvalidArgument;
  comm->members->members[static_cast<std::size_t>(comm->rank)] = nullptr;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  std::lock_guard lock(cuda_on_host::runtime_lock());
  if (comm == nullptr)
    return ncclInvalidArgument;
  // Its own markers are released (its stream can be destroyed); the other
  // members learn of it from their asynchronous error.
  for (auto& [sequence, c] : comm->members->pending)
    c->released[static_cast<std::size_t>(comm->rank)] = true;
  for (auto* member : comm->members->members)
    if (member != nullptr && member != comm && member->async == ncclSuccess) {
      member->async = ncclRemoteError;
      member->last_error = "another member aborted its communicator";
    }
  comm->members->members[static_cast<std::size_t>(comm->rank)] = nullptr;
  delete comm;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  std::lock_guard lock(cuda_on_host::runtime_lock());
  return comm != nullptr ? comm->last_error.c_str() : "";
}

ncclResult_t ncclAllReduce(const void* send, void* receive, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return join_collective(comm, {kind::all_reduce, count, type, op, 0}, {send, receive},
                         stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* receive, std::size_t receive_count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return join_collective(comm, {kind::reduce_scatter, receive_count, type, op, 0},
                         {send, receive}, stream);
}

ncclResult_t ncclAllGather(const void* send, void* receive, std::size_t send_count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return join_collective(comm, {kind::all_gather, send_count, type, ncclSum, 0}, {send, receive},
                         stream);
}

ncclResult_t ncclBroadcast(const void* send, void* receive, std::size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  if (comm != nullptr && (root < 0 || root >= comm->members->ranks))
    return refuse(comm, ncclInvalidArgument, "root outside the communicator");
  return join_collective(comm, {kind::broadcast, count, type, ncclSum, root},
                         {send, receive}, stream);
}
