// Tensor parallelism equals one process: layers split over 2 and 3 ranks
// (threads of this process, one reducer each) train to the losses and
// parameters of the same layers in one process, with sizes the degree does
// not divide; the conjugate collectives' forward and backward by hand.
#include "troupe/parallel/tensor_parallel.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <vector>

#include "emulated_device.hpp"
#include "gpt_reference.hpp"
#include "ring_support.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/parallel/mesh.hpp"
#include "troupe/parallel/tensor_parallel_transformer.hpp"
#include "troupe/parallel/vocab_parallel.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {
namespace {

using ::testing::HasSubstr;
using autograd::variable;
using test::local_ring;
using namespace std::chrono_literals;

constexpr std::int64_t width = 5, hidden = 7, batch = 6;
constexpr int steps = 4;

/// The one-process MLP: children named as parallel_mlp's.
struct reference_mlp : nn::module {
  std::shared_ptr<nn::linear> fc, proj;
  explicit reference_mlp(std::uint64_t seed) {
    fc = register_module("fc", std::make_shared<nn::linear>(
                                   nn::linear_options{.in_features = width, .out_features = hidden,
                                                      .type = dtype::float64}));
    proj = register_module("proj", std::make_shared<nn::linear>(
                                       nn::linear_options{.in_features = hidden, .out_features = width,
                                                          .type = dtype::float64}));
    reset_parameters(seed);
  }
  variable forward(const variable& x) override { return (*proj)(autograd::gelu((*fc)(x))); }
};

tensor inputs(int step) {
  generator gen{100 + static_cast<std::uint64_t>(step)};
  return randn({batch, width}, gen, 0.0, 1.0, dtype::float64);
}
tensor targets(int step) {
  generator gen{200 + static_cast<std::uint64_t>(step)};
  return randn({batch, width}, gen, 0.0, 1.0, dtype::float64);
}

/// Losses of `steps` SGD steps, and the parameters by name afterwards.
template <class Model> std::vector<double> train(Model& model, named_tensors& parameters) {
  optim::sgd opt(model.named_parameters(), {.lr = 0.1});
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    auto loss = autograd::mse_loss(model(variable(inputs(s))), variable(targets(s)));
    autograd::backward(loss);
    opt.step();
    losses.push_back(loss.item());
  }
  for (auto& [name, p] : model.named_parameters())
    parameters.emplace_back(name, p.data().clone());
  return losses;
}

const tensor& named(const named_tensors& all, const std::string& name) {
  for (auto& [n, t] : all)
    if (n == name)
      return t;
  throw std::runtime_error("no parameter " + name);
}

class TensorParallel : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(TensorParallel, MlpTrainsLikeOneProcess) {
  const auto degree = GetParam();
  reference_mlp whole(9);
  named_tensors want;
  const auto want_losses = train(whole, want);

