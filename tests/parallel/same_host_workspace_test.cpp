// The same-host allreduce's workspace (parallel/src/same_host_workspace.hpp):
// the offer every member sends when joining comes from another process, so
// its decoder is tested against bad input, and so is mapping a peer's
// segment that does not hold what was announced. The allreduce itself is
// tested through reducer_group in collectives_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>

#include <string>
#include <thread>

#include "same_host_workspace.hpp"

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
          .segment = {.name = "/troupe-ws-123-1-00000000deadbeef", .nonce = 0xdeadbeef, .pass_bytes = 262144}};
}

TEST(SameHostOffer, RoundTrips) {
  auto decoded = decode_offer(encode_offer(sample()));
  ASSERT_TRUE(decoded) << decoded.error().message();
  EXPECT_TRUE(decoded->wants);
  EXPECT_EQ(decoded->host_key, "1f2e-boot:803:1");
  EXPECT_EQ(decoded->segment.name, "/troupe-ws-123-1-00000000deadbeef");
  EXPECT_EQ(decoded->segment.nonce, 0xdeadbeefu);
  EXPECT_EQ(decoded->segment.pass_bytes, 262144u);
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
  const std::vector<bad> cases = {
      {"", "0 lines"},
      {text.substr(0, text.size() - 1), "does not end in a newline"},
      {"troupe-same-host 2\n1\nk\n/troupe-ws-1\nff\n4096\n", "first line"},
      {"troupe-same-host 1\n2\nk\n/troupe-ws-1\nff\n4096\n", "'wants' is '2'"},
      {"troupe-same-host 1\n1\nk\x01\n/troupe-ws-1\nff\n4096\n", "unprintable byte 0x1"},
      {"troupe-same-host 1\n1\nk\n/etc/passwd\nff\n4096\n", "must start with '/troupe-ws-'"},
      {"troupe-same-host 1\n1\nk\n/troupe-ws-../x\nff\n4096\n", "has character 0x2e"},
      {"troupe-same-host 1\n1\nk\n/troupe-ws-1\nfg\n4096\n", "nonce 'fg' is not a base-16 number"},
      {"troupe-same-host 1\n1\nk\n/troupe-ws-1\n1ffffffffffffffff\n4096\n", "nonce '1ffffffffffffffff' is above"},
      {"troupe-same-host 1\n1\nk\n/troupe-ws-1\nff\n\n", "pass_bytes '' is not a number"},
      {"troupe-same-host 1\n1\nk\n/troupe-ws-1\nff\n1073741825\n", "pass_bytes '1073741825' is above 1073741824"},
      {"troupe-same-host 1\n1\nk\n/troupe-ws-1\nff\n4096\nextra\n", "7 lines, want 6"},
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
          .describe = [](std::uint32_t k) { return "replica " + std::to_string(k); }};
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

TEST(SameHostWorkspace, MappingASegmentThatDoesNotMatchItsOfferFails) {
  auto a = same_host_workspace::create(options_for(0));
  auto b = same_host_workspace::create(options_for(1));
  ASSERT_TRUE(a && b);
  auto offer = (*b)->own();

  auto wrong_nonce = offer;
  wrong_nonce.nonce ^= 1;
  auto mapped = (*a)->map_peer(1, wrong_nonce);
  ASSERT_FALSE(mapped);
  EXPECT_THAT(mapped.error().message(), HasSubstr("does not hold what was announced"));

  auto wrong_size = offer;
  wrong_size.pass_bytes = 8192;
  mapped = (*a)->map_peer(1, wrong_size);
  ASSERT_FALSE(mapped);
  EXPECT_THAT(mapped.error().message(), HasSubstr("pass_bytes 8192 differs"));

  auto missing = offer;
  missing.name = "/troupe-ws-0-0-nothing";
  mapped = (*a)->map_peer(1, missing);
  ASSERT_FALSE(mapped);
  EXPECT_THAT(mapped.error().message(), HasSubstr("replica 1"));

  // Rank 0's own segment announced as rank 1's: the rank field differs.
  mapped = (*a)->map_peer(1, (*a)->own());
  ASSERT_FALSE(mapped);
  EXPECT_THAT(mapped.error().message(), HasSubstr("does not hold what was announced"));

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

} // namespace
