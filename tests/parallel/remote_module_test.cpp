// Remote modules (troupe/parallel/remote_module.hpp): two callers train
// through one hosted module exactly as one process does (the module's
// gradients averaged, the callers' own layers receiving the input gradient
// the host sends back), a forward of a step waits for every caller's step
// and fails naming the late caller, and a gradient for an unknown call is
// refused without touching the module.
#include "troupe/parallel/remote_module.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <optional>

#include "emulated_device.hpp"
#include "ring_support.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::parallel;
using ::testing::HasSubstr;

namespace {

std::shared_ptr<nn::module> make_head() {
  auto head = std::make_shared<nn::sequential>();
  head->append(nn::make<nn::linear>(6, 5));
  head->append(nn::make<nn::relu>());
  head->append(nn::make<nn::linear>(5, 3));
  head->reset_parameters(7);
  return head;
}

remote_module_options head_options(std::uint32_t callers) {
  remote_module_options o;
  o.name = "head";
  o.place = "worker0/cpu";
  for (std::uint32_t i = 0; i < callers; ++i)
    o.callers.push_back("worker0/cpu");
  o.factory = make_head;
  o.optimizer = sgd_factory({.lr = 0.1});
  o.timeout = 5s;
  return o;
}

struct hosted {
  std::optional<remote_module_host> host;
  std::vector<std::optional<remote_module>> callers;
  hosted(actors::node& node, const remote_module_options& o) {
    auto h = std::async(std::launch::async, [&] { return remote_module_host::host(node, o); });
    for (std::uint32_t i = 0; i < o.callers.size(); ++i) {
      auto c = remote_module::connect(node, o, i);
      EXPECT_TRUE(c) << c.error().message();
      if (c)
        callers.push_back(std::move(*c));
    }
    auto made = h.get();
    EXPECT_TRUE(made) << made.error().message();
    if (made)
      host = std::move(*made);
  }
  ~hosted() {
    callers.clear();
    host.reset();
  }
};

} // namespace

namespace {

/// Two callers, each with its own first layer on `callers_on`, train
/// through the head hosted at `host_place`, against one process on the CPU.
void two_callers_train_like_one_process(const std::string& host_place, device callers_on) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  auto options = head_options(2);
  options.place = host_place;
  for (auto& caller : options.callers)
    caller = "worker0/" + callers_on.to_string();
  hosted m(**node, options);
  ASSERT_TRUE(m.host);
  ASSERT_EQ(m.callers.size(), 2u);

  // One process: the same head, each caller's own first layer; the head's
  // gradient is the average of both callers', the first layers' their own.
  auto head = make_head();
  std::vector<std::shared_ptr<nn::linear>> reference_pre, pre;
  for (std::uint64_t i = 0; i < 2; ++i) {
    reference_pre.push_back(std::make_shared<nn::linear>(4, 6, 20 + i));
    pre.push_back(std::make_shared<nn::linear>(4, 6, 20 + i));
    pre.back()->to(callers_on);
  }
  optim::sgd head_opt(head->named_parameters(), {.lr = 0.1});
  std::vector<std::unique_ptr<optim::sgd>> reference_pre_opt;
  for (auto& p : reference_pre)
    reference_pre_opt.push_back(std::make_unique<optim::sgd>(p->named_parameters(), optim::sgd_options{.lr = 0.1}));

