// Pipeline training in one process against single-process training, the
// schedules' credits, recomputation, failures and usage errors.
#include "troupe/parallel/pipeline.hpp"

#include "pipeline_state.hpp"

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <unistd.h>
#include <thread>

#include <caf/all.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "troupe/actors/trace.hpp"
#include "troupe/actors/trace_reader.hpp"
#include "troupe/actors/trace_report.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/job.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {
namespace {

using ::testing::HasSubstr;

/// 8 x (Linear(32, 32) + ReLU) in float64: 16 layers, parameters named
/// "0.weight" ... "14.bias", identical for every build with the same seed.
std::shared_ptr<nn::sequential> make_mlp(std::uint64_t seed = 7) {
  auto model = std::make_shared<nn::sequential>();
  for (int i = 0; i < 8; ++i) {
    nn::linear_options o;
    o.in_features = 32;
    o.out_features = 32;
    o.type = dtype::float64;
    model->append(nn::make<nn::linear>(o));
    model->append(nn::make<nn::relu>());
  }
  model->reset_parameters(seed);
  return model;
}

struct batch {
  tensor inputs;
  tensor targets;
};

batch make_batch(std::uint64_t step, std::int64_t size = 12) {
  generator gen{1000 + step};
  return {randn({size, 32}, gen, 0.0, 1.0, dtype::float64),
          randn({size, 32}, gen, 0.0, 1.0, dtype::float64)};
}

/// One step of plain training on the whole batch.
double reference_step(nn::sequential& model, optim::optimizer& opt, const batch& b) {
  auto loss = autograd::mse_loss(model.forward(autograd::variable(b.inputs)),
                                 autograd::variable(b.targets));
  autograd::backward(loss);
  opt.step();
  opt.zero_grad();
  return loss.item();
}

class PipelineTest : public ::testing::Test {
protected:
  pipeline_options options(std::shared_ptr<nn::sequential> model, std::size_t stages,
                           std::size_t micro_batches, schedule_kind schedule) {
    pipeline_options o;
    o.model = std::move(model);
    o.places.assign(stages, "worker0/cpu");
    o.split = even(stages, o.model->size());
    o.schedule = schedule;
    o.micro_batches = micro_batches;
    o.optimizer = sgd_factory({.lr = 0.05, .momentum = 0.9});
    o.loss = mse_loss_function();
    o.timeout = std::chrono::seconds(20);
    o.in_this_process = true;
    return o;
  }

  std::unique_ptr<pipeline> make(pipeline_options o) {
    auto p = pipeline::create(job_, std::move(o));
    EXPECT_TRUE(p.has_value()) << (p ? "" : p.error_value().message());
    return p ? std::make_unique<pipeline>(std::move(*p)) : nullptr;
  }

