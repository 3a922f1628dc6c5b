#include "troupe/actors/launcher.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <map>

namespace troupe::actors {

namespace {

std::string_view trim(std::string_view text) {
  auto begin = text.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos)
    return {};
  auto end = text.find_last_not_of(" \t\r");
  return text.substr(begin, end - begin + 1);
}

// A host name as a node name: [A-Za-z0-9._-] only (IPv6 colons become '-').
std::string node_name_of(std::string_view host) {
  std::string name(host);
  for (auto& c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      c = '-';
  return name;
}

// What a remote rank runs under ssh (`sh -c REMOTE_RANK remote-rank GRACE
// command...`). ssh alone cannot stop a remote program: when the client
// dies, sshd closes the session but sends the command no signal, so a rank
// would run on, orphaned. The launcher therefore holds ssh's standard input
// open for as long as the rank should run, and this script:
//  1. reads the job token's line from standard input (a token on the
//     command line would be readable by anyone on the host through `ps`);
//  2. starts the rank in a session and process group of its own (setsid
//     execs in place in a background child, so the child's pid is the
//     group's id);
//  3. watches standard input in the background: at its end (the launcher
//     closed it, or ssh or the launcher died) the rank's group gets SIGTERM,
//     then SIGKILL once GRACE tenths of a second have passed, polling so the
//     watcher ends as soon as the rank has. The watcher ignores SIGTERM,
//     SIGHUP and SIGINT: a signal that ends the script (a hang-up, a kill of
//     the session's group) must not end the one process that can still
//     stop the rank;
//  4. waits for the rank, kills whatever it left in its group, and exits
//     with the rank's status, which ssh hands back to the launcher.
constexpr const char* remote_rank_script =
  "IFS= read -r token || exit 125; export TROUPE_JOB_TOKEN=\"$token\"; tenths=$1; shift; "
  "exec 3<&0; setsid \"$@\" 3<&- & rank=$!; "
  "{ trap \"\" TERM HUP INT; while IFS= read -r _ <&3; do :; done; "
  "kill -TERM -$rank 2>/dev/null || kill -TERM $rank 2>/dev/null; "
  "i=0; while kill -0 $rank 2>/dev/null && [ $i -lt $tenths ]; do sleep 0.1; i=$((i+1)); done; "
  "kill -KILL -$rank 2>/dev/null; } >/dev/null 2>&1 & watcher=$!; exec 3<&-; "
  "wait $rank; status=$?; kill -KILL $watcher 2>/dev/null; kill -KILL -$rank 2>/dev/null; exit $status";

bool is_launcher_variable(std::string_view name) {
  return name == env_coordinator || name == env_rank || name == env_world_size || name == env_node_name ||
         name == env_restart || name == "TROUPE_JOB_TOKEN";
}

} // namespace

std::vector<std::string> forwarded_variables(const environment& env) {
  std::vector<std::string> forwarded;
  for (auto& [name, value] : env) {
    bool wanted = name.starts_with("TROUPE_") || name.starts_with("UCX_") || name.starts_with("OPENBLAS_") ||
                  name.starts_with("OMP_");
    if (wanted && !is_launcher_variable(name))
      forwarded.push_back(name + "=" + value);
  }
  return forwarded;
}

troupe::expected<std::vector<host_slots>> parse_hosts(std::string_view text, std::string_view file) {
  std::vector<host_slots> hosts;
  int number = 0;
  while (!text.empty()) {
    ++number;
    auto newline = text.find('\n');
    auto line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view{} : text.substr(newline + 1);
    if (auto hash = line.find('#'); hash != std::string_view::npos)
      line = line.substr(0, hash);
    line = trim(line);
    if (line.empty())
      continue;
    auto space = line.find_first_of(" \t");
    host_slots entry{std::string(line.substr(0, space)), 1};
    if (space != std::string_view::npos) {
      auto rest = trim(line.substr(space));
      if (!rest.starts_with("slots="))
        return make_error(errc::invalid_argument, "{}:{}: \"{}\" is not `host [slots=N]`", file, number, line);
      auto digits = rest.substr(6);
      std::uint32_t slots = 0;
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), slots);
      if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() || slots == 0)
        return make_error(errc::invalid_argument, "{}:{}: slots=\"{}\" is not a positive integer", file, number,
                          digits);
      entry.slots = slots;
    }
    hosts.push_back(std::move(entry));
  }
  if (hosts.empty())
    return make_error(errc::invalid_argument, "{}: no hosts listed", file);
  return hosts;
}

