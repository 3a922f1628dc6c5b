// troupe-checkpoint: inspects, verifies, consolidates and exports the
// distributed checkpoints that shard_writer and commit_checkpoint write.
// Run `troupe-checkpoint --help` for the commands.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "troupe/serialization/checkpoint_directory.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/serialization/safetensors.hpp"

using namespace troupe;

namespace {

constexpr const char* usage = R"(usage: troupe-checkpoint COMMAND [OPTIONS] DIR [OUT]

DIR is a checkpoint (a step-<N> directory holding a manifest) or a directory
of them (then the latest complete one is used).

commands:
  inspect DIR                     tensors with dtype, global shape and pieces
                                  (offset, shape, file, bytes, CRC32C), and
                                  the driver's metadata
  verify DIR                      reads every piece and checks its CRC32C;
                                  names each bad piece
  consolidate DIR OUT             one checkpoint file of whole tensors, for
                                  one process (load_checkpoint, then a
                                  module's load_state_dict)
  export --safetensors DIR OUT    the same as a .safetensors file

options:
  -h, --help   this text

exit status: 0 on success, 1 when the checkpoint is bad or unreadable or the
output cannot be written, 2 on a usage error.
)";

int bad_usage(const std::string& message) {
  fmt::print(stderr, "troupe-checkpoint: {}\n(run troupe-checkpoint --help for usage)\n", message);
  return 2;
}

int failure(const error& e) {
  fmt::print(stderr, "troupe-checkpoint: {}\n", e.message());
  return 1;
}

/// DIR itself when it holds a manifest, else its latest checkpoint.
expected<checkpoint_reader> open_checkpoint(const std::filesystem::path& dir) {
  if (std::filesystem::exists(dir / "manifest"))
    return checkpoint_reader::open(dir);
  auto latest = latest_checkpoint(dir);
  if (!latest)
    return latest.error();
  if (!*latest)
    return make_error(errc::io_error, "'{}' holds no manifest and no complete checkpoint", dir.string());
  return checkpoint_reader::open(**latest);
}

/// Printable text as is, anything else as hex.
std::string shown(const std::string& bytes) {
  bool printable = true;
  for (unsigned char c : bytes)
    printable = printable && c >= 0x20 && c < 0x7f;
  if (printable)
    return fmt::format("\"{}\"", bytes);
  std::string hex = "0x";
  for (unsigned char c : bytes)
    hex += fmt::format("{:02x}", c);
  return hex;
}

int inspect(const checkpoint_reader& reader) {
  const auto& manifest = reader.manifest();
  std::size_t pieces = 0;
  std::uint64_t bytes = 0;
  for (const auto& t : manifest.tensors)
    for (const auto& piece : t.pieces) {
      ++pieces;
      bytes += piece.byte_count;
    }
  fmt::print("checkpoint {}: step {}, {} tensors in {} pieces, {} bytes\n", reader.directory().string(), manifest.step,
             manifest.tensors.size(), pieces, bytes);
  if (!manifest.metadata.empty())
    fmt::print("metadata:\n");
  for (const auto& [key, value] : manifest.metadata)
    fmt::print("  {}: {}\n", key, shown(value));
  fmt::print("tensors:\n");
  for (const auto& t : manifest.tensors) {
    fmt::print("  {}  {}  {}  {} piece{}\n", t.name, t.type, t.global_shape, t.pieces.size(),
               t.pieces.size() == 1 ? "" : "s");
    for (const auto& piece : t.pieces)
      fmt::print("    offset {} shape {}  {} bytes [{}, +{})  crc32c {:#010x}\n", piece.offset, piece.shape, piece.file,
                 piece.byte_offset, piece.byte_count, piece.crc32c);
  }
  return 0;
}

int verify(const checkpoint_reader& reader) {
  std::size_t checked = 0, bad = 0;
  for (const auto& t : reader.manifest().tensors)
    for (std::size_t i = 0; i < t.pieces.size(); ++i, ++checked)
      if (auto piece = reader.read_piece(t, i); !piece) {
        fmt::print(stderr, "bad: {}\n", piece.error().message());
        ++bad;
      }
  fmt::print("{}: {} pieces of {} tensors checked, {} bad\n", reader.directory().string(), checked,
             reader.manifest().tensors.size(), bad);
  return bad == 0 ? 0 : 1;
}

/// Every tensor whole, plus the manifest's metadata and step.
int consolidate(const checkpoint_reader& reader, const std::string& out, bool safetensors) {
  auto tensors = reader.read_all();
  if (!tensors)
    return failure(tensors.error());
  auto metadata = reader.manifest().metadata;
  metadata.emplace_back("step", std::to_string(reader.step()));
  auto written = safetensors ? save_safetensors(out, *tensors, metadata) : save_checkpoint(out, *tensors, metadata);
  if (!written)
    return failure(written.error());
  fmt::print("wrote {} tensors of {} to {}\n", tensors->size(), reader.directory().string(), out);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty())
    return bad_usage("no command");
  if (args[0] == "-h" || args[0] == "--help")
    return fmt::print("{}", usage), 0;
  const auto command = args[0];
  args.erase(args.begin());
  bool safetensors = false;
  if (command == "export") {
    auto flag = std::find(args.begin(), args.end(), "--safetensors");
    if (flag == args.end())
      return bad_usage("export needs a format: --safetensors");
    args.erase(flag);
    safetensors = true;
  }
  for (const auto& arg : args)
    if (arg.starts_with("-"))
      return bad_usage(fmt::format("unknown option '{}'", arg));
  const std::size_t wanted = command == "inspect" || command == "verify" ? 1
                             : command == "consolidate" || command == "export" ? 2
                                                                               : 0;
  if (wanted == 0)
    return bad_usage(fmt::format("unknown command '{}'", command));
  if (args.size() != wanted)
    return bad_usage(fmt::format("{} takes {} but got {}: {}", command, wanted == 1 ? "DIR" : "DIR OUT", args.size(),
                                   args));

  auto reader = open_checkpoint(args[0]);
  if (!reader)
    return failure(reader.error());
  if (command == "inspect")
    return inspect(*reader);
  if (command == "verify")
    return verify(*reader);
  return consolidate(*reader, args[1], safetensors);
}
