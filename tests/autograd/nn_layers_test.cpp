// Each layer's forward against values computed by hand on tiny inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::nn {
namespace {

tensor f32(std::vector<float> values, const dims& shape) {
  return tensor::from(values, shape);
}

tensor ids(std::vector<std::int64_t> values, const dims& shape) {
  return tensor::from(values, shape);
}

void set(const variable& parameter, const tensor& values) {
  tensor data = parameter.data();
  data.copy_from(values);
}

void expect_near_all(const tensor& actual, const std::vector<double>& expected, double tolerance = 1e-5) {
  auto got = actual.to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], tolerance) << "element " << i;
}

TEST(NnLayers, LinearComputesXTimesWeightTransposedPlusBias) {
  linear layer(3, 2);
  set(layer.weight(), f32({1, 2, 3, -1, 0, 2}, {2, 3}));
  set(layer.bias(), f32({0.5f, -1}, {2}));
  auto y = layer(variable(f32({1, 0, 2, -1, 1, 1}, {2, 3})));
  ASSERT_EQ(y.shape(), (dims{2, 2}));
  // Row 0: [1*1 + 0*2 + 2*3 + 0.5, -1 + 0 + 4 - 1]; row 1: [-1 + 2 + 3 + 0.5, 1 + 0 + 2 - 1].
  expect_near_all(y.data(), {7.5, 2, 4.5, 2});

  // Gradients reach both parameters: d sum(y) / d bias = batch size.
  autograd::backward(autograd::sum(y));
  expect_near_all(layer.bias().grad(), {2, 2});
  expect_near_all(layer.weight().grad(), {0, 1, 3, 0, 1, 3});
}

TEST(NnLayers, LinearWithoutBiasAndOnThreeDimensionalInput) {
  linear layer(linear_options{.in_features = 2, .out_features = 1, .bias = false});
  EXPECT_FALSE(layer.bias().defined());
  EXPECT_EQ(layer.named_parameters().size(), 1u);
  set(layer.weight(), f32({2, -1}, {1, 2}));
  auto y = layer(variable(f32({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2})));
  ASSERT_EQ(y.shape(), (dims{2, 2, 1}));
  expect_near_all(y.data(), {0, 2, 4, 6});
}

TEST(NnLayers, Conv2dMatchesADirectSum) {
  conv2d layer(conv2d_options{.in_channels = 2, .out_channels = 2, .kernel_size = 2, .stride = 2, .padding = 1});
  std::vector<float> input_values(2 * 3 * 3);
  for (std::size_t i = 0; i < input_values.size(); ++i)
    input_values[i] = static_cast<float>(i % 7) - 3.0f;
  auto input = f32(input_values, {1, 2, 3, 3});
  auto y = layer(variable(input));
  ASSERT_EQ(y.shape(), (dims{1, 2, 2, 2})); // (3 + 2 - 2) / 2 + 1 = 2

  // Reference: out[o][i][j] = b[o] + sum_c,ki,kj w[o][c][ki][kj] x[c][2i+ki-1][2j+kj-1].
  auto w = layer.weight().data();
  auto b = layer.bias().data();
  std::vector<double> expected;
  for (std::int64_t o = 0; o < 2; ++o)
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 2; ++j) {
        double total = b.at({o});
        for (std::int64_t c = 0; c < 2; ++c)
          for (std::int64_t ki = 0; ki < 2; ++ki)
            for (std::int64_t kj = 0; kj < 2; ++kj) {
              auto row = 2 * i + ki - 1, col = 2 * j + kj - 1;
              if (row >= 0 && row < 3 && col >= 0 && col < 3)
                total += w.at({o, c, ki, kj}) * input.at({0, c, row, col});
            }
        expected.push_back(total);
      }
  expect_near_all(y.data(), expected);
}

TEST(NnLayers, MaxPool2dTakesTheLargestOfEachWindow) {
  max_pool2d pool(pool2d_options{.kernel = 2, .stride = 2});
  auto y = pool(variable(f32({1, 5, 2, 0, 3, 4, 8, 1, -1, -2, 0, 0, -3, -4, 0, 9}, {1, 1, 4, 4})));
  ASSERT_EQ(y.shape(), (dims{1, 1, 2, 2}));
  expect_near_all(y.data(), {5, 8, -1, 9});
}

TEST(NnLayers, LayerNormNormalisesTheLastDimension) {
  layer_norm norm(4);
  set(norm.weight(), f32({1, 2, 1, 1}, {4}));
  set(norm.bias(), f32({0, 0, 1, 0}, {4}));
  auto y = norm(variable(f32({1, 2, 3, 4, 2, 2, 2, 2}, {2, 4})));
  // Row 0: mean 2.5, variance 1.25 (biased).
  double rstd = 1.0 / std::sqrt(1.25 + 1e-5);
  expect_near_all(y.data(), {-1.5 * rstd, 2 * -0.5 * rstd, 0.5 * rstd + 1, 1.5 * rstd, 0, 0, 1, 0});
}

