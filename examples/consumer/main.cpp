// Built against an installed troupe (CMakeLists.txt beside this file): one
// SGD step of a linear layer, with the job reading the command line.
#include <fmt/format.h>

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/all.hpp"
#include "troupe/job.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  job job(argc, argv); // flags only: this program trains in one process
  const auto rows = job.flag("rows", 8, 1, 1024);
  generator gen{1};
  auto x = randn({rows, 3}, gen);
  nn::linear layer(3, 2, 7);
  optim::sgd opt(layer.named_parameters(), {.lr = 0.1});
  auto target = autograd::variable(tensor::zeros({rows, 2}));
  const double before = autograd::mse_loss(layer(autograd::variable(x)), target).item();
  autograd::backward(autograd::mse_loss(layer(autograd::variable(x)), target));
  opt.step();
  const double after = autograd::mse_loss(layer(autograd::variable(x)), target).item();
  fmt::print("consumer: loss {:.4f} -> {:.4f}\n", before, after);
  return after < before ? 0 : 1;
}