  constexpr int steps = 8;
  std::vector<std::vector<tensor>> xs(2), ys(2);
  for (std::uint64_t i = 0; i < 2; ++i) {
    generator gen{50 + i};
    for (int s = 0; s < steps; ++s) {
      xs[i].push_back(randn({5, 4}, gen));
      ys[i].push_back(randn({5, 3}, gen));
    }
  }
  std::vector<std::vector<double>> losses(2, std::vector<double>(steps));
  auto train_caller = [&](std::uint32_t i) {
    distributed_optimizer opt(std::make_unique<optim::sgd>(pre[i]->named_parameters(), optim::sgd_options{.lr = 0.1}),
                              {&*m.callers[i]});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto out = (*m.callers[i])((*pre[i])(autograd::variable(xs[i][s].to(callers_on))));
      EXPECT_EQ(out.data().where(), callers_on) << "the answer comes on the input's device";
      auto loss = autograd::mse_loss(out, autograd::variable(ys[i][s].to(callers_on)));
      autograd::backward(loss);
      ASSERT_TRUE(opt.step());
      losses[i][s] = loss.item();
    }
  };
  std::vector<std::thread> callers;
  for (std::uint32_t i = 0; i < 2; ++i)
    callers.emplace_back([&, i] {
      try {
        train_caller(i);
      } catch (const std::exception& e) { // a failed call throws out of the autograd graph
        ADD_FAILURE() << "caller " << i << ": " << e.what();
      }
    });
  for (auto& t : callers)
    t.join();

  for (int s = 0; s < steps; ++s) {
    head_opt.zero_grad();
    for (std::uint32_t i = 0; i < 2; ++i) {
      reference_pre_opt[i]->zero_grad();
      auto loss = autograd::mse_loss((*head)((*reference_pre[i])(autograd::variable(xs[i][s]))), autograd::variable(ys[i][s]));
      autograd::backward(loss);
      EXPECT_NEAR(losses[i][s], loss.item(), 1e-5) << "caller " << i << " step " << s;
      reference_pre_opt[i]->step();
    }
    for (auto& [name, p] : head_opt.parameters())
      p.grad().copy_from(mul(p.grad(), 0.5));
    head_opt.step();
  }
  // The last step() is a message: wait (bounded) until the host applied it.
  for (int i = 0; i < 200 && m.host->steps_applied() < steps; ++i)
    std::this_thread::sleep_for(10ms);
  auto hosted_parameters = m.host->parameters();
  for (auto& [name, p] : head->named_parameters())
    EXPECT_LT(max_abs_diff(find_tensor(hosted_parameters, name), p.data()), 1e-5) << name;
  for (std::uint32_t i = 0; i < 2; ++i)
    EXPECT_LT(max_abs_diff(pre[i]->weight().data().to(device::cpu()), reference_pre[i]->weight().data()), 1e-5);
  EXPECT_EQ(m.host->steps_applied(), static_cast<std::uint64_t>(steps));
}

} // namespace

TEST(RemoteModule, TwoCallersTrainLikeOneProcess) { two_callers_train_like_one_process("worker0/cpu", device::cpu()); }

// On a GPU place the module and its optimizer live there; callers on the
// CPU or on a GPU get their answers on their input's device. Without a GPU,
// on an emulated device (emulated_device.hpp), which checks placement.
TEST(RemoteModule, OnACudaPlaceTrainsLikeOneProcess) {
  const test::cuda_or_emulated devices(1);
  two_callers_train_like_one_process("worker0/cuda:0", device::cpu());
  two_callers_train_like_one_process("worker0/cuda:0", device::cuda(0));
  two_callers_train_like_one_process("worker0/cpu", device::cuda(0));
}

TEST(RemoteModule, AForwardWaitsForEveryCallersStepAndNamesTheLateOne) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  auto o = head_options(2);
  o.timeout = 600ms;
  hosted m(**node, o);
  ASSERT_TRUE(m.host);
  auto x = autograd::variable(tensor::ones({2, 6}));
  auto& fast = *m.callers[0];
  auto& slow = *m.callers[1];
  ASSERT_NO_THROW((void)fast(x));
  ASSERT_TRUE(fast.step());
  try {
    (void)fast(x); // step 2: the head still waits for the slow caller's step 1
    FAIL() << "a forward ran ahead of a caller's step";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("waited 600 ms for step 1 to end at caller 1"));
  }
  auto released = std::async(std::launch::async, [&] { return fast(x).data().numel(); });
  std::this_thread::sleep_for(100ms);
  ASSERT_NO_THROW((void)slow(x));
  ASSERT_TRUE(slow.step());
  EXPECT_EQ(released.get(), 6);
  EXPECT_EQ(m.host->steps_applied(), 1u);
}

TEST(RemoteModule, AGradientForAnUnknownCallIsRefusedAndTheModuleUntouched) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  hosted m(**node, head_options(1));
  ASSERT_TRUE(m.host);
  auto before = m.host->parameters();
  auto router = (*node)->router();
  actors::tensor_message bogus;
  bogus.meta.kind = message_kind::backward_gradient;
  bogus.meta.step = 1;
  bogus.meta.context_id = 12345; // caller 0, a call never made
  bogus.value = tensor::ones({2, 3});
  testing::internal::CaptureStderr();
  ASSERT_TRUE(router->send(*actors::place::parse_named("worker0/cpu/module_head"), std::move(bogus)));
  std::this_thread::sleep_for(300ms);
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("has no forward here"));
  // A forward of the wrong width fails the call with the module's own message.
  EXPECT_THROW((void)(*m.callers[0])(autograd::variable(tensor::ones({2, 7}))), std::runtime_error);
  auto after = m.host->parameters();
  for (auto& [name, t] : before)
    EXPECT_EQ(max_abs_diff(find_tensor(after, name), t), 0.0) << name;
  // And the module still serves.
  EXPECT_EQ((*m.callers[0])(autograd::variable(tensor::ones({2, 6}))).data().shape(), (dims{2, 3}));
}

