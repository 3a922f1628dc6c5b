// causal_attention (ops.hpp): the fused core of causal self-attention
// against a float64 reference written out as loops, against the composed
// ops other backends run, and its gradient against the composed backward.
#include <cmath>
#include <limits>

#include "test_util.hpp"
#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/intra_op_threads.hpp"

namespace troupe {
namespace {

using test::expect_close;
using test::sample;
using test::values;
using testing::HasSubstr;

/// y [batch, seq, width] of attention over qkv [batch, seq, 3 width], by
/// the definition: per head, softmax over keys j <= i of scale <q_i, k_j>,
/// then the weighted sum of v_j; in double, one element at a time.
std::vector<double> attention_by_definition(const tensor& qkv, std::int64_t heads, double scale) {
  const auto batch = qkv.size(0), seq = qkv.size(1), width = qkv.size(2) / 3, hs = width / heads;
  const auto x = values(qkv);
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h, std::int64_t d) {
    return x[static_cast<std::size_t>(((b * seq + t) * 3 + part) * width + h * hs + d)];
  };
  std::vector<double> y(static_cast<std::size_t>(batch * seq * width));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < seq; ++i) {
        std::vector<double> score(static_cast<std::size_t>(i + 1));
        double top = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < hs; ++d)
            dot += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          score[static_cast<std::size_t>(j)] = scale * dot;
          top = std::max(top, scale * dot);
        }
        double total = 0;
        for (auto& s : score)
          total += (s = std::exp(s - top));
        for (std::int64_t d = 0; d < hs; ++d) {
          double sum = 0;
          for (std::int64_t j = 0; j <= i; ++j)
            sum += score[static_cast<std::size_t>(j)] / total * at(b, j, 2, h, d);
          y[static_cast<std::size_t>((b * seq + i) * width + h * hs + d)] = sum;
        }
      }
  return y;
}

struct attention_size {
  std::int64_t batch, seq, heads, head_size;
};

// Sequences shorter than, equal to, between and past the kernel's blocks
// of 32 query rows; one and several heads.
const attention_size sizes[] = {{1, 1, 1, 1}, {2, 5, 3, 2}, {1, 31, 2, 4}, {2, 32, 1, 8},
                                {1, 33, 3, 3}, {2, 70, 2, 5}, {1, 129, 1, 4}};

TEST(CausalAttention, EqualsTheDefinitionForEveryLength) {
  for (const auto& s : sizes) {
    SCOPED_TRACE(testing::Message() << "batch " << s.batch << " seq " << s.seq << " heads " << s.heads);
    const auto width = s.heads * s.head_size;
    auto qkv = mul(sample({s.batch, s.seq, 3 * width}, 70), 2.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_size));
    auto result = causal_attention(qkv, s.heads, scale);
    ASSERT_EQ(result.output.shape(), (dims{s.batch, s.seq, width}));
    ASSERT_EQ(result.weights.shape(), (dims{s.batch * s.heads, s.seq, s.seq}));
    expect_close(result.output, attention_by_definition(qkv, s.heads, scale), 1e-13);
    // The mask's entries are exact zeros (the backward's products read them).
    auto w = values(result.weights);
    for (std::int64_t m = 0; m < s.batch * s.heads; ++m)
      for (std::int64_t i = 0; i < s.seq; ++i)
        for (std::int64_t j = i + 1; j < s.seq; ++j)
          ASSERT_EQ(w[static_cast<std::size_t>((m * s.seq + i) * s.seq + j)], 0.0) << m << " " << i << " " << j;

    // float32 within a bound of the float64 result.
    auto single = causal_attention(qkv.to(dtype::float32), s.heads, scale);
    EXPECT_EQ(single.output.type(), dtype::float32);
    expect_close(single.output, result.output, 2e-6);
  }
}

/// The fused op against backend::causal_attention's default (split heads,
/// bmm, causal_softmax, mul by the mask when there is one, bmm), forward
/// and backward, with or without a dropout mask on the weights; the weights
/// it keeps are the softmax's either way.
void expect_fused_equals_composed(const attention_size& s, bool with_mask) {
  SCOPED_TRACE(testing::Message() << "batch " << s.batch << " seq " << s.seq << " heads " << s.heads
                                  << (with_mask ? ", dropout mask" : ""));
  auto& cpu = backend_for(device::cpu());
  const auto width = s.heads * s.head_size;
  auto qkv = sample({s.batch, s.seq, 3 * width}, 71);
  auto grad = sample({s.batch, s.seq, width}, 72);
  generator gen{73};
  const auto mask = with_mask ? dropout_mask({s.batch * s.heads, s.seq, s.seq}, 0.3, gen, dtype::float64) : tensor();
  const double scale = 0.6;
  auto fused = causal_attention(qkv, s.heads, scale, mask);
  auto output = tensor::empty(fused.output.shape(), dtype::float64);
  auto weights = tensor::empty(fused.weights.shape(), dtype::float64);
  cpu.backend::causal_attention(qkv, s.heads, scale, mask, output, weights);
  expect_close(fused.output, output, 1e-14);
  expect_close(fused.weights, weights, 1e-14);
  if (with_mask) {
    expect_close(fused.weights, causal_attention(qkv, s.heads, scale).weights, 0.0);
    double moved = 0; // how far the mask moved the output from attention without it
    const auto with = values(fused.output), without = values(causal_attention(qkv, s.heads, scale).output);
    for (std::size_t i = 0; i < with.size(); ++i)
      moved = std::max(moved, std::abs(with[i] - without[i]));
    EXPECT_GT(moved, 1e-3) << "the mask changed nothing";
  }

  auto composed = tensor::empty(qkv.shape(), dtype::float64);
  cpu.backend::causal_attention_backward(grad, qkv, weights, mask, s.heads, scale, composed);
  auto dqkv = causal_attention_backward(grad, qkv, fused.weights, s.heads, scale, mask);
  expect_close(dqkv, composed, 1e-13);
  auto dqkv32 = causal_attention_backward(grad.to(dtype::float32), qkv.to(dtype::float32),
                                          fused.weights.to(dtype::float32), s.heads, scale,
                                          with_mask ? mask.to(dtype::float32) : tensor());
  expect_close(dqkv32, composed, 2e-5);
}