bool is_local_host(std::string_view host) {
  if (host == "localhost" || host == "::1" || host.starts_with("127."))
    return true;
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 && host == name;
}

std::string shell_quote(std::string_view text) {
  bool safe = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("@%_+=:,./-").find(c) != std::string_view::npos;
  });
  if (safe)
    return std::string(text);
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'')
      quoted += "'\\''";
    else
      quoted += c;
  }
  return quoted + "'";
}

std::string shell_line(const std::vector<std::string>& argv) {
  std::string line;
  for (auto& arg : argv) {
    if (!line.empty())
      line += ' ';
    line += shell_quote(arg);
  }
  return line;
}

troupe::expected<std::vector<rank_command>> plan_launch(const launch_request& request) {
  if (request.program.empty())
    return make_error(errc::invalid_argument, "no program to launch (put it after --)");
  if (request.ranks == 0)
    return make_error(errc::invalid_argument, "the number of ranks (-n) must be at least 1");
  // Rank -> host, filling each host's slots in order.
  std::vector<std::string> rank_hosts;
  if (request.hosts.empty()) {
    rank_hosts.assign(request.ranks, "localhost");
  } else {
    for (auto& entry : request.hosts)
      for (std::uint32_t slot = 0; slot < entry.slots && rank_hosts.size() < request.ranks; ++slot)
        rank_hosts.push_back(entry.host);
    if (rank_hosts.size() < request.ranks)
      return make_error(errc::invalid_argument, "{} ranks requested but the hosts file has only {} slots",
                        request.ranks, rank_hosts.size());
  }
  bool all_local = std::all_of(rank_hosts.begin(), rank_hosts.end(), [](auto& h) { return is_local_host(h); });
  std::string coordinator_host = rank_hosts[0];
  if (all_local) {
    coordinator_host = "127.0.0.1";
  } else if (is_local_host(coordinator_host)) {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    coordinator_host = name;
  }
  auto coordinator = endpoint{coordinator_host, request.port}.to_string();
  std::map<std::string, std::uint32_t> per_host;
  for (auto& host : rank_hosts)
    ++per_host[host];
  std::map<std::string, std::uint32_t> next_index;
  std::vector<rank_command> commands;
  for (std::uint32_t rank = 0; rank < request.ranks; ++rank) {
    rank_command command;
    command.rank = rank;
    command.host = rank_hosts[rank];
    command.remote = !is_local_host(command.host);
    if (request.hosts.empty())
      command.node_name = "worker" + std::to_string(rank);
    else if (per_host[command.host] == 1)
      command.node_name = node_name_of(command.host);
    else
      command.node_name = node_name_of(command.host) + "-" + std::to_string(next_index[command.host]++);
    command.env = {std::string(env_coordinator) + "=" + coordinator, std::string(env_rank) + "=" + std::to_string(rank),
                   std::string(env_world_size) + "=" + std::to_string(request.ranks),
                   std::string(env_node_name) + "=" + command.node_name,
                   std::string(env_restart) + "=" + std::to_string(request.restart)};
    if (!command.remote) {
      if (!request.job_token.empty())
        command.env.push_back("TROUPE_JOB_TOKEN=" + request.job_token);
      command.argv = request.program;
    } else {
      // ssh joins its arguments into one line for the remote shell, so the
      // remote command is built and quoted here, once.
      const auto tenths = static_cast<long>(request.remote_grace_s * 10 + 0.5);
      std::vector<std::string> remote{"exec", "sh", "-c", remote_rank_script, "remote-rank", std::to_string(tenths),
                                      "env"};
      remote.insert(remote.end(), request.forwarded_env.begin(), request.forwarded_env.end());
      remote.insert(remote.end(), command.env.begin(), command.env.end());
      remote.insert(remote.end(), request.program.begin(), request.program.end());
      auto line = shell_line(remote);
      if (!request.working_directory.empty())
        line = "cd " + shell_quote(request.working_directory) + " && " + line;
      command.argv = request.ssh;
      command.argv.insert(command.argv.end(), {"-o", "BatchMode=yes", command.host, "--", line});
      command.stdin_text = request.job_token + "\n";
    }
    commands.push_back(std::move(command));
  }
  return commands;
}

} // namespace troupe::actors