  troupe::job job_ = troupe::job::local().value();
};

struct equivalence_case {
  schedule_kind schedule;
  std::size_t stages;
  std::size_t micro_batches;
  bool defer_weight_gradients;
  std::vector<double> shares = {}; ///< micro-batch sizes; empty: equal
  bool overlap_update = false;
};

void PrintTo(const equivalence_case& c, std::ostream* os) {
  *os << name_of(c.schedule) << ", " << c.stages << " stages, " << c.micro_batches << " micro-batches"
      << (c.shares.empty() ? "" : fmt::format(" (shares {})", fmt::join(c.shares, "/"))) << ", "
      << (c.defer_weight_gradients ? "deferred" : "immediate") << " weight gradients"
      << (c.overlap_update ? ", updates overlapping the next step" : "");
}

class PipelineEquivalence : public PipelineTest,
                            public ::testing::WithParamInterface<equivalence_case> {};

TEST_P(PipelineEquivalence, SameLossesAndParametersAsOneProcess) {
  const auto c = GetParam();
  auto reference = make_mlp();
  optim::sgd reference_opt(reference->named_parameters(), {.lr = 0.05, .momentum = 0.9});
  auto model = make_mlp();
  auto o = options(model, c.stages, c.micro_batches, c.schedule);
  o.defer_weight_gradients = c.defer_weight_gradients;
  o.micro_batch_shares = c.shares;
  o.overlap_update = c.overlap_update;
  auto pipe = make(std::move(o));
  ASSERT_TRUE(pipe);
  // With overlapping updates each step's losses can only match when its
  // forwards ran after the previous step's optimizer steps.
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto b = make_batch(step);
    const double expected_loss = reference_step(*reference, reference_opt, b);
    auto loss = pipe->train_step(b.inputs, b.targets);
    ASSERT_TRUE(loss.has_value()) << loss.error_value().message();
    EXPECT_NEAR(*loss, expected_loss, 1e-12 * std::max(1.0, expected_loss)) << "step " << step;
  }
  // The model is read directly below: the last step's updates must be done.
  ASSERT_TRUE(pipe->synchronize().has_value());
  // The stages trained the model's own modules (slices share them).
  auto want = reference->state_dict();
  auto got = model->state_dict();
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].first, got[i].first);
    EXPECT_LT(max_abs_diff(want[i].second, got[i].second), 1e-12) << want[i].first;
  }
  // Evaluation through the stages equals the model's own forward.
  auto b = make_batch(99);
  auto out = pipe->forward(b.inputs);
  ASSERT_TRUE(out.has_value()) << out.error_value().message();
  autograd::no_grad_guard no_grad;
  EXPECT_LT(max_abs_diff(*out, reference->forward(autograd::variable(b.inputs)).data()), 1e-12);
  // Credits: no stage held more micro-batches than its schedule allows.
  auto stats = pipe->stats();
  ASSERT_TRUE(stats.has_value());
  for (std::size_t s = 0; s < c.stages; ++s)
    EXPECT_LE((*stats)[s].peak_in_flight,
              policy_for(c.schedule, s, c.stages, c.micro_batches).credits)
      << "stage " << s;
}

