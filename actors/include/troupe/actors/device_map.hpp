#pragma once
// Where a tensor sent from one node lands on another: a map from the device
// the tensor is on at the sender to a device of the receiver (PyTorch RPC's
// `set_device_map`, with CPU entries too: `cpu->cuda:0` puts host tensors
// on the receiver's GPU). Both planes carry host memory, so a tensor whose
// device is not listed arrives on the host, and the receiving actor moves it
// where it wants it (a pipeline stage onto its place's device).
#include <map>
#include <optional>
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

  /// The receiver's device for a tensor on `from` at the sender: the
  /// listed one, or the host.
  troupe::device landing(troupe::device from) const {
    auto i = entries_.find(from);
    return i == entries_.end() ? troupe::device::cpu() : i->second;
  }

  /// The listed device for `from`, if any.
  std::optional<troupe::device> find(troupe::device from) const {
    auto i = entries_.find(from);
    return i == entries_.end() ? std::nullopt : std::optional<troupe::device>(i->second);
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
