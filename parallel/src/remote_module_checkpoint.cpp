#include "remote_module_checkpoint.hpp"

#include <charconv>

#include <fmt/format.h>

#include "training_state.hpp"

namespace troupe::parallel {

std::string remote_module_writer(std::string_view name) { return writer_name(fmt::format("remote-module.{}", name)); }

std::string remote_module_step_key(std::string_view name) { return fmt::format("remote_module.{}.step", name); }

expected<std::uint64_t> saved_module_step(const checkpoint_reader& reader, std::string_view name) {
  const auto key = remote_module_step_key(name);
  for (const auto& [k, v] : reader.manifest().metadata) {
    if (k != key)
      continue;
    std::uint64_t step = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), step);
    if (ec != std::errc{} || end != v.data() + v.size() || v.empty())
      return make_error(errc::malformed_message, "checkpoint {}: '{}' is '{}', not a step", reader.directory().string(),
                        key, v);
    return step;
  }
  return make_error(errc::state_mismatch, "checkpoint {} has no state of remote module '{}' ('{}')",
                    reader.directory().string(), name, key);
}

} // namespace troupe::parallel
