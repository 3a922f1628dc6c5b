// One-process training throughput of the MLP in docs/baselines.md:
// 8 x (Linear(1024, 1024) + ReLU), batch 256, MSE loss against a random
// target, SGD(lr = 0.05), one compute thread — troupe beside PyTorch
// (/usr/bin/python3, bench/peers/mlp_step_torch.py) in interleaved rounds
// of the same run.
//
//   build/bench/mlp_step [--json] [--rounds=5] [--steps=4] [--no-peers]
#include <cmath>

#include "interleaved_rounds.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/relu.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/sgd.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  bench::check_flags("mlp_step", argc, argv, {"rounds=", "steps=", "no-peers"});
  bench::report out("mlp_step", argc, argv);
  const auto rounds = static_cast<int>(bench::int_option(argc, argv, "rounds", 5, 1, 1000));
  const auto steps = static_cast<int>(bench::int_option(argc, argv, "steps", 4, 1, 1000));
  constexpr std::int64_t dim = 1024, layers = 8, batch = 256;

  auto model = std::make_shared<nn::sequential>();
  for (std::int64_t i = 0; i < layers; ++i) {
    model->append(nn::make<nn::linear>(dim, dim, /*seed=*/0));
    model->append(nn::make<nn::relu>());
  }
  model->reset_parameters(0);
  optim::sgd sgd(model->named_parameters(), {.lr = 0.05});
  generator data_gen{1234};
  autograd::variable x(randn({batch, dim}, data_gen));
  autograd::variable y(randn({batch, dim}, data_gen));

  auto train_step = [&] {
    sgd.zero_grad();
    auto loss = autograd::mse_loss((*model)(x), y);
    autograd::backward(loss);
    sgd.step();
    return loss.item();
  };

  bool peers = true;
  for (int i = 1; i < argc; ++i)
    peers &= std::string_view(argv[i]) != "--no-peers";
  std::optional<bench::peer_process> torch;
  if (peers)
    torch.emplace(std::vector<std::string>{"/usr/bin/python3",
                                           std::string(TROUPE_SOURCE_DIR) + "/bench/peers/mlp_step_torch.py"});
  bool have_peer = torch && torch->started() && torch->read_line(120'000).value_or("").find("ready") != std::string::npos;
  if (peers && !have_peer)
    out.note("PyTorch peer unavailable (install python3-torch); reporting troupe alone");

  // Warm-up, then rounds in which each side runs `steps` timed steps, so the
  // machine's speed drift hits both alike.
  double first_loss = train_step();
  double last_loss = first_loss;
  double torch_loss = NAN;
  if (have_peer)
    torch->ask("steps 1", 120'000);
  bench::peer_process* peer = have_peer ? &*torch : nullptr;
  auto times = bench::interleaved_rounds(rounds, steps, [&] { last_loss = train_step(); }, peer, 300'000, out);
  have_peer = peer != nullptr;
  const auto& ours = times.ours;
  const auto& theirs = times.theirs;
  torch_loss = bench::json_number(times.last_reply, "loss").value_or(NAN);
  auto ours_rate = batch / bench::median(ours);
  // The correctness column: the loss must be finite and falling.
  auto check = fmt::format("loss {:.4f} -> {:.4f}{}", first_loss, last_loss,
                           std::isfinite(last_loss) && last_loss < first_loss ? "" : " WRONG");
  bench::row r{"8x(Linear(1024,1024)+ReLU) b256", "samples/s", ours_rate, "samples/s", "", {}, check};
  if (have_peer && !theirs.empty()) {
    r.baseline = "PyTorch 1 thread";
    r.baseline_value = batch / bench::median(theirs);
    r.note += fmt::format("; torch loss {:.4f}", torch_loss);
  }
  out.add(r);
  out.add({"8x(Linear(1024,1024)+ReLU) b256", "step time", bench::median(ours) * 1e3, "ms",
           r.baseline_value ? "PyTorch 1 thread" : "",
           r.baseline_value ? std::optional<double>(bench::median(theirs) * 1e3) : std::nullopt, ""});
  out.print();
}
