// The equivalence harness (tensor_parallel_equivalence.hpp).
#include "troupe/parallel/tensor_parallel_equivalence.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "troupe/autograd/backward.hpp"
#include "troupe/parallel/ring_allreduce.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/parallel/tensor_parallel_collectives.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

using autograd::variable;

namespace {

/// One layer's run: the leaf it took (the previous output, detached) and
/// what it gave.
struct layer_step {
  variable input;
  variable output;
};

/// A float64 copy on the host: what is compared, whichever device the
/// model computed on.
tensor as_float64(const tensor& t) {
  return t.to(device::cpu()).to(dtype::float64).contiguous().clone();
}

std::vector<layer_step> run_forward(nn::sequential& model, const tensor& input) {
  require(model.size() > 0, "equivalence: the model has no layers");
  model.zero_grad();
  std::vector<layer_step> steps;
  tensor x = input;
  for (std::size_t i = 0; i < model.size(); ++i) {
    variable leaf(x, is_floating(x.type()));
    auto out = model.at(i)->forward(leaf);
    steps.push_back({leaf, out});
    x = out.data();
  }
  return steps;
}

/// Backward layer by layer from the last, seeded with `seed`; each layer's
/// input gradient (zeros where its input did not reach the output) seeds
/// the layer before it.
void run_backward(std::vector<layer_step>& steps, tensor seed) {
  for (std::size_t i = steps.size(); i-- > 0;) {
    autograd::backward(std::span<const variable>(&steps[i].output, 1), std::span<const tensor>(&seed, 1));
    if (!steps[i].input.requires_grad())
      break;
    seed = steps[i].input.grad();
    if (!seed.defined())
      seed = tensor::zeros(steps[i].input.data().shape(), steps[i].input.data().type(), steps[i].input.data().where());
  }
}

/// The layer (top-level name) a parameter FQN belongs to.
std::string layer_of(const std::string& fqn) {
  return fqn.substr(0, fqn.find('.'));
}

tensor gradient_or_zeros(const variable& p) {
  return p.grad().defined() ? p.grad() : tensor::zeros(p.data().shape(), p.data().type(), p.data().where());
}

/// How the ranks hold one tensor: whole on each (dim -1), or pieces of
/// `sizes` in rank order along `dim`; `error` when neither.
struct layout {
  std::int64_t dim = -1;
  std::vector<std::int64_t> sizes;
  std::string error;
};

constexpr std::int64_t max_rank = 8;

/// Decides the layout from every rank's shape, the same on every rank
/// (one gather of max_rank + 1 numbers per rank).
layout agree_layout(const dims& mine, const dims& whole, reducer_group& group) {
  require(static_cast<std::int64_t>(mine.size()) <= max_rank, "equivalence: a tensor of rank {} (at most {})",
          mine.size(), max_rank);
  std::vector<double> encoded(max_rank + 1, -1.0);
  encoded[0] = static_cast<double>(mine.size());
  for (std::size_t d = 0; d < mine.size(); ++d)
    encoded[d + 1] = static_cast<double>(mine[d]);
  const auto n = group.size();
  const auto gathered = gather_from_group(variable(tensor::from(encoded, {max_rank + 1})), group, 0,
                                          (max_rank + 1) * n)
                          .data()
                          .to_vector<double>();
  std::vector<dims> shapes(n);
  for (std::uint32_t r = 0; r < n; ++r) {
    const auto* row = gathered.data() + r * (max_rank + 1);
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(row[0]); ++d)
      shapes[r].push_back(static_cast<std::int64_t>(row[d + 1]));
  }
  layout out;
  std::vector<std::int64_t> differing;
  for (const auto& shape : shapes) {
    if (shape.size() != whole.size()) {
      out.error = fmt::format("the ranks' shapes {} do not make up {}", shapes, whole);
      return out;
    }
    for (std::size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != whole[d] && std::find(differing.begin(), differing.end(), d) == differing.end())
        differing.push_back(static_cast<std::int64_t>(d));
  }
  if (differing.empty())
    return out; // a replica on every rank
  std::int64_t total = 0;
  if (differing.size() == 1) {
    out.dim = differing[0];
    for (const auto& shape : shapes) {
      out.sizes.push_back(shape[out.dim]);
      total += shape[out.dim];
    }
  }
  if (differing.size() != 1 || total != whole[out.dim])
    out.error = fmt::format("the ranks' shapes {} do not make up {}", shapes, whole);
  return out;
}

