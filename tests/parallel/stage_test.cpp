// The stage factory's spawn arguments arrive from another process:
// stage_spec_from must accept what to_message writes and refuse everything
// else with a message naming the problem.
#include "stage.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <caf/all.hpp>

namespace troupe::parallel {
namespace {

using ::testing::HasSubstr;

stage_spec replicated() {
  stage_spec s;
  s.index = 1;
  s.stages = 2;
  s.begin = 4;
  s.end = 8;
  s.credits = 2;
  s.fixed_order = true;
  s.micro_batches = 3;
  s.replica_rank = 1;
  s.ring = "worker1/cpu/r0.stage1.reducer,worker3/cpu/r1.stage1.reducer";
  s.bucket_bytes = 4096;
  s.ring_timeout_ms = 500;
  return s;
}

std::string refusal(const stage_spec& s) {
  auto got = stage_spec_from(to_message(s));
  return got ? std::string("accepted") : got.error_value().message();
}

TEST(StageSpec, RoundTrip) {
  auto got = stage_spec_from(to_message(replicated()));
  ASSERT_TRUE(got) << got.error_value().message();
  EXPECT_EQ(got->index, 1u);
  EXPECT_EQ(got->end, 8u);
  EXPECT_EQ(got->replica_rank, 1u);
  EXPECT_TRUE(got->fixed_order);
  EXPECT_EQ(got->micro_batches, 3u);
  auto ring = ring_places(*got);
  ASSERT_TRUE(ring);
  EXPECT_EQ(*ring, (std::vector<std::string>{"worker1/cpu/r0.stage1.reducer", "worker3/cpu/r1.stage1.reducer"}));
  stage_spec plain; // not replicated
  plain.end = 1;
  auto p = stage_spec_from(to_message(plain));
  ASSERT_TRUE(p) << p.error_value().message();
  EXPECT_TRUE(ring_places(*p)->empty());
}

TEST(StageSpec, WrongElementTypesAreRefused) {
  auto got = stage_spec_from(caf::make_message(std::uint64_t{1}, std::string("two")));
  ASSERT_FALSE(got);
  EXPECT_THAT(got.error_value().message(), HasSubstr("must be (index, stages"));
  EXPECT_EQ(got.error_value().code(), errc::malformed_message);
}

TEST(StageSpec, InconsistentValuesAreRefused) {
  auto s = replicated();
  s.index = 2;
  EXPECT_THAT(refusal(s), HasSubstr("stage 2 of 2"));
  s = replicated();
  s.begin = 8;
  EXPECT_THAT(refusal(s), HasSubstr("layers [8, 8)"));
  s = replicated();
  s.credits = 0;
  EXPECT_THAT(refusal(s), HasSubstr("0 credits"));
  s = replicated();
  s.micro_batches = 0;
  EXPECT_THAT(refusal(s), HasSubstr("0 micro-batches"));
}

TEST(StageSpec, BadRingsAreRefused) {
  auto s = replicated();
  s.ring = "worker1/cpu/r0.stage1.reducer,not a place";
  EXPECT_THAT(refusal(s), HasSubstr("reducer place 1 of its ring"));
  s.ring = "worker1/cpu/r0.stage1.reducer,";
  EXPECT_THAT(refusal(s), HasSubstr("reducer place 1 of its ring"));
  s.ring = "worker1/cpu"; // no actor name
  EXPECT_THAT(refusal(s), HasSubstr("reducer place 0 of its ring"));
  s = replicated();
  s.replica_rank = 2;
  EXPECT_THAT(refusal(s), HasSubstr("replica 2 of a ring of 2"));
  s = replicated();
  s.ring = "worker1/cpu/r0.stage1.reducer";
  s.replica_rank = 0;
  EXPECT_THAT(refusal(s), HasSubstr("a ring of 1"));
  s = replicated();
  s.bucket_bytes = 0;
  EXPECT_THAT(refusal(s), HasSubstr("buckets of 0 bytes"));
  s = replicated();
  s.ring_timeout_ms = 0;
  EXPECT_THAT(refusal(s), HasSubstr("0 ms timeout"));
  s = replicated();
  s.ring.clear();
  for (int k = 0; k < 5000; ++k)
    s.ring += (k ? "," : "") + std::string("w/cpu/r");
  EXPECT_THAT(refusal(s), HasSubstr("more than 4096 replicas"));
}

} // namespace
} // namespace troupe::parallel