  local_ring ring(degree);
  ASSERT_TRUE(ring.node);
  std::vector<std::vector<double>> losses(degree);
  std::vector<named_tensors> got(degree);
  std::vector<std::vector<parameter_shard>> fc_shards(degree), proj_shards(degree);
  ring.each([&](std::uint32_t r) {
    parallel_mlp mlp({.width = width, .hidden = hidden, .type = dtype::float64, .seed = 9}, *ring.groups[r]);
    losses[r] = train(mlp, got[r]);
    fc_shards[r] = mlp.fc().shards();
    proj_shards[r] = mlp.proj().shards();
  });
  for (std::uint32_t r = 0; r < degree; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(degree));
    ASSERT_EQ(losses[r].size(), want_losses.size());
    for (std::size_t s = 0; s < want_losses.size(); ++s)
      EXPECT_NEAR(losses[r][s], want_losses[s], 1e-12 * (1 + std::abs(want_losses[s]))) << "step " << s;
    // Each rank's pieces are the one-process parameters' pieces.
    const auto piece = tensor_parallel_split(hidden, degree, r);
    EXPECT_TRUE(allclose(named(got[r], "fc.weight"), named(want, "fc.weight").slice(0, piece.offset, piece.offset + piece.size), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(named(got[r], "fc.bias"), named(want, "fc.bias").slice(0, piece.offset, piece.offset + piece.size), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(named(got[r], "proj.weight"), named(want, "proj.weight").slice(1, piece.offset, piece.offset + piece.size), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(named(got[r], "proj.bias"), named(want, "proj.bias"), 1e-12, 1e-12));
    // Their global shapes and offsets, for checkpoints.
    ASSERT_EQ(fc_shards[r].size(), 2u);
    EXPECT_EQ(fc_shards[r][0].global_shape, (dims{hidden, width}));
    EXPECT_EQ(fc_shards[r][0].dim, 0);
    EXPECT_EQ(fc_shards[r][0].offset, piece.offset);
    EXPECT_EQ(fc_shards[r][0].size, piece.size);
    ASSERT_EQ(proj_shards[r].size(), 2u);
    EXPECT_EQ(proj_shards[r][0].dim, 1);
    EXPECT_EQ(proj_shards[r][0].offset, piece.offset);
    EXPECT_EQ(proj_shards[r][1].dim, -1) << "the row-parallel bias is replicated";
  }
}

INSTANTIATE_TEST_SUITE_P(Degrees, TensorParallel, ::testing::Values(1u, 2u, 3u));

// Tensor x data, 2 x 2: ranks 0, 1 split replica 0's MLP, ranks 2, 3
// replica 1's; each replica trains on half the batch and averages its
// pieces' gradients with the other replica's same pieces. Equals one
// process with the whole batch.
TEST(TensorParallelMesh, TensorTimesDataTwoByTwoTrainsLikeOneProcess) {
  constexpr std::int64_t rows = 6;
  auto full_batch = [](int step) { return std::pair{inputs(step), targets(step)}; };
  reference_mlp whole(9);
  named_tensors want;
  std::vector<double> want_losses;
  {
    optim::sgd opt(whole.named_parameters(), {.lr = 0.1});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto [x, y] = full_batch(s);
      auto loss = autograd::mse_loss(whole(variable(x)), variable(y));
      autograd::backward(loss);
      opt.step();
      want_losses.push_back(loss.item());
    }
    for (auto& [name, p] : whole.named_parameters())
      want.emplace_back(name, p.data().clone());
  }

  auto node = test::start_local_node();
  ASSERT_TRUE(node) << node.error().message();
  auto grid = mesh::create({{"data", 2}, {"tensor", 2}}, std::vector<std::string>(4, "worker0/cpu"));
  ASSERT_TRUE(grid) << grid.error().message();
  std::vector<std::vector<double>> losses(4);
  std::vector<named_tensors> got(4);
  std::vector<std::thread> ranks;
  for (std::uint32_t rank = 0; rank < 4; ++rank)
    ranks.emplace_back([&, rank] {
      auto tensor_group = reducer_group::join(**node, grid->group_options(rank, "tensor"));
      ASSERT_TRUE(tensor_group) << tensor_group.error().message();
      auto data_group = reducer_group::join(**node, grid->group_options(rank, "data"));
      ASSERT_TRUE(data_group) << data_group.error().message();
      parallel_mlp mlp({.width = width, .hidden = hidden, .type = dtype::float64, .seed = 9}, *tensor_group);
      auto dp = data_parallel::create(mlp.named_parameters(), *data_group);
      ASSERT_TRUE(dp) << dp.error().message();
      optim::sgd opt(mlp.named_parameters(), {.lr = 0.1});
      const auto replica = grid->coordinate(rank, "data");
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        auto [x, y] = full_batch(s);
        const auto half = rows / 2 * replica;
        auto loss = autograd::mse_loss(mlp(variable(x.slice(0, half, half + rows / 2).contiguous())),
                                       variable(y.slice(0, half, half + rows / 2).contiguous()));
        auto ok = dp->backward(loss);
        ASSERT_TRUE(ok) << ok.error().message();
        opt.step();
        losses[rank].push_back(loss.item());
      }
      for (auto& [name, p] : mlp.named_parameters())
        got[rank].emplace_back(name, p.data().clone());
    });
  for (auto& t : ranks)
    t.join();
  for (std::uint32_t rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    ASSERT_EQ(losses[rank].size(), want_losses.size());
    const auto other = grid->group(rank, "data")[1 - grid->coordinate(rank, "data")];
    for (std::size_t s = 0; s < want_losses.size(); ++s) // the two halves' mean is the whole batch's loss
      EXPECT_NEAR((losses[rank][s] + losses[other][s]) / 2, want_losses[s], 1e-12 * (1 + want_losses[s])) << s;
    const auto piece = tensor_parallel_split(hidden, 2, grid->coordinate(rank, "tensor"));
    EXPECT_TRUE(allclose(named(got[rank], "fc.weight"), named(want, "fc.weight").slice(0, piece.offset, piece.offset + piece.size), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(named(got[rank], "proj.weight"), named(want, "proj.weight").slice(1, piece.offset, piece.offset + piece.size), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(named(got[rank], "proj.bias"), named(want, "proj.bias"), 1e-12, 1e-12));
  }
  (*node)->stop();
}

TEST(TensorParallelMesh, GroupsAlongEachAxisAndBadShapes) {
  auto grid = mesh::create({{"pipe", 2}, {"data", 3}, {"tensor", 2}}, std::vector<std::string>(12, "w/cpu"));
  ASSERT_TRUE(grid);
  EXPECT_EQ(grid->group(7, "tensor"), (std::vector<std::uint32_t>{6, 7}));
  EXPECT_EQ(grid->group(7, "data"), (std::vector<std::uint32_t>{7, 9, 11}));
  EXPECT_EQ(grid->group(7, "pipe"), (std::vector<std::uint32_t>{1, 7}));
  EXPECT_EQ(grid->coordinate(7, "data"), 0u);
  auto options = grid->group_options(9, "data");
  EXPECT_EQ(options.rank, 1u);
  EXPECT_EQ(options.places, (std::vector<std::string>{"w/cpu/data_r7", "w/cpu/data_r9", "w/cpu/data_r11"}));
  EXPECT_THROW(grid->group(0, "model"), usage_error);
  auto wrong = mesh::create({{"data", 2}, {"tensor", 2}}, {"a/cpu", "b/cpu", "c/cpu"});
  ASSERT_FALSE(wrong);
  EXPECT_THAT(wrong.error().message(), HasSubstr("the axes hold 4 ranks but there are 3 places"));
  EXPECT_FALSE(mesh::create({{"data", 2}, {"data", 1}}, {"a/cpu", "b/cpu"}));
  EXPECT_FALSE(mesh::create({{"da ta", 2}}, {"a/cpu", "b/cpu"}));
}

constexpr std::int64_t vocabulary = 11, tokens = 8, dim = 6;

/// Embedding → head → cross entropy: the vocabulary on both ends.
template <class Embedding, class Head> struct language_model : nn::module {
  std::shared_ptr<Embedding> emb;
  std::shared_ptr<Head> head;
  language_model(std::shared_ptr<Embedding> e, std::shared_ptr<Head> h) {
    emb = register_module("emb", std::move(e));
    head = register_module("head", std::move(h));
    reset_parameters(3);
  }
  variable forward(const variable& ids) override { return (*head)((*emb)(ids)); }
};

tensor token_ids(int step, std::uint64_t salt) {
  generator gen{300 + salt + static_cast<std::uint64_t>(step)};
  return randint({tokens}, gen, 0, vocabulary);
}

class VocabParallel : public ::testing::TestWithParam<std::uint32_t> {};

// A vocabulary of 11 over 2 and 3 ranks: embedding, head and loss train
// like one process, and no rank holds more than its rows of the table or
// its classes of the logits.
TEST_P(VocabParallel, EmbeddingHeadAndLossTrainLikeOneProcess) {
  const auto degree = GetParam();
  const nn::embedding_options table{.num_embeddings = vocabulary, .embedding_dim = dim, .type = dtype::float64};
  const nn::linear_options head{.in_features = dim, .out_features = vocabulary, .type = dtype::float64};
  language_model whole(std::make_shared<nn::embedding>(table), std::make_shared<nn::linear>(head));
  std::vector<double> want_losses;
  named_tensors want;
  {
    optim::sgd opt(whole.named_parameters(), {.lr = 0.5});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto loss = autograd::cross_entropy(whole(variable(token_ids(s, 0))), token_ids(s, 1));
      autograd::backward(loss);
      opt.step();
      want_losses.push_back(loss.item());
    }
    for (auto& [name, p] : whole.named_parameters())
      want.emplace_back(name, p.data().clone());
  }
  local_ring ring(degree);
  ASSERT_TRUE(ring.node);
  std::vector<std::vector<double>> losses(degree);
  std::vector<named_tensors> got(degree);
  ring.each([&](std::uint32_t r) {
    auto& group = *ring.groups[r];
    language_model split(std::make_shared<vocab_parallel_embedding>(table, group),
                         std::make_shared<column_parallel_linear>(head, group));
    EXPECT_EQ(split.emb->weight().data().shape()[0], tensor_parallel_split(vocabulary, degree, r).size);
    optim::sgd opt(split.named_parameters(), {.lr = 0.5});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto logits = split(variable(token_ids(s, 0)));
      EXPECT_EQ(logits.data().shape()[1], tensor_parallel_split(vocabulary, degree, r).size) << "logits stay split";
      auto loss = vocab_parallel_cross_entropy(logits, token_ids(s, 1), group, vocabulary);
      autograd::backward(loss);
      opt.step();
      losses[r].push_back(loss.item());
    }
    for (auto& [name, p] : split.named_parameters())
      got[r].emplace_back(name, p.data().clone());
  });
  for (std::uint32_t r = 0; r < degree; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(degree));
    ASSERT_EQ(losses[r].size(), want_losses.size());
    for (std::size_t s = 0; s < want_losses.size(); ++s)
      EXPECT_NEAR(losses[r][s], want_losses[s], 1e-12 * (1 + want_losses[s])) << "step " << s;
    const auto rows = tensor_parallel_split(vocabulary, degree, r);
    EXPECT_TRUE(allclose(named(got[r], "emb.weight"), named(want, "emb.weight").slice(0, rows.offset, rows.offset + rows.size), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(named(got[r], "head.weight"), named(want, "head.weight").slice(0, rows.offset, rows.offset + rows.size), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(named(got[r], "head.bias"), named(want, "head.bias").slice(0, rows.offset, rows.offset + rows.size), 1e-12, 1e-12));
  }
}

INSTANTIATE_TEST_SUITE_P(Degrees, VocabParallel, ::testing::Values(2u, 3u));

TEST(VocabParallelUse, AnIdOutsideTheVocabularyIsAUsageErrorNamingItBeforeAnyCollective) {
  local_ring ring(2);
  ASSERT_TRUE(ring.node);
  ring.each([&](std::uint32_t r) {
    vocab_parallel_embedding emb({.num_embeddings = vocabulary, .embedding_dim = dim}, *ring.groups[r]);
    try {
      emb(variable(tensor::from(std::vector<std::int64_t>{3, 11}, {2})));
      ADD_FAILURE() << "rank " << r << " accepted id 11";
    } catch (const usage_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("id 11 at 1 is outside the vocabulary [0, 11)"));
    }
    EXPECT_THROW(vocab_parallel_cross_entropy(variable(tensor::zeros({2, 4})), tensor::from(std::vector<std::int64_t>{0, 1}, {2}),
                                              *ring.groups[r], vocabulary),
                 usage_error)
        << "rank " << r << "'s logits hold " << (r == 0 ? 6 : 5) << " classes, not 4";
  });
}

