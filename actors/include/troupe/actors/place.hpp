#pragma once
// Where an actor lives and what it is called: `<node>/<device>/<name>`, for
// example `worker1/cpu/stage0` or `worker1/cuda:0/stage1`. The registry on the
// coordinator resolves the full string to an actor handle.
#include <string>
#include <string_view>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

/// A parsed place. `name` is empty for a bare location (`worker1/cuda:0`).
struct place {
  std::string node;
  troupe::device device = troupe::device::cpu();
  std::string name;

  /// Parses `<node>/<device>/<name>` or `<node>/<device>`. Node and actor
  /// names use [A-Za-z0-9._-] (names may also contain ':'); the device is
  /// `cpu` or `cuda:N`. Anything else is an invalid_argument error that
  /// quotes the text and says which part is wrong.
  static troupe::expected<place> parse(std::string_view text);

  /// Same rules, but the name part is required.
  static troupe::expected<place> parse_named(std::string_view text);

  /// `<node>/<device>/<name>`, or `<node>/<device>` without a name.
  std::string to_string() const;

  /// This place with another actor name.
  place with_name(std::string actor_name) const { return {node, device, std::move(actor_name)}; }

  friend bool operator==(const place&, const place&) = default;
};

/// Checks a node name ([A-Za-z0-9._-]+, at most 64 characters).
troupe::expected<void> validate_node_name(std::string_view name);

} // namespace troupe::actors
