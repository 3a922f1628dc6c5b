// The shared-memory arena: tensors handed to another process by reference.
// The cross-process test re-executes this binary as the receiver
// (TROUPE_ARENA_CHILD), which reports its release over its stdout pipe.
#include "troupe/actors/shared_arena.hpp"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;

extern char** environ;

namespace {

std::string to_hex(std::span<const std::byte> bytes) {
  std::string out;
  for (auto b : bytes)
    out += fmt::format("{:02x}", static_cast<unsigned>(b));
  return out;
}

std::vector<std::byte> from_hex(const std::string& hex) {
  std::vector<std::byte> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::byte>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::string unique_name(const char* what) {
  return shared_arena::name_for(fmt::format("test{}", ::getpid()), what);
}

bool shm_exists(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd >= 0)
    ::close(fd);
  return fd >= 0;
}

/// Whether `p` lies in a mapping of /dev/shm/<name> in this process.
bool mapped_from(const void* p, const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  auto address = reinterpret_cast<std::uintptr_t>(p);
  while (std::getline(maps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2)
      continue;
    if (address >= lo && address < hi)
      return line.find("/dev/shm" + name) != std::string::npos;
  }
  return false;
}

/// The receiving process: opens the handoff from the environment, checks
/// the bytes and that they are the shared pages themselves, writes a marker
/// into them, drops the tensor and prints the release it sent.
int child_receiver() {
  arena_handoff handoff;
  handoff.region.arena = std::getenv("TROUPE_ARENA_NAME");
  handoff.region.offset = std::stoull(std::getenv("TROUPE_ARENA_OFFSET"));
  handoff.region.length = std::stoull(std::getenv("TROUPE_ARENA_LENGTH"));
  handoff.header = from_hex(std::getenv("TROUPE_ARENA_HEADER"));
  arena_mapper mapper([](const arena_ref& r) {
    std::printf("RELEASE %s %llu %llu\n", r.arena.c_str(),
                static_cast<unsigned long long>(r.offset),
                static_cast<unsigned long long>(r.length));
    std::fflush(stdout);
  });
  {
    auto message = mapper.open(handoff);
    if (!message)
      return 10;
    auto& t = message->value;
    if (t.numel() != 1024 || message->meta.destination != "receiver")
      return 11;
    auto* p = t.data<float>();
    for (int i = 0; i < 1024; ++i)
      if (p[i] != static_cast<float>(i))
        return 12;
    if (!mapped_from(p, handoff.region.arena))
      return 13; // a copy, not the shared pages
    p[0] = -42.0f; // the owner must see this
  }
  return mapper.mapped_arenas() == 1 ? 0 : 14;
}

const bool child_ran = [] {
  if (std::getenv("TROUPE_ARENA_CHILD"))
    std::_Exit(child_receiver());
  return false;
}();

} // namespace

TEST(SharedArena, HandoffToAnotherProcessIsByReferenceAndReleased) {
  auto arena = shared_arena::create(unique_name("handoff"), 1 << 20);
  ASSERT_TRUE(arena) << arena.error().to_string();
  auto& owner = **arena;
  auto t = owner.allocate({1024});
  ASSERT_TRUE(t);
  auto* p = t->data<float>();
  for (int i = 0; i < 1024; ++i)
    p[i] = static_cast<float>(i);
  message_meta meta;
  meta.destination = "receiver";
  auto handoff = owner.share(meta, *t);
  ASSERT_TRUE(handoff);

  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    env_strings.emplace_back(*e);
  env_strings.push_back("TROUPE_ARENA_CHILD=1");
  env_strings.push_back("TROUPE_ARENA_NAME=" + handoff->region.arena);
  env_strings.push_back(fmt::format("TROUPE_ARENA_OFFSET={}", handoff->region.offset));
  env_strings.push_back(fmt::format("TROUPE_ARENA_LENGTH={}", handoff->region.length));
  env_strings.push_back("TROUPE_ARENA_HEADER=" + to_hex(handoff->header));
  std::vector<char*> env;
  for (auto& s : env_strings)
    env.push_back(s.data());
  env.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, self, &actions, nullptr, argv, env.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  struct reaper {
    pid_t pid;
    bool reaped = false;
    ~reaper() {
      if (!reaped) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } guard{pid};

  // Read the child's release line (bounded), then its exit status.
  std::string output;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (output.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd fd{out[0], POLLIN, 0};
    if (::poll(&fd, 1, 100) > 0) {
      char buffer[256];
      auto n = ::read(out[0], buffer, sizeof buffer);
      if (n <= 0)
        break;
      output.append(buffer, static_cast<std::size_t>(n));
    }
  }
  ::close(out[0]);
  int status = -1;
  for (int i = 0; i < 1000 && ::waitpid(pid, &status, WNOHANG) != pid; ++i)
    std::this_thread::sleep_for(5ms);
  guard.reaped = WIFEXITED(status) || WIFSIGNALED(status);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);

  // The child's write landed in our memory: same pages, no copy.
  EXPECT_EQ(p[0], -42.0f);
  EXPECT_EQ(output, fmt::format("RELEASE {} {} {}\n", handoff->region.arena,
                                handoff->region.offset, handoff->region.length));

  // Released remotely but still held here: not free yet. Then both gone.
  ASSERT_TRUE(owner.release(handoff->region));
  EXPECT_EQ(owner.shared_regions(), 0u);
  EXPECT_EQ(owner.used_bytes(), 4096u);
  t = make_error(errc::invalid_argument, "dropped");
  EXPECT_EQ(owner.used_bytes(), 0u);
}