class GptTensorParallel : public ::testing::TestWithParam<std::tuple<std::uint32_t, bool>> {};

/// Trains parallel_gpt at `degree` (rank r's pieces and batches on
/// `where(r)`) and checks every rank's losses and pieces against nn::gpt's
/// on the CPU.
void expect_split_gpt_trains_like_one_process(std::uint32_t degree, bool sequence_parallel,
                                              const std::function<device(std::uint32_t)>& where_of) {
  const nn::gpt_config config{.vocab_size = vocabulary, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 12,
                              .type = dtype::float64, .seed = 21};
  constexpr int gpt_steps = 3;
  auto batch_ids = [](int step, std::uint64_t salt) {
    generator gen{400 + salt + static_cast<std::uint64_t>(step)};
    return randint({2, 5}, gen, 0, vocabulary);
  };
  const auto one_process = test::train_gpt(config, gpt_steps, batch_ids);
  const auto& want_losses = one_process.losses;
  const auto& want = one_process.parameters;

  local_ring ring(degree);
  ASSERT_TRUE(ring.node);
  std::vector<std::vector<double>> losses(degree);
  std::vector<std::string> verdicts(degree), untrained(degree);
  std::vector<device> held(degree, device::cpu());
  ring.each([&](std::uint32_t r) {
    auto& group = *ring.groups[r];
    const auto where = where_of(r);
    parallel_gpt split(config, group, {.sequence_parallel = sequence_parallel});
    split.to(where);
    if (auto fresh = pieces_equal(split, want, 1e-10); !fresh)
      untrained[r] = fresh.error().message();
    optim::sgd opt(split.named_parameters(), {.lr = 0.1});
    for (int s = 0; s < gpt_steps; ++s) {
      opt.zero_grad();
      auto logits = split(variable(batch_ids(s, 0).to(where)));
      auto classes = logits.data().shape()[2];
      auto loss = vocab_parallel_cross_entropy(autograd::reshape(logits, {10, classes}),
                                               batch_ids(s, 1).reshape({10}).to(where), group, vocabulary);
      autograd::backward(loss);
      opt.step();
      losses[r].push_back(loss.item());
    }
    held[r] = split.named_parameters().front().second.data().where();
    auto same = pieces_equal(split, want, 1e-10);
    verdicts[r] = same ? "equal" : same.error().message();
  });
  for (std::uint32_t r = 0; r < degree; ++r) {
    const auto where = where_of(r);
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(degree) +
                 (sequence_parallel ? ", sequence parallel" : "") + " on " + fmt::format("{}", where));
    ASSERT_EQ(losses[r].size(), want_losses.size());
    for (std::size_t s = 0; s < want_losses.size(); ++s)
      EXPECT_NEAR(losses[r][s], want_losses[s], 1e-10 * (1 + want_losses[s])) << "step " << s;
    EXPECT_EQ(verdicts[r], "equal");
    EXPECT_EQ(held[r], where) << "the trained pieces stay where they were put";
    // The check can fail: before training the pieces differ from the
    // trained model's, and it names the first parameter that does.
    EXPECT_THAT(untrained[r], HasSubstr("0.wte.weight: piece"));
  }
}