/// The whole tensor from this rank's piece (the same on every rank), in
/// float64: the pieces put in place in zeros and summed over the group.
/// A replica comes back as it is.
tensor put_together(const tensor& mine, const layout& how, const dims& whole, reducer_group& group) {
  if (how.dim < 0)
    return as_float64(mine);
  auto full = tensor::zeros(whole, dtype::float64);
  std::int64_t offset = 0;
  for (std::uint32_t r = 0; r < group.rank(); ++r)
    offset += how.sizes[r];
  full.slice(how.dim, offset, offset + how.sizes[group.rank()]).copy_from(mine.to(device::cpu()));
  if (auto summed = ring_allreduce(group, full); !summed)
    throw std::runtime_error(summed.error().message());
  return full;
}

/// This rank's piece of the whole `t` under `how`.
tensor piece_of(const tensor& t, const layout& how, std::uint32_t rank) {
  if (how.dim < 0)
    return t;
  std::int64_t offset = 0;
  for (std::uint32_t r = 0; r < rank; ++r)
    offset += how.sizes[r];
  return t.slice(how.dim, offset, offset + how.sizes[rank]).contiguous();
}

tensor_difference difference(std::string name, const tensor& got, const tensor& want, double tolerance) {
  tensor_difference out;
  out.name = std::move(name);
  const auto a = got.to_vector<double>();
  const auto b = want.to_vector<double>();
  TROUPE_ASSERT(a.size() == b.size(), "equivalence: {} holds {} values against {}", out.name, a.size(), b.size());
  constexpr double inf = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double abs = std::abs(a[i] - b[i]);
    const double rel = abs / (1 + std::abs(b[i]));
    out.max_abs = std::max(out.max_abs, std::isnan(abs) ? inf : abs);
    out.max_relative = std::max(out.max_relative, std::isnan(rel) ? inf : rel);
  }
  out.differs = !(out.max_relative <= tolerance);
  return out;
}

/// A tensor whose pieces do not fit: a difference by itself.
tensor_difference misfit(std::string name, const std::string& why) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  return {.name = std::move(name), .max_abs = inf, .max_relative = inf, .layout_error = why, .differs = true};
}

} // namespace

layer_trace record_layers(nn::sequential& model, const tensor& input, const equivalence_options& options) {
  auto steps = run_forward(model, input);
  layer_trace trace;
  generator gen{options.seed};
  const auto& out = steps.back().output.data();
  trace.output_gradient = randn(out.shape(), gen, 0.0, 1.0, dtype::float64);
  run_backward(steps, trace.output_gradient.to(out.type()).to(out.where()));
  for (std::size_t i = 0; i < steps.size(); ++i) {
    layer_record record;
    record.name = model.name_at(i);
    record.output = as_float64(steps[i].output.data());
    if (steps[i].input.requires_grad())
      record.input_gradient = as_float64(gradient_or_zeros(steps[i].input));
    trace.layers.push_back(std::move(record));
  }
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < trace.layers.size(); ++i)
    index[trace.layers[i].name] = i;
  for (auto& [fqn, p] : model.named_parameters())
    trace.layers.at(index.at(layer_of(fqn))).parameter_gradients.emplace_back(fqn, as_float64(gradient_or_zeros(p)));
  return trace;
}

