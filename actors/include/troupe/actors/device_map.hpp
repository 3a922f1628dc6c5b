#pragma once
// Where a tensor sent from one node lands on another: a map from the sender's
// device to the receiver's device (PyTorch RPC's `set_device_map`). A device
// that is not listed lands on the same device kind and index.
#include <map>
#include <string>
#include <string_view>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

class device_map {
public:
  device_map() = default;

  /// Parses `cpu->cpu,cuda:0->cuda:1` (an empty string is the identity).
  static troupe::expected<device_map> parse(std::string_view text);

  void set(troupe::device from, troupe::device to) { entries_[from] = to; }

  /// The receiver's device for a tensor on `from` at the sender.
  troupe::device map(troupe::device from) const {
    auto i = entries_.find(from);
    return i == entries_.end() ? from : i->second;
  }

  bool empty() const noexcept { return entries_.empty(); }
  const std::map<troupe::device, troupe::device>& entries() const noexcept { return entries_; }

  /// The canonical text form, parseable by `parse`.
  std::string to_string() const;

  friend bool operator==(const device_map&, const device_map&) = default;

private:
  std::map<troupe::device, troupe::device> entries_;
};

} // namespace troupe::actors
