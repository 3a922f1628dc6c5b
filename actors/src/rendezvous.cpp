#include "troupe/actors/rendezvous.hpp"

#include <charconv>

extern char** environ;

namespace troupe::actors {

environment current_environment() {
  environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view text(*entry);
    auto eq = text.find('=');
    if (eq != std::string_view::npos)
      env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

std::string endpoint::to_string() const {
  if (host.find(':') != std::string::npos)
    return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

troupe::expected<std::uint32_t> parse_count(std::string_view text, std::string_view what) {
  std::uint32_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size())
    return make_error(errc::invalid_argument, "{}=\"{}\" is not a non-negative integer", what, text);
  return value;
}

troupe::expected<endpoint> parse_endpoint(std::string_view text, std::string_view what) {
  std::string_view host;
  std::string_view port_text;
  if (text.starts_with('[')) {
    auto close = text.find("]:");
    if (close == std::string_view::npos)
      return make_error(errc::invalid_argument, "{}=\"{}\" is not host:port ([v6-address]:port for IPv6)", what,
                        text);
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos)
      return make_error(errc::invalid_argument, "{}=\"{}\" is not host:port (no ':')", what, text);
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (host.empty())
    return make_error(errc::invalid_argument, "{}=\"{}\" has an empty host", what, text);
  std::uint32_t port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc{} || end != port_text.data() + port_text.size() || port > 65535)
    return make_error(errc::invalid_argument, "{}=\"{}\": port \"{}\" is not in [0, 65535]", what, text, port_text);
  return endpoint{std::string(host), static_cast<std::uint16_t>(port)};
}

troupe::expected<rendezvous> rendezvous::from(const environment& env) {
  rendezvous result;
  auto get = [&](const char* key) -> const std::string* {
    // An empty variable counts as unset (`TROUPE_COORDINATOR= prog`).
    auto i = env.find(key);
    return i == env.end() || i->second.empty() ? nullptr : &i->second;
  };
  // The launcher's variables win over the batch system's.
  const std::pair<const char*, const char*> sources[] = {
    {env_rank, env_world_size}, {"SLURM_PROCID", "SLURM_NTASKS"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}};
  for (auto [rank_var, size_var] : sources) {
    auto rank = get(rank_var);
    auto size = get(size_var);
    if (!rank && !size)
      continue;
    if (rank) {
      auto value = parse_count(*rank, rank_var);
      if (!value)
        return value.error();
      result.rank = *value;
    }
    if (size) {
      auto value = parse_count(*size, size_var);
      if (!value)
        return value.error();
      if (*value == 0)
        return make_error(errc::invalid_argument, "{}=\"0\": the world size must be at least 1", size_var);
      result.world_size = *value;
    }
    if (result.rank && result.world_size && *result.rank >= *result.world_size)
      return make_error(errc::invalid_argument, "{}={} is not below {}={}", rank_var, *result.rank, size_var,
                        *result.world_size);
    break;
  }
  if (auto text = get(env_coordinator)) {
    auto value = parse_endpoint(*text, env_coordinator);
    if (!value)
      return value.error();
    result.coordinator = *value;
  }
  if (auto text = get(env_node_name))
    result.node_name = *text;
  if (auto text = get(env_restart)) {
    auto value = parse_count(*text, env_restart);
    if (!value)
      return value.error();
    result.restart = *value;
  }
  return result;
}

} // namespace troupe::actors
