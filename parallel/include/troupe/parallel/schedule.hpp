#pragma once
// Pipeline schedules as credits (docs/design.md): no global clock, only a local
// rule in every stage — "hold at most K micro-batches in flight" plus a
// priority between ready forward and ready backward work.
//
//   GPipe (fill-drain)  K = m (every micro-batch), forward first: a stage
//                       runs every forward it has before any backward.
//   1F1B                K = min(m, p - i) for stage i of p, backward first:
//                       after the warm-up of p - i forwards, each finished
//                       backward frees the credit for the next forward.
//
// Why this cannot deadlock. A micro-batch is "in flight" at stage i from its
// forward until its backward there. (1) Backward work never waits: it needs
// no credit, and it only frees one. (2) Only a forward waits, and only for a
// credit of its own stage, i.e. for a backward of a micro-batch that stage
// already forwarded — which depends only on stages after it. (3) The last
// stage creates each micro-batch's backward itself right after its forward
// (the loss), so every forward it admits returns. (4) By induction from the
// last stage down, every forward admitted anywhere returns, so every credit
// comes back; forwards are admitted in arrival (micro-batch) order, so no
// micro-batch waits behind one that can never be admitted. The wait-for
// relation points strictly downstream for credits and upstream for data, so
// it has no cycle. K >= 1 is required; K = p - i is the smallest that keeps
// the pipeline full (the warm-up of stage i covers the p - i - 1 stages after
// it plus its own forward).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>

#include "troupe/actors/tensor_message.hpp"

namespace troupe::parallel {

enum class schedule_kind : std::uint8_t {
  gpipe,       ///< fill-drain: all forwards, then all backwards
  one_f_one_b, ///< PipeDream-flush / Megatron 1F1B
};

constexpr std::string_view name_of(schedule_kind kind) {
  return kind == schedule_kind::gpipe ? "gpipe" : "1f1b";
}

/// The schedule called `name` ("gpipe" or "1f1b", as name_of writes them);
/// usage_error for any other name.
schedule_kind schedule_named(std::string_view name);

/// One stage's local rule.
struct schedule_policy {
  /// Micro-batches the stage may hold in flight (forward done, backward not).
  std::size_t credits = 1;
  /// Run a ready backward before a ready forward.
  bool backward_first = true;
  /// Micro-batches of a step (policy_for sets it).
  std::size_t micro_batches = 1;
  /// Run the work in one order fixed by the credits alone, waiting for the
  /// next piece to arrive instead of running other ready work: a forward
  /// (in micro-batch order) while the step has forwards left and a credit
  /// is free, else the oldest micro-batch's backward. For GPipe every
  /// forward, then every backward; for 1F1B the warm-up forwards, then one
  /// backward and one forward, then the last backwards (Megatron's order).
  /// Stages whose layers make collectives with other pipelines' stages
  /// (tensor parallelism) need it: every member of a group makes the same
  /// calls in the same order, which arrival order does not give.
  bool fixed_order = false;
};

/// The policy of stage `stage` of `stages` for `micro_batches` per step.
/// Throws usage_error for a stage out of range or zero micro-batches.
schedule_policy policy_for(schedule_kind kind, std::size_t stage, std::size_t stages,
                           std::size_t micro_batches);

/// A stage's ready work, picked by its policy. Messages are kept as they
/// arrived (tensor_message shares the tensor: nothing is copied).
class work_queue {
public:
  explicit work_queue(schedule_policy policy) : policy_(policy) {}

  /// A forward whose inputs are complete, or a backward.
  void push(actors::tensor_message work);

  /// The next work to run, or nothing when only forwards beyond the credit
  /// limit (or nothing at all) are waiting. Popping a forward takes a
  /// credit; call `finished_backward` to give it back.
  std::optional<actors::tensor_message> pop();

  /// A micro-batch's backward finished on this stage: its credit returns.
  void finished_backward();

  /// Drops all queued work and credits (a failed step).
  void clear();

  bool has_runnable() const noexcept;
  std::size_t in_flight() const noexcept { return in_flight_; }
  std::size_t peak_in_flight() const noexcept { return peak_in_flight_; }
  void reset_peak() noexcept { peak_in_flight_ = in_flight_; }
  std::size_t queued() const noexcept { return forwards_.size() + backwards_.size(); }
  const schedule_policy& policy() const noexcept { return policy_; }

private:
  /// Fixed order: whether the next work is a forward, and its position in
  /// its queue; nothing when it has not arrived.
  struct position {
    bool forward;
    std::size_t index;
  };
  std::optional<position> next_in_order() const noexcept;

  schedule_policy policy_;
  std::deque<actors::tensor_message> forwards_;
  std::deque<actors::tensor_message> backwards_;
  std::size_t in_flight_ = 0;
  std::size_t peak_in_flight_ = 0;
  /// Fixed order: forwards and backwards of the step taken so far.
  std::size_t forwards_taken_ = 0;
  std::size_t backwards_taken_ = 0;
};

} // namespace troupe::parallel
