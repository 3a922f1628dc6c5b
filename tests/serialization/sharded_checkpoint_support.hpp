#pragma once
// What the distributed checkpoint tests share: a fresh directory per test,
// tensors whose every element differs, and a save of named tensors split
// among writers as tensor-parallel ranks would hold them.
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "troupe/serialization/checkpoint_directory.hpp"
#include "troupe/serialization/shard_writer.hpp"

namespace troupe::testing {

/// A fresh directory per test, removed afterwards.
class CheckpointDirectory : public ::testing::Test {
protected:
  void SetUp() override {
    auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = std::filesystem::temp_directory_path() /
            (std::string("troupe_sharded_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::filesystem::path root_;
};

/// Element i is i * 0.25 - 3 (float32), i / 3 (float64) or i * 1000003 - 2^40
/// (int64): every element distinct, and computable in Python too.
inline tensor patterned(const dims& shape, dtype type) {
  auto t = tensor::empty(shape, type);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (type == dtype::float32)
      t.data<float>()[i] = static_cast<float>(i) * 0.25f - 3.0f;
    else if (type == dtype::float64)
      t.data<double>()[i] = static_cast<double>(i) / 3.0;
    else
      t.data<std::int64_t>()[i] = i * 1000003 - (std::int64_t{1} << 40);
  }
  return t;
}

/// The `ways` pieces of `whole` split along `dim` (the first ones one
/// element larger when it does not divide), as views of `whole`.
inline std::vector<tensor_piece> split(const std::string& name, const tensor& whole, std::int64_t dim,
                                       std::int64_t ways) {
  std::vector<tensor_piece> pieces;
  auto size = whole.shape()[static_cast<std::size_t>(dim)];
  std::int64_t start = 0;
  for (std::int64_t k = 0; k < ways; ++k) {
    auto length = size / ways + (k < size % ways ? 1 : 0);
    pieces.push_back(split_piece(name, whole.narrow(dim, start, length), whole.shape(), dim, start));
    start += length;
  }
  return pieces;
}

inline bool bitwise_equal(const tensor& a, const tensor& b) {
  if (a.type() != b.type() || a.shape() != b.shape())
    return false;
  auto ca = a.contiguous();
  auto cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

/// Options that commit step `step`, keeping the newest `keep_last`.
inline commit_options at_step(std::uint64_t step, std::size_t keep_last = 0) {
  commit_options options;
  options.step = step;
  options.keep_last = keep_last;
  return options;
}

/// Concatenates every writer's report, as the coordinator collects them.
inline std::vector<checkpoint_tensor> write_all(const std::vector<shard_writer>& writers) {
  std::vector<checkpoint_tensor> written;
  for (const auto& writer : writers) {
    auto report = writer.write();
    EXPECT_TRUE(report) << report.error().to_string();
    if (report)
      written.insert(written.end(), report->begin(), report->end());
  }
  return written;
}

} // namespace troupe::testing
