// Optimizer updates against the published formulas, evaluated in double
// in the test; state_dict save/restore continues an uninterrupted run.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "troupe/autograd/optim/all.hpp"
#include "troupe/tensor/intra_op_threads.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::optim {
namespace {

const std::vector<double> initial{0.5, -1.0, 2.0};

/// The gradient fed at step t (1-based) for parameter values p: depends on
/// both, so a wrong state or step count shows.
std::vector<double> gradient_at(int t, const std::vector<double>& p) {
  std::vector<double> g(p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    g[i] = 2.0 * p[i] + 0.1 * t - 0.3 * static_cast<double>(i);
  return g;
}

variable make_parameter(const std::vector<double>& values) {
  return variable(tensor::from(values, {static_cast<std::int64_t>(values.size())}), true);
}

/// Runs `steps` steps of `opt` on `p`, feeding gradient_at(first_step + k).
void run(optimizer& opt, variable& p, int first_step, int steps) {
  for (int k = 0; k < steps; ++k) {
    p.set_grad(tensor::from(gradient_at(first_step + k, p.data().to_vector<double>()), p.shape()).to(p.type()));
    opt.step();
  }
}

void expect_values(const variable& p, const std::vector<double>& expected) {
  auto got = p.data().to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], 1e-12) << "element " << i;
}