TEST(NnLayers, LayerNormStartsAsOnesAndZeros) {
  layer_norm norm(3);
  norm.reset_parameters(42);
  expect_near_all(norm.weight().data(), {1, 1, 1});
  expect_near_all(norm.bias().data(), {0, 0, 0});
}

TEST(NnLayers, EmbeddingLooksUpRows) {
  embedding table(4, 2);
  set(table.weight(), f32({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}));
  auto y = table(variable(ids({3, 0, 1, 1}, {2, 2})));
  ASSERT_EQ(y.shape(), (dims{2, 2, 2}));
  expect_near_all(y.data(), {30, 31, 0, 1, 10, 11, 10, 11});
}

TEST(NnLayers, EmbeddingBagSumsAndAveragesBags) {
  auto weights = f32({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  auto indices = ids({0, 2, 3, 1}, {4});
  auto offsets = ids({0, 1, 1}, {3}); // bags {0}, {}, {2, 3, 1}

  embedding_bag sum_bag(embedding_bag_options{.num_embeddings = 4, .embedding_dim = 2, .mode = bag_mode::sum});
  set(sum_bag.weight(), weights);
  expect_near_all(sum_bag.forward(indices, offsets).data(), {1, 2, 0, 0, 15, 18});

  embedding_bag mean_bag(embedding_bag_options{.num_embeddings = 4, .embedding_dim = 2, .mode = bag_mode::mean});
  set(mean_bag.weight(), weights);
  expect_near_all(mean_bag.forward(indices, offsets).data(), {1, 2, 0, 0, 5, 6});
  // Fixed-size bags through the module interface: [bags, k] ids.
  expect_near_all(mean_bag(variable(ids({0, 1, 2, 3}, {2, 2}))).data(), {2, 3, 6, 7});
}

TEST(NnLayers, ReluAndGeluMatchTheirFormulas) {
  auto x = f32({-2, -0.5f, 0, 1.5f}, {4});
  relu r;
  expect_near_all(r(variable(x)).data(), {0, 0, 0, 1.5});
  gelu g;
  std::vector<double> expected;
  for (double v : {-2.0, -0.5, 0.0, 1.5})
    expected.push_back(v * 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))));
  expect_near_all(g(variable(x)).data(), expected);
  gelu approximate(gelu_approximation::tanh);
  expected.clear();
  for (double v : {-2.0, -0.5, 0.0, 1.5})
    expected.push_back(0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v))));
  expect_near_all(approximate(variable(x)).data(), expected);
}

TEST(NnLayers, DropoutIsIdentityInEvalAndScalesKeptElementsInTraining) {
  dropout drop(0.5);
  auto x = tensor::ones({1000});
  drop.eval();
  EXPECT_EQ(max_abs_diff(drop(variable(x)).data(), x), 0.0);
  drop.train();
  auto values = drop(variable(x)).data().to_vector<double>();
  int zeros = 0;
  for (double v : values) {
    EXPECT_TRUE(v == 0.0 || std::abs(v - 2.0) < 1e-6) << v;
    zeros += v == 0.0;
  }
  EXPECT_GT(zeros, 350);
  EXPECT_LT(zeros, 650);
  EXPECT_THROW(dropout(1.0), usage_error);
}

TEST(NnLayers, CausalAttentionOutputDependsOnlyOnEarlierTokens) {
  causal_self_attention attention(attention_options{.n_embd = 8, .n_head = 2, .seed = 3});
  generator gen{11};
  auto x = randn({2, 5, 8}, gen);
  auto y = attention(variable(x)).data();
  ASSERT_EQ(y.shape(), (dims{2, 5, 8}));

  // Perturb positions 2..4: outputs at positions 0 and 1 must not change,
  // later ones must.
  auto perturbed = x.clone();
  auto later = perturbed.narrow(1, 2, 3);
  later.copy_from(randn({2, 3, 8}, gen));
  auto z = attention(variable(perturbed)).data();
  EXPECT_LT(max_abs_diff(y.narrow(1, 0, 2), z.narrow(1, 0, 2)), 1e-6);
  EXPECT_GT(max_abs_diff(y.narrow(1, 2, 3), z.narrow(1, 2, 3)), 1e-4);
}

/// Dropout on attention weights through a module of its own, which makes
/// nn::causal_attention compose bmm, causal_softmax, this and bmm.
class composed_weights_dropout : public module {
public:
  explicit composed_weights_dropout(double p) : p_(p) {}
  variable forward(const variable& input) override { return autograd::dropout(input, p_, true); }

private:
  double p_;
};