TEST(CausalAttention, BackwardEqualsTheComposedOps) {
  // The default is independent of the fused kernel; both against finite
  // differences is autograd's gradcheck (FunctionsGradcheck.CausalAttention).
  for (const auto& s : sizes)
    expect_fused_equals_composed(s, false);
}

TEST(CausalAttention, WithADropoutMaskEqualsTheComposedOps) {
  for (const auto& s : sizes)
    expect_fused_equals_composed(s, true);
}

TEST(CausalAttention, AStridedInputEqualsItsContiguousCopy) {
  auto wide = sample({2, 40, 2, 18}, 73);
  auto qkv = wide.select(2, 1); // [2, 40, 18], rows 36 elements apart
  ASSERT_FALSE(qkv.is_contiguous());
  auto strided = causal_attention(qkv, 2, 0.5);
  auto copied = causal_attention(qkv.contiguous(), 2, 0.5);
  EXPECT_EQ(values(strided.output), values(copied.output));
  auto g = sample({2, 6, 40}, 75).transpose(1, 2); // [2, 40, 6], strided
  EXPECT_EQ(values(causal_attention_backward(g, qkv, strided.weights, 2, 0.5)),
            values(causal_attention_backward(g.contiguous(), qkv.contiguous(), copied.weights, 2, 0.5)));
}

TEST(CausalAttention, IntraOpThreadsGiveBitwiseTheSameResult) {
  auto qkv = sample({3, 45, 3 * 12}, 76, dtype::float32);
  auto grad = sample({3, 45, 12}, 77, dtype::float32);
  auto one = causal_attention(qkv, 4, 0.5);
  auto back_one = causal_attention_backward(grad, qkv, one.weights, 4, 0.5);
  set_intra_op_threads(2);
  auto two = causal_attention(qkv, 4, 0.5);
  auto back_two = causal_attention_backward(grad, qkv, two.weights, 4, 0.5);
  set_intra_op_threads(1);
  EXPECT_EQ(values(one.output), values(two.output));
  EXPECT_EQ(values(one.weights), values(two.weights));
  EXPECT_EQ(values(back_one), values(back_two));
}

TEST(CausalAttention, NamesBadShapesAndScales) {
  auto qkv = sample({2, 4, 12}, 78);
  EXPECT_THAT(test::usage_error_of([&] { (void)causal_attention(qkv.view({8, 12}), 2, 1.0); }),
              HasSubstr("causal_attention: qkv must be [batch, seq, 3 width], got shape [8, 12]"));
  EXPECT_THAT(test::usage_error_of([&] { (void)causal_attention(qkv, 3, 1.0); }),
              HasSubstr("causal_attention: qkv's last dimension 12 is not 3 x width for 3 heads"));
  EXPECT_THAT(test::usage_error_of([&] { (void)causal_attention(qkv, 0, 1.0); }),
              HasSubstr("for 0 heads"));
  EXPECT_THAT(test::usage_error_of([&] { (void)causal_attention(qkv, 2, -1.0); }),
              HasSubstr("causal_attention: scale must be positive and finite, got -1"));
  generator gen{80};
  EXPECT_THAT(test::usage_error_of([&] {
                (void)causal_attention(qkv, 2, 1.0, dropout_mask({4, 4, 5}, 0.1, gen, dtype::float64));
              }),
              HasSubstr("causal_attention: dropout_mask must be [4, 4, 4], got shape [4, 4, 5]"));
  EXPECT_THAT(test::usage_error_of([&] { (void)causal_attention(qkv, 2, 1.0, dropout_mask({4, 4, 4}, 0.1, gen)); }),
              HasSubstr("causal_attention: dtypes differ: float32 and float64"));
  auto fwd = causal_attention(qkv, 2, 1.0);
  EXPECT_THAT(test::usage_error_of([&] {
                (void)causal_attention_backward(sample({2, 4, 5}, 79), qkv, fwd.weights, 2, 1.0);
              }),
              HasSubstr("causal_attention_backward: grad must be [2, 4, 4], got shape [2, 4, 5]"));
  EXPECT_THAT(test::usage_error_of([&] {
                (void)causal_attention_backward(fwd.output, qkv, fwd.weights.view({2, 2, 16}), 2, 1.0);
              }),
              HasSubstr("causal_attention_backward: weights must be [4, 4, 4], got shape [2, 2, 16]"));
  EXPECT_THAT(test::usage_error_of([&] {
                (void)causal_attention_backward(fwd.output.to(dtype::float32), qkv, fwd.weights, 2, 1.0);
              }),
              HasSubstr("causal_attention_backward"));
}

} // namespace
} // namespace troupe
