#pragma once
// The rendezvous variables a process reads to find its place in a job: its
// rank, the world size, the coordinator's address and its node name. The
// launcher sets the TROUPE_* ones; Slurm and Open MPI set their own.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

inline constexpr const char* env_coordinator = "TROUPE_COORDINATOR";
inline constexpr const char* env_rank = "TROUPE_RANK";
inline constexpr const char* env_world_size = "TROUPE_WORLD_SIZE";
inline constexpr const char* env_node_name = "TROUPE_NODE_NAME";
inline constexpr const char* env_config = "TROUPE_CONFIG";
/// Which run of the job this is (troupe-launch --restarts): 0, 1, ...
inline constexpr const char* env_restart = "TROUPE_RESTART";

/// A snapshot of environment variables (tests pass their own).
using environment = std::map<std::string, std::string, std::less<>>;

/// The variables of this process.
environment current_environment();

/// A `host:port` pair.
struct endpoint {
  std::string host;
  std::uint16_t port = 0;
  std::string to_string() const;
  friend bool operator==(const endpoint&, const endpoint&) = default;
};

/// Parses `host:port` (`[v6addr]:port` too); `what` names the source in the
/// error ("TROUPE_COORDINATOR", "--troupe.coordinator").
troupe::expected<endpoint> parse_endpoint(std::string_view text, std::string_view what);

/// What the environment says; unset fields stay empty.
struct rendezvous {
  std::optional<std::uint32_t> rank;
  std::optional<std::uint32_t> world_size;
  std::optional<endpoint> coordinator;
  std::optional<std::string> node_name;
  std::optional<std::uint32_t> restart;

  /// Reads TROUPE_RANK / TROUPE_WORLD_SIZE, else SLURM_PROCID / SLURM_NTASKS,
  /// else OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE, and TROUPE_COORDINATOR,
  /// TROUPE_NODE_NAME and TROUPE_RESTART. A set but malformed variable is an
  /// error naming it.
  static troupe::expected<rendezvous> from(const environment& env);
};

/// Parses a non-negative integer; the error names `what` and quotes `text`.
troupe::expected<std::uint32_t> parse_count(std::string_view text, std::string_view what);

} // namespace troupe::actors
