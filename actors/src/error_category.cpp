#include "troupe/actors/error_category.hpp"

#include <caf/make_message.hpp>
#include <caf/message.hpp>

namespace troupe::actors {

caf::error to_caf_error(const troupe::error& e) {
  return make_caf_error(e.code(), e.message());
}

caf::error make_caf_error(errc code, std::string message) {
  return caf::error(static_cast<std::uint8_t>(code), error_category,
                    caf::make_message(std::move(message)));
}

void add_error_category(caf::actor_system_config& config) {
  config.add_error_category(error_category, [](std::uint8_t code, caf::atom_value,
                                               const caf::message& context) {
    auto text = "troupe::" + std::string(name_of(static_cast<errc>(code)));
    if (context.match_elements<std::string>())
      text += "(" + context.get_as<std::string>(0) + ")";
    return text;
  });
}

} // namespace troupe::actors
