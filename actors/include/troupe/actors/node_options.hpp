#pragma once
// Everything a node needs to start, from (lowest to highest precedence)
// defaults, an optional config file, the environment and the command line.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "troupe/actors/device_map.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/actors/tls.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

/// CAF scheduler settings. Measured on the 2-core development machine
/// (figures in node.cpp): the sharing policy with one worker per core gave
/// the lowest small-message round trip between processes, 58-80 us against
/// 213 us for CAF's default work stealing.
struct scheduler_options {
  std::string policy = "sharing"; ///< "sharing" or "stealing"
  std::uint32_t max_threads = 0;  ///< 0: one per core (CAF's own default is max(cores, 4))
  std::uint32_t middleman_workers = 0; ///< 0: CAF's default
};

struct node_options {
  /// This node's name (`worker1`); default `worker<rank>`.
  std::string name;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  /// Which run of the job this is: 0 the first, k after troupe-launch
  /// restarted it k times (TROUPE_RESTART).
  std::uint32_t restart = 0;
  /// The coordinator (rank 0). Rank 0 listens on its port; with port 0 it
  /// picks a free one (node::port() tells which).
  endpoint coordinator{"127.0.0.1", 0};
  /// The port a non-coordinator node listens on (0: pick a free one).
  std::uint16_t port = 0;
  /// The address to listen on; empty: the coordinator's host when that is a
  /// loopback address (a job on this host stays on loopback), all
  /// interfaces otherwise. The data plane's TCP lanes use the interface of
  /// this address (network_interface.hpp) unless UCX_NET_DEVICES is set.
  std::string listen_address;
  /// A one-process job that no other process joins (world size 1): no
  /// control-plane listener, no data plane and no shared arena, so the job
  /// opens no socket at all (job::local()).
  bool local_only = false;

  /// BASP heartbeats, on every node. A peer silent for `heartbeat_timeout`
  /// is declared lost; the timeout must exceed the time to drain the largest
  /// send queue (500 ms gave false disconnects under 64 MiB transfers).
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds heartbeat_timeout{5000};
  /// How long a non-coordinator keeps trying to reach the coordinator.
  std::chrono::milliseconds join_timeout{30000};
  /// The bound on every request the node makes for you (lookup, spawn).
  std::chrono::milliseconds request_timeout{10000};

  tls_options tls;
  /// The job's shared secret (TROUPE_JOB_TOKEN; troupe-launch makes a random
  /// one per job): every control-plane connection must carry it before CAF
  /// sees a byte, and the data plane's frames carry it too. Empty: a fixed
  /// value, which still turns away clients that do not speak troupe but
  /// proves no membership; a job reachable from other hosts sets one.
  std::string job_token;
  scheduler_options scheduler;
  /// Per destination node: where tensors from this node's devices land.
  std::map<std::string, device_map> device_maps;
  /// The shared arena for tensors to nodes on this host (tensor_router.hpp):
  /// its size (0: none) and the smallest heap tensor copied into it.
  std::uint64_t arena_bytes = std::uint64_t{1} << 30;
  std::uint64_t arena_copy_min_bytes = std::uint64_t{64} << 10;
  /// How long the data plane's thread polls after its last work before it
  /// sleeps (data_plane_options::spin_before_sleep); 0: never poll, not
  /// even while a large transfer is under way (spin_while_transferring).
  std::chrono::microseconds data_plane_spin{50};
  /// Tensors to a node on another host up to this many bytes go eagerly,
  /// not by rendezvous (data_plane_options::network_eager_bytes); 0: by
  /// rendezvous from 64 KiB, as on this host. At most 1 GiB.
  std::uint64_t network_eager_bytes = std::uint64_t{4} << 20;
  /// Freed heap memory the process keeps mapped so eager messages do not
  /// land in fresh pages (data_plane_options::keep_freed_heap_bytes, a
  /// process-wide malloc setting); 0 leaves malloc alone. At most 2 GiB.
  std::uint64_t keep_freed_heap_bytes = std::uint64_t{256} << 20;
  /// Threads one CPU op of this process may use (intra_op_threads.hpp); 0
  /// leaves the process's setting (1 unless the program changed it).
  std::uint32_t intra_op_threads = 0;
  /// How reducer groups run their collectives over messages when the
  /// program leaves reducer_group_options::messages unset: "ring",
  /// "halving-doubling" or "automatic" (troupe/parallel/reducer_group.hpp).
  /// A job-wide knob, like NCCL_ALGO: it changes the algorithm without
  /// rebuilding the program. Every rank of a job must give the same.
  std::string collectives = "automatic";

  bool is_coordinator() const { return rank == 0; }

  /// Checks the combination (rank < world size, timeouts ordered, a
  /// coordinator port for ranks > 0, ...).
  troupe::expected<void> validate() const;

  /// Builds options from the command line and environment. Recognised
  /// flags are `--troupe.<key>=<value>` and `--troupe.<key> <value>`; other
  /// arguments belong to the program and are ignored. Keys: name, rank,
  /// world-size, coordinator (host:port), port, listen-address,
  /// heartbeat-interval, heartbeat-timeout, join-timeout, request-timeout
  /// (durations: 500ms, 5s, 1.5s, 2m; a bare number is milliseconds),
  /// tls.certificate, tls.key, tls.ca, tls.passphrase, job-token, scheduler.policy,
  /// scheduler.max-threads, middleman.workers, arena-bytes,
  /// arena-copy-min-bytes, network-eager-bytes, keep-freed-heap-bytes (byte counts), data-plane-spin (a duration, `50us`;
  /// at most 10ms), intra-op-threads (1 to 1024), collectives (ring,
  /// halving-doubling or automatic), device-map.<node>
  /// (`cpu->cpu,cuda:0->cuda:1`) and config (a file of `key = value` lines
  /// with the same keys; also TROUPE_CONFIG). Every bad value is an
  /// invalid_argument error naming the flag, variable or file line.
  static troupe::expected<node_options> from(int argc, const char* const* argv,
                                             const environment& env = current_environment());

  /// Applies one `key`/`value`; `source` names it in errors.
  troupe::expected<void> set(std::string_view key, std::string_view value, std::string_view source);
};

/// Parses `500ms`, `5s`, `1.5s`, `2m`, `50us` or a bare number of
/// milliseconds, rounded to whole milliseconds.
troupe::expected<std::chrono::milliseconds> parse_duration(std::string_view text,
                                                           std::string_view what);
/// The same grammar, rounded to whole microseconds.
troupe::expected<std::chrono::microseconds> parse_duration_us(std::string_view text,
                                                              std::string_view what);

} // namespace troupe::actors
