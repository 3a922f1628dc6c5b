#include "troupe/actors/place.hpp"

#include <algorithm>

namespace troupe::actors {

namespace {

bool is_name_char(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || (allow_colon && c == ':');
}

troupe::expected<void> check_part(std::string_view text, std::string_view part, std::string_view what,
                                  bool allow_colon) {
  if (part.empty())
    return make_error(errc::invalid_argument, "place \"{}\": the {} is empty (expected <node>/<device>/<name>)",
                      text, what);
  if (part.size() > 64)
    return make_error(errc::invalid_argument, "place \"{}\": the {} has {} characters but must have at most 64",
                      text, what, part.size());
  auto bad = std::find_if(part.begin(), part.end(), [&](char c) { return !is_name_char(c, allow_colon); });
  if (bad != part.end())
    return make_error(errc::invalid_argument,
                      "place \"{}\": the {} \"{}\" contains '{}' but may only use [A-Za-z0-9._-{}]", text,
                      what, part, *bad, allow_colon ? ":" : "");
  return {};
}

} // namespace

troupe::expected<void> validate_node_name(std::string_view name) {
  if (auto ok = check_part(name, name, "node name", false); !ok)
    return make_error(errc::invalid_argument, "node name \"{}\" is invalid: {}", name,
                      ok.error().message());
  return {};
}

troupe::expected<place> place::parse(std::string_view text) {
  auto first = text.find('/');
  if (first == std::string_view::npos)
    return make_error(errc::invalid_argument,
                      "place \"{}\" has no '/': expected <node>/<device>/<name>, e.g. worker1/cpu/stage0", text);
  auto node_part = text.substr(0, first);
  auto rest = text.substr(first + 1);
  auto second = rest.find('/');
  auto device_part = rest.substr(0, second);
  std::string_view name_part;
  if (second != std::string_view::npos) {
    name_part = rest.substr(second + 1);
    if (name_part.find('/') != std::string_view::npos)
      return make_error(errc::invalid_argument,
                        "place \"{}\" has more than three parts: expected <node>/<device>/<name>", text);
    if (auto ok = check_part(text, name_part, "actor name", true); !ok)
      return ok.error();
  }
  if (auto ok = check_part(text, node_part, "node name", false); !ok)
    return ok.error();
  if (device_part.empty())
    return make_error(errc::invalid_argument, "place \"{}\": the device is empty (expected cpu or cuda:N)", text);
  auto dev = troupe::device::parse(device_part);
  if (!dev)
    return make_error(errc::invalid_argument, "place \"{}\": device \"{}\" is not cpu or cuda:N", text,
                      device_part);
  return place{std::string(node_part), *dev, std::string(name_part)};
}

troupe::expected<place> place::parse_named(std::string_view text) {
  auto result = parse(text);
  if (result && result->name.empty())
    return make_error(errc::invalid_argument, "place \"{}\" names no actor: expected <node>/<device>/<name>", text);
  return result;
}

std::string place::to_string() const {
  auto text = node + "/" + device.to_string();
  if (!name.empty())
    text += "/" + name;
  return text;
}

} // namespace troupe::actors
