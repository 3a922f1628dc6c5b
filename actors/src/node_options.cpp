#include "troupe/actors/node_options.hpp"

#include <charconv>
#include <cmath>
#include <fstream>
#include <vector>

#include "troupe/actors/place.hpp"
#include "troupe/actors/shared_arena.hpp"

namespace troupe::actors {

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t' || text.front() == '\r'))
    text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r'))
    text.remove_suffix(1);
  return text;
}

troupe::expected<void> load_config_file(node_options& options, const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return make_error(errc::io_error, "config file \"{}\" cannot be read", path);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    auto text = trim(line);
    if (text.empty() || text.starts_with('#'))
      continue;
    auto eq = text.find('=');
    if (eq == std::string_view::npos)
      return make_error(errc::invalid_argument, "{}:{}: \"{}\" is not key = value", path, number, text);
    auto key = trim(text.substr(0, eq));
    if (key.starts_with("troupe."))
      key.remove_prefix(7);
    if (key == "config")
      return make_error(errc::invalid_argument, "{}:{}: a config file cannot name another one", path, number);
    auto where = fmt::format("{}:{}: {}", path, number, key);
    if (auto ok = options.set(key, trim(text.substr(eq + 1)), where); !ok)
      return ok;
  }
  return {};
}

struct flag {
  std::string key;
  std::string value;
  std::string source;
};

troupe::expected<std::vector<flag>> collect_flags(int argc, const char* const* argv) {
  std::vector<flag> flags;
  constexpr std::string_view prefix = "--troupe.";
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--")
      break;
    if (!arg.starts_with(prefix))
      continue;
    auto body = arg.substr(prefix.size());
    auto eq = body.find('=');
    if (eq != std::string_view::npos) {
      flags.push_back({std::string(body.substr(0, eq)), std::string(body.substr(eq + 1)), std::string(arg.substr(0, prefix.size() + eq))});
    } else if (i + 1 < argc) {
      flags.push_back({std::string(body), argv[++i], std::string(arg)});
    } else {
      return make_error(errc::invalid_argument, "{} needs a value ({}=VALUE or {} VALUE)", arg, arg, arg);
    }
  }
  return flags;
}

} // namespace

troupe::expected<std::chrono::microseconds> parse_duration_us(std::string_view text, std::string_view what) {
  auto fail = [&] {
    return make_error(errc::invalid_argument,
                      "{}=\"{}\" is not a duration (e.g. 500ms, 5s, 1.5s, 2m, 50us; a bare number is milliseconds)",
                      what, text);
  };
  auto digits_end = text.find_first_not_of("0123456789.");
  auto number = text.substr(0, digits_end);
  auto unit = digits_end == std::string_view::npos ? std::string_view{} : text.substr(digits_end);
  double value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || ec != std::errc{} || end != number.data() + number.size() || !std::isfinite(value))
    return fail();
  double scale = 0;
  if (unit.empty() || unit == "ms")
    scale = 1;
  else if (unit == "s")
    scale = 1000;
  else if (unit == "m" || unit == "min")
    scale = 60'000;
  else if (unit == "us")
    scale = 0.001;
  else
    return fail();
  auto ms = value * scale;
  if (ms > 24.0 * 3600 * 1000)
    return make_error(errc::invalid_argument, "{}=\"{}\" is longer than a day", what, text);
  return std::chrono::microseconds(static_cast<std::int64_t>(std::llround(ms * 1000)));
}

troupe::expected<std::chrono::milliseconds> parse_duration(std::string_view text, std::string_view what) {
  auto us = parse_duration_us(text, what);
  if (!us)
    return us.error();
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(static_cast<double>(us->count()) / 1000)));
}

