// Layer profiling and the balance-by-time dynamic programme.
#include "troupe/parallel/partition.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include <fmt/format.h>

#include "troupe/autograd/backward.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

namespace {

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

std::size_t parameter_bytes_of(const nn::module& layer) {
  std::size_t bytes = 0;
  for (const auto& p : layer.parameters())
    bytes += p.data().nbytes();
  return bytes;
}

std::string format_bytes(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20))
    return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= (std::size_t{1} << 10))
    return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1 << 10));
  return fmt::format("{} B", bytes);
}

} // namespace

double partition::bottleneck_ms() const {
  return predicted_ms.empty() ? 0.0 : *std::max_element(predicted_ms.begin(), predicted_ms.end());
}

std::vector<layer_profile> profile_layers(nn::sequential& model, const tensor& sample,
                                          const profile_options& options) {
  require(options.repetitions >= 1, "profile_layers: repetitions is {} but must be >= 1",
          options.repetitions);
  require(sample.defined(), "profile_layers: no sample input");
  std::vector<layer_profile> out(model.size());
  tensor h = sample;
  for (std::size_t i = 0; i < model.size(); ++i) {
    auto& layer = *model.at(i);
    auto& p = out[i];
    p.parameter_bytes = parameter_bytes_of(layer);
    p.forward_ms = p.backward_ms = std::numeric_limits<double>::infinity();
    tensor next;
    // One warm-up run, then the timed ones.
    for (int rep = 0; rep <= options.repetitions; ++rep) {
      autograd::variable x(h, is_floating(h.type()));
      auto t0 = std::chrono::steady_clock::now();
      auto y = layer.forward(x);
      double forward = elapsed_ms(t0);
      double backward = 0;
      if (y.requires_grad()) {
        auto grad = tensor::ones(y.shape(), y.type());
        auto t1 = std::chrono::steady_clock::now();
        autograd::variable roots[] = {y};
        tensor grads[] = {grad};
        autograd::backward(roots, grads);
        backward = elapsed_ms(t1);
      }
      if (rep > 0) {
        p.forward_ms = std::min(p.forward_ms, forward);
        p.backward_ms = std::min(p.backward_ms, backward);
      }
      next = y.data();
    }
    p.activation_bytes = next.nbytes();
    layer.zero_grad();
    h = next;
  }
  return out;
}

partition from_balance(const std::vector<std::size_t>& balance, std::size_t layers) {
  require(!balance.empty(), "partition: the balance list is empty");
  partition out;
  out.boundaries.push_back(0);
  for (std::size_t i = 0; i < balance.size(); ++i) {
    require(balance[i] > 0, "partition: stage {} of balance {} has no layers", i, balance);
    out.boundaries.push_back(out.boundaries.back() + balance[i]);
  }
  require(out.boundaries.back() == layers,
          "partition: balance {} covers {} layers but the model has {}", balance,
          out.boundaries.back(), layers);
  return out;
}

partition from_split_points(const std::vector<std::size_t>& split_points, std::size_t layers) {
  partition out;
  out.boundaries.push_back(0);
  for (auto point : split_points) {
    require(point > out.boundaries.back() && point < layers,
            "partition: split points {} must increase strictly inside (0, {})", split_points,
            layers);
    out.boundaries.push_back(point);
  }
  out.boundaries.push_back(layers);
  return out;
}

partition even(std::size_t stages, std::size_t layers) {
  require(stages >= 1 && stages <= layers,
          "partition: {} stages for {} layers; every stage needs at least one layer", stages,
          layers);
  std::vector<std::size_t> balance(stages, layers / stages);
  for (std::size_t i = 0; i < layers % stages; ++i)
    ++balance[i];
  return from_balance(balance, layers);
}

namespace {

/// Prefix sums so a stage's time and bytes cost O(1).
struct stage_costs {
  std::vector<double> ms;         // ms[j]: layers [0, j)
  std::vector<double> parameters; // parameter bytes, as double to scale
  std::vector<double> activations;
  const balance_options* options;

  stage_costs(const std::vector<layer_profile>& profile, const balance_options& opts)
      : ms(profile.size() + 1), parameters(profile.size() + 1), activations(profile.size() + 1),
        options(&opts) {
    for (std::size_t i = 0; i < profile.size(); ++i) {
      ms[i + 1] = ms[i] + profile[i].total_ms();
      parameters[i + 1] = parameters[i] + static_cast<double>(profile[i].parameter_bytes);
      activations[i + 1] = activations[i] + static_cast<double>(profile[i].activation_bytes);
    }
  }
  double time(std::size_t begin, std::size_t end) const { return ms[end] - ms[begin]; }
  std::size_t bytes(std::size_t begin, std::size_t end) const {
    double b = (parameters[end] - parameters[begin]) * options->parameter_copies +
               (activations[end] - activations[begin]) *
                   static_cast<double>(options->activations_in_flight);
    return static_cast<std::size_t>(b);
  }
  bool fits(std::size_t stage, std::size_t begin, std::size_t end) const {
    if (options->memory_caps.empty() || options->memory_caps[stage] == 0)
      return true;
    return bytes(begin, end) <= options->memory_caps[stage];
  }
};

} // namespace

