// Storage: alignment of troupe's allocations, and foreign memory whose
// deleter runs exactly once, when the last view goes away.
#include <cstdint>

#include "test_util.hpp"

namespace troupe {
namespace {

TEST(Storage, AllocationsAre64ByteAligned) {
  for (std::size_t bytes : {0u, 1u, 3u, 64u, 100u, 4096u}) {
    auto memory = storage::allocate(bytes);
    ASSERT_NE(memory->data(), nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(memory->data()) % 64, 0u) << bytes << " bytes";
    EXPECT_EQ(memory->bytes(), bytes);
  }
  auto t = tensor::empty({3, 5}, dtype::float64);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % storage::alignment, 0u);
}

TEST(Storage, ForeignMemoryDeleterRunsOnceWhenTheLastViewDies) {
  std::vector<float> buffer{1, 2, 3, 4, 5, 6};
  int deleted = 0;
  void* seen = nullptr;
  {
    auto memory = storage::wrap(buffer.data(), buffer.size() * sizeof(float), device::cpu(),
                                [&](void* p) {
                                  ++deleted;
                                  seen = p;
                                });
    auto t = tensor::from_storage(memory, {2, 3}, {3, 1}, 0, dtype::float32);
    memory.reset();
    auto view = t.t();
    auto row = t.select(0, 1);
    EXPECT_EQ(t.raw_data(), buffer.data()); // aliases, no copy
    EXPECT_EQ(row.at({2}), 6.0);
    t = tensor{};
    view = tensor{};
    EXPECT_EQ(deleted, 0); // `row` still views the memory
    row.fill(0);
  }
  EXPECT_EQ(deleted, 1);
  EXPECT_EQ(seen, buffer.data());
  EXPECT_EQ(buffer[3], 0.0f);
}

TEST(Storage, FromStorageRejectsViewsPastTheEnd) {
  auto memory = storage::allocate(6 * sizeof(float));
  EXPECT_THAT(test::usage_error_of(
                  [&] { (void)tensor::from_storage(memory, {2, 3}, {3, 1}, 1, dtype::float32); }),
              testing::HasSubstr("from_storage"));
}

} // namespace
} // namespace troupe