std::vector<equivalence_case> all_cases() {
  std::vector<equivalence_case> out;
  for (auto schedule : {schedule_kind::gpipe, schedule_kind::one_f_one_b})
    for (std::size_t stages : {2, 3, 4})
      for (std::size_t m : {1, 3, 4})
        for (bool defer : {true, false})
          out.push_back({schedule, stages, m, defer});
  // Unequal micro-batches: 2, 4 and 6 of the 12 rows.
  for (auto schedule : {schedule_kind::gpipe, schedule_kind::one_f_one_b})
    for (std::size_t stages : {2, 3})
      out.push_back({schedule, stages, 3, true, {1, 2, 3}});
  // Updates overlapping the next step, with and without deferral.
  for (auto schedule : {schedule_kind::gpipe, schedule_kind::one_f_one_b})
    for (std::size_t stages : {2, 3})
      for (bool defer : {true, false})
        out.push_back({schedule, stages, 3, defer, {}, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(SchedulesStagesMicroBatches, PipelineEquivalence,
                         ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<equivalence_case>& info) {
                           return fmt::format("{}_{}stages_{}mb_{}{}{}",
                                              info.param.schedule == schedule_kind::gpipe
                                                ? "GPipe"
                                                : "OneFOneB",
                                              info.param.stages, info.param.micro_batches,
                                              info.param.defer_weight_gradients ? "DeferredW" : "ImmediateW",
                                              info.param.shares.empty() ? "" : "_Unequal",
                                              info.param.overlap_update ? "_Overlapped" : "");
                         });

TEST_F(PipelineTest, SchedulesStayWithinTheirCredits) {
  auto gpipe = make(options(make_mlp(), 4, 4, schedule_kind::gpipe));
  auto one_f_one_b = make(options(make_mlp(), 4, 4, schedule_kind::one_f_one_b));
  auto b = make_batch(0);
  ASSERT_TRUE(gpipe->train_step(b.inputs, b.targets).has_value());
  ASSERT_TRUE(one_f_one_b->train_step(b.inputs, b.targets).has_value());
  auto g = gpipe->stats();
  auto f = one_f_one_b->stats();
  ASSERT_TRUE(g.has_value() && f.has_value());
  // 1F1B: stage i holds at most 4 - i; the last stage exactly one.
  for (std::size_t s = 0; s < 4; ++s)
    EXPECT_LE((*f)[s].peak_in_flight, 4 - s);
  EXPECT_EQ((*f)[3].peak_in_flight, 1u);
  // What the credits bound: 1F1B's stage 0 never stashes more than 4
  // micro-batches' worth, and the last stage one at a time.
  const std::uint64_t per_micro_batch = 3 * 32 * sizeof(double) * 5; // input + 4 layer outputs
  EXPECT_LE((*f)[0].peak_stashed_bytes, 4 * per_micro_batch);
  EXPECT_EQ((*f)[3].peak_stashed_bytes, per_micro_batch);
  for (std::size_t s = 0; s < 4; ++s)
    EXPECT_LE((*g)[s].peak_in_flight, 4u);
}

TEST_F(PipelineTest, RematerializationGivesIdenticalParametersAndStashesLess) {
  // Bitwise: without filling idle time with weight gradients, whose
  // summation order depends on timing.
  auto plain_model = make_mlp();
  auto remat_model = make_mlp();
  auto p = options(plain_model, 2, 4, schedule_kind::gpipe);
  p.fill_idle_with_weight_gradients = false;
  auto plain = make(std::move(p));
  auto o = options(remat_model, 2, 4, schedule_kind::gpipe);
  o.remat = rematerialization::always;
  o.fill_idle_with_weight_gradients = false;
  auto remat = make(std::move(o));
  for (std::uint64_t step = 0; step < 2; ++step) {
    auto b = make_batch(step);
    auto l1 = plain->train_step(b.inputs, b.targets);
    auto l2 = remat->train_step(b.inputs, b.targets);
    ASSERT_TRUE(l1.has_value() && l2.has_value());
    EXPECT_EQ(*l1, *l2);
  }
  auto want = plain_model->state_dict();
  auto got = remat_model->state_dict();
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(max_abs_diff(want[i].second, got[i].second), 0.0) << want[i].first;
  // Stashed bytes with one micro-batch in flight (12 samples): 8 layer
  // outputs plus the input without recomputation, input and output with it.
  auto one_plain = make(options(make_mlp(), 2, 1, schedule_kind::gpipe));
  auto o1 = options(make_mlp(), 2, 1, schedule_kind::gpipe);
  o1.remat = rematerialization::always;
  auto one_remat = make(std::move(o1));
  auto b = make_batch(0);
  ASSERT_TRUE(one_plain->train_step(b.inputs, b.targets).has_value());
  ASSERT_TRUE(one_remat->train_step(b.inputs, b.targets).has_value());
  auto s1 = one_plain->stats();
  auto s2 = one_remat->stats();
  ASSERT_TRUE(s1.has_value() && s2.has_value());
  const std::uint64_t activation = 12 * 32 * sizeof(double);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_EQ((*s1)[s].peak_stashed_bytes, 9 * activation) << "stage " << s;
    EXPECT_EQ((*s2)[s].peak_stashed_bytes, 2 * activation) << "stage " << s;
  }
}

TEST_F(PipelineTest, DeferredWeightGradientsAreCountedAndHeldUntilTheStepEnds) {
  // 1F1B, 2 stages of 4 x Linear(32, 32), 4 micro-batches of 3 float64 rows.
  // Deferred, each linear keeps its input and output gradient (3 x 32 each)
  // for every micro-batch until the step's last backward: m, not the
  // stage's credits, which is the memory deferral costs under 1F1B.
  // (Without filling idle time: that computes some of them earlier, as
  // timing allows.)
  auto d = options(make_mlp(), 2, 4, schedule_kind::one_f_one_b);
  d.fill_idle_with_weight_gradients = false;
  auto deferred = make(std::move(d));
  auto o = options(make_mlp(), 2, 4, schedule_kind::one_f_one_b);
  o.defer_weight_gradients = false;
  auto immediate = make(std::move(o));
  auto b = make_batch(0);
  ASSERT_TRUE(deferred->train_step(b.inputs, b.targets).has_value());
  ASSERT_TRUE(immediate->train_step(b.inputs, b.targets).has_value());
  auto with = deferred->stats();
  auto without = immediate->stats();
  ASSERT_TRUE(with.has_value() && without.has_value());
  const std::uint64_t per_linear = 2 * 3 * 32 * sizeof(double);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_EQ((*with)[s].peak_deferred_bytes, 4 * 4 * per_linear) << "stage " << s;
    EXPECT_EQ((*without)[s].peak_deferred_bytes, 0u) << "stage " << s;
    EXPECT_LE((*with)[s].peak_in_flight, policy_for(schedule_kind::one_f_one_b, s, 2, 4).credits);
  }
}

