// Keeping freed heap memory mapped (actors/src/heap_retention.hpp): blocks
// the size of an eager message, freed and allocated again, fault no pages
// once a data plane has started; under glibc's own settings they do.
#include "heap_retention.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "troupe/actors/data_plane.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/node_options.hpp"

namespace troupe::actors {
namespace {

/// Page faults of this thread over a third round of allocating, touching
/// and freeing `count` blocks of `bytes`; by default 16 of 1 MiB and UCX's
/// descriptor, the shape of a stream of eager messages (the first two
/// rounds fault in whatever the heap keeps).
long faults_in_third_round(int count = 16, std::size_t bytes = (std::size_t{1} << 20) + 128) {
  long before = 0;
  for (int round = 0; round < 3; ++round) {
    if (round == 2) {
      rusage usage{};
      getrusage(RUSAGE_THREAD, &usage);
      before = usage.ru_minflt;
    }
    std::vector<void*> blocks;
    for (int i = 0; i < count; ++i) {
      blocks.push_back(std::malloc(bytes));
      std::memset(blocks.back(), round + 1, bytes);
    }
    for (void* p : blocks)
      std::free(p);
  }
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt - before;
}

/// Runs `measure` in a child forked from this process as it is now and
/// returns what it measured, or -1 when the child sent nothing back.
template <typename F> long in_child(F measure) {
  int out[2];
  if (pipe(out) != 0)
    return -1;
  const pid_t child = fork();
  if (child == 0) {
    close(out[0]);
    const long faults = measure();
    (void)!write(out[1], &faults, sizeof faults);
    _exit(0);
  }
  close(out[1]);
  long faults = -1;
  if (read(out[0], &faults, sizeof faults) != sizeof faults)
    faults = -1;
  close(out[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return faults;
}

TEST(HeapRetention, ADataPlaneKeepsFreedBlocksMapped) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc: malloc's settings are left alone";
#endif
  // Children forked before this process freed any large block, so each
  // starts from glibc's first settings, as a training process does.
  const long kept = in_child([] {
    data_plane_options options;
    options.node_name = "heap";
    options.token = 7;
    options.net_devices = "lo";
    options.on_receive = [](peer_id, tensor_message&&) {};
    auto plane = data_plane::start(options);
    if (!plane)
      return -2L;
    const long faults = faults_in_third_round();
    (*plane)->close();
    return faults;
  });
  // glibc's own settings give the freed blocks back: the third round
  // faults every page again (16 MiB of 4 KiB pages).
  const long by_default = in_child([] { return faults_in_third_round(); });
  EXPECT_GT(by_default, 2000) << "glibc's defaults no longer give freed blocks back; this test shows nothing";
  EXPECT_GE(kept, 0) << "the child could not start a data plane";
  EXPECT_LT(kept, 100) << "by default " << by_default;
}

/// A node of one, from `--troupe.*` flags; its data plane starts with it.
long faults_under_a_node(std::vector<std::string> flags) {
  std::vector<const char*> argv{"heap"};
  for (auto& f : flags)
    argv.push_back(f.c_str());
  auto options = node_options::from(static_cast<int>(argv.size()), argv.data(), {});
  if (!options)
    return -3;
  options->name = "worker0";
  options->world_size = 1;
  options->listen_address = "127.0.0.1";
  auto started = node::start(*options);
  if (!started)
    return -2;
  const long faults = faults_in_third_round();
  (*started)->stop();
  return faults;
}

TEST(HeapRetention, ANodeSetsItFromItsOptions) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc";
#endif
  const long kept = in_child([] { return faults_under_a_node({}); });
  const long left_alone = in_child([] { return faults_under_a_node({"--troupe.keep-freed-heap-bytes=0"}); });
  EXPECT_GE(kept, 0);
  EXPECT_LT(kept, 100) << "with keep-freed-heap-bytes=0: " << left_alone;
  EXPECT_GT(left_alone, 2000) << "the node's option did not reach the data plane";
  EXPECT_EQ(node_options{}.keep_freed_heap_bytes, data_plane_options{}.keep_freed_heap_bytes);
}

TEST(HeapRetention, ZeroAsksForNothing) {
  EXPECT_FALSE(detail::keep_freed_heap(std::size_t{1} << 20, 0));
}

TEST(HeapRetention, NoEagerBlocksStillLeaveGlibcsFirstThreshold) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc";
#endif
  // network_eager_bytes = 0: the plane asks for 64 KiB blocks. Blocks of
  // 100 KiB, below glibc's own 128 KiB, must still come from the heap.
  const long faults = in_child([] {
    detail::keep_freed_heap(std::size_t{64} << 10, std::size_t{256} << 20);
    return faults_in_third_round(64, std::size_t{100} << 10);
  });
  EXPECT_GE(faults, 0);
  EXPECT_LT(faults, 100);
}

} // namespace
} // namespace troupe::actors