equivalence_report compare_layers(const layer_trace& reference, nn::sequential& model, reducer_group& group,
                                  const tensor& input, const equivalence_options& options) {
  const auto n = reference.layers.size();
  require(model.size() == n, "compare_layers: the split model has {} layers but the reference {}", model.size(), n);
  for (std::size_t i = 0; i < n; ++i)
    require(model.name_at(i) == reference.layers[i].name, "compare_layers: layer {} is '{}' here but '{}' in the reference",
            i, model.name_at(i), reference.layers[i].name);
  // The parameters' pieces, by FQN.
  std::map<std::string, std::vector<parameter_shard>> pieces;
  for (auto& [fqn, shard] : parameter_shards(model))
    pieces[fqn].push_back(shard);
  std::map<std::string, variable> parameters;
  for (auto& [fqn, p] : model.named_parameters())
    parameters.emplace(fqn, p);
  std::size_t recorded = 0;
  for (const auto& layer : reference.layers)
    recorded += layer.parameter_gradients.size();
  require(parameters.size() == recorded, "compare_layers: the split model has {} parameters but the reference {}",
          parameters.size(), recorded);

  // Forward; then every output's layout (the collectives in the same order
  // on every rank), so that each rank seeds backward with its piece.
  auto steps = run_forward(model, input);
  std::vector<layout> layouts;
  for (std::size_t i = 0; i < n; ++i)
    layouts.push_back(agree_layout(steps[i].output.data().shape(), reference.layers[i].output.shape(), group));
  const auto& last = layouts.back();
  const auto& out = steps.back().output.data();
  run_backward(steps, last.error.empty()
                        ? piece_of(reference.output_gradient, last, group.rank()).to(out.type()).to(out.where())
                        : tensor::zeros(out.shape(), out.type(), out.where()));

  equivalence_report report;
  const double tolerance = options.tolerance;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& want = reference.layers[i];
    layer_comparison layer;
    layer.layer = want.name;
    layer.output = layouts[i].error.empty()
                     ? difference("output", put_together(steps[i].output.data(), layouts[i], want.output.shape(), group),
                                  want.output, tolerance)
                     : misfit("output", layouts[i].error);
    if (want.input_gradient.defined()) {
      // The input's layout is the previous output's (the first layer's
      // input is the same on every rank).
      const layout replica{};
      const auto& how = i == 0 ? replica : layouts[i - 1];
      const auto mine = gradient_or_zeros(steps[i].input);
      layer.input_gradient = how.error.empty()
                               ? difference("input gradient", put_together(mine, how, want.input_gradient.shape(), group),
                                            want.input_gradient, tolerance)
                               : misfit("input gradient", how.error);
    }
    for (const auto& [fqn, whole] : want.parameter_gradients) {
      require(pieces.count(fqn) != 0, "compare_layers: the split model has no parameter {}", fqn);
      const auto& shards = pieces.at(fqn);
      const auto mine = gradient_or_zeros(parameters.at(fqn)).to(device::cpu());
      tensor got;
      if (shards.front().dim < 0) {
        got = as_float64(mine);
      } else {
        got = tensor::zeros(whole.shape(), dtype::float64);
        for (const auto& s : shards)
          got.slice(s.dim, s.offset, s.offset + s.size).copy_from(mine.slice(s.dim, s.local_offset, s.local_offset + s.size));
        if (auto summed = ring_allreduce(group, got); !summed)
          throw std::runtime_error(summed.error().message());
      }
      require(got.shape() == whole.shape(), "compare_layers: {} is {} whole here but {} in the reference", fqn,
              got.shape(), whole.shape());
      layer.parameter_gradients.push_back(difference(fqn, got, whole, tolerance));
    }
    report.layers.push_back(std::move(layer));
  }

  // Replicas differ by rank: every rank takes the largest of each number.
  std::vector<tensor_difference*> all;
  for (auto& layer : report.layers) {
    all.push_back(&layer.output);
    if (!layer.input_gradient.name.empty())
      all.push_back(&layer.input_gradient);
    for (auto& g : layer.parameter_gradients)
      all.push_back(&g);
  }
  std::vector<double> mine;
  for (const auto* d : all) {
    mine.push_back(d->max_abs);
    mine.push_back(d->max_relative);
  }
  const auto count = static_cast<std::int64_t>(mine.size());
  const auto every = gather_from_group(variable(tensor::from(mine, {count})), group, 0, count * group.size())
                       .data()
                       .to_vector<double>();
  for (std::size_t k = 0; k < all.size(); ++k) {
    for (std::uint32_t r = 0; r < group.size(); ++r) {
      all[k]->max_abs = std::max(all[k]->max_abs, every[r * count + 2 * k]);
      all[k]->max_relative = std::max(all[k]->max_relative, every[r * count + 2 * k + 1]);
    }
    all[k]->differs = all[k]->differs || !(all[k]->max_relative <= tolerance);
  }

  // The first difference in the order the computation makes the tensors.
  for (const auto& layer : report.layers)
    if (layer.output.differs) {
      report.first = equivalence_report::first_difference{layer.layer, layer.output};
      return report;
    }
  for (std::size_t i = n; i-- > 0;) {
    const auto& layer = report.layers[i];
    for (const auto& g : layer.parameter_gradients)
      if (g.differs) {
        report.first = equivalence_report::first_difference{layer.layer, g};
        return report;
      }
    if (layer.input_gradient.differs) {
      report.first = equivalence_report::first_difference{layer.layer, layer.input_gradient};
      return report;
    }
  }
  return report;
}

std::string equivalence_report::to_string() const {
  std::string out = fmt::format("{:<8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "layer", "out abs", "out rel",
                                "in-grad abs", "in-grad rel", "param abs", "param rel");
  for (const auto& layer : layers) {
    double abs = 0, rel = 0;
    for (const auto& g : layer.parameter_gradients) {
      abs = std::max(abs, g.max_abs);
      rel = std::max(rel, g.max_relative);
    }
    out += fmt::format("{:<8} {:>12.3e} {:>12.3e} {:>12.3e} {:>12.3e} {:>12.3e} {:>12.3e}\n", layer.layer,
                       layer.output.max_abs, layer.output.max_relative, layer.input_gradient.max_abs,
                       layer.input_gradient.max_relative, abs, rel);
  }
  if (!first)
    return out + "equal within the tolerance\n";
  out += fmt::format("first difference: layer {}, {}: max |a - b| {:.3e}, max |a - b| / (1 + |b|) {:.3e}", first->layer,
                     first->what.name, first->what.max_abs, first->what.max_relative);
  if (!first->what.layout_error.empty())
    out += " (" + first->what.layout_error + ")";
  return out + "\n";
}

} // namespace troupe::parallel
