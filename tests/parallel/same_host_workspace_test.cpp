// The same-host allreduce's workspace (parallel/src/same_host_workspace.hpp):
// the offer every member sends when joining comes from another process, so
// its decoder is tested against bad input, and so is mapping a peer's
// segment that does not hold what was announced, and so is a slot header
// that names values outside the peer's arena or an address its process
// does not map. The allreduce itself is
// tested through reducer_group in collectives_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>

#include <optional>
#include <string>
#include <thread>

#include "same_host_layout.hpp"
#include "same_host_workspace.hpp"
#include "troupe/actors/shared_arena.hpp"
#include <unistd.h>

using namespace troupe;
using namespace troupe::parallel;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

namespace {

std::vector<std::byte> bytes_of(std::string_view text) {
  auto b = std::as_bytes(std::span(text.data(), text.size()));
  return {b.begin(), b.end()};
}

same_host_offer sample() {
  return {.wants = true,
          .host_key = "1f2e-boot:803:1",
          .segment = {.name = "/troupe-ws-123-1-00000000deadbeef",
                      .nonce = 0xdeadbeef,
                      .pass_bytes = 262144,
                      .arena = "/troupe-00ff_123-worker1",
                      .arena_bytes = std::uint64_t{1} << 30}};
}

TEST(SameHostOffer, RoundTrips) {
  auto decoded = decode_offer(encode_offer(sample()));
  ASSERT_TRUE(decoded) << decoded.error().message();
  EXPECT_TRUE(decoded->wants);
  EXPECT_EQ(decoded->host_key, "1f2e-boot:803:1");
  EXPECT_EQ(decoded->segment.name, "/troupe-ws-123-1-00000000deadbeef");
  EXPECT_EQ(decoded->segment.nonce, 0xdeadbeefu);
  EXPECT_EQ(decoded->segment.pass_bytes, 262144u);
  EXPECT_EQ(decoded->segment.arena, "/troupe-00ff_123-worker1");
  EXPECT_EQ(decoded->segment.arena_bytes, std::uint64_t{1} << 30);
  for (auto algorithm : {message_algorithm::ring, message_algorithm::halving_doubling, message_algorithm::automatic}) {
    auto other = sample();
    other.messages = algorithm;
    auto decoded_other = decode_offer(encode_offer(other));
    ASSERT_TRUE(decoded_other) << decoded_other.error().message();
    EXPECT_EQ(decoded_other->messages, algorithm);
  }
  // A member that declines sends no segment.
  auto declined = decode_offer(encode_offer({.wants = false, .host_key = "", .segment = {}}));
  ASSERT_TRUE(declined) << declined.error().message();
  EXPECT_FALSE(declined->wants);
}

TEST(SameHostOffer, MalformedOffersAreErrorsNamingTheField) {
  auto good = encode_offer(sample());
  std::string text(reinterpret_cast<const char*>(good.data()), good.size());
  struct bad {
    std::string text;
    const char* names;
  };
  const std::string head = "troupe-same-host 3\n1\nk\n";
  const std::vector<bad> cases = {
      {"", "0 lines"},
      {text.substr(0, text.size() - 1), "does not end in a newline"},
      {"troupe-same-host 1\n1\nk\n/troupe-ws-1\nff\n4096\n\n0\nring\n", "first line"},
      {"troupe-same-host 3\n2\nk\n/troupe-ws-1\nff\n4096\n\n0\nring\n", "'wants' is '2'"},
      {"troupe-same-host 3\n1\nk\x01\n/troupe-ws-1\nff\n4096\n\n0\nring\n", "unprintable byte 0x1"},
      {head + "/etc/passwd\nff\n4096\n\n0\nring\n", "must start with '/troupe-ws-'"},
      {head + "/troupe-ws-../x\nff\n4096\n\n0\nring\n", "has character 0x2e"},
      {head + "/troupe-ws-1\nfg\n4096\n\n0\nring\n", "nonce 'fg' is not a base-16 number"},
      {head + "/troupe-ws-1\n1ffffffffffffffff\n4096\n\n0\nring\n", "nonce '1ffffffffffffffff' is above"},
      {head + "/troupe-ws-1\nff\n\n\n0\nring\n", "pass_bytes '' is not a number"},
      {head + "/troupe-ws-1\nff\n1073741825\n\n0\nring\n", "pass_bytes '1073741825' is above 1073741824"},
      {head + "/troupe-ws-1\nff\n4096\n\n0\nring\nextra\n", "10 lines, want 9"},
      {head + "/troupe-ws-1\nff\n4096\n", "6 lines, want 9"},
      {head + "/troupe-ws-1\nff\n4096\n/troupe-a-w0\n\nring\n", "arena_bytes '' is not a number"},
      {head + "/troupe-ws-1\nff\n4096\n/troupe-a-w0\n1099511627777\nring\n", "arena_bytes '1099511627777' is above"},
      {head + "/troupe-ws-1\nff\n4096\n/troupe-a-w0\n0\nring\n", "arena '/troupe-a-w0' with 0 bytes"},
      {head + "/troupe-ws-1\nff\n4096\n\n4096\nring\n", "arena '' with 4096 bytes"},
      {head + "/troupe-ws-1\nff\n4096\n/dev/shm/x\n4096\nring\n", "must start with '/troupe-'"},
      {head + "/troupe-ws-1\nff\n4096\n/troupe-a/../b\n4096\nring\n", "has character 0x2f"},
      {head + "/troupe-ws-1\nff\n4096\n\n0\nRing\n",
       "message algorithm 'Ring' is not one of ring, halving-doubling, automatic"},
      {text + std::string(1100, 'x'), "at most 1024 allowed"},
  };
  for (const auto& c : cases) {
    auto decoded = decode_offer(bytes_of(c.text));
    ASSERT_FALSE(decoded) << c.text;
    EXPECT_EQ(decoded.error().code(), errc::malformed_message);
    EXPECT_THAT(decoded.error().message(), HasSubstr(c.names)) << c.text;
  }
}

same_host_workspace_options options_for(std::uint32_t rank) {
  return {.rank = rank, .size = 2, .pass_bytes = 4096, .timeout = 300ms, .failure = {},
          .describe = [](std::uint32_t k) { return "replica " + std::to_string(k); },
          .arena_name = {}, .arena_base = nullptr, .arena_bytes = 0};
}

TEST(SameHostWorkspace, BadOptionsAreRefused) {
  auto lonely = options_for(0);
  lonely.size = 1;
  auto one = same_host_workspace::create(lonely);
  ASSERT_FALSE(one);
  EXPECT_THAT(one.error().message(), HasSubstr("needs 2 or more ranks"));
  auto odd = options_for(0);
  odd.pass_bytes = 5000;
  auto refused = same_host_workspace::create(odd);
  ASSERT_FALSE(refused);
  EXPECT_THAT(refused.error().message(), HasSubstr("pass_bytes 5000 must be a multiple of 64"));
}

/// `ws` refuses to map `offer` as rank 1's segment, saying `what`.
void expect_refused(same_host_workspace& ws, const same_host_workspace::invitation& offer, const std::string& what) {
  auto mapped = ws.map_peer(1, offer);
  ASSERT_FALSE(mapped);
  EXPECT_THAT(mapped.error().message(), HasSubstr(what));
}

TEST(SameHostWorkspace, MappingASegmentThatDoesNotMatchItsOfferFails) {
  auto a = same_host_workspace::create(options_for(0));
  auto b = same_host_workspace::create(options_for(1));
  ASSERT_TRUE(a && b);
  auto offer = (*b)->own();

  auto wrong_nonce = offer;
  wrong_nonce.nonce ^= 1;
  expect_refused(**a, wrong_nonce, "does not hold what was announced");

  auto wrong_size = offer;
  wrong_size.pass_bytes = 8192;
  expect_refused(**a, wrong_size, "pass_bytes 8192 differs");

  auto missing = offer;
  missing.name = "/troupe-ws-0-0-nothing";
  expect_refused(**a, missing, "replica 1");

  // Rank 0's own segment announced as rank 1's: the rank field differs.
  expect_refused(**a, (*a)->own(), "does not hold what was announced");

  EXPECT_TRUE((*a)->map_peer(1, offer));
}

TEST(SameHostWorkspace, SetupWaitsForEveryPeerAndUnlinksTheName) {
  auto a = same_host_workspace::create(options_for(0));
  auto b = same_host_workspace::create(options_for(1));
  ASSERT_TRUE(a && b);
  auto name = (*a)->own().name;
  ASSERT_TRUE((*a)->map_peer(1, (*b)->own()));
  // Rank 1 never maps rank 0: setup gives up after the timeout, naming it.
  auto start = std::chrono::steady_clock::now();
  auto alone = (*a)->finish_setup();
  ASSERT_FALSE(alone);
  EXPECT_THAT(alone.error().message(), HasSubstr("replica 1 did not map every member's workspace within 300 ms"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  ASSERT_TRUE((*b)->map_peer(0, (*a)->own()));
  std::thread other([&] { EXPECT_TRUE((*b)->finish_setup()); });
  EXPECT_TRUE((*a)->finish_setup());
  other.join();
  // Both mapped: the names are gone from /dev/shm, the mappings stay.
  EXPECT_LT(shm_open(name.c_str(), O_RDONLY, 0), 0);
  std::vector<float> x(3000, 1.0f), y(3000, 2.0f);
  std::thread reducer([&] { EXPECT_TRUE((*b)->allreduce(y.data(), 3000, false, 7, (*b)->take_ticket())); });
  EXPECT_TRUE((*a)->allreduce(x.data(), 3000, false, 7, (*a)->take_ticket()));
  reducer.join();
  EXPECT_EQ(x, std::vector<float>(3000, 3.0f));
  EXPECT_EQ(y, x);
}

/// `o` with `arena` as its node's arena.
same_host_workspace_options with_arena(same_host_workspace_options o, const actors::shared_arena& arena) {
  o.arena_name = arena.name();
  o.arena_base = arena.base();
  o.arena_bytes = arena.capacity();
  return o;
}

/// Two ranks of one group in this process, each with its own node arena,
/// set up as reducer_group does it.
struct two_ranks {
  std::unique_ptr<actors::shared_arena> arena[2];
  std::unique_ptr<same_host_workspace> ws[2];
};

two_ranks set_up_with_arenas() {
  two_ranks t;
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto arena = actors::shared_arena::create(fmt::format("/troupe-wstest_{}-r{}", ::getpid(), r), 1 << 20);
    EXPECT_TRUE(arena) << arena.error().message();
    t.arena[r] = std::move(*arena);
    auto ws = same_host_workspace::create(with_arena(options_for(r), *t.arena[r]));
    EXPECT_TRUE(ws) << ws.error().message();
    t.ws[r] = std::move(*ws);
  }
  EXPECT_TRUE(t.ws[0]->map_peer(1, t.ws[1]->own()));
  EXPECT_TRUE(t.ws[1]->map_peer(0, t.ws[0]->own()));
  std::thread other([&] { EXPECT_TRUE(t.ws[1]->finish_setup()); });
  EXPECT_TRUE(t.ws[0]->finish_setup());
  other.join();
  return t;
}

TEST(SameHostWorkspace, TensorsInTheArenaAreReadWhereTheyLie) {
  // 3001 floats in passes of 1024: three passes, the last one short.
  constexpr std::int64_t count = 3001;
  for (auto [in0, in1] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
    auto t = set_up_with_arenas();
    const bool in_arena[2] = {in0, in1};
    tensor values[2];
    for (int r = 0; r < 2; ++r) {
      if (in_arena[r]) {
        auto allocated = t.arena[r]->allocate({count});
        ASSERT_TRUE(allocated);
        values[r] = *allocated;
      } else {
        values[r] = tensor::empty({count});
      }
      auto* v = values[r].data<float>();
      for (std::int64_t i = 0; i < count; ++i)
        v[i] = static_cast<float>((r + 1) * 1000 + i % 97) / 8.0f; // exact in float, sums too
    }
    std::thread other([&] {
      EXPECT_TRUE(t.ws[1]->allreduce(values[1].data<float>(), count, false, 9, t.ws[1]->take_ticket()));
    });
    auto ok = t.ws[0]->allreduce(values[0].data<float>(), count, false, 9, t.ws[0]->take_ticket());
    other.join();
    ASSERT_TRUE(ok) << ok.error().message();
    auto* a = values[0].data<float>();
    auto* b = values[1].data<float>();
    for (std::int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(a[i], static_cast<float>(3000 + 2 * (i % 97)) / 8.0f) << "element " << i << " (" << in0 << in1 << ")";
      ASSERT_EQ(a[i], b[i]) << "element " << i;
    }
    // Each rank's tensor in its arena was read in place by the other.
    EXPECT_EQ(t.ws[0]->published_in_place(), in0 ? 1u : 0u);
    EXPECT_EQ(t.ws[1]->published_in_place(), in1 ? 1u : 0u);
    EXPECT_EQ(t.ws[0]->read_in_place(), in1 ? 1u : 0u);
    EXPECT_EQ(t.ws[1]->read_in_place(), in0 ? 1u : 0u);
  }
}

TEST(SameHostWorkspace, APeersArenaMustBeWhatItAnnounced) {
  auto arena = actors::shared_arena::create(fmt::format("/troupe-wstest_{}-announced", ::getpid()), 1 << 20);
  ASSERT_TRUE(arena);
  auto a = same_host_workspace::create(options_for(0));
  auto b = same_host_workspace::create(with_arena(options_for(1), **arena));
  ASSERT_TRUE(a && b);
  auto offer = (*b)->own();
  EXPECT_EQ(offer.arena, (*arena)->name());

  auto wrong_size = offer;
  wrong_size.arena_bytes += 64;
  expect_refused(**a, wrong_size, "announced " + std::to_string(wrong_size.arena_bytes));

  auto missing = offer;
  missing.arena = "/troupe-wstest-nobody-has-this";
  expect_refused(**a, missing, "shm_open(/troupe-wstest-nobody-has-this)");

  auto not_an_arena = offer;
  not_an_arena.arena = "/troupe-ws-../../etc";
  expect_refused(**a, not_an_arena, "has character 0x2f");

  EXPECT_TRUE((*a)->map_peer(1, offer));

  // A workspace refuses an arena it cannot describe.
  auto bad = options_for(0);
  bad.arena_name = "/troupe-x";
  bad.arena_bytes = 4096; // but no mapping
  auto refused = same_host_workspace::create(bad);
  ASSERT_FALSE(refused);
  EXPECT_THAT(refused.error().message(), HasSubstr("need a mapping"));
}


/// A peer's segment mapped by its name (before finish_setup unlinks it), so
/// that the test can write its header as that peer would.
struct played_peer {
  void* base = MAP_FAILED;
  std::size_t bytes = 0;
  explicit played_peer(const same_host_workspace::invitation& segment)
      : bytes(same_host_layout::segment_bytes(segment.pass_bytes)) {
    const int fd = shm_open(segment.name.c_str(), O_RDWR, 0);
    EXPECT_GE(fd, 0) << segment.name;
    if (fd >= 0) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
    EXPECT_NE(base, MAP_FAILED);
  }
  ~played_peer() {
    if (base != MAP_FAILED)
      munmap(base, bytes);
  }
  same_host_layout::control& head() const { return *static_cast<same_host_layout::control*>(base); }
};

/// Ranks 0 (`a`, the one tested) and 1 (`b`) set up with each other, and
/// rank 1's segment mapped for the test to write its slot headers.
struct played_pair {
  std::unique_ptr<same_host_workspace> a, b;
  std::optional<played_peer> peer;
  explicit played_pair(same_host_workspace_options b_options) {
    auto made_a = same_host_workspace::create(options_for(0));
    auto made_b = same_host_workspace::create(std::move(b_options));
    if (!made_a || !made_b) {
      ADD_FAILURE() << "workspaces not created";
      return;
    }
    a = std::move(*made_a);
    b = std::move(*made_b);
    EXPECT_TRUE(a->map_peer(1, b->own()));
    EXPECT_TRUE(b->map_peer(0, a->own()));
    peer.emplace(b->own());
    std::thread other([&] { EXPECT_TRUE(b->finish_setup()); });
    EXPECT_TRUE(a->finish_setup());
    other.join();
  }
  bool ready() const { return a && b && peer && peer->base != MAP_FAILED; }
  /// Publishes, as rank 1, pass 1 (the first of the next collective): the
  /// first pass of collective `id` of `count` float32 values, which lie at
  /// `source` of its arena, or at `address` of its process.
  void publish_first_pass(same_host_layout::collective kind, std::uint64_t id, std::uint64_t count,
                          std::uint64_t source, std::uint64_t address = 0) const {
    auto& slot = peer->head().slot[1 % same_host_layout::slot_count];
    slot.element_bytes = sizeof(float);
    slot.kind = static_cast<std::uint32_t>(kind);
    slot.id = id;
    slot.count = count;
    slot.pass_index = 0;
    slot.source = source;
    slot.address = address;
    slot.published.store(1, std::memory_order_release);
  }
};

TEST(SameHostWorkspace, AHeaderNamingValuesOutsideThePeersArenaIsRefused) {
  constexpr std::int64_t count = 3000; // 12000 bytes
  auto arena = actors::shared_arena::create(fmt::format("/troupe-wstest_{}-header", ::getpid()), 1 << 20);
  ASSERT_TRUE(arena);
  const std::uint64_t capacity = (*arena)->capacity();
  struct header_case {
    bool peer_has_arena;
    std::uint64_t source;
    std::string says;
  };
  const header_case cases[] = {
      {false, 0, "published 12000 bytes at offset 0 of its arena, which has 0 bytes"},
      {true, capacity - 4, fmt::format("published 12000 bytes at offset {} of its arena, which has {} bytes",
                                       capacity - 4, capacity)},
      // Aligned, and offset + bytes wraps around to inside the arena.
      {true, std::uint64_t{0} - 4096, fmt::format("at offset {} of its arena", std::uint64_t{0} - 4096)},
      {true, 2, "published 12000 bytes at offset 2 of its arena"}, // not aligned for float
  };
  for (const auto& c : cases) {
    played_pair pair(c.peer_has_arena ? with_arena(options_for(1), **arena) : options_for(1));
    ASSERT_TRUE(pair.ready());
    auto& a = pair.a;
    // Rank 1 announces pass 1 of the same allreduce (id 7), its values "in its arena" at c.source.
    pair.publish_first_pass(same_host_layout::collective::allreduce, 7, count, c.source);
    std::vector<float> x(count, 1.0f);
    auto refused = a->allreduce(x.data(), count, false, 7, a->take_ticket());
    ASSERT_FALSE(refused) << "offset " << c.source;
    EXPECT_EQ(refused.error().code(), errc::malformed_message);
    EXPECT_THAT(refused.error().message(), HasSubstr("same-host allreduce: replica 1 published"));
    EXPECT_THAT(refused.error().message(), HasSubstr(c.says));
    EXPECT_EQ(x, std::vector<float>(count, 1.0f)) << "the tensor is left as it was";
  }
}

// A peer that announces its all-gather piece at an address of its process
// that it does not map (wholly, or from some byte on) gets an error naming
// it, the address and the first byte that could not be read.
TEST(SameHostWorkspace, AHeaderNamingAnAddressThePeerDoesNotMapIsRefused) {
  constexpr std::int64_t count = 1024; // one pass of 4096 bytes
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // One readable page followed by one that is not mapped.
  auto* pages = static_cast<std::byte*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                             -1, 0));
  ASSERT_NE(pages, MAP_FAILED);
  ASSERT_EQ(munmap(pages + page, page), 0);
  struct address_case {
    std::uint64_t address;
    std::string says;
  };
  const auto straddling = reinterpret_cast<std::uintptr_t>(pages) + page - 100;
  const address_case cases[] = {
      {16, "reading 4096 bytes at 0x10 of replica 1's process"},
      {straddling, fmt::format("reading 4096 bytes at {:#x} of replica 1's process (pid {}) failed at byte 100",
                               straddling, ::getpid())},
  };
  for (const auto& c : cases) {
    played_pair pair(options_for(1));
    ASSERT_TRUE(pair.ready());
    auto& a = pair.a;
    // Rank 1 announces pass 1, the first of all-gather 9, its piece "at" c.address of its process.
    pair.publish_first_pass(same_host_layout::collective::all_gather, 9, count, same_host_layout::in_slot, c.address);
    std::vector<float> mine(count, 1.0f), out(2 * count, 0.0f);
    auto refused = a->all_gather(mine.data(), count, out.data(), 9, a->take_ticket());
    ASSERT_FALSE(refused) << "address " << c.address;
    EXPECT_EQ(refused.error().code(), errc::malformed_message);
    EXPECT_THAT(refused.error().message(), HasSubstr("same-host all-gather: " + c.says));
  }
  munmap(pages, page);
}

} // namespace