// The GPT with a vocabulary (11), a head count (3) and a sequence (5) that
// 2 does not divide: at degrees 2 and 3, with sequence parallelism on and
// off, every rank's losses and pieces equal nn::gpt's in one process after
// 3 SGD steps (so on equals off).
TEST_P(GptTensorParallel, TrainsLikeOneProcess) {
  const auto [degree, sequence_parallel] = GetParam();
  expect_split_gpt_trains_like_one_process(degree, sequence_parallel, [](std::uint32_t) { return device::cpu(); });
}

// The same with every rank's pieces and batches on cuda:0: the
// collectives move host memory, so the layers stage their operands through
// the host and put the results back on the GPU (ids too: the vocabulary's
// split is decided on the host).
TEST(GptTensorParallelOnCuda, TrainsLikeOneProcessOnTheCpu) {
  test::cuda_or_emulated devices(1);
  for (const bool sequence_parallel : {false, true})
    expect_split_gpt_trains_like_one_process(2, sequence_parallel, [](std::uint32_t) { return device::cuda(0); });
}

// Members on GPUs of their own run the layers' collectives with NCCL. With
// two GPUs the GPT trains like one process on the CPU. On the emulated
// device (two ordinals, no NCCL behind them) the first forward fails in
// NCCL's set-up, naming it: that shows the choice, since members sharing a
// GPU (above) go through the host.
TEST(GptTensorParallelOnCuda, MembersOnGpusOfTheirOwnChooseNccl) {
#ifndef TROUPE_HAVE_NCCL
  GTEST_SKIP() << "this build has no NCCL: members on GPUs of their own go through the host";
#else
  test::cuda_or_emulated devices(2);
  auto own = [](std::uint32_t r) { return device::cuda(static_cast<std::int32_t>(r)); };
  if (!devices.emulated()) {
    if (devices.ordinals() < 2)
      GTEST_SKIP() << "needs 2 GPUs, found " << devices.ordinals();
    for (const bool sequence_parallel : {false, true})
      expect_split_gpt_trains_like_one_process(2, sequence_parallel, own);
    return;
  }
  local_ring ring(2, 1024, 2000ms);
  ASSERT_TRUE(ring.node);
  std::vector<std::string> errors(2);
  ring.each([&](std::uint32_t r) {
    parallel_mlp mlp({.width = width, .hidden = hidden, .type = dtype::float64, .seed = 9}, *ring.groups[r]);
    mlp.to(own(r));
    try {
      (void)mlp(variable(inputs(0).to(own(r))));
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  for (std::uint32_t r = 0; r < 2; ++r)
    EXPECT_THAT(errors[r], HasSubstr("nccl_communicator")) << "rank " << r;
#endif
}

INSTANTIATE_TEST_SUITE_P(Degrees, GptTensorParallel, ::testing::Combine(::testing::Values(2u, 3u), ::testing::Bool()));

// A member that stops taking part (here: never calls forward) fails the
// others' forward within the group's timeout, naming it, instead of a hang.
TEST(TensorParallelFailure, ASilentMemberFailsTheOthersForwardNamingIt) {
  local_ring ring(2, 1024, 500ms);
  ASSERT_TRUE(ring.node);
  row_parallel_linear row({.in_features = 8, .out_features = 3, .type = dtype::float64}, *ring.groups[0]);
  const auto start = std::chrono::steady_clock::now();
  try {
    row(variable(tensor::ones({2, 4}, dtype::float64)));
    ADD_FAILURE() << "the forward returned without its peer";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("replica 1 (worker0/cpu/reducer1)"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(TensorParallelSplit, FirstRanksHoldTheRemainder) {
  EXPECT_EQ(tensor_parallel_split(7, 3, 0).size, 3);
  EXPECT_EQ(tensor_parallel_split(7, 3, 1).offset, 3);
  EXPECT_EQ(tensor_parallel_split(7, 3, 1).size, 2);
  EXPECT_EQ(tensor_parallel_split(7, 3, 2).offset, 5);
  EXPECT_EQ(tensor_parallel_split(2, 3, 2).size, 0);
  EXPECT_THROW(tensor_parallel_split(7, 3, 3), usage_error);
}

TEST(SequenceParallelLayerNorm, WithoutAffineParametersIsRefusedWhenMade) {
  local_ring ring(1);
  ASSERT_TRUE(ring.node);
  try {
    sequence_parallel_layer_norm norm({.normalized_size = 4, .elementwise_affine = false}, *ring.groups[0]);
    ADD_FAILURE() << "a layer norm without affine parameters was made";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("without affine parameters use nn::layer_norm"));
  }
}

// A column-parallel layer that gathers its output, and a row-parallel layer
// given the whole input, each equal nn::linear: output and input gradient.
TEST(TensorParallelLayers, GatheredColumnAndSplitRowEqualTheWholeLayer) {
  constexpr std::uint32_t degree = 3;
  const nn::linear_options shape{.in_features = 4, .out_features = 7, .type = dtype::float64, .seed = 5};
  nn::linear whole(shape);
  generator gen{3};
  const auto x = randn({2, 3, 4}, gen, 0.0, 1.0, dtype::float64);
  const auto weights = randn({2, 3, 7}, gen, 0.0, 1.0, dtype::float64);
  variable xv(x, true);
  autograd::backward(autograd::sum(autograd::mul(whole(xv), variable(weights))));
  const auto want_out = whole(variable(x)).data();
  const auto want_grad = xv.grad();

  const nn::linear_options row_shape{.in_features = 7, .out_features = 4, .type = dtype::float64, .seed = 6};
  nn::linear whole_row(row_shape);
  const auto x7 = randn({5, 7}, gen, 0.0, 1.0, dtype::float64);
  variable x7v(x7, true);
  autograd::backward(autograd::sum(whole_row(x7v)));

  local_ring ring(degree);
  ASSERT_TRUE(ring.node);
  std::mutex m;
  ring.each([&](std::uint32_t r) {
    column_parallel_linear column(shape, *ring.groups[r], {.gather_output = true});
    variable mine(x, true);
    auto out = column(mine);
    autograd::backward(autograd::sum(autograd::mul(out, variable(weights))));
    row_parallel_linear row(row_shape, *ring.groups[r], {.input_is_parallel = false});
    variable mine7(x7, true);
    auto out7 = row(mine7);
    autograd::backward(autograd::sum(out7));
    std::lock_guard lock(m);
    EXPECT_TRUE(allclose(out.data(), want_out, 1e-12, 1e-12)) << "rank " << r;
    EXPECT_TRUE(allclose(mine.grad(), want_grad, 1e-12, 1e-12)) << "rank " << r;
    EXPECT_TRUE(allclose(out7.data(), whole_row(variable(x7)).data(), 1e-12, 1e-12)) << "rank " << r;
    EXPECT_TRUE(allclose(mine7.grad(), x7v.grad(), 1e-12, 1e-12)) << "rank " << r;
  });
}

// Sequence parallelism's pair along a dimension of 5 over 3 ranks: the
// reduce-scatter's forward is this rank's piece of the sum and its backward
// gathers; the all-gather's backward sums the ranks' gradients, then takes
// this rank's piece.
TEST(TensorParallelCollectives, ReduceScatterAndAllGatherAlongADimensionAndTheirGradients) {
  constexpr std::uint32_t degree = 3;
  auto of_rank = [](std::uint32_t r) {
    generator gen{50 + r};
    return randn({2, 5, 3}, gen, 0.0, 1.0, dtype::float64);
  };
  auto sum = tensor::zeros({2, 5, 3}, dtype::float64);
  for (std::uint32_t r = 0; r < degree; ++r)
    sum = add(sum, of_rank(r));
  local_ring ring(degree);
  ASSERT_TRUE(ring.node);
  std::mutex m;
  ring.each([&](std::uint32_t r) {
    auto& group = *ring.groups[r];
    const auto piece = tensor_parallel_split(5, degree, r);
    variable x(of_rank(r), true);
    auto scattered = reduce_scatter_to_group(x, group, 1);
    // Backward of reduce-scatter: every rank's piece of the gradient (here
    // the rank's own constant) gathered.
    autograd::backward(autograd::sum(autograd::mul(scattered, variable(tensor::full({2, piece.size, 3}, r + 1.0, dtype::float64)))));
    variable y(sum.slice(1, piece.offset, piece.offset + piece.size).contiguous(), true);
    auto gathered = all_gather_from_group(y, group, 1, 5);
    autograd::backward(autograd::sum(autograd::mul(gathered, variable(of_rank(r)))));
    std::lock_guard lock(m);
    EXPECT_TRUE(allclose(scattered.data(), sum.slice(1, piece.offset, piece.offset + piece.size), 1e-12, 1e-12));
    for (std::uint32_t k = 0; k < degree; ++k) {
      const auto theirs = tensor_parallel_split(5, degree, k);
      EXPECT_TRUE(allclose(x.grad().slice(1, theirs.offset, theirs.offset + theirs.size),
                           tensor::full({2, theirs.size, 3}, k + 1.0, dtype::float64), 0, 0))
          << "rank " << r << ", piece " << k;
    }
    EXPECT_TRUE(allclose(gathered.data(), sum, 0, 0)) << "rank " << r;
    EXPECT_TRUE(allclose(y.grad(), sum.slice(1, piece.offset, piece.offset + piece.size), 1e-12, 1e-12))
        << "rank " << r << ": the sum of every rank's gradient, this rank's piece";
  });
}

TEST(TensorParallelCollectives, APieceOfTheWrongSizeIsAUsageErrorNamingIt) {
  local_ring ring(2);
  ASSERT_TRUE(ring.node);
  ring.each([&](std::uint32_t r) {
    // Rank 0's piece of 5 is 3; rank 1's is 2. Both pass 4: refused before any message.
    try {
      gather_from_group(variable(tensor::zeros({4}, dtype::float64)), *ring.groups[r], 0, 5);
      ADD_FAILURE() << "rank " << r << " accepted a piece of 4";
    } catch (const usage_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(fmt::format("rank {} holds 4 of dimension 0 but its piece of 5 is {}", r,
                                                  r == 0 ? 3 : 2)));
    }
  });
}

} // namespace
} // namespace troupe::parallel
