// build_kept_layers: a stage process builds the whole model from its factory
// and keeps a slice; the range comes from another process's stage spec, so
// a range the model does not have is refused with a message, not sliced.
#include "kept_layers.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "troupe/autograd/nn/all.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<nn::sequential> four_layers() {
  return std::make_shared<nn::gpt>(nn::gpt_config{
           .vocab_size = 30, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16, .seed = 5})
    ->as_sequential();
}

std::string refusal(std::function<std::shared_ptr<nn::sequential>()> build, layer_range range) {
  try {
    build_kept_layers(build, [&](const nn::sequential&) { return range; }, "stage worker1/cpu/stage1");
  } catch (const usage_error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(KeptLayers, TheSliceHasTheEagerBuildsValuesAndNames) {
  const auto eager = four_layers();
  std::size_t size_seen = 0;
  auto [whole, kept] = build_kept_layers(
    four_layers,
    [&](const nn::sequential& whole) {
      size_seen = whole.size();
      return layer_range{1, 3};
    },
    "stage");
  EXPECT_EQ(size_seen, eager->size()) << "the range is chosen from the whole model";
  EXPECT_EQ(whole->size(), eager->size());
  ASSERT_EQ(kept->size(), 2u);
  const auto want = eager->slice(1, 3)->state_dict();
  const auto got = kept->state_dict();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(troupe::allclose(got[i].second, want[i].second, 0.0, 0.0)) << got[i].first;
  }
}

TEST(KeptLayers, ARangeTheModelDoesNotHaveIsRefusedByName) {
  const auto layers = four_layers()->size();
  const auto past = refusal(four_layers, {1, layers + 3});
  EXPECT_THAT(past, HasSubstr("stage worker1/cpu/stage1"));
  EXPECT_THAT(past, HasSubstr(fmt::format("layers [1, {})", layers + 3)));
  EXPECT_THAT(past, HasSubstr(fmt::format("model has {}", layers)));
  EXPECT_THAT(refusal(four_layers, {2, 2}), HasSubstr("layers [2, 2)"));
  EXPECT_THAT(refusal(four_layers, {3, 1}), HasSubstr("layers [3, 1)"));
}

TEST(KeptLayers, AFactoryWithoutLayersIsRefused) {
  EXPECT_THAT(refusal([] { return std::shared_ptr<nn::sequential>(); }, {0, 1}), HasSubstr("gave no layers"));
  EXPECT_THAT(refusal([] { return std::make_shared<nn::sequential>(); }, {0, 1}), HasSubstr("gave no layers"));
}

} // namespace
} // namespace troupe::parallel
