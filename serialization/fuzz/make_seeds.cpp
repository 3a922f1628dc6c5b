// Writes a small seed corpus for the fuzzer: valid flat frames of several
// dtypes and layouts, a valid checkpoint image and a valid manifest.
//   serialization.fuzz_seeds <directory>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "troupe/serialization/checkpoint_file.hpp"
#include "troupe/serialization/checkpoint_manifest.hpp"
#include "troupe/serialization/encoded_message.hpp"

using namespace troupe;

namespace {

void write(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
    return 2;
  }
  std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  message_meta meta{message_kind::forward_activation, 3, 1, 77, "stage-1"};
  std::vector<tensor> samples{
      tensor::from<float>({1, 2, 3, 4, 5, 6}, {2, 3}),
      tensor::from<float>({1, 2, 3, 4, 5, 6}, {2, 3}).t(),
      tensor::from<std::int64_t>({1, 2, 3}, {1, 3}).expand({4, 3}),
      tensor::scalar(1.5, dtype::float64),
      tensor::zeros({0, 3}, dtype::bfloat16),
      tensor::ones({5}, dtype::uint8),
  };
  int n = 0;
  for (const auto& sample : samples)
    write(dir / ("frame_" + std::to_string(n++)), encode(meta, sample).to_flat_bytes());

  auto checkpoint = dir / "checkpoint.tmp_seed";
  named_tensors state{{"w", tensor::from<float>({1, 2, 3, 4}, {2, 2})},
                      {"step", tensor::scalar(7, dtype::int64)}};
  if (auto ok = save_checkpoint(checkpoint, state, {{"k", "v"}}); !ok) {
    std::fprintf(stderr, "%s\n", ok.error().to_string().c_str());
    return 1;
  }
  std::filesystem::rename(checkpoint, dir / "checkpoint");
  // "w" [4, 6] in two row blocks of two files, a replicated scalar, metadata.
  checkpoint_manifest manifest{12,
                               {{"w", dtype::float32, {4, 6}, {{{0, 0}, {2, 6}, "rank-0.shard", 192, 48, 1},
                                                              {{2, 0}, {2, 6}, "rank-1.shard", 192, 48, 2}}},
                                {"step", dtype::int64, {}, {{{}, {}, "rank-0.shard", 256, 8, 3}}}},
                               {{"data_position", std::string("\x00\x01", 2)}}};
  write(dir / "manifest", encode_manifest(manifest));
  std::printf("wrote %d frames, a checkpoint and a manifest to %s\n", n, dir.c_str());
  return 0;
}