TEST_F(PipelineTest, AllButLastStageRecomputesEverywhereExceptTheLast) {
  auto model = make_mlp();
  auto o = options(model, 3, 3, schedule_kind::one_f_one_b);
  o.split = from_balance({6, 6, 4}, model->size());
  o.remat = rematerialization::all_but_last_stage;
  auto pipe = make(std::move(o));
  auto b = make_batch(0);
  ASSERT_TRUE(pipe->train_step(b.inputs, b.targets).has_value());
  auto s = pipe->stats();
  ASSERT_TRUE(s.has_value());
  const std::uint64_t micro_batch_activation = 4 * 32 * sizeof(double);
  // Stage 0 recomputes: it keeps only input + output of each of its (at
  // most 3, timing decides) micro-batches in flight. The last stage does
  // not: one micro-batch of input + 4 layer outputs.
  EXPECT_EQ((*s)[0].peak_stashed_bytes % (2 * micro_batch_activation), 0u);
  EXPECT_GE((*s)[0].peak_stashed_bytes, 2 * micro_batch_activation);
  EXPECT_LE((*s)[0].peak_stashed_bytes, 3 * 2 * micro_batch_activation);
  EXPECT_EQ((*s)[2].peak_stashed_bytes, 5 * micro_batch_activation);
}

TEST_F(PipelineTest, MismatchedPlacesAndPartitionIsAUsageError) {
  auto o = options(make_mlp(), 2, 1, schedule_kind::gpipe);
  o.places.assign(3, "worker0/cpu");
  try {
    (void)pipeline::create(job_, std::move(o));
    FAIL() << "expected usage_error";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("3 places for a partition of 2 stages"));
  }
}

TEST_F(PipelineTest, PartitionNotCoveringTheModelIsAUsageError) {
  auto o = options(make_mlp(), 2, 1, schedule_kind::gpipe);
  o.split = from_balance({4, 4}, 8);
  EXPECT_THROW((void)pipeline::create(job_, std::move(o)), usage_error);
  EXPECT_THROW((void)from_balance({4, 0, 4}, 8), usage_error);
  EXPECT_THROW((void)from_split_points({4, 2}, 8), usage_error);
}

TEST_F(PipelineTest, BadPlaceIsAUsageError) {
  auto o = options(make_mlp(), 2, 1, schedule_kind::gpipe);
  o.places[1] = "worker 1/gpu";
  try {
    (void)pipeline::create(job_, std::move(o));
    FAIL() << "expected usage_error";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("place worker 1/gpu of stage 1"));
  }
}

TEST(MicroBatchRows, EqualPartsOrPartsInProportionToTheShares) {
  EXPECT_EQ(micro_batch_rows(10, 3, {}), (std::vector<std::int64_t>{4, 3, 3}));
  EXPECT_EQ(micro_batch_rows(256, 3, {3, 6.5, 6.5}), (std::vector<std::int64_t>{48, 104, 104}));
  // 10 * (1, 1, 1) / 3 = 3.33 each: the remaining row goes to the first.
  EXPECT_EQ(micro_batch_rows(10, 3, {1, 1, 1}), (std::vector<std::int64_t>{4, 3, 3}));
  // 7 * (1, 2) / 3 = 2.33, 4.67: floors 2 and 4, the second lost more.
  EXPECT_EQ(micro_batch_rows(7, 2, {1, 2}), (std::vector<std::int64_t>{2, 5}));
  EXPECT_EQ(micro_batch_rows(1, 1, {0.25}), (std::vector<std::int64_t>{1}));
}