TEST(SharedArena, RegionIsFreedOnlyWhenBothSidesAreDone) {
  auto arena = shared_arena::create(unique_name("release"), 4096);
  ASSERT_TRUE(arena);
  auto& owner = **arena;
  arena_ref released;
  int releases = 0;
  arena_mapper mapper([&](const arena_ref& r) {
    released = r;
    ++releases;
  });
  auto handoff = [&] {
    auto t = owner.allocate({1024}); // the whole arena
    EXPECT_TRUE(t);
    auto h = owner.share({}, *t);
    EXPECT_TRUE(h);
    EXPECT_FALSE(owner.allocate({1})); // full
    return *h;
  }();
  // The owner's tensor is gone but the region is shared: still allocated.
  EXPECT_EQ(owner.used_bytes(), 4096u);
  {
    auto received = mapper.open(handoff);
    ASSERT_TRUE(received) << received.error().to_string();
    EXPECT_TRUE(mapped_from(received->value.raw_data(), handoff.region.arena));
  }
  ASSERT_EQ(releases, 1);
  EXPECT_EQ(released, handoff.region);
  EXPECT_EQ(owner.used_bytes(), 4096u);
  ASSERT_TRUE(owner.release(released));
  EXPECT_EQ(owner.used_bytes(), 0u);
  EXPECT_TRUE(owner.allocate({1024}));
  // A second release of the same region is refused, not a double free.
  EXPECT_FALSE(owner.release(released));
}

TEST(SharedArena, BadRegionsAreRejected) {
  auto arena = shared_arena::create(unique_name("bad"), 8192);
  ASSERT_TRUE(arena);
  auto t = (*arena)->allocate({256});
  ASSERT_TRUE(t);
  auto good = (*arena)->share({}, *t);
  ASSERT_TRUE(good);
  int releases = 0;
  arena_mapper mapper([&](const arena_ref&) { ++releases; });
  auto with = [&](auto change) {
    auto h = *good;
    change(h);
    return mapper.open(h);
  };
  auto rejected = [&](auto change, errc code) {
    auto r = with(change);
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error().code(), code) << r.error().to_string();
    }
  };
  rejected([](arena_handoff& h) { h.region.offset = 8192; }, errc::malformed_message);
  rejected([](arena_handoff& h) { h.region.offset = 8192 - 64; }, errc::malformed_message);
  rejected([](arena_handoff& h) { h.region.offset = ~std::uint64_t{0} - 63; },
           errc::malformed_message);
  rejected([](arena_handoff& h) { h.region.offset = 4; }, errc::malformed_message);
  rejected([](arena_handoff& h) { h.region.length = 1ull << 62; }, errc::malformed_message);
  rejected([](arena_handoff& h) { h.region.length = 512; }, errc::malformed_message);
  rejected([](arena_handoff& h) { h.region.arena = "/etc/passwd"; }, errc::malformed_message);
  rejected([](arena_handoff& h) { h.region.arena = "/troupe-../x"; }, errc::malformed_message);
  rejected([](arena_handoff& h) { h.region.arena += "-missing"; }, errc::io_error);
  rejected([](arena_handoff& h) { h.header.resize(8); }, errc::malformed_message);
  // Every field is checked before the region is accepted, so nothing was
  // released; an accepted region is released when its last view goes.
  EXPECT_EQ(releases, 0);
  EXPECT_TRUE(mapper.open(*good));
  EXPECT_EQ(releases, 1);
  // The owner refuses releases of regions it never shared.
  EXPECT_FALSE((*arena)->release({(*arena)->name(), 64, 64}));
  EXPECT_FALSE((*arena)->release({"/troupe-other", 0, 1024}));
}

TEST(SharedArena, StaleNamesAreReplacedAndNamesUnlinkedOnClose) {
  auto name = unique_name("stale");
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT, 0600); // left by a "crashed" run
  ASSERT_GE(fd, 0);
  ::close(fd);
  {
    auto arena = shared_arena::create(name, 4096);
    ASSERT_TRUE(arena) << arena.error().to_string();
    EXPECT_TRUE(shm_exists(name));
  }
  EXPECT_FALSE(shm_exists(name));
  EXPECT_FALSE(shared_arena::create("/not-troupe", 4096));
  EXPECT_FALSE(shared_arena::create(unique_name("zero"), 0));
}

