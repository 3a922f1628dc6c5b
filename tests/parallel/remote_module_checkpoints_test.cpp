// Remote modules in distributed checkpoints (checkpoints::track of a
// remote_module, parallel/src/remote_module_checkpoint.hpp): two callers
// train through a hosted module with Adam, the coordinator's own first layer
// beside it; a run resumed from the checkpoint of step 3 must give the
// losses, module parameters and first layer of an uninterrupted run. Then
// what may go wrong: a checkpoint without the module, a module of another
// shape, and checkpoint requests on the wire that the host must refuse
// without changing the module.
#include "troupe/parallel/checkpoints.hpp"

#include <unistd.h>

#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ps_wire.hpp"
#include "emulated_device.hpp"
#include "ring_support.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/remote_module.hpp"
#include "troupe/serialization/checkpoint_directory.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr int saved_at = 3;
constexpr int last_step = 6;
constexpr std::uint32_t callers = 2;

std::shared_ptr<nn::module> make_head(std::int64_t in = 6) {
  auto head = std::make_shared<nn::sequential>();
  head->append(nn::make<nn::linear>(in, 5));
  head->append(nn::make<nn::relu>());
  head->append(nn::make<nn::linear>(5, 3));
  head->reset_parameters(7);
  return head;
}

remote_module_options head_options(std::int64_t in = 6) {
  remote_module_options o;
  o.name = "head";
  o.place = "worker0/cpu";
  for (std::uint32_t i = 0; i < callers; ++i)
    o.callers.push_back("worker0/cpu");
  o.factory = [in] { return make_head(in); };
  o.optimizer = adam_factory({.lr = 0.01});
  o.timeout = 5s;
  return o;
}

/// Caller `caller`'s batch of step `step` (a function of both, so a resumed
/// run sees what an uninterrupted one saw): caller 0 feeds [5, 4] through
/// its own layer, caller 1 [5, 6] straight into the head.
std::pair<tensor, tensor> batch(std::uint32_t caller, std::int64_t step) {
  generator gen{static_cast<std::uint64_t>(100 * caller + step)};
  auto x = randn({5, caller == 0 ? 4 : 6}, gen);
  auto y = randn({5, 3}, gen);
  return {x, y};
}

struct run_result {
  std::vector<std::vector<double>> losses; ///< per caller, steps from..last_step
  named_tensors head;
  named_tensors first_layer;
  std::vector<std::string> errors;
};

enum class start { fresh, resume };