TEST(MicroBatchRows, BadSharesAreUsageErrorsNamingTheValue) {
  auto message = [](auto call) {
    try {
      call();
    } catch (const usage_error& e) {
      return std::string(e.what());
    }
    return std::string("no usage_error");
  };
  EXPECT_THAT(message([] { (void)micro_batch_rows(12, 3, {1, 2}); }),
              HasSubstr("2 micro-batch shares for 3 micro-batches"));
  EXPECT_THAT(message([] { (void)micro_batch_rows(12, 2, {1, -2}); }), HasSubstr("share 1 is -2"));
  EXPECT_THAT(message([] { (void)micro_batch_rows(12, 2, {1, std::nan("")}); }), HasSubstr("share 1 is nan"));
  EXPECT_THAT(message([] { (void)micro_batch_rows(12, 2, {1, 0}); }), HasSubstr("share 1 is 0"));
  EXPECT_THAT(message([] { (void)micro_batch_rows(4, 2, {100, 1}); }),
              HasSubstr("micro-batch 1 gets no rows of a batch of 4"));
  EXPECT_THAT(message([] { (void)micro_batch_rows(2, 3, {}); }), HasSubstr("3 micro-batches for a batch of 2"));
}

TEST_F(PipelineTest, MicroBatchSharesAreCheckedWhenThePipelineIsCreated) {
  auto o = options(make_mlp(), 2, 3, schedule_kind::gpipe);
  o.micro_batch_shares = {1, 2};
  EXPECT_THROW((void)pipeline::create(job_, std::move(o)), usage_error);
  // Shares that would leave a micro-batch empty only for small batches are
  // fine until such a batch comes.
  auto lopsided = options(make_mlp(), 2, 2, schedule_kind::gpipe);
  lopsided.micro_batch_shares = {1, 30};
  auto pipe = make(std::move(lopsided));
  ASSERT_TRUE(pipe);
  EXPECT_TRUE(pipe->train_step(make_batch(0, 31).inputs, make_batch(0, 31).targets).has_value());
  EXPECT_THROW((void)pipe->train_step(make_batch(1).inputs, make_batch(1).targets), usage_error);
}

TEST_F(PipelineTest, MoreMicroBatchesThanSamplesIsAUsageError) {
  auto pipe = make(options(make_mlp(), 2, 4, schedule_kind::gpipe));
  auto b = make_batch(0, 3);
  try {
    (void)pipe->train_step(b.inputs, b.targets);
    FAIL() << "expected usage_error";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("4 micro-batches for a batch of 3"));
  }
  auto mismatched = make_batch(0);
  EXPECT_THROW((void)pipe->train_step(mismatched.inputs, make_batch(1, 6).targets), usage_error);
}