TEST(SharedArena, ArenasLeftByAGoneProcessAreRemovedByItsPid) {
  // Names as a router makes them, for a process that is removed by its
  // pid and for a neighbour's. Both pids are alive (init and this process),
  // so no other test's router sweeps them away meanwhile
  // (remove_left_by_gone_processes).
  const long gone = 1, other = ::getpid();
  auto left = shared_arena::name_for(fmt::format("{:x}-{}", 0xabcdef, gone), "worker1");
  auto left_too = shared_arena::name_for(fmt::format("{:x}-{}", 0x12, gone), "worker0");
  auto neighbour = shared_arena::name_for(fmt::format("{:x}-{}", 0xabcdef, other), "worker1");
  auto lookalike = "/troupe-notHex_" + std::to_string(gone) + "-worker1"; // not a router's name
  for (const auto& name : {left, left_too, neighbour, lookalike}) {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0) << name;
    ::close(fd);
  }
  EXPECT_EQ(shared_arena::remove_left_by(gone), 2u);
  EXPECT_FALSE(shm_exists(left));
  EXPECT_FALSE(shm_exists(left_too));
  EXPECT_TRUE(shm_exists(neighbour));
  EXPECT_TRUE(shm_exists(lookalike));
  EXPECT_EQ(shared_arena::remove_left_by(gone), 0u);
  EXPECT_EQ(shared_arena::remove_left_by(0), 0u);
  ::shm_unlink(neighbour.c_str());
  ::shm_unlink(lookalike.c_str());
}

TEST(SharedArena, ArenasOfProcessesThatNoLongerExistAreRemovedAndLiveOnesKept) {
  // A child that has exited and been reaped: its pid names no process.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0)
    ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto gone = shared_arena::name_for(fmt::format("{:x}-{}", 0xabc, child), "worker1");
  auto live = shared_arena::name_for(fmt::format("{:x}-{}", 0xabc, ::getpid()), "worker9");
  auto lookalike = "/troupe-abc_" + std::to_string(child) + "x-worker1"; // not a router's name
  for (const auto& name : {gone, live, lookalike}) {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0) << name;
    ::close(fd);
  }
  // (Another test's router may sweep it first: only the outcome is checked.)
  (void)shared_arena::remove_left_by_gone_processes();
  EXPECT_FALSE(shm_exists(gone));
  EXPECT_TRUE(shm_exists(live)) << "this process is alive";
  EXPECT_TRUE(shm_exists(lookalike));
  ::shm_unlink(live.c_str());
  ::shm_unlink(lookalike.c_str());
}

TEST(SharedArena, ShareRegionCountsLikeShareAndContainsOnlyItsOwnMemory) {
  auto arena = shared_arena::create(unique_name("region"), 4096);
  ASSERT_TRUE(arena);
  auto& owner = **arena;
  auto t = owner.allocate({256});
  ASSERT_TRUE(t);
  EXPECT_TRUE(owner.contains(*t));
  EXPECT_FALSE(owner.contains(tensor::zeros({256})));
  EXPECT_FALSE(owner.contains(tensor{}));
  auto region = owner.share_region(*t);
  ASSERT_TRUE(region) << region.error().to_string();
  EXPECT_EQ(*region, (arena_ref{owner.name(), 0, 1024}));
  EXPECT_EQ(owner.shared_regions(), 1u);
  // A view that does not start the region cannot be shared by reference.
  EXPECT_FALSE(owner.share_region(t->narrow(0, 16, 16)));
  EXPECT_FALSE(owner.share_region(tensor::zeros({4})));
  *t = tensor{};
  EXPECT_EQ(owner.used_bytes(), 1024u); // still lent
  ASSERT_TRUE(owner.release(*region));
  EXPECT_EQ(owner.used_bytes(), 0u);
}

TEST(ArenaLoans, OnlyALentRegionCanBeGivenBackAndALostPeersLoansEndAtOnce) {
  arena_loans loans;
  arena_ref a{"/troupe-x", 0, 64}, b{"/troupe-x", 64, 128};
  loans.lend("worker1", a);
  loans.lend("worker1", a); // the same region handed over twice
  loans.lend("worker2", b);
  EXPECT_EQ(loans.outstanding(), 3u);
  EXPECT_EQ(loans.outstanding("worker1"), 2u);
  // Forged: another peer's region, a different length, an unknown peer.
  EXPECT_FALSE(loans.give_back("worker1", b));
  EXPECT_FALSE(loans.give_back("worker1", arena_ref{"/troupe-x", 0, 65}));
  EXPECT_FALSE(loans.give_back("worker3", a));
  EXPECT_TRUE(loans.give_back("worker1", a));
  EXPECT_TRUE(loans.give_back("worker1", a));
  auto repeated = loans.give_back("worker1", a); // a third release of two loans
  ASSERT_FALSE(repeated);
  EXPECT_EQ(repeated.error().code(), errc::invalid_argument);
  auto lost = loans.take_all("worker2");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0], b);
  EXPECT_EQ(loans.outstanding(), 0u);
  EXPECT_TRUE(loans.take_all("worker2").empty());
}
