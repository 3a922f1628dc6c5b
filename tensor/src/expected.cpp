#include "troupe/tensor/expected.hpp"

namespace troupe {

std::string_view name_of(errc code) {
  switch (code) {
    case errc::malformed_message: return "malformed_message";
    case errc::unsupported_dtype: return "unsupported_dtype";
    case errc::size_limit_exceeded: return "size_limit_exceeded";
    case errc::checksum_mismatch: return "checksum_mismatch";
    case errc::io_error: return "io_error";
    case errc::state_mismatch: return "state_mismatch";
    case errc::invalid_argument: return "invalid_argument";
  }
  return "unknown_error";
}

std::string error::to_string() const {
  return fmt::format("{}: {}", name_of(code_), message_);
}

} // namespace troupe
