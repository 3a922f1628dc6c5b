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

} // namespace

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
    if (!request.job_token.empty())
      command.env.push_back("TROUPE_JOB_TOKEN=" + request.job_token);
    if (!command.remote) {
      command.argv = request.program;
    } else {
      // ssh joins its arguments into one line for the remote shell, so the
      // remote command is built and quoted here, once.
      std::vector<std::string> remote{"env"};
      remote.insert(remote.end(), command.env.begin(), command.env.end());
      remote.insert(remote.end(), request.program.begin(), request.program.end());
      auto line = shell_line(remote);
      if (!request.working_directory.empty())
        line = "cd " + shell_quote(request.working_directory) + " && " + line;
      command.argv = {"ssh", "-o", "BatchMode=yes", command.host, "--", line};
    }
    commands.push_back(std::move(command));
  }
  return commands;
}

} // namespace troupe::actors
