#pragma once
// Reads trace files (format: trace_format.hpp). Files are outside input: a
// bad file header is an error; a torn or corrupt chunk ends the file with a
// warning (the valid prefix is kept); a record naming an undefined string or
// an unknown type is skipped with a warning. Every warning names the file and
// the byte offset.
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/actors/trace_format.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::trace {

/// One process's trace, decoded.
struct trace_file {
  std::string path;
  file_header header;
  std::unordered_map<std::uint32_t, std::string> strings; ///< id -> text
  std::vector<record> records;                            ///< in file order
  std::vector<std::string> warnings;
  std::uint64_t dropped = 0; ///< sum of `dropped` records
  std::uint64_t chunks = 0;  ///< complete chunks read
  bool has_clock_offset = false;
  std::int64_t clock_offset_ns = 0; ///< the offset with the least uncertainty
  std::int64_t clock_uncertainty_ns = 0;

  /// The text of string `id`, "" for 0 or an undefined id.
  const std::string& name(std::uint32_t id) const;
  /// A record's time on the merged timeline: its steady-clock time mapped to
  /// this host's system clock by the start-up pair, shifted by the clock offset.
  std::int64_t global_ns(std::int64_t time_ns) const {
    return time_ns - header.mono_ns + header.wall_ns + clock_offset_ns;
  }
};

/// Reads one file. An error only when nothing can be read (missing file, bad
/// header); damage after the header becomes warnings.
expected<trace_file> read_trace_file(const std::string& path);

/// Expands directories to their trace-*.bin files (sorted) and reads every
/// file. A file that cannot be read is skipped with a line in `warnings`; an
/// error when no file could be read.
expected<std::vector<trace_file>> read_trace_inputs(std::span<const std::string> paths,
                                                    std::vector<std::string>& warnings);

} // namespace troupe::trace
