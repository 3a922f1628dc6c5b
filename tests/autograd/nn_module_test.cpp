// Module bookkeeping: names, state dicts, modes, seeded init, slices.
#include <gtest/gtest.h>

#include <algorithm>

#include "troupe/autograd/nn/all.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {
namespace {

/// A model with a nested sequential registered as `layers` and a buffer.
class tower : public module {
public:
  explicit tower(std::uint64_t seed) {
    layers_ = register_module("layers", make<sequential>());
    for (int i = 0; i < 4; ++i)
      layers_->append(make<linear>(3, 3, seed));
    head_ = register_module("head", make<linear>(3, 2, seed));
    register_buffer("running_total", tensor::zeros({2}));
  }
  variable forward(const variable& x) override { return (*head_)((*layers_)(x)); }
  std::shared_ptr<sequential> layers_;
  std::shared_ptr<linear> head_;
};

std::shared_ptr<sequential> linear_stack(std::size_t count, std::uint64_t seed) {
  auto model = make<sequential>();
  for (std::size_t i = 0; i < count; ++i)
    model->append(make<linear>(4, 4, seed));
  return model;
}

named_tensors snapshot(const module& m) {
  named_tensors out;
  for (const auto& [key, value] : m.state_dict())
    out.emplace_back(key, value.clone());
  return out;
}

void expect_same_state(const named_tensors& a, const named_tensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(max_abs_diff(a[i].second, b[i].second), 0.0) << a[i].first;
  }
}

TEST(NnModule, NestedParametersHaveFullyQualifiedNamesInRegistrationOrder) {
  tower model(1);
  std::vector<std::string> names;
  for (const auto& [name, parameter] : model.named_parameters()) {
    names.push_back(name);
    EXPECT_EQ(parameter.name(), name); // variables carry their FQN once assembled
    EXPECT_TRUE(parameter.requires_grad());
  }
  std::vector<std::string> expected{"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                                    "layers.2.weight", "layers.2.bias", "layers.3.weight", "layers.3.bias",
                                    "head.weight",     "head.bias"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(model.parameters().size(), 10u);
  EXPECT_EQ(model.parameter_count(), 4 * 12 + 8);
  auto state = model.state_dict();
  // As torch: each module's parameters, then its buffers, then its children.
  ASSERT_EQ(state.size(), 11u);
  EXPECT_EQ(state.front().first, "running_total");
  EXPECT_EQ(state.back().first, "head.bias");
  EXPECT_EQ(model.named_buffers().size(), 1u);
  EXPECT_EQ(model.children().size(), 2u);
}

TEST(NnModule, DuplicateOrDottedNamesAreUsageErrors) {
  linear layer(2, 2);
  EXPECT_THROW(layer.register_parameter("weight", variable(tensor::zeros({1}))), usage_error);
  EXPECT_THROW(layer.register_buffer("a.b", tensor::zeros({1})), usage_error);
}

TEST(NnModule, StateDictRoundTripCopiesEveryValue) {
  tower source(1), target(2);
  target.named_buffers()[0].second.fill(5.0);
  ASSERT_GT(max_abs_diff(source.state_dict()[0].second, target.state_dict()[0].second), 0.0);
  auto loaded = target.load_state_dict(source.state_dict());
  ASSERT_TRUE(loaded) << loaded.error().message();
  expect_same_state(snapshot(source), snapshot(target));
  // Copied, not aliased.
  EXPECT_FALSE(source.state_dict()[0].second.shares_storage_with(target.state_dict()[0].second));
}

TEST(NnModule, LoadStateDictWithMissingKeyFailsAndModifiesNothing) {
  tower source(1), target(2);
  auto before = snapshot(target);
  auto state = snapshot(source);
  std::erase_if(state, [](const auto& entry) { return entry.first == "layers.2.bias"; });
  ASSERT_EQ(state.size(), 10u);
  auto loaded = target.load_state_dict(state);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().code(), errc::state_mismatch);
  EXPECT_NE(loaded.error().message().find("layers.2.bias"), std::string::npos) << loaded.error().message();
  expect_same_state(before, snapshot(target));
}

