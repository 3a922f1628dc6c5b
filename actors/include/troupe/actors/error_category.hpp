#pragma once
// troupe's errors as CAF errors: the lower modules report outside-input
// failures as troupe::error (tensor/expected.hpp, no CAF there); at the actor
// boundary they become caf::error values of the "troupe" category, so they
// travel in error replies and down/exit reasons like any CAF error.
#include <string>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>

#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

/// The CAF error category of troupe's errc codes.
inline constexpr caf::atom_value error_category = caf::atom("troupe");

/// A caf::error carrying `e`'s code, with its message as context.
caf::error to_caf_error(const troupe::error& e);

/// A caf::error for `code` with a formatted message.
caf::error make_caf_error(errc code, std::string message);

/// Registers the category's renderer so `to_string(err)` prints
/// "troupe::malformed_message(...)" instead of a number.
void add_error_category(caf::actor_system_config& config);

} // namespace troupe::actors
