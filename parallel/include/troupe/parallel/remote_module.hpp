#pragma once
// Remote modules: any nn module built at a place by its factory, called
// from other processes as if it were local. The caller's forward sends its
// input to the host actor, which runs the module under the step's context
// in its distributed-autograd registry (distributed_autograd.hpp) and sends
// the output back; the caller's backward sends the output's gradient, the
// host runs backward from the recorded output (its parameters' gradients
// accumulate where they live) and returns the input's gradient, so
// gradients keep flowing into whatever produced the input on the caller.
//
// The test hosts a module named "head" (its options list both callers'
// places in `o.callers`) and connects its two callers, all in one process.
// From tests/parallel/remote_module_test.cpp:
//
//   o.place = "worker0/cpu";
//   ...
//   o.factory = make_head;
//   o.optimizer = sgd_factory({.lr = 0.1});
//   ...
//   auto h = std::async(std::launch::async, [&] { return remote_module_host::host(node, o); });
//   ...
//   auto c = remote_module::connect(node, o, i);
//   ...
//   distributed_optimizer opt(std::make_unique<optim::sgd>(pre[i]->named_parameters(), optim::sgd_options{.lr = 0.1}),
//                             {&*m.callers[i]});
//   ...
//   auto out = (*m.callers[i])((*pre[i])(autograd::variable(xs[i][s].to(callers_on))));
//   ...
//   auto loss = autograd::mse_loss(out, autograd::variable(ys[i][s].to(callers_on)));
//   autograd::backward(loss);
//   ASSERT_TRUE(opt.step());
//
// In a job, the rank at `place` calls remote_module_host::host(job, o) and
// serves, and each caller calls remote_module::connect(job, o). A call
// returns an autograd variable, as a local module does; backward sends the
// gradient to the host, and the distributed optimizer steps the module
// where it lives together with the caller's own parameters.
//
// Checkpoints: every caller tracks its handle (checkpoints.hpp) and one of
// them coordinates; the host saves the module and its optimizer state from
// its own process as the part `<name>` of the job's model.
//
// Steps are synchronous: the host applies its optimizer for step t once
// every caller's step() for t arrived (gradients averaged over the callers
// by default, as data parallelism does), and holds a forward of step t+1
// until then, so training equals one process. Every wait is bounded; a lost
// host fails the caller's next call naming it; a lost caller fails the
// forwards that wait for its step.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/tensor/named_tensors.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/parallel/distributed_optimizer.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe {
class job;
namespace actors {
class node;
}
} // namespace troupe

namespace troupe::parallel {

struct remote_module_options {
  /// Names the module's actors: "<place>/module_<name>" and each caller's
  /// "<caller place>/module_<name>_caller<i>".
  std::string name;
  /// Where it lives: "<node>/<device>". On "<node>/cuda:N" the module, its
  /// optimizer and its work are on that GPU; a caller gets its answers on
  /// its input's device.
  std::string place;
  /// Every caller's "<node>/<device>", in order.
  std::vector<std::string> callers;
  /// Builds the module on the host (the same recipe on every rank).
  std::function<std::shared_ptr<nn::module>()> factory;
  /// The host's optimizer over the module's parameters (parallel::sgd_factory
  /// and adam_factory of pipeline.hpp give one).
  std::function<std::unique_ptr<optim::optimizer>(optim::named_variables)> optimizer;
  /// Divide the accumulated gradients by the number of callers before a
  /// step (data parallelism's average); false: their sum.
  bool average_over_callers = true;
  /// Bound on every wait (joining, a held forward); a caller waits twice
  /// this for a reply.
  std::chrono::milliseconds timeout{10000};
};

/// The host of a remote module: one actor (a thread fed by the router)
/// owning the module, its optimizer and its distributed-autograd registry.
class remote_module_host {
public:
  static expected<remote_module_host> host(troupe::job& job, remote_module_options options);
  static expected<remote_module_host> host(actors::node& node, remote_module_options options);
  ~remote_module_host();
  remote_module_host(remote_module_host&&) noexcept;
  remote_module_host& operator=(remote_module_host&&) noexcept;
  remote_module_host(const remote_module_host&) = delete;
  remote_module_host& operator=(const remote_module_host&) = delete;

  /// Copies of the module's parameters, on the host (tests, checks).
  named_tensors parameters() const;
  /// Steps applied so far.
  std::uint64_t steps_applied() const;
  void stop();

  struct state;

private:
  explicit remote_module_host(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

/// A caller's handle on a remote module.
class remote_module final : public remote_parameters {
public:
  static expected<remote_module> connect(troupe::job& job, remote_module_options options);
  /// `caller`: the entry of options.callers this is, or (-1) the first on this node.
  static expected<remote_module> connect(actors::node& node, remote_module_options options,
                                         std::int64_t caller = -1);
  ~remote_module() override;
  remote_module(remote_module&&) noexcept;
  remote_module& operator=(remote_module&&) noexcept;
  remote_module(const remote_module&) = delete;
  remote_module& operator=(const remote_module&) = delete;

  /// The module's output for `input`, recorded for backward. Throws
  /// std::runtime_error naming the host when it fails or is lost.
  autograd::variable operator()(const autograd::variable& input);

  /// Tells the host this caller's step is done (its optimizer applies once
  /// every caller's is); the next forward belongs to the next step.
  expected<void> step() override;
  /// Nothing to drop here: the host zeroes its gradients after each step.
  void zero_grad() override {}

  std::uint64_t current_step() const;
  /// Unregisters the caller's reply actor; later calls fail (idempotent).
  void shutdown();

  struct state;

private:
  friend struct remote_module_access; // checkpoints of the host (parallel/src)
  explicit remote_module(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

} // namespace troupe::parallel