expected<partition> balance_by_profile(const std::vector<layer_profile>& profile,
                                       const balance_options& options) {
  const std::size_t n = profile.size();
  const std::size_t p = options.stages;
  if (p == 0 || p > n)
    return make_error(errc::invalid_argument,
                      "balance_by_profile: {} stages for {} layers; every stage needs at least "
                      "one layer",
                      p, n);
  if (!options.memory_caps.empty() && options.memory_caps.size() != p)
    return make_error(errc::invalid_argument,
                      "balance_by_profile: {} memory caps for {} stages; give one per stage or "
                      "none",
                      options.memory_caps.size(), p);
  stage_costs costs(profile, options);
  constexpr double infeasible = std::numeric_limits<double>::infinity();
  // best[k][j]: the smallest possible slowest-stage time when stages [0, k)
  // hold layers [0, j); cut[k][j]: where stage k-1 begins in that split.
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, infeasible));
  std::vector<std::vector<std::size_t>> cut(p + 1, std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0;
  for (std::size_t k = 1; k <= p; ++k) {
    // Stage k-1 ends at j; the p-k later stages need a layer each.
    for (std::size_t j = k; j + (p - k) <= n; ++j) {
      // Scanning i downward and keeping only strict improvements prefers the
      // latest beginning of the last stage, i.e. early stages as full as the
      // optimum allows.
      for (std::size_t i = j; i-- > k - 1;) {
        if (best[k - 1][i] == infeasible || !costs.fits(k - 1, i, j))
          continue;
        double slowest = std::max(best[k - 1][i], costs.time(i, j));
        if (slowest < best[k][j]) {
          best[k][j] = slowest;
          cut[k][j] = i;
        }
      }
    }
  }
  if (best[p][n] == infeasible) {
    // Name the first stage whose cap is below its smallest possible need.
    std::size_t smallest_layer = 0;
    for (std::size_t i = 1; i < n; ++i)
      if (costs.bytes(i, i + 1) < costs.bytes(smallest_layer, smallest_layer + 1))
        smallest_layer = i;
    return make_error(errc::invalid_argument,
                      "balance_by_profile: no split of {} layers into {} stages fits the memory "
                      "caps {} bytes (the smallest layer alone needs {} bytes)",
                      n, p, options.memory_caps, costs.bytes(smallest_layer, smallest_layer + 1));
  }
  partition out;
  out.boundaries.assign(p + 1, 0);
  out.boundaries[p] = n;
  for (std::size_t k = p, j = n; k > 0; --k) {
    j = cut[k][j];
    out.boundaries[k - 1] = j;
  }
  return with_prediction(std::move(out), profile, options);
}

expected<partition> balance_by_time(nn::sequential& model, const tensor& sample,
                                    const balance_options& options,
                                    const profile_options& profiling) {
  return balance_by_profile(profile_layers(model, sample, profiling), options);
}

partition with_prediction(partition split, const std::vector<layer_profile>& profile,
                          const balance_options& options) {
  require(split.layers() == profile.size(),
          "partition: the split covers {} layers but the profile has {}", split.layers(),
          profile.size());
  stage_costs costs(profile, options);
  split.predicted_ms.clear();
  split.predicted_bytes.clear();
  for (std::size_t s = 0; s < split.stages(); ++s) {
    split.predicted_ms.push_back(costs.time(split.begin(s), split.end(s)));
    split.predicted_bytes.push_back(costs.bytes(split.begin(s), split.end(s)));
  }
  return split;
}

std::string to_string(const partition& split, const std::vector<double>& measured_ms) {
  std::string out;
  for (std::size_t s = 0; s < split.stages(); ++s) {
    out += fmt::format("stage {}: layers [{}, {})", s, split.begin(s), split.end(s));
    if (s < split.predicted_ms.size())
      out += fmt::format(", predicted {:.3f} ms", split.predicted_ms[s]);
    if (s < split.predicted_bytes.size())
      out += fmt::format(", {}", format_bytes(split.predicted_bytes[s]));
    if (s < measured_ms.size())
      out += fmt::format(", measured {:.3f} ms", measured_ms[s]);
    out += '\n';
  }
  return out;
}

} // namespace troupe::parallel
