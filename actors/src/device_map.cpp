#include "troupe/actors/device_map.hpp"

namespace troupe::actors {

troupe::expected<device_map> device_map::parse(std::string_view text) {
  device_map result;
  while (!text.empty()) {
    auto comma = text.find(',');
    auto entry = text.substr(0, comma);
    if (entry.empty() || (comma != std::string_view::npos && comma + 1 == text.size()))
      return make_error(errc::invalid_argument, "device map has an empty entry (expected e.g. cpu->cpu,cuda:0->cuda:1)");
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    auto arrow = entry.find("->");
    if (arrow == std::string_view::npos)
      return make_error(errc::invalid_argument, "device map entry \"{}\" has no \"->\" (expected e.g. cuda:0->cuda:1)",
                        entry);
    auto from = troupe::device::parse(entry.substr(0, arrow));
    auto to = troupe::device::parse(entry.substr(arrow + 2));
    if (!from || !to)
      return make_error(errc::invalid_argument, "device map entry \"{}\": \"{}\" is not cpu or cuda:N", entry,
                        !from ? entry.substr(0, arrow) : entry.substr(arrow + 2));
    if (result.entries_.contains(*from))
      return make_error(errc::invalid_argument, "device map maps {} twice", *from);
    result.set(*from, *to);
  }
  return result;
}

std::string device_map::to_string() const {
  std::string text;
  for (auto& [from, to] : entries_) {
    if (!text.empty())
      text += ',';
    text += from.to_string() + "->" + to.to_string();
  }
  return text;
}

} // namespace troupe::actors