/// torch.optim.SGD's documented algorithm, element by element.
std::vector<double> reference_sgd(const sgd_options& o, int steps) {
  auto p = initial;
  std::vector<double> buf(p.size());
  for (int t = 1; t <= steps; ++t) {
    auto g = gradient_at(t, p);
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + o.weight_decay * p[i];
      if (o.momentum != 0.0) {
        buf[i] = t == 1 ? d : o.momentum * buf[i] + (1.0 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
  }
  return p;
}

/// torch.optim.Adam / AdamW's documented algorithm.
std::vector<double> reference_adam(const adam_options& o, bool decoupled, int steps) {
  auto p = initial;
  std::vector<double> m(p.size()), v(p.size());
  for (int t = 1; t <= steps; ++t) {
    auto g = gradient_at(t, p);
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (decoupled)
        p[i] *= 1.0 - o.lr * o.weight_decay;
      else
        g[i] += o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g[i] * g[i];
      double m_hat = m[i] / (1.0 - std::pow(o.beta1, t));
      double v_hat = v[i] / (1.0 - std::pow(o.beta2, t));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
  return p;
}

TEST(OptimSgd, PlainStepIsLearningRateTimesGradient) {
  auto p = make_parameter(initial);
  sgd_options o{.lr = 0.1};
  sgd opt({{"w", p}}, o);
  run(opt, p, 1, 4);
  expect_values(p, reference_sgd(o, 4));
  EXPECT_EQ(opt.step_count(), 4);
  EXPECT_EQ(opt.state_dict().size(), 1u); // only `step`
}

TEST(OptimSgd, MomentumWithDampeningAndWeightDecay) {
  auto p = make_parameter(initial);
  sgd_options o{.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 0.01};
  sgd opt({{"w", p}}, o);
  run(opt, p, 1, 5);
  expect_values(p, reference_sgd(o, 5));
}

TEST(OptimSgd, NesterovWithWeightDecay) {
  auto p = make_parameter(initial);
  sgd_options o{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.1, .nesterov = true};
  sgd opt({{"w", p}}, o);
  run(opt, p, 1, 5);
  expect_values(p, reference_sgd(o, 5));
  EXPECT_THROW(sgd({{"w", p}}, sgd_options{.lr = 0.1, .nesterov = true}), usage_error);
}

TEST(OptimAdam, MatchesTheBiasCorrectedUpdateWithL2) {
  auto p = make_parameter(initial);
  adam_options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  adam opt({{"w", p}}, o);
  run(opt, p, 1, 6);
  expect_values(p, reference_adam(o, false, 6));
}

TEST(OptimAdamW, AnUpdateSplitOverTwoIntraOpThreadsGivesTheSameBits) {
  // 100K elements: several ranges of the element loop (kernels.hpp).
  generator gen{5, 0};
  const auto start = randn({100'000}, gen, 0.0, 1.0, dtype::float32);
  const auto grad = randn({100'000}, gen, 0.0, 1.0, dtype::float32);
  auto run_with = [&](int threads) {
    set_intra_op_threads(threads);
    variable p(start.clone(), true);
    adamw opt({{"w", p}}, adam_options{.lr = 0.01, .weight_decay = 0.1});
    for (int step = 0; step < 3; ++step) {
      p.set_grad(mul(grad, 1.0 + step));
      opt.step();
    }
    set_intra_op_threads(1);
    return p.data().to_vector<double>();
  };
  const auto one = run_with(1);
  EXPECT_EQ(run_with(2), one);
  EXPECT_NE(one, start.template to_vector<double>()) << "the steps changed the parameter";
}

/// Adam's element loop as the CPU backend documents it (double per element,
/// stored in T), over `steps` steps of gradient g_k = grad * (1 + k).
template <class T>
std::vector<T> adam_element_loop(std::vector<T> p, const std::vector<T>& grad, const adam_options& o, bool decoupled,
                                 int steps) {
  std::vector<T> m(p.size()), v(p.size());
  for (int k = 0; k < steps; ++k) {
    const double t = k + 1;
    const double step_size = o.lr / (1.0 - std::pow(o.beta1, t));
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));
    const double l2 = decoupled ? 0.0 : o.weight_decay;
    const double decay = decoupled ? 1.0 - o.lr * o.weight_decay : 1.0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const T g = static_cast<T>(grad[i] * static_cast<T>(1.0 + k));
      double param = static_cast<double>(p[i]) * decay;
      double gi = static_cast<double>(g) + l2 * static_cast<double>(p[i]);
      double mi = o.beta1 * m[i] + (1.0 - o.beta1) * gi;
      double vi = o.beta2 * v[i] + (1.0 - o.beta2) * gi * gi;
      m[i] = static_cast<T>(mi);
      v[i] = static_cast<T>(vi);
      p[i] = static_cast<T>(param - step_size * mi / (std::sqrt(vi) / bias_correction2_sqrt + o.eps));
    }
  }
  return p;
}

template <class T> void expect_the_element_loops_bits(dtype type) {
  // 1003 elements: whole vectors and a partial one at the end.
  generator gen{9, 0};
  const auto start = randn({1003}, gen, 0.0, 1.0, type);
  const auto grad = randn({1003}, gen, 0.0, 1.0, type);
  const adam_options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  for (bool decoupled : {false, true}) {
    variable p(start.clone(), true);
    std::unique_ptr<optimizer> opt;
    if (decoupled)
      opt = std::make_unique<adamw>(named_variables{{"w", p}}, o);
    else
      opt = std::make_unique<adam>(named_variables{{"w", p}}, o);
    for (int k = 0; k < 3; ++k) {
      p.set_grad(mul(grad, 1.0 + k));
      opt->step();
    }
    const auto want = adam_element_loop<T>(start.to_vector<T>(), grad.to_vector<T>(), o, decoupled, 3);
    const auto got = p.data().to_vector<T>();
    ASSERT_EQ(got.size(), want.size());
    std::size_t differing = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      differing += got[i] != want[i];
    EXPECT_EQ(differing, 0u) << (decoupled ? "adamw" : "adam") << ", " << fmt::format("{}", type) << ": elements whose bits differ";
    EXPECT_NE(got, start.to_vector<T>()) << "the steps changed the parameter";
  }
}

TEST(OptimAdam, EveryElementHasTheElementLoopsBitsInFloat32AndFloat64) {
  // Where the CPU has AVX2 the step runs in vector lanes (tensor/src/
  // cpu_vector_optim.cpp); they must round exactly as the loop does.
  expect_the_element_loops_bits<float>(dtype::float32);
  expect_the_element_loops_bits<double>(dtype::float64);
}

TEST(OptimAdamW, DecaysWeightsDecoupledFromTheGradient) {
  auto p = make_parameter(initial);
  adam_options o{.lr = 0.01, .weight_decay = 0.5};
  adamw opt({{"w", p}}, o);
  run(opt, p, 1, 6);
  expect_values(p, reference_adam(o, true, 6));
  // And it differs from Adam's L2 penalty.
  auto q = make_parameter(initial);
  adam l2({{"w", q}}, o);
  run(l2, q, 1, 6);
  EXPECT_GT(max_abs_diff(p.data(), q.data()), 1e-6);
}

TEST(OptimAdam, WorksOnFloat32Parameters) {
  auto p = variable(tensor::from<float>({0.5f, -1.0f, 2.0f}, {3}), true);
  adam_options o{.lr = 0.01};
  adam opt({{"w", p}}, o);
  run(opt, p, 1, 3);
  auto expected = reference_adam(o, false, 3);
  auto got = p.data().to_vector<double>();
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(got[i], expected[i], 1e-5);
}

TEST(OptimStep, ParametersWithoutGradientAreSkipped) {
  auto p = make_parameter(initial);
  auto untouched = make_parameter(initial);
  adam opt({{"a", p}, {"b", untouched}});
  run(opt, p, 1, 2);
  expect_values(untouched, initial);
  auto state = opt.state_dict();
  EXPECT_TRUE(find_tensor(state, "a.exp_avg").defined());
  EXPECT_FALSE(find_tensor(state, "b.exp_avg").defined());
  EXPECT_EQ(find_tensor(state, "a.step").item(), 2.0);
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
}

/// Runs 3 steps, saves, builds a fresh optimizer over a copy of the
/// parameters, loads, runs 4 more: must equal 7 uninterrupted steps.
void expect_resume_matches(const std::function<std::unique_ptr<optimizer>(variable&)>& make_optimizer) {
  auto straight = make_parameter(initial);
  auto uninterrupted = make_optimizer(straight);
  run(*uninterrupted, straight, 1, 7);

  auto first = make_parameter(initial);
  auto before = make_optimizer(first);
  run(*before, first, 1, 3);
  auto saved = before->state_dict();

  auto second = make_parameter(first.data().to_vector<double>());
  auto after = make_optimizer(second);
  auto loaded = after->load_state_dict(saved);
  ASSERT_TRUE(loaded) << loaded.error().message();
  EXPECT_EQ(after->step_count(), 3);
  run(*after, second, 4, 4);
  expect_values(second, straight.data().to_vector<double>());
}

TEST(OptimStateDict, SgdResumesExactly) {
  expect_resume_matches([](variable& p) {
    return std::make_unique<sgd>(named_variables{{"layer.weight", p}},
                                 sgd_options{.lr = 0.05, .momentum = 0.9, .nesterov = true});
  });
  auto p = make_parameter(initial);
  sgd opt({{"layer.weight", p}}, sgd_options{.lr = 0.1, .momentum = 0.5});
  run(opt, p, 1, 1);
  EXPECT_TRUE(find_tensor(opt.state_dict(), "layer.weight.momentum_buffer").defined());
}

TEST(OptimStateDict, AdamResumesExactly) {
  expect_resume_matches([](variable& p) {
    return std::make_unique<adamw>(named_variables{{"layer.weight", p}}, adam_options{.lr = 0.02});
  });
}

// Loading from an rvalue (a checkpoint's values, read for this) keeps those
// tensors as the state; from an lvalue, or a view into a larger buffer, the
// state is a copy. Either way the run resumes exactly.
TEST(OptimStateDict, LoadingFromAnRvalueKeepsTheTensorsItWasGiven) {
  auto straight = make_parameter(initial);
  adamw uninterrupted({{"layer.weight", straight}}, adam_options{.lr = 0.02});
  run(uninterrupted, straight, 1, 7);

  auto first = make_parameter(initial);
  adamw before({{"layer.weight", first}}, adam_options{.lr = 0.02});
  run(before, first, 1, 3);
  auto saved = before.state_dict();
  const void* exp_avg = find_tensor(saved, "layer.weight.exp_avg").raw_data();
  // exp_avg_sq as a view into a buffer twice its size: copied, not kept.
  auto wide = tensor::zeros({2 * static_cast<std::int64_t>(initial.size())}, dtype::float64);
  for (auto& [key, value] : saved)
    if (key == "layer.weight.exp_avg_sq") {
      auto half = wide.narrow(0, 0, value.numel());
      half.copy_from(value);
      value = half;
    }

  auto second = make_parameter(first.data().to_vector<double>());
  adamw after({{"layer.weight", second}}, adam_options{.lr = 0.02});
  auto copied = after.load_state_dict(saved);
  ASSERT_TRUE(copied) << copied.error().message();
  EXPECT_NE(find_tensor(after.state_views(), "layer.weight.exp_avg").raw_data(), exp_avg);
  auto adopted = after.load_state_dict(std::move(saved));
  ASSERT_TRUE(adopted) << adopted.error().message();
  EXPECT_EQ(find_tensor(after.state_views(), "layer.weight.exp_avg").raw_data(), exp_avg);
  EXPECT_NE(find_tensor(after.state_views(), "layer.weight.exp_avg_sq").raw_data(), wide.raw_data());
  run(after, second, 4, 4);
  expect_values(second, straight.data().to_vector<double>());
}

TEST(OptimStateDict, BadStateIsAnErrorAndChangesNothing) {
  auto p = make_parameter(initial);
  adam opt({{"w", p}});
  run(opt, p, 1, 2);
  auto good = opt.state_dict();
  auto expect_rejected = [&](const named_tensors& state, const std::string& key) {
    auto loaded = opt.load_state_dict(state);
    ASSERT_FALSE(loaded);
    EXPECT_EQ(loaded.error().code(), errc::state_mismatch);
    EXPECT_NE(loaded.error().message().find(key), std::string::npos) << loaded.error().message();
    auto now = opt.state_dict();
    ASSERT_EQ(now.size(), good.size());
    for (std::size_t i = 0; i < now.size(); ++i)
      EXPECT_EQ(max_abs_diff(now[i].second, good[i].second), 0.0) << now[i].first;
  };

  auto unknown = good;
  unknown.emplace_back("v.exp_avg", tensor::zeros({3}, dtype::float64));
  expect_rejected(unknown, "v.exp_avg");

  auto wrong_shape = good;
  for (auto& [key, value] : wrong_shape)
    if (key == "w.exp_avg_sq")
      value = tensor::zeros({4}, dtype::float64);
  expect_rejected(wrong_shape, "w.exp_avg_sq");

  auto incomplete = named_tensors{};
  for (const auto& entry : good)
    if (entry.first != "w.exp_avg")
      incomplete.push_back(entry);
  expect_rejected(incomplete, "w.exp_avg");

  auto no_step = named_tensors{};
  for (const auto& entry : good)
    if (entry.first != "step")
      no_step.push_back(entry);
  expect_rejected(no_step, "step");
}

} // namespace
} // namespace troupe::optim
