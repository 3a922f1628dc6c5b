// The equivalence harness finds nothing where the split model is right
// (GPT at degrees 2 and 3, sequence parallelism on and off) and names the
// right layer, and no earlier one, where a fault was put: a perturbed piece
// of a middle block's weight (forward), a missing allreduce of an input
// gradient (backward only), pieces of a hidden layer in the wrong order.
#include "troupe/parallel/tensor_parallel_equivalence.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "emulated_device.hpp"
#include "ring_support.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/parallel/tensor_parallel_transformer.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {
namespace {

using ::testing::HasSubstr;
using autograd::variable;
using test::local_ring;

const nn::gpt_config config{.vocab_size = 11, .block_size = 8, .n_layer = 3, .n_head = 3, .n_embd = 12,
                            .type = dtype::float64, .seed = 21};

tensor gpt_ids() {
  generator gen{400};
  return randint({2, 5}, gen, 0, config.vocab_size);
}

/// Every rank's report on the GPT split over `degree` ranks, after
/// `change(rank, model)` (a fault, or nothing).
std::vector<equivalence_report> gpt_reports(std::uint32_t degree, bool sequence_parallel,
                                            const std::function<void(std::uint32_t, parallel_gpt&)>& change,
                                            device where = device::cpu()) {
  nn::gpt whole(config);
  const auto ids = gpt_ids();
  const auto reference = record_layers(whole, ids, {});
  local_ring ring(degree);
  EXPECT_TRUE(ring.node);
  std::vector<equivalence_report> reports(degree);
  ring.each([&](std::uint32_t r) {
    parallel_gpt split(config, *ring.groups[r], {.sequence_parallel = sequence_parallel});
    change(r, split);
    split.to(where);
    reports[r] = compare_layers(reference, split, *ring.groups[r], ids.to(where), {.tolerance = 1e-10});
  });
  return reports;
}

class GptEquivalence : public ::testing::TestWithParam<std::tuple<std::uint32_t, bool>> {};

TEST_P(GptEquivalence, FindsNoDifferenceInAnyLayer) {
  const auto [degree, sequence_parallel] = GetParam();
  const auto reports = gpt_reports(degree, sequence_parallel, [](std::uint32_t, parallel_gpt&) {});
  for (std::uint32_t r = 0; r < degree; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(reports[r].equal()) << reports[r].to_string();
    ASSERT_EQ(reports[r].layers.size(), static_cast<std::size_t>(config.n_layer + 2));
    EXPECT_EQ(reports[r].layers[2].layer, "2");
    // Every parameter was compared.
    std::size_t parameters = 0;
    for (const auto& layer : reports[r].layers)
      parameters += layer.parameter_gradients.size();
    EXPECT_EQ(parameters, nn::gpt(config).named_parameters().size());
  }
}

INSTANTIATE_TEST_SUITE_P(Degrees, GptEquivalence, ::testing::Combine(::testing::Values(2u, 3u), ::testing::Bool()));

// One element of rank 1's piece of block 1's (layer "2") attention weight
// is off by 1e-3. The report names layer 2's output; the layers before it
// agree in their outputs, and the embedding's gradient, which differs too
// (backward passes through the fault), is not what is named.
void perturb_block_2_on_rank_1(std::uint32_t r, parallel_gpt& split) {
  if (r == 1)
    for (auto& [fqn, p] : split.named_parameters())
      if (fqn == "2.attn.c_attn.weight") {
        auto corner = p.data().slice(0, 0, 1).slice(1, 0, 1);
        corner.copy_from(add(corner, 1e-3));
      }
}

/// What the perturbation must give: layer 2's output named, not earlier.
void expect_block_2_named(const equivalence_report& report) {
  ASSERT_FALSE(report.equal());
  EXPECT_EQ(report.first->layer, "2") << report.to_string();
  EXPECT_EQ(report.first->what.name, "output");
  EXPECT_FALSE(report.layers[0].output.differs);
  EXPECT_FALSE(report.layers[1].output.differs);
  EXPECT_TRUE(report.layers[0].parameter_gradients[0].differs) << "the embedding's gradient differs too";
  EXPECT_THAT(report.to_string(), HasSubstr("first difference: layer 2, output"));
}

TEST_P(GptEquivalence, NamesTheMiddleBlockWhoseWeightIsPerturbed) {
  const auto [degree, sequence_parallel] = GetParam();
  const auto reports = gpt_reports(degree, sequence_parallel, perturb_block_2_on_rank_1);
  for (std::uint32_t r = 0; r < degree; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_block_2_named(reports[r]);
  }
}

// The split model on cuda:0 against the one-process model recorded on the
// CPU: no layer differs (float64), and the perturbed block is named.
TEST(GptEquivalenceOnCuda, ASplitModelOnAGpuIsComparedWithTheCpu) {
  test::cuda_or_emulated devices(1);
  const auto none = [](std::uint32_t, parallel_gpt&) {};
  for (const auto& report : gpt_reports(2, true, none, device::cuda(0)))
    EXPECT_TRUE(report.equal()) << report.to_string();
  for (const auto& report : gpt_reports(2, false, perturb_block_2_on_rank_1, device::cuda(0)))
    expect_block_2_named(report);
}

constexpr std::int64_t width = 4, hidden = 8, rows = 6;

/// Linear → GELU → Linear → Linear, the last one whole on every rank.
std::shared_ptr<nn::sequential> reference_mlp() {
  auto mlp = std::make_shared<nn::sequential>(std::initializer_list<nn::module_ptr>{
      std::make_shared<nn::linear>(nn::linear_options{.in_features = width, .out_features = hidden, .type = dtype::float64}),
      std::make_shared<nn::gelu>(),
      std::make_shared<nn::linear>(nn::linear_options{.in_features = hidden, .out_features = width, .type = dtype::float64}),
      std::make_shared<nn::linear>(nn::linear_options{.in_features = width, .out_features = 3, .type = dtype::float64})});
  mlp->reset_parameters(7);
  return mlp;
}

/// A column-parallel layer that forgets copy_to_group: its forward is
/// right, its input gradient only this rank's part of the sum.
struct column_without_allreduce : column_parallel_linear {
  using column_parallel_linear::column_parallel_linear;
  variable forward(const variable& x) override { return autograd::linear(x, weight(), bias()); }
};

/// The MLP split over `group`; `first` is its column-parallel layer.
std::shared_ptr<nn::sequential> split_mlp(std::shared_ptr<nn::module> first, reducer_group& group) {
  auto mlp = std::make_shared<nn::sequential>(std::initializer_list<nn::module_ptr>{
      std::move(first), std::make_shared<nn::gelu>(),
      std::make_shared<row_parallel_linear>(nn::linear_options{.in_features = hidden, .out_features = width, .type = dtype::float64}, group),
      std::make_shared<nn::linear>(nn::linear_options{.in_features = width, .out_features = 3, .type = dtype::float64})});
  mlp->reset_parameters(7);
  return mlp;
}

tensor mlp_input() {
  generator gen{8};
  return randn({rows, width}, gen, 0.0, 1.0, dtype::float64);
}

enum class fault { none, missing_allreduce, reversed_pieces };

/// Every rank's report on the MLP split over 2 ranks with `what` wrong.
std::vector<equivalence_report> mlp_reports(fault what) {
  const auto reference = record_layers(*reference_mlp(), mlp_input(), {});
  local_ring ring(2);
  EXPECT_TRUE(ring.node);
  std::vector<equivalence_report> reports(2);
  ring.each([&](std::uint32_t r) {
    auto& group = *ring.groups[r];
    const nn::linear_options fc{.in_features = width, .out_features = hidden, .type = dtype::float64};
    std::shared_ptr<nn::module> first;
    if (what == fault::missing_allreduce)
      first = std::make_shared<column_without_allreduce>(fc, group);
    else if (what == fault::reversed_pieces) // rank 0 holds rank 1's features and the other way round
      first = std::make_shared<column_parallel_linear>(fc, group, column_parallel_options{.pieces = {tensor_parallel_split(hidden, 2, 1 - r)}});
    else
      first = std::make_shared<column_parallel_linear>(fc, group);
    reports[r] = compare_layers(reference, *split_mlp(first, group), group, mlp_input(), {.tolerance = 1e-12});
  });
  return reports;
}

TEST(MlpEquivalence, TheRightSplitIsEqual) {
  for (const auto& report : mlp_reports(fault::none)) {
    EXPECT_TRUE(report.equal()) << report.to_string();
    EXPECT_EQ(report.layers[0].input_gradient.name, "input gradient") << "a float input's gradient is compared";
  }
}

// The forward is right everywhere, so only backward shows the fault: the
// first layer's input gradient, after the later layers' gradients agreed.
TEST(MlpEquivalence, AMissingAllreduceInBackwardNamesItsLayerByItsInputGradient) {
  for (const auto& report : mlp_reports(fault::missing_allreduce)) {
    ASSERT_FALSE(report.equal());
    EXPECT_EQ(report.first->layer, "0") << report.to_string();
    EXPECT_EQ(report.first->what.name, "input gradient");
    for (const auto& layer : report.layers) {
      EXPECT_FALSE(layer.output.differs) << layer.layer;
      for (const auto& g : layer.parameter_gradients)
        EXPECT_FALSE(g.differs) << g.name;
    }
  }
}

TEST(MlpEquivalence, PiecesInTheWrongOrderNameTheFirstLayer) {
  for (const auto& report : mlp_reports(fault::reversed_pieces)) {
    ASSERT_FALSE(report.equal());
    EXPECT_EQ(report.first->layer, "0") << report.to_string();
    EXPECT_EQ(report.first->what.name, "output");
    EXPECT_TRUE(report.layers[2].output.differs) << "the row-parallel layer sums the wrong columns";
  }
}

} // namespace
} // namespace troupe::parallel
