// Forward + backward of the ops a GPT step is made of, at the shapes of
// gpt_step's 6-block GPT (16 x 128 tokens, width 256, 8 heads, vocabulary
// 86), troupe beside PyTorch (bench/peers/ops_torch.py, one thread) in
// interleaved rounds of the same run. Each case runs the op forward, then
// backward from a fixed upstream gradient, through autograd on both sides.
//
//   build/bench/ops [--json] [--rounds=5] [--python=/usr/bin/python3] [--no-peers]
//
// Each round runs as many calls as fill about 25 ms (3 to 100), then the
// peer's as many; the figures are medians over every call. The correctness
// column checks the gradient is finite and not all zero.
#include <algorithm>
#include <cmath>
#include <functional>

#include "interleaved_rounds.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/causal_self_attention.hpp"
#include "troupe/autograd/nn/embedding.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
#include "troupe/autograd/optim/adam.hpp"

using namespace troupe;
using autograd::variable;

namespace {

constexpr std::int64_t batch = 16, sequence = 128, width = 256, heads = 8, vocabulary = 86;
constexpr std::int64_t tokens = batch * sequence;

/// One case: `run()` does forward + backward (or the optimizer step) once
/// and returns the gradient it checks.
struct op_case {
  std::string name;
  std::function<tensor()> run;
};

/// Forward, then backward from `upstream`; returns the input's gradient.
tensor forward_backward(const variable& input, const std::function<variable(const variable&)>& f,
                        const tensor& upstream) {
  auto x = input.detach();
  x.set_requires_grad(true);
  auto y = f(x);
  const variable roots[] = {y};
  const tensor grads[] = {upstream};
  autograd::backward(roots, grads);
  return x.grad();
}

} // namespace

int main(int argc, char** argv) {
  bench::check_flags("ops", argc, argv, {"rounds=", "python=", "no-peers"});
  bench::report out("ops", argc, argv);
  const auto rounds = static_cast<int>(bench::int_option(argc, argv, "rounds", 5, 1, 1000));
  const auto python = bench::option(argc, argv, "python", "/usr/bin/python3");
  bool peers = true;
  for (int i = 1; i < argc; ++i)
    peers &= std::string_view(argv[i]) != "--no-peers";

  generator gen{3};
  auto hidden = randn({tokens, 4 * width}, gen);
  auto scores = randn({batch * heads, sequence, sequence}, gen);
  auto activations = randn({batch, sequence, width}, gen);
  auto logits = randn({tokens, vocabulary}, gen);
  auto targets = randint({tokens}, gen, 0, vocabulary);
  auto ids = randint({batch, sequence}, gen, 0, vocabulary);
  nn::layer_norm norm(width);
  nn::causal_self_attention attention(nn::attention_options{.n_embd = width, .n_head = heads, .seed = 1});
  nn::causal_self_attention attention_dropout(
    nn::attention_options{.n_embd = width, .n_head = heads, .dropout = 0.1, .seed = 1});
  nn::embedding table(vocabulary, width, 2);
  auto parameter = variable(randn({4'800'000}, gen), true);
  optim::adamw adamw(nn::named_variables{{"p", parameter}}, optim::adam_options{.lr = 1e-3, .weight_decay = 0.01});
  parameter.set_grad(randn({4'800'000}, gen));

  const std::vector<op_case> cases{
    {"gelu [2048, 1024]",
     [&] { return forward_backward(variable(hidden), [](const variable& x) { return autograd::gelu(x); }, hidden); }},
    {"gelu tanh [2048, 1024]",
     [&] {
       return forward_backward(
         variable(hidden), [](const variable& x) { return autograd::gelu(x, gelu_approximation::tanh); }, hidden);
     }},
    {"softmax [128, 128, 128]",
     [&] {
       return forward_backward(variable(scores), [](const variable& x) { return autograd::softmax(x, -1); }, scores);
     }},
    {"layer_norm [2048, 256]",
     [&] { return forward_backward(variable(activations), [&](const variable& x) { return norm(x); }, activations); }},
    {"attention [16, 128, 256], 8 heads",
     [&] {
       return forward_backward(variable(activations), [&](const variable& x) { return attention(x); }, activations);
     }},
    {"attention, dropout p = 0.1 (weights, output)",
     [&] {
       return forward_backward(
         variable(activations), [&](const variable& x) { return attention_dropout(x); }, activations);
     }},
    {"cross_entropy [2048, 86]",
     [&] {
       return forward_backward(variable(logits),
                               [&](const variable& x) { return autograd::cross_entropy(x, targets); },
                               tensor::ones({}));
     }},
    {"embedding [16, 128] of [86, 256]",
     [&] {
       table.zero_grad();
       auto y = table(variable(ids));
       const variable roots[] = {y};
       const tensor grads[] = {activations};
       autograd::backward(roots, grads);
       return table.named_parameters().front().second.grad();
     }},
    {"dropout p = 0.1 [2048, 1024]",
     [&] {
       return forward_backward(
         variable(hidden), [](const variable& x) { return autograd::dropout(x, 0.1, true); }, hidden);
     }},
    {"bias gradient: sum over rows of [2048, 1024]", [&] { return sum(hidden, {0}); }},
    {"to bfloat16 and back [2048, 1024]", [&] { return hidden.to(dtype::bfloat16).to(dtype::float32); }},
    {"adamw step, 4.8M parameters",
     [&] {
       adamw.step();
       return parameter.data();
     }},
  };

  std::optional<bench::peer_process> torch;
  if (peers)
    torch.emplace(std::vector<std::string>{python, std::string(TROUPE_SOURCE_DIR) + "/bench/peers/ops_torch.py"});
  bool have_peer =
    torch && torch->started() && torch->read_line(120'000).value_or("").find("ready") != std::string::npos;
  if (peers && !have_peer)
    out.note("PyTorch peer unavailable (install python3-torch); reporting troupe alone");

  for (std::size_t k = 0; k < cases.size(); ++k) {
    const auto& c = cases[k];
    auto gradient = c.run(); // warm-up, and the gradient the correctness column checks
    const auto call_start = bench::now_seconds();
    (void)c.run();
    const auto call_seconds = bench::now_seconds() - call_start;
    const auto values = gradient.to_vector<double>();
    bool finite = true;
    bool nonzero = false;
    for (double v : values) {
      finite &= std::isfinite(v);
      nonzero |= v != 0.0;
    }
    if (have_peer)
      torch->ask(fmt::format("case {}", k), 120'000); // the peer's warm-up of the same case
    bench::peer_process* peer = have_peer ? &*torch : nullptr;
    // Enough calls that a round of the short, memory-bound ops lasts about
    // 25 ms: the first call after the other process's turn finds its data
    // evicted, and a round of three such calls was mostly that.
    const int calls = static_cast<int>(std::clamp(std::ceil(0.025 / std::max(call_seconds, 1e-6)), 3.0, 100.0));
    auto times = bench::interleaved_rounds(rounds, calls, [&] { (void)c.run(); }, peer, 120'000, out);
    have_peer = peer != nullptr;
    bench::row r{c.name, "fwd+bwd", bench::median(times.ours) * 1e6, "us", "", {},
                 finite && nonzero ? "gradient finite, nonzero" : "WRONG: gradient not finite or all zero"};
    if (!times.theirs.empty()) {
      r.baseline = "PyTorch 1 thread";
      r.baseline_value = bench::median(times.theirs) * 1e6;
    }
    out.add(r);
  }
  out.note("a ratio below 1 means troupe takes less time");
  out.print();
}