TEST(NnLayers, AttentionDropoutInOneOpEqualsTheComposedForm) {
  // nn::dropout on the weights runs the fused op with a mask drawn from the
  // default stream as dropout() draws it: the same output and gradients as
  // the composed form, from the same stream position.
  const std::int64_t batch = 2, seq = 37, heads = 3, head_size = 4;
  generator gen{61};
  const auto qkv_data = randn({batch, seq, 3 * heads * head_size}, gen, 0.0, 1.0, dtype::float64);
  const auto upstream = randn({batch, seq, heads * head_size}, gen, 0.0, 1.0, dtype::float64);
  auto run = [&](module& weights_dropout) {
    manual_seed(62);
    variable qkv(qkv_data.clone(), true);
    auto y = causal_attention(qkv, heads, head_size, weights_dropout);
    const variable roots[] = {y};
    const tensor grads[] = {upstream};
    autograd::backward(roots, grads);
    return std::pair{y.data(), qkv.grad()};
  };
  dropout fused_dropout(0.3);
  composed_weights_dropout composed_dropout(0.3);
  const auto [fused_y, fused_grad] = run(fused_dropout);
  const auto [composed_y, composed_grad] = run(composed_dropout);
  expect_near_all(fused_y, composed_y.to_vector<double>(), 1e-12);
  expect_near_all(fused_grad, composed_grad.to_vector<double>(), 1e-12);
  fused_dropout.eval(); // the identity: no mask, so a different output
  const auto plain_y = causal_attention(variable(qkv_data), heads, head_size, fused_dropout).data().to_vector<double>();
  EXPECT_NE(plain_y, fused_y.to_vector<double>());
}

TEST(NnLayers, SingleTokenAttentionIsTheProjectedValue) {
  // With one position the softmax weight is 1: y = c_proj(v).
  causal_self_attention attention(attention_options{.n_embd = 4, .n_head = 2, .seed = 1});
  generator gen{2};
  auto x = randn({1, 1, 4}, gen);
  auto y = attention(variable(x)).data();
  auto named = attention.named_parameters();
  auto w_attn = find_tensor(attention.state_dict(), "c_attn.weight");
  auto b_attn = find_tensor(attention.state_dict(), "c_attn.bias");
  auto w_proj = find_tensor(attention.state_dict(), "c_proj.weight");
  auto b_proj = find_tensor(attention.state_dict(), "c_proj.bias");
  std::vector<double> v(4), expected(4);
  for (std::int64_t i = 0; i < 4; ++i) {
    double total = b_attn.at({8 + i});
    for (std::int64_t j = 0; j < 4; ++j)
      total += w_attn.at({8 + i, j}) * x.at({0, 0, j});
    v[static_cast<std::size_t>(i)] = total;
  }
  for (std::int64_t i = 0; i < 4; ++i) {
    double total = b_proj.at({i});
    for (std::int64_t j = 0; j < 4; ++j)
      total += w_proj.at({i, j}) * v[static_cast<std::size_t>(j)];
    expected[static_cast<std::size_t>(i)] = total;
  }
  expect_near_all(y, expected);
}

TEST(NnLayers, TransformerBlockKeepsShapeAndIsCausal) {
  transformer_block block(attention_options{.n_embd = 8, .n_head = 4, .seed = 9});
  generator gen{4};
  auto x = randn({1, 4, 8}, gen);
  auto y = block(variable(x)).data();
  ASSERT_EQ(y.shape(), (dims{1, 4, 8}));
  auto perturbed = x.clone();
  auto last = perturbed.narrow(1, 3, 1);
  last.fill(3.0);
  auto z = block(variable(perturbed)).data();
  EXPECT_LT(max_abs_diff(y.narrow(1, 0, 3), z.narrow(1, 0, 3)), 1e-6);
}

TEST(NnLayers, GptMapsTokenIdsToLogitsAndBackpropagates) {
  gpt model(gpt_config{.vocab_size = 13, .block_size = 6, .n_layer = 2, .n_head = 2, .n_embd = 8, .seed = 1});
  auto tokens = ids({1, 2, 3, 4, 5, 0, 12, 11, 10, 9}, {2, 5});
  auto logits = model(variable(tokens));
  ASSERT_EQ(logits.shape(), (dims{2, 5, 13}));
  auto loss = autograd::cross_entropy(autograd::reshape(logits, {10, 13}), ids({2, 3, 4, 5, 0, 11, 10, 9, 8, 7}, {10}));
  EXPECT_TRUE(std::isfinite(loss.item()));
  autograd::backward(loss);
  for (const auto& [name, parameter] : model.named_parameters())
    EXPECT_TRUE(parameter.grad().defined()) << name;
  EXPECT_THROW(model(variable(ids({1, 2, 3, 4, 5, 6, 7}, {1, 7}))), usage_error); // longer than block_size
}

} // namespace
} // namespace troupe::nn
