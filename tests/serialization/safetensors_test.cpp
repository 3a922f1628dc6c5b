// The safetensors export: layout, JSON escaping, and what it refuses.
// (checkpoint_tool.sh reads an export back with Python and compares values.)
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "troupe/serialization/safetensors.hpp"

using namespace troupe;

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::filesystem::path scratch(const char* name) {
  return std::filesystem::temp_directory_path() / (std::string(name) + "_" + std::to_string(::getpid()));
}

} // namespace

TEST(Safetensors, WritesTheLengthTheHeaderAndTheBytes) {
  auto path = scratch("troupe_safetensors_layout");
  auto weight = tensor::from<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  ASSERT_TRUE(save_safetensors(path, {{"w", weight.t()}, {"n", tensor::from<std::int64_t>({7}, {1})}}, {{"step", "3"}}));
  auto file = read_text(path);
  std::filesystem::remove(path);
  std::uint64_t length = 0;
  std::memcpy(&length, file.data(), 8);
  ASSERT_EQ(length % 8, 0u);
  ASSERT_EQ(file.size(), 8 + length + 6 * 4 + 8);
  auto header = file.substr(8, length);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"w": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 24]}, )"
            R"("n": {"dtype": "I64", "shape": [1], "data_offsets": [24, 32]}, "__metadata__": {"step": "3"}})");
  float first_column[3];
  std::memcpy(first_column, file.data() + 8 + length, sizeof first_column);
  EXPECT_EQ(first_column[1], 4.0f) << "the transposed view is written densely, row-major";
}

TEST(Safetensors, EscapesNamesAndHexEncodesBinaryMetadata) {
  auto path = scratch("troupe_safetensors_escapes");
  ASSERT_TRUE(save_safetensors(path, {{"a\"b\\c\n", tensor::zeros({1})}}, {{"rng", std::string("\xff\x00", 2)}}));
  auto file = read_text(path);
  std::filesystem::remove(path);
  EXPECT_NE(file.find(R"("a\"b\\c\u000a": {)"), std::string::npos) << file;
  EXPECT_NE(file.find(R"("rng.hex": "ff00")"), std::string::npos) << file;
}

TEST(Safetensors, RefusesDuplicateAndReservedNames) {
  auto path = scratch("troupe_safetensors_refused");
  auto twice = save_safetensors(path, {{"w", tensor::zeros({1})}, {"w", tensor::zeros({1})}});
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message().find("'w'"), std::string::npos);
  EXPECT_FALSE(save_safetensors(path, {{"__metadata__", tensor::zeros({1})}}));
  EXPECT_FALSE(save_safetensors(path, {{"bad\xff", tensor::zeros({1})}}));
  EXPECT_FALSE(std::filesystem::exists(path));
}
