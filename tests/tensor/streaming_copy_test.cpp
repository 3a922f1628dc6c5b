// streaming_copy copies every byte exactly, whatever the size and the
// alignment of either side, and touches nothing around the destination.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "troupe/tensor/streaming_copy.hpp"

namespace troupe {
namespace {

TEST(StreamingCopy, EveryByteAtEverySizeAndAlignment) {
  const std::size_t big = streaming_copy_min_bytes;
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{4096}, big - 1, big,
                            big + 13, big + 200})
    for (std::size_t src_offset : {0, 17})
      for (std::size_t dst_offset : {0, 5, 32}) {
        std::vector<std::uint8_t> src(bytes + 64), dst(bytes + 128, 0xAB);
        for (std::size_t i = 0; i < src.size(); ++i)
          src[i] = static_cast<std::uint8_t>(i * 131 + i / 251);
        streaming_copy(dst.data() + dst_offset, src.data() + src_offset, bytes);
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_offset && i < dst_offset + bytes;
          const auto want = inside ? src[i - dst_offset + src_offset] : std::uint8_t{0xAB};
          ASSERT_EQ(dst[i], want) << "byte " << i << " of a copy of " << bytes << " bytes (source offset "
                                  << src_offset << ", destination offset " << dst_offset << ")";
        }
      }
}

} // namespace
} // namespace troupe