/// One job of a host and two callers on one node: trains to last_step,
/// saving step saved_at (fresh) or resuming from the latest checkpoint.
run_result train(const fs::path& directory, start how, bool track_module = true,
                 const remote_module_options& o = head_options()) {
  run_result out;
  out.losses.resize(callers);
  auto node = test::start_local_node();
  if (!node) {
    out.errors.push_back(node.error().message());
    return out;
  }
  {
    auto h = std::async(std::launch::async, [&] { return remote_module_host::host(**node, o); });
    std::vector<std::optional<remote_module>> handles;
    for (std::uint32_t i = 0; i < callers; ++i) {
      auto c = remote_module::connect(**node, o, i);
      if (!c) {
        out.errors.push_back(c.error().message());
        return out;
      }
      handles.push_back(std::move(*c));
    }
    auto host = h.get();
    if (!host) {
      out.errors.push_back(host.error().message());
      return out;
    }
    auto first = std::make_shared<nn::linear>(4, 6, 20);
    std::mutex failures;
    auto report = [&](std::uint32_t caller, const std::string& why) {
      std::lock_guard lock(failures);
      out.errors.push_back(fmt::format("caller {}: {}", caller, why));
    };
    std::vector<std::thread> threads;
    for (std::uint32_t i = 0; i < callers; ++i)
      threads.emplace_back([&, i] {
        std::unique_ptr<optim::optimizer> local;
        if (i == 0)
          local = std::make_unique<optim::adam>(first->named_parameters(), optim::adam_options{.lr = 0.01});
        auto* local_raw = local.get();
        distributed_optimizer opt(std::move(local), {&*handles[i]});
        // Without the module tracked, caller 1 has nothing to save (and
        // would coordinate a second checkpoint of its own).
        auto ckpt = checkpoints::create({.directory = track_module || i == 0 ? directory : fs::path{}}).value();
        if (track_module)
          ckpt.track(*handles[i]);
        if (i == 0)
          ckpt.track(*first, *local_raw);
        std::int64_t done = 0;
        if (how == start::resume) {
          auto resumed = ckpt.resume();
          if (!resumed)
            return report(i, resumed.error().message());
          done = *resumed;
        }
        try {
          for (std::int64_t step = done + 1; step <= last_step; ++step) {
            opt.zero_grad();
            auto [x, y] = batch(i, step);
            auto input = i == 0 ? (*first)(autograd::variable(x)) : autograd::variable(x);
            auto loss = autograd::mse_loss((*handles[i])(input), autograd::variable(y));
            autograd::backward(loss);
            if (auto ok = opt.step(); !ok)
              return report(i, ok.error().message());
            out.losses[i].push_back(loss.item());
            if (how == start::fresh && step == saved_at)
              if (auto ok = ckpt.save(step); !ok)
                return report(i, ok.error().message());
          }
        } catch (const std::exception& e) {
          return report(i, e.what());
        }
        if (auto ok = ckpt.wait(); !ok)
          report(i, ok.error().message());
      });
    for (auto& t : threads)
      t.join();
    // The last step() is a message: wait (bounded) until the host applied it.
    for (int i = 0; i < 300 && out.errors.empty() && host->steps_applied() < last_step; ++i)
      std::this_thread::sleep_for(10ms);
    out.head = host->parameters();
    for (auto& [name, p] : first->named_parameters())
      out.first_layer.emplace_back(name, p.data().clone());
    handles.clear();
  }
  (*node)->stop();
  return out;
}

fs::path fresh_directory(const std::string& what) {
  auto directory = fs::temp_directory_path() / fmt::format("troupe-remote-module-ckpt-{}-{}", what, ::getpid());
  fs::remove_all(directory);
  return directory;
}

void expect_equal(const named_tensors& got, const named_tensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, value] : want)
    EXPECT_LT(max_abs_diff(find_tensor(got, name), value), 1e-6) << what << ": " << name;
}

TEST(RemoteModuleCheckpoints, AResumedRunEqualsAnUninterruptedOne) {
  const auto directory = fresh_directory("resume");
  auto uninterrupted = train(directory, start::fresh);
  ASSERT_TRUE(uninterrupted.errors.empty()) << uninterrupted.errors.front();
  ASSERT_EQ(uninterrupted.losses[0].size(), static_cast<std::size_t>(last_step));

  // The module's state is saved by the host, under the part's names.
  auto reader = checkpoint_reader::open(checkpoint_path(directory, saved_at));
  ASSERT_TRUE(reader) << reader.error().message();
  for (const auto* name : {"model.head.0.weight", "model.head.2.bias", "optimizer.head.0.weight.exp_avg",
                           "optimizer.head.2.bias.exp_avg_sq", "optimizer.head.step", "model.weight",
                           "optimizer.weight.exp_avg", "optimizer.step"})
    EXPECT_NE(reader->find(name), nullptr) << name;
  const auto& metadata = reader->manifest().metadata;
  EXPECT_NE(std::find(metadata.begin(), metadata.end(), std::pair<std::string, std::string>{"remote_module.head.step",
                                                                                            "3"}),
            metadata.end());
  EXPECT_EQ(reader->read("optimizer.head.step")->to_vector<std::int64_t>().at(0), saved_at);

  auto resumed = train(directory, start::resume);
  ASSERT_TRUE(resumed.errors.empty()) << resumed.errors.front();
  for (std::uint32_t c = 0; c < callers; ++c) {
    ASSERT_EQ(resumed.losses[c].size(), static_cast<std::size_t>(last_step - saved_at)) << "caller " << c;
    for (int s = 0; s < last_step - saved_at; ++s)
      EXPECT_NEAR(resumed.losses[c][s], uninterrupted.losses[c][saved_at + s], 1e-6)
        << "caller " << c << " step " << saved_at + s + 1;
  }
  expect_equal(resumed.head, uninterrupted.head, "the module");
  expect_equal(resumed.first_layer, uninterrupted.first_layer, "caller 0's own layer");
  fs::remove_all(directory);
}

