// Credits and priorities, and a whole pipeline simulated without actors.
#include "troupe/parallel/schedule.hpp"

#include <deque>
#include <string>

#include <gtest/gtest.h>

namespace troupe::parallel {
namespace {

actors::tensor_message work(message_kind kind, std::uint32_t mb) {
  actors::tensor_message m;
  m.meta.kind = kind;
  m.meta.micro_batch = mb;
  return m;
}

TEST(Schedule, CreditsPerStage) {
  EXPECT_EQ(policy_for(schedule_kind::gpipe, 0, 4, 8).credits, 8u);
  EXPECT_FALSE(policy_for(schedule_kind::gpipe, 0, 4, 8).backward_first);
  EXPECT_EQ(policy_for(schedule_kind::one_f_one_b, 0, 4, 8).credits, 4u);
  EXPECT_EQ(policy_for(schedule_kind::one_f_one_b, 3, 4, 8).credits, 1u);
  EXPECT_EQ(policy_for(schedule_kind::one_f_one_b, 0, 4, 2).credits, 2u);
  EXPECT_TRUE(policy_for(schedule_kind::one_f_one_b, 1, 4, 8).backward_first);
  EXPECT_THROW((void)policy_for(schedule_kind::gpipe, 4, 4, 8), usage_error);
  EXPECT_THROW((void)policy_for(schedule_kind::gpipe, 0, 4, 0), usage_error);
}

TEST(Schedule, ForwardBeyondCreditWaitsAndBackwardGoesFirst) {
  work_queue q({.credits = 2, .backward_first = true});
  for (std::uint32_t mb = 0; mb < 3; ++mb)
    q.push(work(message_kind::forward_activation, mb));
  EXPECT_EQ(q.pop()->meta.micro_batch, 0u);
  EXPECT_EQ(q.pop()->meta.micro_batch, 1u);
  EXPECT_FALSE(q.pop().has_value()); // mb 2 waits for a credit
  EXPECT_FALSE(q.has_runnable());
  q.push(work(message_kind::backward_gradient, 0));
  auto b = q.pop();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->meta.kind, message_kind::backward_gradient);
  q.finished_backward();
  EXPECT_EQ(q.pop()->meta.micro_batch, 2u);
  EXPECT_EQ(q.peak_in_flight(), 2u);
}

TEST(Schedule, GPipeRunsForwardsBeforeBackwards) {
  work_queue q({.credits = 4, .backward_first = false});
  q.push(work(message_kind::forward_activation, 1));
  q.push(work(message_kind::backward_gradient, 0));
  EXPECT_EQ(q.pop()->meta.kind, message_kind::forward_activation);
  EXPECT_EQ(q.pop()->meta.kind, message_kind::backward_gradient);
}

// The fixed order waits for the micro-batch whose turn it is, whatever else
// is ready: 1F1B with 2 credits and 3 micro-batches runs F0 F1 B0 F2 B1 B2
// although forward 1 arrives last and backward 1 before backward 0; then
// the next step starts over at F0.
TEST(Schedule, FixedOrderWaitsForTheMicroBatchWhoseTurnItIs) {
  work_queue q({.credits = 2, .backward_first = true, .micro_batches = 3, .fixed_order = true});
  auto next = [&] {
    auto w = q.pop();
    if (!w)
      return std::string("wait");
    if (w->meta.kind == message_kind::backward_gradient) {
      q.finished_backward();
      return "B" + std::to_string(w->meta.micro_batch);
    }
    return "F" + std::to_string(w->meta.micro_batch);
  };
  q.push(work(message_kind::forward_activation, 0));
  q.push(work(message_kind::forward_activation, 2));
  EXPECT_EQ(next(), "F0");
  EXPECT_EQ(next(), "wait") << "forward 2 is ready, but forward 1 comes first";
  q.push(work(message_kind::forward_activation, 1));
  q.push(work(message_kind::backward_gradient, 1));
  EXPECT_EQ(next(), "F1");
  EXPECT_EQ(next(), "wait") << "backward 1 is ready, but backward 0 comes first";
  EXPECT_FALSE(q.has_runnable());
  q.push(work(message_kind::backward_gradient, 0));
  EXPECT_TRUE(q.has_runnable());
  EXPECT_EQ(next(), "B0");
  EXPECT_EQ(next(), "F2");
  EXPECT_EQ(next(), "B1");
  EXPECT_EQ(next(), "wait");
  q.push(work(message_kind::forward_activation, 0)); // the next step's, before this one's last backward
  EXPECT_EQ(next(), "wait");
  q.push(work(message_kind::backward_gradient, 2));
  EXPECT_EQ(next(), "B2");
  EXPECT_EQ(next(), "F0");
}

/// Runs p stages' queues as a discrete simulation (one piece of work per
/// stage per tick, messages arrive the next tick) and returns each stage's
/// order of work, "F0 F1 B0 ...". Fails the test on a deadlock.
std::vector<std::string> simulate(schedule_kind kind, std::size_t p, std::uint32_t m) {
  std::vector<work_queue> queues;
  for (std::size_t s = 0; s < p; ++s)
    queues.emplace_back(policy_for(kind, s, p, m));
  for (std::uint32_t mb = 0; mb < m; ++mb)
    queues[0].push(work(message_kind::forward_activation, mb));
  std::vector<std::string> order(p);
  std::uint32_t done = 0;
  for (int tick = 0; tick < 1000 && done < m; ++tick) {
    std::vector<std::pair<std::size_t, actors::tensor_message>> mail;
    for (std::size_t s = 0; s < p; ++s) {
      auto w = queues[s].pop();
      if (!w)
        continue;
      const bool forward = w->meta.kind == message_kind::forward_activation;
      order[s] += (forward ? "F" : "B") + std::to_string(w->meta.micro_batch) + " ";
      if (forward && s + 1 < p)
        mail.emplace_back(s + 1, *w);
      else if (forward) // last stage: its backward is ready at once
        mail.emplace_back(s, work(message_kind::backward_gradient, w->meta.micro_batch));
      else {
        queues[s].finished_backward();
        if (s > 0)
          mail.emplace_back(s - 1, *w);
        else
          ++done;
      }
    }
    for (auto& [s, w] : mail)
      queues[s].push(w);
  }
  EXPECT_EQ(done, m) << "deadlock";
  return order;
}

TEST(Schedule, SimulatedPipelinesFinishAndFollowTheirSchedule) {
  for (auto kind : {schedule_kind::gpipe, schedule_kind::one_f_one_b})
    for (std::size_t p = 1; p <= 5; ++p)
      for (std::uint32_t m = 1; m <= 9; ++m)
        simulate(kind, p, m);
  auto gpipe = simulate(schedule_kind::gpipe, 2, 4);
  EXPECT_EQ(gpipe[0], "F0 F1 F2 F3 B0 B1 B2 B3 ");
  auto one_f_one_b = simulate(schedule_kind::one_f_one_b, 2, 4);
  EXPECT_EQ(one_f_one_b[0], "F0 F1 B0 F2 B1 F3 B2 B3 ");
  EXPECT_EQ(one_f_one_b[1], "F0 B0 F1 B1 F2 B2 F3 B3 ");
}

} // namespace
} // namespace troupe::parallel
