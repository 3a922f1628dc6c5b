#include "troupe/tensor/host_allocator.hpp"

#include <cstdint>

#include <gtest/gtest.h>

#include "troupe/tensor/tensor.hpp"

using troupe::host_allocator;

TEST(HostAllocator, LargeBlocksAreReusedAndAligned) {
  host_allocator allocator(std::size_t{64} << 20);
  void* first = allocator.allocate(1 << 20);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % host_allocator::alignment, 0u);
  allocator.deallocate(first, 1 << 20);
  EXPECT_EQ(allocator.cached_bytes(), std::size_t{1} << 20);
  // A request rounding to the same 4 KiB block size gets the cached block.
  void* second = allocator.allocate((1 << 20) - 100);
  EXPECT_EQ(second, first);
  EXPECT_EQ(allocator.cached_bytes(), 0u);
  allocator.deallocate(second, (1 << 20) - 100);
}

TEST(HostAllocator, SmallBlocksAreNotCached) {
  host_allocator allocator(std::size_t{64} << 20);
  void* block = allocator.allocate(100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block) % host_allocator::alignment, 0u);
  allocator.deallocate(block, 100);
  EXPECT_EQ(allocator.cached_bytes(), 0u);
}

TEST(HostAllocator, CacheNeverExceedsItsLimit) {
  host_allocator allocator(std::size_t{3} << 20);
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i)
    blocks.push_back(allocator.allocate(1 << 20));
  for (auto* block : blocks)
    allocator.deallocate(block, 1 << 20);
  EXPECT_EQ(allocator.cached_bytes(), std::size_t{3} << 20);
  allocator.set_limit(std::size_t{1} << 20);
  EXPECT_EQ(allocator.cached_bytes(), std::size_t{1} << 20);
  allocator.release_cached();
  EXPECT_EQ(allocator.cached_bytes(), 0u);
}

TEST(HostAllocator, ZeroLimitDisablesTheCache) {
  host_allocator allocator(0);
  void* block = allocator.allocate(1 << 20);
  allocator.deallocate(block, 1 << 20);
  EXPECT_EQ(allocator.cached_bytes(), 0u);
}

TEST(HostAllocator, TensorsReturnTheirStorageToTheProcessCache) {
  auto& allocator = host_allocator::instance();
  allocator.release_cached();
  const void* first = nullptr;
  {
    auto t = troupe::tensor::zeros({512, 512}); // 1 MiB
    first = t.raw_data();
  }
  EXPECT_GE(allocator.cached_bytes(), std::size_t{1} << 20);
  auto again = troupe::tensor::empty({512, 512});
  EXPECT_EQ(again.raw_data(), first);
}
