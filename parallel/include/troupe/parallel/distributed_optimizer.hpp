#pragma once
// One optimizer step over parameters held in many places: the trainer's own
// optimizer steps its local (and data-parallel) parameters, and every
// remote holder (parameter-server tables through their client, remote
// modules) applies its own optimizer where the parameters live. Nothing
// moves parameters.
#include <memory>
#include <vector>

#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

/// Parameters that live in another actor and are stepped there.
class remote_parameters {
public:
  virtual ~remote_parameters() = default;
  /// Sends this step's gradients (or the signal that this caller's step is
  /// done) to where the parameters live; never waits for the update.
  virtual expected<void> step() = 0;
  /// Forgets gradients recorded on this side for the current step.
  virtual void zero_grad() = 0;
};

class distributed_optimizer {
public:
  /// `local` may be null (every parameter is remote).
  distributed_optimizer(std::unique_ptr<optim::optimizer> local, std::vector<remote_parameters*> remote)
      : local_(std::move(local)), remote_(std::move(remote)) {}
  /// Local step, then every remote holder's step(); the first error is returned.
  expected<void> step();
  /// Local gradients dropped and every remote holder's zero_grad().
  void zero_grad();
  optim::optimizer* local() { return local_.get(); }

private:
  std::unique_ptr<optim::optimizer> local_;
  std::vector<remote_parameters*> remote_;
};

} // namespace troupe::parallel