TEST(RemoteModuleCheckpoints, ACheckpointWithoutTheModuleIsRefusedNamingIt) {
  const auto directory = fresh_directory("without");
  auto saved = train(directory, start::fresh, /*track_module=*/false);
  ASSERT_TRUE(saved.errors.empty()) << saved.errors.front();
  auto resumed = train(directory, start::resume);
  ASSERT_FALSE(resumed.errors.empty());
  for (const auto& e : resumed.errors)
    EXPECT_THAT(e, HasSubstr("has no state of remote module 'head' ('remote_module.head.step')"));
  fs::remove_all(directory);
}

TEST(RemoteModuleCheckpoints, AModuleOfAnotherShapeIsRefusedBeforeAnythingLoads) {
  const auto directory = fresh_directory("shape");
  auto saved = train(directory, start::fresh);
  ASSERT_TRUE(saved.errors.empty()) << saved.errors.front();
  auto other = head_options(6);
  other.factory = [] {
    auto head = std::make_shared<nn::sequential>();
    head->append(nn::make<nn::linear>(6, 4)); // 4 hidden units, not 5
    head->append(nn::make<nn::relu>());
    head->append(nn::make<nn::linear>(4, 3));
    head->reset_parameters(7);
    return std::static_pointer_cast<nn::module>(head);
  };
  other.timeout = 1s; // caller 1's forward of step 4 waits for a load that fails
  auto resumed = train(directory, start::resume, true, other);
  ASSERT_FALSE(resumed.errors.empty());
  EXPECT_THAT(resumed.errors.front(), HasSubstr("'model.head.0.weight' is float32 [5, 6] there but float32 [4, 6]"));
  // Nothing of caller 0 loaded either: its layer is as built.
  nn::linear built(4, 6, 20);
  for (auto& [name, p] : built.named_parameters())
    EXPECT_EQ(max_abs_diff(find_tensor(resumed.first_layer, name), p.data()), 0.0) << name;
  fs::remove_all(directory);
}

/// The module hosted on a node of its own with one caller.
struct one_caller {
  std::unique_ptr<actors::node> node;
  std::optional<remote_module_host> host;
  std::optional<remote_module> caller;
  one_caller() {
    auto started = test::start_local_node();
    if (!started)
      return;
    node = std::move(*started);
    auto o = head_options();
    o.callers = {"worker0/cpu"};
    auto h = std::async(std::launch::async, [&] { return remote_module_host::host(*node, o); });
    auto c = remote_module::connect(*node, o, 0);
    EXPECT_TRUE(c) << c.error().message();
    auto made = h.get();
    EXPECT_TRUE(made) << made.error().message();
    if (c && made) {
      caller = std::move(*c);
      host = std::move(*made);
    }
  }
  ~one_caller() {
    caller.reset();
    host.reset();
  }
};