TEST(NnModule, LoadStateDictWithUnexpectedKeyFailsAndModifiesNothing) {
  tower source(1), target(2);
  auto before = snapshot(target);
  auto state = snapshot(source);
  state.emplace_back("layers.9.weight", tensor::zeros({3, 3}));
  auto loaded = target.load_state_dict(state);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().code(), errc::state_mismatch);
  EXPECT_NE(loaded.error().message().find("layers.9.weight"), std::string::npos) << loaded.error().message();
  expect_same_state(before, snapshot(target));
  // Not strict: the extra key is ignored and the rest loads.
  ASSERT_TRUE(target.load_state_dict(state, false));
  expect_same_state(snapshot(source), snapshot(target));
}

TEST(NnModule, LoadStateDictWithWrongShapeNamesKeyAndBothShapes) {
  tower source(1), target(2);
  auto before = snapshot(target);
  auto state = snapshot(source);
  ASSERT_EQ(state[9].first, "head.weight");
  state[9].second = tensor::zeros({3, 2}); // head.weight is [2, 3]
  for (bool strict : {true, false}) {
    auto loaded = target.load_state_dict(state, strict);
    ASSERT_FALSE(loaded);
    EXPECT_EQ(loaded.error().code(), errc::state_mismatch);
    const auto& message = loaded.error().message();
    EXPECT_NE(message.find("head.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("[3, 2]"), std::string::npos) << message;
    EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
    expect_same_state(before, snapshot(target));
  }
}

TEST(NnModule, LoadStateDictWithWrongDtypeFails) {
  tower source(1), target(2);
  auto before = snapshot(target);
  auto state = snapshot(source);
  ASSERT_EQ(state[0].first, "running_total");
  state[0].second = state[0].second.to(dtype::float64);
  auto loaded = target.load_state_dict(state);
  ASSERT_FALSE(loaded);
  EXPECT_NE(loaded.error().message().find("running_total"), std::string::npos) << loaded.error().message();
  expect_same_state(before, snapshot(target));
}

TEST(NnModule, TrainAndEvalPropagateToEveryDescendant) {
  tower model(1);
  auto all_training = [&](bool expected) {
    for (const auto& [name, m] : model.named_modules())
      if (m->is_training() != expected)
        return false;
    return true;
  };
  EXPECT_TRUE(all_training(true));
  model.eval();
  EXPECT_TRUE(all_training(false));
  EXPECT_EQ(model.named_modules().size(), 7u); // root, layers, 4 linears, head
  model.train();
  EXPECT_TRUE(all_training(true));
}

TEST(NnModule, ZeroGradDropsEveryGradient) {
  linear layer(2, 2);
  auto w = layer.weight();
  w.set_grad(tensor::ones({2, 2}));
  ASSERT_TRUE(layer.weight().grad().defined());
  layer.zero_grad();
  EXPECT_FALSE(layer.weight().grad().defined());
}

TEST(NnModule, ResetParametersDependsOnSeedAndNameNotCreationOrder) {
  auto whole = linear_stack(8, 100);
  whole->reset_parameters(7);

  // Built differently: layers created last-to-first with other seeds, a
  // larger model, then a slice [4, 8) of it.
  std::vector<module_ptr> layers(10);
  for (int i = 9; i >= 0; --i)
    layers[static_cast<std::size_t>(i)] = make<linear>(4, 4, static_cast<std::uint64_t>(i));
  auto other = make<sequential>(layers);
  auto stage = other->slice(4, 8);
  stage->reset_parameters(7);

  auto expected = whole->state_dict();
  auto stage_state = stage->state_dict();
  ASSERT_EQ(stage_state.size(), 8u);
  for (const auto& [key, value] : stage_state) {
    auto reference = find_tensor(expected, key);
    ASSERT_TRUE(reference.defined()) << key;
    EXPECT_EQ(max_abs_diff(value, reference), 0.0) << key;
  }
  // Different names give different values; different seeds too.
  EXPECT_GT(max_abs_diff(find_tensor(expected, "4.weight"), find_tensor(expected, "5.weight")), 0.0);
  auto reseeded = linear_stack(8, 100);
  reseeded->reset_parameters(8);
  EXPECT_GT(max_abs_diff(find_tensor(expected, "4.weight"), find_tensor(reseeded->state_dict(), "4.weight")), 0.0);
}

TEST(NnModule, LinearInitIsUniformWithinOneOverSqrtFanIn) {
  linear layer(16, 64, 3);
  auto values = layer.weight().data().to_vector<double>();
  double bound = 0.25, largest = 0.0;
  for (double v : values)
    largest = std::max(largest, std::abs(v));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.8 * bound);
  for (double v : layer.bias().data().to_vector<double>())
    EXPECT_LE(std::abs(v), bound);
}

TEST(NnModule, SequentialSliceSharesModulesAndKeepsOriginalKeys) {
  auto whole = linear_stack(8, 1);
  auto stage = whole->slice(4, 8);
  ASSERT_EQ(stage->size(), 4u);
  EXPECT_EQ(stage->at(0), whole->at(4));
  EXPECT_EQ(stage->name_at(0), "4");
  std::vector<std::string> keys;
  for (const auto& [key, value] : stage->state_dict())
    keys.push_back(key);
  std::vector<std::string> expected{"4.weight", "4.bias", "5.weight", "5.bias",
                                    "6.weight", "6.bias", "7.weight", "7.bias"};
  EXPECT_EQ(keys, expected);
  // Shared: loading into the slice changes the whole model.
  auto other = linear_stack(8, 2);
  ASSERT_TRUE(stage->load_state_dict(other->state_dict(), false));
  EXPECT_EQ(max_abs_diff(find_tensor(whole->state_dict(), "6.weight"), find_tensor(other->state_dict(), "6.weight")),
            0.0);
  EXPECT_GT(max_abs_diff(find_tensor(whole->state_dict(), "0.weight"), find_tensor(other->state_dict(), "0.weight")),
            0.0);
  // Slicing does not rename the whole model's variables.
  EXPECT_EQ(whole->named_parameters()[8].second.name(), "4.weight");
  // A slice of a slice keeps the names; appending continues the numbering.
  auto inner = stage->slice(1, 3);
  EXPECT_EQ(inner->state_dict().front().first, "5.weight");
  inner->append(make<relu>());
  EXPECT_EQ(inner->name_at(2), "7");
  EXPECT_THROW(whole->slice(3, 9), usage_error);
}

TEST(NnModule, GptIsASequentialWhoseSlicesKeepWholeModelKeys) {
  gpt_config config{.vocab_size = 11, .block_size = 8, .n_layer = 3, .n_head = 2, .n_embd = 8, .seed = 5};
  auto model = make<gpt>(config);
  ASSERT_EQ(model->size(), 5u);
  auto whole = model->state_dict();
  EXPECT_EQ(whole.front().first, "0.wte.weight");
  EXPECT_EQ(whole.back().first, "4.lm_head.weight");
  EXPECT_TRUE(find_tensor(whole, "2.attn.c_attn.weight").defined());
  EXPECT_TRUE(find_tensor(whole, "3.mlp.2.bias").defined());

  // Every stage built from a separate copy of the model gets the same values.
  auto copy = make<gpt>(gpt_config{config.vocab_size, config.block_size, config.n_layer, config.n_head,
                                   config.n_embd, 0.0, dtype::float32, 99});
  auto stage = copy->slice(2, 5);
  stage->reset_parameters(5);
  for (const auto& [key, value] : stage->state_dict())
    EXPECT_EQ(max_abs_diff(value, find_tensor(whole, key)), 0.0) << key;
  EXPECT_EQ(model->as_sequential()->state_dict().size(), whole.size());
}

} // namespace
} // namespace troupe::nn