troupe::expected<void> node_options::set(std::string_view key, std::string_view value, std::string_view source) {
  auto count = [&](std::uint32_t& out) -> troupe::expected<void> {
    auto parsed = parse_count(value, source);
    if (!parsed)
      return parsed.error();
    out = *parsed;
    return {};
  };
  auto duration = [&](std::chrono::milliseconds& out) -> troupe::expected<void> {
    auto parsed = parse_duration(value, source);
    if (!parsed)
      return parsed.error();
    if (parsed->count() <= 0)
      return make_error(errc::invalid_argument, "{}=\"{}\" must be positive", source, value);
    out = *parsed;
    return {};
  };
  if (key == "name") {
    if (auto ok = validate_node_name(value); !ok)
      return make_error(errc::invalid_argument, "{}: {}", source, ok.error().message());
    name = value;
    return {};
  }
  if (key == "rank")
    return count(rank);
  if (key == "world-size") {
    if (auto ok = count(world_size); !ok)
      return ok;
    if (world_size == 0)
      return make_error(errc::invalid_argument, "{}=\"0\": the world size must be at least 1", source);
    return {};
  }
  if (key == "coordinator") {
    auto parsed = parse_endpoint(value, source);
    if (!parsed)
      return parsed.error();
    coordinator = *parsed;
    return {};
  }
  if (key == "port") {
    std::uint32_t p = 0;
    if (auto ok = count(p); !ok)
      return ok;
    if (p > 65535)
      return make_error(errc::invalid_argument, "{}=\"{}\" is not in [0, 65535]", source, value);
    port = static_cast<std::uint16_t>(p);
    return {};
  }
  if (key == "listen-address") {
    listen_address = value;
    return {};
  }
  if (key == "heartbeat-interval")
    return duration(heartbeat_interval);
  if (key == "heartbeat-timeout")
    return duration(heartbeat_timeout);
  if (key == "join-timeout")
    return duration(join_timeout);
  if (key == "request-timeout")
    return duration(request_timeout);
  if (key == "tls.certificate") {
    tls.certificate = value;
    return {};
  }
  if (key == "tls.key") {
    tls.key = value;
    return {};
  }
  if (key == "tls.ca") {
    tls.ca_file = value;
    return {};
  }
  if (key == "tls.passphrase") {
    tls.passphrase = value;
    return {};
  }
  if (key == "job-token") {
    if (value.empty())
      return make_error(errc::invalid_argument, "{} is empty (leave it unset for no job token)", source);
    job_token = value;
    return {};
  }
  if (key == "scheduler.policy") {
    if (value != "sharing" && value != "stealing")
      return make_error(errc::invalid_argument, "{}=\"{}\" must be sharing or stealing", source, value);
    scheduler.policy = value;
    return {};
  }
  if (key == "scheduler.max-threads")
    return count(scheduler.max_threads);
  if (key == "middleman.workers")
    return count(scheduler.middleman_workers);
  if (key == "arena-bytes" || key == "arena-copy-min-bytes" || key == "network-eager-bytes" ||
      key == "keep-freed-heap-bytes") {
    // Plain decimal byte counts, 64-bit.
    std::uint64_t bytes = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), bytes);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty())
      return make_error(errc::invalid_argument, "{}=\"{}\" is not a byte count", source, value);
    if (key == "arena-bytes" && bytes > shared_arena::max_bytes)
      return make_error(errc::invalid_argument, "{}=\"{}\" is above the largest arena, {} bytes", source, value,
                        shared_arena::max_bytes);
    if (key == "network-eager-bytes" && bytes > (std::uint64_t{1} << 30))
      return make_error(errc::invalid_argument, "{}=\"{}\" is above 1 GiB", source, value);
    // glibc takes its trim threshold as an int.
    if (key == "keep-freed-heap-bytes" && bytes > (std::uint64_t{2} << 30) - 1)
      return make_error(errc::invalid_argument, "{}=\"{}\" is above 2 GiB", source, value);
    (key == "arena-bytes"             ? arena_bytes
     : key == "arena-copy-min-bytes"  ? arena_copy_min_bytes
     : key == "network-eager-bytes"   ? network_eager_bytes
                                      : keep_freed_heap_bytes) = bytes;
    return {};
  }
  if (key == "data-plane-spin") {
    auto parsed = parse_duration_us(value, source);
    if (!parsed)
      return parsed.error();
    if (*parsed > std::chrono::milliseconds(10))
      return make_error(errc::invalid_argument, "{}=\"{}\" is above 10ms (a poll that long is a busy core)", source,
                        value);
    data_plane_spin = *parsed;
    return {};
  }
  if (key == "intra-op-threads") {
    std::uint32_t threads = 0;
    if (auto ok = count(threads); !ok)
      return ok;
    if (threads < 1 || threads > 1024)
      return make_error(errc::invalid_argument, "{}=\"{}\" must be between 1 and 1024", source, value);
    intra_op_threads = threads;
    return {};
  }
  if (key == "collectives") {
    if (value != "ring" && value != "halving-doubling" && value != "automatic")
      return make_error(errc::invalid_argument, "{}=\"{}\" must be ring, halving-doubling or automatic", source,
                        value);
    collectives = value;
    return {};
  }
  if (key.starts_with("device-map.")) {
    auto destination = key.substr(11);
    if (auto ok = validate_node_name(destination); !ok)
      return make_error(errc::invalid_argument, "{}: {}", source, ok.error().message());
    auto parsed = device_map::parse(value);
    if (!parsed)
      return make_error(errc::invalid_argument, "{}: {}", source, parsed.error().message());
    device_maps[std::string(destination)] = *parsed;
    return {};
  }
  return make_error(errc::invalid_argument,
                    "{}: unknown option \"{}\" (known: name, rank, world-size, coordinator, port, listen-address, "
                    "heartbeat-interval, heartbeat-timeout, join-timeout, request-timeout, tls.certificate, "
                    "tls.key, tls.ca, tls.passphrase, job-token, scheduler.policy, scheduler.max-threads, middleman.workers, "
                    "arena-bytes, arena-copy-min-bytes, network-eager-bytes, keep-freed-heap-bytes, data-plane-spin, intra-op-threads, collectives, device-map.<node>, "
                    "config)",
                    source, key);
}