TEST(RemoteModuleCheckpoints, BadRequestsOnTheWireAreRefusedAndTheModuleServesOn) {
  one_caller m;
  ASSERT_TRUE(m.caller && m.host);
  auto& caller = m.caller;
  auto& host = m.host;
  auto before = host->parameters();
  auto router = m.node->router();
  auto send = [&](tensor value) {
    actors::tensor_message m;
    m.meta.kind = message_kind::control;
    m.meta.context_id = 77; // caller 0, a call never made: its answer is dropped
    m.value = std::move(value);
    ASSERT_TRUE(router->send(*actors::place::parse_named("worker0/cpu/module_head"), std::move(m)));
  };
  testing::internal::CaptureStderr();
  send(tensor::from(std::vector<std::uint8_t>{1, 2, 3}, {3}));
  send(ps_wire::encode_checkpoint(ps_wire::op::apply_load, {.checkpoint_step = 4, .table_step = 4, .directory = {}}));
  send(ps_wire::encode_checkpoint(ps_wire::op::load, {.checkpoint_step = 4, .table_step = 4,
                                                      .directory = "/nonexistent/step-4"}));
  auto lookup = ps_wire::encode_lookup(0, 0, std::vector<std::int64_t>{0}, std::vector<std::int64_t>{1}, {});
  send(lookup);
  std::this_thread::sleep_for(300ms);
  const auto logged = testing::internal::GetCapturedStderr();
  EXPECT_THAT(logged, HasSubstr("a malformed checkpoint request"));
  EXPECT_THAT(logged, HasSubstr("no load of checkpoint step 4 was read"));
  EXPECT_THAT(logged, HasSubstr("/nonexistent/step-4"));
  EXPECT_THAT(logged, HasSubstr("which a remote module does not serve"));
  auto after = host->parameters();
  for (auto& [name, t] : before)
    EXPECT_EQ(max_abs_diff(find_tensor(after, name), t), 0.0) << name;
  EXPECT_EQ(host->steps_applied(), 0u);
  // And the module still serves and steps.
  EXPECT_EQ((*caller)(autograd::variable(tensor::ones({2, 6}))).data().shape(), (dims{2, 3}));
  ASSERT_TRUE(caller->step());
  for (int i = 0; i < 200 && host->steps_applied() < 1; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(host->steps_applied(), 1u);
}

TEST(RemoteModuleCheckpoints, AModelPartNamedLikeTheModuleIsRefusedWhenTracked) {
  one_caller m;
  ASSERT_TRUE(m.caller && m.host);
  auto& caller = m.caller;
  // The caller's own model has a part "head" too: `model.head.weight` would
  // be written by both.
  nn::sequential model;
  model.register_module("head", nn::make<nn::linear>(4, 6));
  optim::adam opt(model.named_parameters(), {.lr = 0.01});
  auto ckpt = checkpoints::create({.directory = fresh_directory("apart")}).value();
  ckpt.track(*caller);
  try {
    ckpt.track(model, opt);
    FAIL() << "a model part named like the remote module was tracked";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("the model's 'head.weight' and remote module 'head'"));
  }
}

// A module hosted on a GPU place saves its state (copied to the host) and
// resumes onto the GPU, and the run equals the CPU-hosted one. Without a
// GPU on an emulated device (emulated_device.hpp), which checks placement.
TEST(RemoteModuleCheckpoints, OnACudaPlaceAResumedRunEqualsTheCpuHostedOne) {
  const test::cuda_or_emulated devices(1);
  const auto on_cpu_directory = fresh_directory("cpu-host");
  auto on_cpu = train(on_cpu_directory, start::fresh);
  ASSERT_TRUE(on_cpu.errors.empty()) << on_cpu.errors.front();
  auto o = head_options();
  o.place = "worker0/cuda:0";
  const auto directory = fresh_directory("cuda-host");
  auto saved = train(directory, start::fresh, true, o);
  ASSERT_TRUE(saved.errors.empty()) << saved.errors.front();
  auto resumed = train(directory, start::resume, true, o);
  ASSERT_TRUE(resumed.errors.empty()) << resumed.errors.front();
  for (std::uint32_t c = 0; c < callers; ++c) {
    ASSERT_EQ(saved.losses[c].size(), static_cast<std::size_t>(last_step)) << "caller " << c;
    ASSERT_EQ(resumed.losses[c].size(), static_cast<std::size_t>(last_step - saved_at)) << "caller " << c;
    for (int s = 0; s < last_step; ++s)
      EXPECT_NEAR(saved.losses[c][s], on_cpu.losses[c][s], 1e-6) << "caller " << c << " step " << s + 1;
    for (int s = 0; s < last_step - saved_at; ++s)
      EXPECT_NEAR(resumed.losses[c][s], on_cpu.losses[c][saved_at + s], 1e-6)
        << "caller " << c << " step " << saved_at + s + 1;
  }
  expect_equal(resumed.head, on_cpu.head, "the module");
  fs::remove_all(on_cpu_directory);
  fs::remove_all(directory);
}

} // namespace
} // namespace troupe::parallel
