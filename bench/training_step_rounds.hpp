#pragma once
// How the one-process training benchmarks (gpt_step, cnn_step) time one
// model beside the PyTorch peer and turn it into their samples/s row.
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "interleaved_rounds.hpp"
#include "peer_process.hpp"
#include "report.hpp"
#include "troupe/tensor/device.hpp"

namespace troupe::bench {

struct training_step_result {
  step_times times;
  double last_loss = NAN; ///< troupe's loss after the timed steps
  /// samples/s, with the peer's beside it when it ran; the note says
  /// whether troupe's loss fell ("WRONG" if not) and the peer's losses.
  row samples;
};

/// Two untimed steps on each side (the allocators' pools, cuBLAS's
/// workspaces, cuDNN's algorithm choice; the peer answers with its first
/// loss), then `rounds` of `steps` steps of `train_step` (returning the
/// loss) alternated with the peer's (interleaved_rounds). `peer` may be
/// null; `samples` is the batch size, `threads` the intra-op threads.
template <class Step>
training_step_result time_training_steps(Step&& train_step, peer_process* peer, int rounds, int steps,
                                         const std::string& case_name, double samples, device where, int threads,
                                         const report& out) {
  training_step_result result;
  const double first_loss = train_step();
  train_step();
  result.last_loss = first_loss;
  double torch_first = NAN;
  if (peer != nullptr) {
    auto reply = peer->ask("steps 2", 300'000);
    torch_first = reply ? json_number(*reply, "first_loss").value_or(NAN) : NAN;
  }
  result.times = interleaved_rounds(rounds, steps, [&] { result.last_loss = train_step(); }, peer, 600'000, out);
  const double torch_last = json_number(result.times.last_reply, "loss").value_or(NAN);
  auto check = fmt::format("loss {:.4f} -> {:.4f}{}", first_loss, result.last_loss,
                           std::isfinite(result.last_loss) && result.last_loss < first_loss ? "" : " WRONG");
  result.samples = row{case_name, "samples/s", samples / median(result.times.ours), "samples/s", "", {}, check};
  if (!result.times.theirs.empty()) {
    result.samples.baseline = where.kind != device_kind::cpu ? "PyTorch CUDA"
                              : threads == 1                  ? "PyTorch 1 thread"
                                                              : fmt::format("PyTorch {} threads", threads);
    result.samples.baseline_value = samples / median(result.times.theirs);
    result.samples.note += fmt::format("; torch loss {:.4f} -> {:.4f}", torch_first, torch_last);
  }
  return result;
}

} // namespace troupe::bench