troupe::expected<void> node_options::validate() const {
  if (auto ok = validate_node_name(name); !ok)
    return ok;
  if (rank >= world_size)
    return make_error(errc::invalid_argument, "rank {} is not below the world size {}", rank, world_size);
  if (rank > 0 && coordinator.port == 0)
    return make_error(errc::invalid_argument,
                      "node {} (rank {}) needs the coordinator's address: set {}=host:port or "
                      "--troupe.coordinator=host:port",
                      name, rank, env_coordinator);
  if (local_only && world_size != 1)
    return make_error(errc::invalid_argument, "a local-only node is a job of one process, but the world size is {}",
                      world_size);
  if (heartbeat_timeout <= heartbeat_interval)
    return make_error(errc::invalid_argument, "heartbeat-timeout ({} ms) must exceed heartbeat-interval ({} ms)",
                      heartbeat_timeout.count(), heartbeat_interval.count());
  return {};
}

troupe::expected<node_options> node_options::from(int argc, const char* const* argv, const environment& env) {
  node_options options;
  auto flags = collect_flags(argc, argv);
  if (!flags)
    return flags.error();
  // Lowest precedence after the defaults: the config file.
  std::string config_path;
  if (auto i = env.find(env_config); i != env.end())
    config_path = i->second;
  for (auto& f : *flags)
    if (f.key == "config")
      config_path = f.value;
  if (!config_path.empty())
    if (auto ok = load_config_file(options, config_path); !ok)
      return ok.error();
  // Then the environment (launcher, Slurm, Open MPI).
  auto rv = rendezvous::from(env);
  if (!rv)
    return rv.error();
  if (rv->rank)
    options.rank = *rv->rank;
  if (rv->world_size)
    options.world_size = *rv->world_size;
  if (rv->coordinator)
    options.coordinator = *rv->coordinator;
  if (rv->restart)
    options.restart = *rv->restart;
  if (rv->node_name)
    if (auto ok = options.set("name", *rv->node_name, env_node_name); !ok)
      return ok.error();
  const std::pair<const char*, const char*> secret_vars[] = {{"TROUPE_TLS_CERTIFICATE", "tls.certificate"},
                                                          {"TROUPE_TLS_KEY", "tls.key"},
                                                          {"TROUPE_TLS_CA", "tls.ca"},
                                                          {"TROUPE_TLS_PASSPHRASE", "tls.passphrase"},
                                                          {"TROUPE_JOB_TOKEN", "job-token"}};
  for (auto [var, key] : secret_vars)
    if (auto i = env.find(var); i != env.end())
      if (auto ok = options.set(key, i->second, var); !ok)
        return ok.error();
  // Highest: the command line.
  for (auto& f : *flags) {
    if (f.key == "config")
      continue;
    if (auto ok = options.set(f.key, f.value, f.source); !ok)
      return ok.error();
  }
  if (options.name.empty())
    options.name = "worker" + std::to_string(options.rank);
  if (auto ok = options.validate(); !ok)
    return ok.error();
  return options;
}

} // namespace troupe::actors
