#include "troupe/tensor/host_allocator.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

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

/// The VmFlags line of the mapping in /proc/self/smaps that contains
/// `address`, or "" when there is none. (Contains, not starts at: the kernel
/// may merge the block's mapping with a neighbour that has the same flags.)
std::string vm_flags_of_mapping_at(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  auto wanted = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    auto dash = line.find('-');
    auto space = line.find(' ');
    if (dash != std::string::npos && dash > 0 && space != std::string::npos && space > dash &&
        std::isxdigit(static_cast<unsigned char>(line[0]))) {
      auto begin = std::stoull(line.substr(0, dash), nullptr, 16);
      auto end = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = begin <= wanted && wanted < end;
      continue;
    }
    if (inside && line.starts_with("VmFlags:"))
      return line;
  }
  return "";
}

TEST(HostAllocator, HugeBlocksAreAlignedToAHugePageAndAdvisedToUseOne) {
  host_allocator allocator(std::size_t{64} << 20);
  auto bytes = host_allocator::huge_page_bytes + 12345; // not a multiple
  auto* block = static_cast<unsigned char*>(allocator.allocate(bytes));
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block) % host_allocator::huge_page_bytes, 0u);
  std::memset(block, 0x5a, bytes); // every byte is ours
  EXPECT_EQ(block[bytes - 1], 0x5a);
  // "hg": the kernel took the MADV_HUGEPAGE advice for this mapping (a
  // kernel without transparent huge pages has no such flag to set).
  auto flags = vm_flags_of_mapping_at(block);
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"))
    EXPECT_NE(flags.find(" hg"), std::string::npos) << "VmFlags: '" << flags << "'";
  else
    EXPECT_NE(flags, "") << "no mapping contains the block";
  allocator.deallocate(block, bytes);
  // Cached, like any large block, and handed out again.
  EXPECT_EQ(allocator.allocate(bytes), block);
  allocator.deallocate(block, bytes);
  allocator.release_cached(); // unmapped: the mapping is gone
  EXPECT_EQ(vm_flags_of_mapping_at(block), "");
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

TEST(HostAllocator, ZeroedBlocksAreZeroEvenWhenTheCachedBlockWasWritten) {
  host_allocator allocator(std::size_t{64} << 20);
  const std::size_t bytes = std::size_t{1} << 20;
  auto* dirty = static_cast<unsigned char*>(allocator.allocate(bytes));
  std::memset(dirty, 0x7f, bytes);
  allocator.deallocate(dirty, bytes);
  auto* zeroed = static_cast<unsigned char*>(allocator.allocate_zeroed(bytes));
  EXPECT_EQ(zeroed, dirty) << "the cached block is reused";
  for (std::size_t i = 0; i < bytes; ++i)
    ASSERT_EQ(zeroed[i], 0) << "byte " << i;
  allocator.deallocate(zeroed, bytes);
  auto* small = static_cast<unsigned char*>(allocator.allocate_zeroed(100)); // from malloc
  for (std::size_t i = 0; i < 100; ++i)
    ASSERT_EQ(small[i], 0) << "byte " << i;
  allocator.deallocate(small, 100);
  allocator.release_cached();
}

TEST(HostAllocator, AZeroedMappedBlockTakesNoMemoryUntilWritten) {
  host_allocator allocator(std::size_t{64} << 20);
  const std::size_t bytes = std::size_t{16} << 20;
  auto* block = static_cast<unsigned char*>(allocator.allocate_zeroed(bytes));
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> held(bytes / page);
  ASSERT_EQ(::mincore(block, bytes, held.data()), 0);
  EXPECT_EQ(std::count_if(held.begin(), held.end(), [](unsigned char h) { return h & 1; }), 0)
    << "allocate_zeroed wrote a fresh mapping";
  EXPECT_EQ(block[bytes / 2], 0);
  block[0] = 1; // written: now held
  ASSERT_EQ(::mincore(block, bytes, held.data()), 0);
  EXPECT_EQ(held[0] & 1, 1);
  allocator.deallocate(block, bytes);
  allocator.release_cached();
}

TEST(HostAllocator, TensorZerosIsZeroOnReusedMemory) {
  auto& allocator = host_allocator::instance();
  {
    auto dirty = troupe::tensor::full({512, 512}, 3.0); // 1 MiB, cached when dropped
  }
  ASSERT_GT(allocator.cached_bytes(), 0u);
  auto zeros = troupe::tensor::zeros({512, 512});
  const float* values = zeros.data<float>();
  for (std::int64_t i = 0; i < zeros.numel(); ++i)
    ASSERT_EQ(values[i], 0.0f) << "element " << i;
}
