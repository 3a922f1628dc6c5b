// The CPU's transcendental elementwise ops, troupe beside PyTorch
// (bench/peers/elementwise_torch.py, one thread) in interleaved rounds of
// the same run: GELU forward and backward, exp, tanh and sigmoid over 2^20
// float32 elements drawn from N(0, scale). The scale matters: glibc's
// scalar erff is several times slower once |x| grows, as GELU's inputs do
// during training.
//
//   build/bench/elementwise [--json] [--rounds=5] [--python=/usr/bin/python3] [--no-peers]
//
// The correctness column compares troupe's result with a float64 reference
// computed here: the largest |ours - reference| / (1 + |reference|), an
// absolute error for small values (GELU's tail underflows in float32, and
// its derivative crosses zero) and a relative one for large.
#include <cmath>

#include "peer_process.hpp"
#include "report.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;

namespace {

struct op_case {
  const char* name;
  double scale;
};

constexpr op_case cases[] = {
  {"gelu", 0.5}, {"gelu", 3.0}, {"gelu_backward", 0.5}, {"gelu_backward", 3.0},
  {"exp", 1.0},  {"tanh", 1.0}, {"sigmoid", 1.0},
};
constexpr std::int64_t elements = std::int64_t{1} << 20;

tensor run(std::string_view op, const tensor& x, const tensor& g) {
  if (op == "gelu")
    return gelu(x);
  if (op == "gelu_backward")
    return gelu_backward(g, x);
  if (op == "exp")
    return exp(x);
  if (op == "tanh")
    return tanh(x);
  return sigmoid(x);
}

/// Largest error of troupe's float32 result against float64 (see above).
double worst_error(std::string_view op, const tensor& x, const tensor& g) {
  auto ours = run(op, x, g).to_vector<double>();
  auto want = run(op, x.to(dtype::float64), g.to(dtype::float64)).to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < ours.size(); ++i)
    worst = std::max(worst, std::abs(ours[i] - want[i]) / (1.0 + std::abs(want[i])));
  return worst;
}

} // namespace

int main(int argc, char** argv) {
  bench::check_flags("elementwise", argc, argv, {"rounds=", "python=", "no-peers"});
  bench::report out("elementwise", argc, argv);
  const auto rounds = static_cast<int>(bench::int_option(argc, argv, "rounds", 5, 1, 1000));
  const auto python = bench::option(argc, argv, "python", "/usr/bin/python3");
  bool peers = true;
  for (int i = 1; i < argc; ++i)
    peers &= std::string_view(argv[i]) != "--no-peers";
  std::optional<bench::peer_process> torch;
  if (peers)
    torch.emplace(std::vector<std::string>{python, std::string(TROUPE_SOURCE_DIR) + "/bench/peers/elementwise_torch.py",
                                           std::to_string(elements)});
  bool have_peer =
    torch && torch->started() && torch->read_line(120'000).value_or("").find("ready") != std::string::npos;
  if (peers && !have_peer)
    out.note("PyTorch peer unavailable (install python3-torch); reporting troupe alone");

  for (const auto& c : cases) {
    generator gen{11};
    auto x = randn({elements}, gen, 0.0, c.scale);
    auto g = randn({elements}, gen);
    (void)run(c.name, x, g); // warm-up: the allocator's blocks
    std::vector<double> ours, theirs;
    for (int r = 0; r < rounds; ++r) {
      ours.push_back(bench::time_per_call([&] { (void)run(c.name, x, g); }, 0.1));
      if (have_peer) {
        auto reply = torch->ask(fmt::format("{} {}", c.name, c.scale), 120'000);
        if (auto t = reply ? bench::json_number(*reply, "seconds") : std::nullopt)
          theirs.push_back(*t);
      }
    }
    const double error = worst_error(c.name, x, g);
    bench::row r{fmt::format("{} N(0, {}) 2^20 float32", c.name, c.scale), "time/element",
                 bench::median(ours) * 1e9 / elements, "ns", "", {},
                 fmt::format("max error {:.1e}{}", error, error < 1e-5 ? "" : " WRONG")};
    if (!theirs.empty()) {
      r.baseline = "PyTorch 1 thread";
      r.baseline_value = bench::median(theirs) * 1e9 / elements;
    }
    out.add(r);
  }
  out.note("a ratio below 1 means troupe takes less time per element");
  out.print();
}
