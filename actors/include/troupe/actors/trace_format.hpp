#pragma once
// The on-disk format of a troupe trace file, and the writer the recorder (and
// tests) use to produce one.
//
// A trace is a set of per-process files, `<dir>/trace-<node>-<pid>.bin`, each
// written only by appending. All integers are little-endian.
//
// File header, 128 bytes, written once when the file is created:
//
//   offset size  field
//        0    8  magic         "TROUPETR"
//        8    4  version       1
//       12    4  header_bytes  128
//       16    4  record_bytes  64
//       20    4  pid           of the writing process
//       24    8  flow_prefix   flow ids of this process are (flow_prefix << 40) | n
//       32    8  wall_ns       system_clock (ns since the Unix epoch) ...
//       40    8  mono_ns       ... and steady_clock, sampled together at start
//       48   64  node          node name, NUL-padded (at most 63 bytes)
//      112   12  reserved      zero
//      124    4  header_crc    CRC-32 (IEEE) of bytes [0, 124)
//
// Then any number of chunks. A chunk is written with whole-buffer write()
// calls and no fsync; a reader takes every chunk whose header and payload
// CRCs check and ignores a torn tail, so a file stays readable after the
// writer (or anything else) is killed mid-run.
//
//   offset size  field
//        0    4  magic         "TRCK"
//        4    4  sequence      0, 1, 2, ... within the file
//        8    4  payload_bytes string_bytes + record_count * 64, at most 256 MiB
//       12    4  string_count  strings defined by this chunk
//       16    4  string_bytes  size of the string section, a multiple of 8
//       20    4  record_count
//       24    4  payload_crc   CRC-32 of the payload
//       28    4  header_crc    CRC-32 of bytes [0, 28)
//       32       payload: the string section, then the record section
//
// A string entry: u32 id (>= 1), u32 length (<= 4096), the bytes, zero
// padding to a multiple of 8. Strings are interned per process (actor names,
// message kinds, span and counter names) and each is defined in the file
// before, or in the same chunk as, the first record that refers to it. Id 0
// means "none".
//
// A record, 64 bytes (`trace::record`):
//
//   offset size  field
//        0    8  time_ns      steady_clock (monotonic) time of the event
//        8    8  flow_id      links a send to its receive, a data-plane write
//                             to its read; 0 = none
//       16    8  value        bytes of a message or transfer; the counter's
//                             value; the dropped count; the clock offset (i64)
//       24    8  duration_ns  of a data-plane transfer (the record's time is
//                             its end); the uncertainty of a clock offset
//       32    4  actor        string id of the actor the event belongs to
//       36    4  peer         string id of the other side: the sender of a
//                             received message, the receiver of a sent one,
//                             the peer of a transfer
//       40    4  kind         string id of the message kind, span or counter name
//       44    4  step         training step, or 0xffffffff = none
//       48    4  micro_batch  or 0xffffffff = none
//       52    2  thread       recorder thread index within the process
//       54    1  type         `trace::event_type`
//       55    1  flags        zero
//       56    4  os_tid       Linux thread id
//       60    4  reserved     zero
//
// Record types and which fields they use are listed at `event_type`.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "troupe/tensor/expected.hpp"

namespace troupe::trace {

static_assert(std::endian::native == std::endian::little, "trace files are little-endian");

/// What a record describes. Values are stable: they are stored in files.
enum class event_type : std::uint8_t {
  message_received = 1, ///< actor received `kind` from peer (value = bytes)
  message_sent = 2,     ///< actor sent `kind` to peer (value = bytes)
  handler_start = 3,    ///< actor starts handling `kind` (flow = the message's)
  handler_end = 4,      ///< actor's handler for `kind` returned
  data_write = 5,       ///< data-plane transfer to peer ended (value = bytes)
  data_read = 6,        ///< data-plane transfer from peer ended (value = bytes)
  span_begin = 7,       ///< free-form span `kind` opens on actor/thread
  span_end = 8,         ///< ... and closes
  counter = 9,          ///< counter `kind` has value (i64)
  clock_offset = 10,    ///< coordinator clock = local system clock + value (i64)
  clock_sync = 11,      ///< system clock read at time_ns was value (i64)
  dropped = 12,         ///< value records of thread were lost to a full buffer
};
inline constexpr std::uint8_t max_event_type = 12;

/// "message_received", ... for reports; "unknown" outside the enum.
std::string_view name_of(event_type type);

/// Step and micro-batch are unknown.
inline constexpr std::uint32_t no_step = 0xffffffffu;

/// One event, a fixed-size POD (see the table above).
struct record {
  std::int64_t time_ns = 0;
  std::uint64_t flow_id = 0;
  std::uint64_t value = 0;
  std::int64_t duration_ns = 0;
  std::uint32_t actor = 0;
  std::uint32_t peer = 0;
  std::uint32_t kind = 0;
  std::uint32_t step = no_step;
  std::uint32_t micro_batch = no_step;
  std::uint16_t thread = 0;
  event_type type = event_type::counter;
  std::uint8_t flags = 0;
  std::uint32_t os_tid = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(record) == 64 && std::is_trivially_copyable_v<record>);

inline constexpr char file_magic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'T', 'R'};
inline constexpr std::uint32_t file_version = 1;
inline constexpr std::size_t file_header_bytes = 128;
inline constexpr std::uint32_t chunk_magic = 0x4b435254; // "TRCK" little-endian
inline constexpr std::size_t chunk_header_bytes = 32;
inline constexpr std::size_t max_payload_bytes = std::size_t{256} << 20;
inline constexpr std::size_t max_string_bytes = 4096;
inline constexpr int flow_counter_bits = 40;

/// The decoded file header.
struct file_header {
  std::uint32_t pid = 0;
  std::uint64_t flow_prefix = 0;
  std::int64_t wall_ns = 0;
  std::int64_t mono_ns = 0;
  std::string node;
};

/// A string defined in a chunk.
struct string_entry {
  std::uint32_t id = 0;
  std::string_view text;
};

/// CRC-32 (IEEE 802.3, as zlib's crc32), continuing from `crc`.
std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc = 0);

/// Appends to one trace file: the header on open, then whole chunks. Not
/// thread-safe; the recorder's flush thread is its only user.
class file_writer {
public:
  file_writer() = default;
  file_writer(const file_writer&) = delete;
  file_writer& operator=(const file_writer&) = delete;
  file_writer(file_writer&& other) noexcept;
  file_writer& operator=(file_writer&& other) noexcept;
  ~file_writer();

  /// Creates (truncates) `path` and writes the file header.
  static expected<file_writer> create(const std::string& path, const file_header& header);

  /// Writes one chunk: `strings` then `records`, one write() of the whole
  /// chunk (retried on a short write).
  expected<void> write_chunk(std::span<const string_entry> strings,
                             std::span<const record> records);

  /// Bytes written so far, header included.
  std::uint64_t bytes_written() const noexcept { return bytes_written_; }
  void close();

private:
  int fd_ = -1;
  std::uint32_t sequence_ = 0;
  std::uint64_t bytes_written_ = 0;
  std::string path_;
  std::string buffer_;
};

} // namespace troupe::trace
