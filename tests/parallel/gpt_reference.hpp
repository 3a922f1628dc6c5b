#pragma once
// The one-process side of the tensor-parallel GPT tests: nn::gpt trained
// by SGD on token batches, its losses and its parameters afterwards.
#include <functional>
#include <vector>

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/gpt.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/tensor/named_tensors.hpp"

namespace troupe::test {

struct gpt_reference {
  std::vector<double> losses;
  named_tensors parameters;
};

/// `steps` SGD steps (lr 0.1) of nn::gpt(config), the mean cross entropy
/// of every token: step s reads ids(s, 0) and predicts ids(s, 1).
inline gpt_reference train_gpt(const nn::gpt_config& config, int steps,
                               const std::function<tensor(int step, std::uint64_t salt)>& ids) {
  nn::gpt whole(config);
  gpt_reference out;
  optim::sgd opt(whole.named_parameters(), {.lr = 0.1});
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    const auto targets = ids(s, 1);
    auto logits = whole(autograd::variable(ids(s, 0)));
    auto loss = autograd::cross_entropy(autograd::reshape(logits, {targets.numel(), config.vocab_size}),
                                        targets.reshape({targets.numel()}));
    autograd::backward(loss);
    opt.step();
    out.losses.push_back(loss.item());
  }
  for (auto& [name, p] : whole.named_parameters())
    out.parameters.emplace_back(name, p.data().clone());
  return out;
}

} // namespace troupe::test
