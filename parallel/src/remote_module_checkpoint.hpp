#pragma once
// Remote modules in distributed checkpoints (internal: parallel::checkpoints
// and the module's host use it).
//
// Names. Remote module `head` is the part `head` of the job's model that
// keeps an optimizer of its own: its state is saved as `model.head.<name>`,
// its optimizer's as `optimizer.head.<key>` and `optimizer.head.step`
// (state_names::of_part), by the host as writer `remote-module.head`. The
// coordinator (one of the callers) records the module's step, the last step
// the host applied, as the metadata `remote_module.head.step`; after a
// resume every caller continues at the step after it.
//
// Requests. The coordinator sends them to the host as message_kind::control
// carrying a ps_wire checkpoint request (uint8; the end of a caller's step is
// a float32 control message): save (held until the host has applied step
// table_step, then copied, answered and written: on the host's writer
// thread when asynchronous), load (every tensor read and checked, staged;
// nothing changes) and apply_load (the staged state put in place, the
// module continuing after table_step).
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "ps_wire.hpp"
#include "troupe/parallel/remote_module.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

/// The writer name of remote module `name`'s host.
std::string remote_module_writer(std::string_view name);
/// The metadata key of the module's step.
std::string remote_module_step_key(std::string_view name);
/// The step of remote module `name` in the checkpoint; errc::state_mismatch
/// when it holds none.
expected<std::uint64_t> saved_module_step(const checkpoint_reader& reader, std::string_view name);

/// A caller's side of the host's checkpoint requests (remote_module.cpp).
struct remote_module_access {
  static const remote_module_options& options(const remote_module& module);
  /// Which of options.callers this one is.
  static std::uint32_t caller(const remote_module& module);
  /// The step this caller ended last (0: none).
  static std::uint64_t last_step(const remote_module& module);
  /// Sends `kind` to the host and waits (at most `timeout`) for its answer;
  /// its error names the host.
  static expected<void> ask_host(remote_module& module, ps_wire::op kind, const ps_wire::checkpoint_request& request,
                                 std::chrono::milliseconds timeout);
  /// After a resume: the next step is `module_step + 1`.
  static void continue_after(remote_module& module, std::uint64_t module_step);
};

} // namespace troupe::parallel