TEST_F(PipelineTest, TraceLinksEveryTensorAndShowsEachStagesBubble) {
  auto dir = std::filesystem::temp_directory_path() /
             ("troupe_pipeline_trace_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  trace::options topts;
  topts.directory = dir.string();
  topts.node = "worker0";
  ASSERT_TRUE(trace::start(topts).has_value());
  {
    auto pipe = make(options(make_mlp(), 2, 4, schedule_kind::gpipe));
    for (std::uint64_t step = 0; step < 2; ++step) {
      auto b = make_batch(step);
      ASSERT_TRUE(pipe->train_step(b.inputs, b.targets).has_value());
    }
  }
  trace::stop();
  std::vector<std::string> warnings;
  std::vector<std::string> inputs{dir.string()};
  auto files = trace::read_trace_inputs(inputs, warnings);
  ASSERT_TRUE(files.has_value()) << files.error().message();
  auto summary = trace::summarize(*files, warnings);
  std::map<std::pair<std::string, std::string>, std::uint64_t> matched;
  for (const auto& e : summary.edges)
    matched[{e.sender, e.receiver}] = e.matched;
  EXPECT_EQ((matched[{"driver", "worker0/cpu/stage0"}]), 8u) << trace::format_summary(summary);
  EXPECT_EQ((matched[{"worker0/cpu/stage0", "worker0/cpu/stage1"}]), 8u);
  EXPECT_EQ((matched[{"worker0/cpu/stage1", "worker0/cpu/stage0"}]), 8u);
  int stages_seen = 0;
  for (const auto& a : summary.actors)
    if (a.actor == "worker0/cpu/stage0" || a.actor == "worker0/cpu/stage1") {
      ++stages_seen;
      // 2 steps x 4 micro-batches x (forward, backward), plus any weight
      // gradients computed while the stage waited (as timing allows).
      EXPECT_GE(a.handled, 16u) << a.actor;
      ASSERT_TRUE(a.bubble_fraction.has_value()) << a.actor;
      EXPECT_GT(*a.bubble_fraction, 0.0);
      EXPECT_LT(*a.bubble_fraction, 1.0);
    }
  EXPECT_EQ(stages_seen, 2);
  std::filesystem::remove_all(dir);
}

/// A layer that runs a callback on every forward (to act mid-step).
class probe : public nn::module {
public:
  explicit probe(std::function<void(int)> on_forward) : on_forward_(std::move(on_forward)) {}
  autograd::variable forward(const autograd::variable& input) override {
    on_forward_(calls_++);
    return input;
  }

private:
  std::function<void(int)> on_forward_;
  int calls_ = 0;
};

TEST_F(PipelineTest, KilledStageIsReportedByNameWithinTheTimeout) {
  auto model = make_mlp();
  std::atomic<pipeline*> self{nullptr};
  // Stage 1 kills itself while computing the forward of micro-batch 1.
  model->append(nn::make<probe>([&self](int call) {
    if (call == 1 && self.load() != nullptr)
      caf::anon_send_exit(pipeline_access::stage_actor(*self.load(), 1), caf::exit_reason::kill);
  }));
  auto o = options(model, 2, 4, schedule_kind::one_f_one_b);
  o.split = from_balance({8, 9}, model->size());
  o.timeout = std::chrono::seconds(5);
  auto pipe = make(std::move(o));
  self = pipe.get();
  auto b = make_batch(0);
  auto started = std::chrono::steady_clock::now();
  auto loss = pipe->train_step(b.inputs, b.targets);
  auto elapsed = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(loss.has_value());
  EXPECT_THAT(loss.error_value().message(), HasSubstr("stage 1 (worker0/cpu/stage1) stopped"));
  EXPECT_THAT(loss.error_value().message(), HasSubstr("kill"));
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  // The pipeline refuses further steps instead of hanging.
  auto again = pipe->train_step(b.inputs, b.targets);
  ASSERT_FALSE(again.has_value());
  EXPECT_THAT(again.error_value().message(), HasSubstr("an earlier step failed"));
}

/// SGD that runs `before` at the start of each update (tests hold or fail
/// the optimizer step with it).
class gated_sgd final : public optim::sgd {
public:
  gated_sgd(optim::named_variables parameters, std::function<void()> before)
      : optim::sgd(std::move(parameters), {.lr = 0.05, .momentum = 0.9}), before_(std::move(before)) {}

protected:
  void update(std::size_t index, autograd::variable& parameter, const tensor& grad,
              std::vector<tensor>& state) override {
    if (index == 0)
      before_();
    optim::sgd::update(index, parameter, grad, state);
  }

private:
  std::function<void()> before_;
};

/// Opens a gate on every way out, so that a failed assertion cannot leave
/// the stages' threads waiting at shutdown; operator() opens it early.
struct open_at_exit {
  std::promise<void>& gate;
  bool open = false;
  void operator()() {
    if (!std::exchange(open, true))
      gate.set_value();
  }
  ~open_at_exit() { (*this)(); }
};

TEST_F(PipelineTest, OverlappedUpdateRunsAfterTrainStepReturnsAndSynchronizeWaitsForIt) {
  // Every stage's optimizer step waits until the test opens the gate: with
  // overlap_update train_step must return anyway, and synchronize() must
  // not return before the updates ran.
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  open_at_exit open_gate{gate};
  std::atomic<int> updates{0};
  auto o = options(make_mlp(), 2, 3, schedule_kind::one_f_one_b);
  o.overlap_update = true;
  o.optimizer = [&](optim::named_variables parameters) -> std::unique_ptr<optim::optimizer> {
    return std::make_unique<gated_sgd>(std::move(parameters), [&updates, opened] {
      opened.wait();
      ++updates;
    });
  };
  auto pipe = make(std::move(o));
  ASSERT_TRUE(pipe);
  auto b = make_batch(0);
  auto loss = pipe->train_step(b.inputs, b.targets);
  ASSERT_TRUE(loss.has_value()) << loss.error_value().message();
  EXPECT_EQ(updates.load(), 0); // both stages are held at their update
  open_gate();
  ASSERT_TRUE(pipe->synchronize().has_value());
  EXPECT_EQ(updates.load(), 2);
  EXPECT_TRUE(pipe->synchronize().has_value()); // nothing left to wait for
}

TEST_F(PipelineTest, AFailedUpdateIsReportedWithOrWithoutOverlap) {
  // (overlap_update, which call reports the failure)
  for (auto [overlap, reporter] : {std::pair{false, "train_step"}, std::pair{true, "synchronize"},
                                   std::pair{true, "stats"}}) {
    SCOPED_TRACE(fmt::format("overlap {}, reported by {}", overlap, reporter));
    // Overlapped, the failing updates wait for the gate, which opens only
    // once train_step returned: the failure must come from the next call.
    std::promise<void> gate;
    std::shared_future<void> opened = gate.get_future().share();
    open_at_exit open_gate{gate};
    std::atomic<bool> fail{false};
    auto o = options(make_mlp(), 2, 3, schedule_kind::one_f_one_b);
    o.overlap_update = overlap;
    o.timeout = std::chrono::seconds(5);
    o.optimizer = [&fail, overlap, opened](optim::named_variables parameters) -> std::unique_ptr<optim::optimizer> {
      return std::make_unique<gated_sgd>(std::move(parameters), [&fail, overlap, opened] {
        if (!fail)
          return;
        if (overlap)
          opened.wait();
        throw std::runtime_error("update refused");
      });
    };
    auto pipe = make(std::move(o));
    ASSERT_TRUE(pipe);
    auto b = make_batch(0);
    ASSERT_TRUE(pipe->train_step(b.inputs, b.targets).has_value());
    ASSERT_TRUE(pipe->synchronize().has_value()); // step 1's updates pass
    fail = true;
    auto loss = pipe->train_step(b.inputs, b.targets);
    expected<void> reported{};
    if (!overlap) {
      ASSERT_FALSE(loss.has_value());
      reported = loss.error_value();
    } else {
      ASSERT_TRUE(loss.has_value()) << loss.error_value().message();
      open_gate();
      if (std::string_view(reporter) == "stats") {
        auto stats = pipe->stats();
        if (!stats)
          reported = stats.error_value();
      } else {
        reported = pipe->synchronize();
      }
    }
    ASSERT_FALSE(reported.has_value());
    EXPECT_THAT(reported.error_value().message(), HasSubstr("update refused"));
    EXPECT_THAT(reported.error_value().message(), HasSubstr("(worker0/cpu/stage"));
    auto again = pipe->train_step(b.inputs, b.targets);
    ASSERT_FALSE(again.has_value());
    EXPECT_THAT(again.error_value().message(), HasSubstr("an earlier step failed"));
  }
}

TEST_F(PipelineTest, HungStageIsATimeoutNamingTheStage) {
  auto model = make_mlp();
  model->append(nn::make<probe>([](int call) {
    if (call == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
  }));
  auto o = options(model, 2, 2, schedule_kind::gpipe);
  o.timeout = std::chrono::milliseconds(200);
  auto pipe = make(std::move(o));
  auto b = make_batch(0);
  auto loss = pipe->train_step(b.inputs, b.targets);
  ASSERT_FALSE(loss.has_value());
  EXPECT_THAT(loss.error_value().message(), HasSubstr("no progress for 200 ms"));
  EXPECT_THAT(loss.error_value().message(), HasSubstr("stage 1 (worker0/cpu/stage1)"));
}

TEST_F(PipelineTest, ErrorInsideAStageIsReportedNotFatal) {
  auto pipe = make(options(make_mlp(), 2, 2, schedule_kind::gpipe));
  auto b = make_batch(0);
  // Targets of the wrong width: mse_loss throws inside the last stage.
  generator gen{3};
  auto loss = pipe->train_step(b.inputs, randn({12, 5}, gen, 0.0, 1.0, dtype::float64));
  ASSERT_FALSE(loss.has_value());
  EXPECT_THAT(loss.error_value().message(), HasSubstr("stage 1 (worker0/cpu/stage1) failed"));
}

} // namespace
} // namespace troupe::parallel
