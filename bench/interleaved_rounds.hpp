#pragma once
// Timed rounds of troupe's work interleaved with rounds of a peer's (a
// process answering "steps N", see peer_process.hpp), so that the
// machine's drift in speed, which on these VMs happens within seconds,
// hits both sides alike.
#include <string>
#include <vector>

#include "peer_process.hpp"
#include "report.hpp"

namespace troupe::bench {

struct step_times {
  std::vector<double> ours;   ///< seconds per call of ours
  std::vector<double> theirs; ///< the peer's "step_seconds"
  std::string last_reply;     ///< the peer's last answer (losses and the like)
};

/// `rounds` rounds of `steps` timed calls of `ours`, each followed by the
/// peer's `steps` steps. `peer` may be null; a peer that stops answering is
/// noted through `out` and set to null, and the rounds go on without it.
template <class Step>
step_times interleaved_rounds(int rounds, int steps, Step&& ours, peer_process*& peer, int timeout_ms,
                              const report& out) {
  step_times times;
  for (int r = 0; r < rounds; ++r) {
    for (int s = 0; s < steps; ++s) {
      const auto start = now_seconds();
      ours();
      times.ours.push_back(now_seconds() - start);
    }
    if (peer == nullptr)
      continue;
    auto reply = peer->ask(fmt::format("steps {}", steps), timeout_ms);
    if (!reply) {
      out.note("the peer stopped answering");
      peer = nullptr;
      continue;
    }
    for (auto t : json_numbers(*reply, "step_seconds"))
      times.theirs.push_back(t);
    times.last_reply = *reply;
  }
  return times;
}

} // namespace troupe::bench
