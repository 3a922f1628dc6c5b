#pragma once
// What troupe-launch runs: from a rank count, an optional hosts file and the
// program, one command per rank with the rendezvous variables set
// (rendezvous.hpp). Local ranks run the program directly with the variables
// in their environment; ranks on other hosts run
// `ssh -o BatchMode=yes HOST -- 'cd DIR && exec sh -c REMOTE_RANK ... env VARS program args'`,
// where REMOTE_RANK (launcher.cpp) ties the remote process group's life to
// ssh's standard input: the launcher holds that pipe open while the rank
// should run, writes the job token into it (never onto a command line that
// `ps` shows on the remote host), and when the pipe ends (the launcher
// stopped the rank, was interrupted or died) the remote rank is sent SIGTERM,
// then SIGKILL after the grace period.
// Kept apart from the process handling (actors/tools/launch.cpp) so tests
// can check the command lines without starting anything.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/actors/rendezvous.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

/// One line of a hosts file: `host [slots=N]`.
struct host_slots {
  std::string host;
  std::uint32_t slots = 1;
  friend bool operator==(const host_slots&, const host_slots&) = default;
};

/// Parses a hosts file's text (`#` starts a comment); `file` names it in
/// errors ("hosts:3: ...").
troupe::expected<std::vector<host_slots>> parse_hosts(std::string_view text, std::string_view file);

/// localhost, 127.x.y.z, ::1 and this machine's host name.
bool is_local_host(std::string_view host);

struct launch_request {
  std::uint32_t ranks = 1;
  std::vector<host_slots> hosts;     ///< empty: every rank on this host
  std::uint16_t port = 0;            ///< the coordinator's port
  std::vector<std::string> program;  ///< program and arguments
  std::string working_directory;     ///< where remote ranks cd to
  /// The job's secret, given to every rank as TROUPE_JOB_TOKEN (node_options
  /// job_token); empty: none.
  std::string job_token;
  /// Which run of the job this is, given to every rank as TROUPE_RESTART:
  /// 0 the first, k after k restarts (troupe-launch --restarts). A rank
  /// reads it as job::restart() to know it should resume from its latest
  /// checkpoint.
  std::uint32_t restart = 0;
  /// The ssh client and its options, as words (troupe-launch --ssh): e.g.
  /// {"ssh", "-F", "cluster/ssh_config"}.
  std::vector<std::string> ssh{"ssh"};
  /// `NAME=value` pairs that remote ranks get in their environment before
  /// the rendezvous variables (local ranks inherit the launcher's
  /// environment instead): troupe-launch passes its TROUPE_*, UCX_*,
  /// OPENBLAS_* and OMP_* variables.
  std::vector<std::string> forwarded_env;
  /// How long a remote rank gets between SIGTERM and SIGKILL once its ssh
  /// session ends (troupe-launch --grace).
  double remote_grace_s = 1.5;
};

/// The variables troupe-launch passes on to remote ranks from `env`: those
/// named TROUPE_*, UCX_*, OPENBLAS_* or OMP_*, except the ones the launcher
/// sets itself (rendezvous variables and the job token).
std::vector<std::string> forwarded_variables(const environment& env);

/// How to start one rank.
struct rank_command {
  std::uint32_t rank = 0;
  std::string node_name;
  std::string host;
  bool remote = false;
  std::vector<std::string> env;  ///< VAR=value, added to the launcher's environment
  std::vector<std::string> argv; ///< what to exec
  /// For a remote rank: what the launcher writes into ssh's standard input
  /// (the job token's line), then holds open while the rank should run.
  std::string stdin_text;
};

/// One command per rank; rank 0 is the coordinator. Ranks fill the hosts'
/// slots in order. Errors: no program, zero ranks, more ranks than slots.
troupe::expected<std::vector<rank_command>> plan_launch(const launch_request& request);

/// Quotes `text` for a POSIX shell (unchanged when it is safe as is).
std::string shell_quote(std::string_view text);

/// The argv as one shell-quoted line (for dry runs and logs).
std::string shell_line(const std::vector<std::string>& argv);

} // namespace troupe::actors
