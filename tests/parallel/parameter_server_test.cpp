// Parameter servers (troupe/parallel/parameter_server.hpp): the request
// decoder refuses every malformed request, a shard's initial rows and
// optimizers match their definitions, synchronous training with two trainers
// and data-parallel dense layers equals one process, bounded staleness holds
// its bound, and bad ids or bytes leave the table untouched.
#include "troupe/parallel/parameter_server.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <future>
#include <optional>

#include "ps_shard.hpp"
#include "ps_wire.hpp"
#include "emulated_device.hpp"
#include "ring_support.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::parallel;
using ::testing::HasSubstr;
using troupe::test::local_ring;

namespace {

tensor int64s(std::vector<std::int64_t> v) {
  return tensor::from(v, {static_cast<std::int64_t>(v.size())});
}

/// A request with its header fields overwritten.
tensor patched(tensor bytes, std::size_t at, const void* value, std::size_t n) {
  bytes = bytes.clone();
  std::memcpy(bytes.data<std::uint8_t>() + at, value, n);
  return bytes;
}

std::string decode_error(const tensor& bytes) {
  auto r = ps_wire::decode(bytes);
  return r ? std::string("(accepted)") : r.error().message();
}

/// The tutorial's batches: 20..50 ids, bags of 1..10, 8 classes.
struct batch {
  tensor ids, offsets, targets;
};
batch tutorial_batch(generator& gen, std::int64_t rows) {
  auto n = randint({1}, gen, 20, 51).to_vector<std::int64_t>()[0];
  auto ids = randint({n}, gen, 0, rows);
  std::vector<std::int64_t> offsets;
  for (std::int64_t start = 0; start < n;) {
    offsets.push_back(start);
    start += randint({1}, gen, 1, 11).to_vector<std::int64_t>()[0];
  }
  auto bags = static_cast<std::int64_t>(offsets.size());
  return {ids, int64s(offsets), randint({bags}, gen, 0, 8)};
}

/// One node with the shards and the trainers' clients, all in this process.
struct local_servers {
  std::optional<parameter_server> server;
  std::vector<std::optional<parameter_client>> clients;

  local_servers(actors::node& node, const parameter_server_options& o) {
    auto hosted = std::async(std::launch::async, [&] { return parameter_server::host(node, o); });
    for (std::uint32_t i = 0; i < o.trainers.size(); ++i) {
      auto c = parameter_client::connect(node, o, i);
      EXPECT_TRUE(c) << c.error().message();
      if (c)
        clients.push_back(std::move(*c));
    }
    auto s = hosted.get();
    EXPECT_TRUE(s) << s.error().message();
    if (s)
      server = std::move(*s);
  }
  ~local_servers() {
    clients.clear();
    server.reset();
  }
};

parameter_server_options options_for(std::vector<table_spec> tables, std::uint32_t servers, std::uint32_t trainers) {
  parameter_server_options o;
  o.tables = std::move(tables);
  for (std::uint32_t k = 0; k < servers; ++k)
    o.servers.push_back("worker0/cpu");
  for (std::uint32_t i = 0; i < trainers; ++i)
    o.trainers.push_back("worker0/cpu");
  // Generous: a loaded machine (ctest -j2 beside builds) once took a
  // synchronous step past 5 s. The tests of timeouts set their own.
  o.timeout = 30s;
  return o;
}

} // namespace

// -- the request decoder ---------------------------------------------------------------------------

TEST(ParameterServerWire, LookupsAndGradientsRoundTrip) {
  std::vector<std::int64_t> offsets{0, 2, 2}, ids{5, 7, 9};
  std::vector<float> weights{0.5f, 1.0f, 2.0f};
  auto r = ps_wire::decode(ps_wire::encode_lookup(3, 1, offsets, ids, weights));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->kind, ps_wire::op::lookup);
  EXPECT_EQ(r->lookup.table, 3);
  EXPECT_EQ(r->lookup.trainer, 1u);
  EXPECT_EQ(std::vector<std::int64_t>(r->lookup.ids.begin(), r->lookup.ids.end()), ids);
  EXPECT_EQ(std::vector<float>(r->lookup.weights.begin(), r->lookup.weights.end()), weights);

  auto g = ps_wire::make_gradients(0, 2, 2, 3);
  g.ids[0] = 4;
  g.ids[1] = 8;
  for (int i = 0; i < 6; ++i)
    g.rows[i] = static_cast<float>(i);
  auto d = ps_wire::decode(g.bytes);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, ps_wire::op::gradients);
  EXPECT_EQ(d->gradients.dim, 3);
  EXPECT_EQ(d->gradients.rows[5], 5.0f);
}

TEST(ParameterServerWire, MalformedRequestsAreRefusedNamingWhatIsWrong) {
  std::vector<std::int64_t> offsets{0, 2}, ids{5, 7, 9};
  auto good = ps_wire::encode_lookup(0, 0, offsets, ids, {});
  EXPECT_THAT(decode_error(good.slice(0, 0, 20)), HasSubstr("shorter than its 32-byte header"));
  std::uint32_t bad_magic = 0xdeadbeef;
  EXPECT_THAT(decode_error(patched(good, 0, &bad_magic, 4)), HasSubstr("bad magic"));
  std::uint8_t op = 9;
  EXPECT_THAT(decode_error(patched(good, 4, &op, 1)), HasSubstr("unknown operation 9"));
  std::uint8_t flags = 0x80;
  EXPECT_THAT(decode_error(patched(good, 5, &flags, 1)), HasSubstr("unknown lookup flags"));
  std::uint32_t reserved = 1;
  EXPECT_THAT(decode_error(patched(good, 12, &reserved, 4)), HasSubstr("reserved field"));
  std::uint64_t huge = ~std::uint64_t{0};
  EXPECT_THAT(decode_error(patched(good, 16, &huge, 8)), HasSubstr("does not fit"));
  EXPECT_THAT(decode_error(patched(good, 24, &huge, 8)), HasSubstr("does not fit"));
  std::uint64_t four = 4;
  EXPECT_THAT(decode_error(patched(good, 24, &four, 8)), HasSubstr("needs"));
  std::uint8_t weighted = ps_wire::flag_weighted;
  EXPECT_THAT(decode_error(patched(good, 5, &weighted, 1)), HasSubstr("with weights needs"));
  // Offsets: first not 0, decreasing, past the ids.
  std::int64_t one = 1, ten = 10;
  EXPECT_THAT(decode_error(patched(good, 32, &one, 8)), HasSubstr("offsets[0] is 1"));
  auto decreasing = ps_wire::encode_lookup(0, 0, std::vector<std::int64_t>{0, 2, 1}, ids, {});
  EXPECT_THAT(decode_error(decreasing), HasSubstr("offsets[2] = 1 is below offsets[1] = 2"));
  EXPECT_THAT(decode_error(patched(good, 40, &ten, 8)), HasSubstr("offsets[1] = 10 is past the 3 ids"));
  // Gradients: zero width, rows that do not fill the bytes.
  auto g = ps_wire::make_gradients(0, 0, 2, 4).bytes;
  std::uint64_t zero = 0, three = 3;
  EXPECT_THAT(decode_error(patched(g, 24, &zero, 8)), HasSubstr("rows of width 0"));
  EXPECT_THAT(decode_error(patched(g, 24, &three, 8)), HasSubstr("need"));
  EXPECT_THAT(decode_error(tensor::zeros({40})), HasSubstr("uint8"));
}

TEST(ParameterServerWire, RandomBytesNeverCrashTheDecoder) {
  generator gen{7};
  std::vector<std::int64_t> offsets{0, 1}, ids{1, 2};
  auto good = ps_wire::encode_lookup(0, 0, offsets, ids, {});
  for (int round = 0; round < 2000; ++round) {
    auto bytes = good.clone();
    auto flips = randint({4}, gen, 0, bytes.numel()).to_vector<std::int64_t>();
    auto values = randint({4}, gen, 0, 256).to_vector<std::int64_t>();
    for (int i = 0; i < 4; ++i)
      bytes.data<std::uint8_t>()[flips[i]] = static_cast<std::uint8_t>(values[i]);
    (void)ps_wire::decode(bytes); // must return, accepted or refused
  }
}

// -- one shard -------------------------------------------------------------------------------

TEST(ParameterServerShard, InitialRowsDoNotDependOnSharding) {
  table_spec spec{.name = "t", .rows = 103, .dim = 5, .init_std = 0.5, .seed = 11};
  generator gen{11};
  auto whole = randn({103, 5}, gen, 0.0, 0.5);
  for (auto by : {sharding::row_ranges, sharding::hashed}) {
    spec.shard_by = by;
    shard_map map{103, 3, by};
    for (std::uint32_t k = 0; k < 3; ++k) {
      table_shard shard(spec, k, 3);
      EXPECT_EQ(shard.rows(), map.rows_of(k));
      for (std::int64_t r = 0; r < shard.rows(); ++r) {
        auto id = map.global_id(k, r);
        EXPECT_EQ(map.shard_of(id), k);
        auto row = shard.read(id, 1);
        ASSERT_TRUE(row);
        EXPECT_TRUE(allclose(*row, whole.slice(0, id, id + 1), 0, 0)) << "row " << id;
      }
    }
  }
}

TEST(ParameterServerShard, PoolingEqualsEmbeddingBag) {
  table_spec spec{.name = "t", .rows = 50, .dim = 4, .seed = 3};
  table_shard shard(spec, 0, 1);
  generator gen{3};
  auto weight = randn({50, 4}, gen);
  std::vector<std::int64_t> ids{3, 3, 49, 0, 17}, offsets{0, 2, 2};
  auto out = tensor::zeros({3, 4});
  shard.pool(offsets, ids, {}, out.data<float>());
  auto expected = embedding_bag(weight, int64s(ids), int64s(offsets), bag_mode::sum);
  EXPECT_TRUE(allclose(out, expected, 1e-6, 1e-6));
  std::vector<float> w{0.5f, 2.0f, 1.0f, -1.0f, 3.0f};
  out = tensor::zeros({3, 4});
  shard.pool(offsets, ids, w, out.data<float>());
  auto row = [&](std::int64_t id) { return weight.slice(0, id, id + 1).to_vector<double>(); };
  for (int c = 0; c < 4; ++c) {
    EXPECT_NEAR(out.to_vector<double>()[c], 0.5 * row(3)[c] + 2.0 * row(3)[c], 1e-5);
    EXPECT_NEAR(out.to_vector<double>()[8 + c], 1.0 * row(49)[c] - row(0)[c] + 3.0 * row(17)[c], 1e-5);
  }
}

TEST(ParameterServerShard, OptimizersFollowTheirDefinitions) {
  const std::int64_t dim = 3;
  std::vector<std::int64_t> ids{1, 4};
  std::vector<float> grads{0.1f, -0.2f, 0.3f, 1.0f, 2.0f, -3.0f};
  for (auto kind : {sparse_optimizer::kind::sgd, sparse_optimizer::kind::rowwise_adagrad,
                    sparse_optimizer::kind::lazy_adam}) {
    table_spec spec{.name = "t", .rows = 6, .dim = dim, .seed = 5, .optimizer = {.type = kind, .lr = 0.1}};
    table_shard shard(spec, 0, 1);
    auto before = *shard.read(0, 6);
    // Reference in double: three applications of the same rows, scale 0.5.
    std::vector<double> w = before.to_vector<double>(), m(w.size(), 0), v(w.size(), 0), acc(6, 0);
    for (int t = 1; t <= 3; ++t) {
      shard.apply(ids, grads.data(), 0.5f);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        auto r = ids[i];
        double squares = 0;
        for (int c = 0; c < dim; ++c)
          squares += std::pow(0.5 * grads[i * dim + c], 2);
        acc[r] += squares / dim;
        for (int c = 0; c < dim; ++c) {
          double g = 0.5 * grads[i * dim + c];
          auto& x = w[r * dim + c];
          if (kind == sparse_optimizer::kind::sgd) {
            x -= 0.1 * g;
          } else if (kind == sparse_optimizer::kind::rowwise_adagrad) {
            x -= 0.1 * g / (std::sqrt(acc[r]) + 1e-8);
          } else {
            auto& mm = m[r * dim + c];
            auto& vv = v[r * dim + c];
            mm = 0.9 * mm + 0.1 * g;
            vv = 0.999 * vv + 0.001 * g * g;
            double step = 0.1 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
            x -= step * mm / (std::sqrt(vv) + 1e-8);
          }
        }
      }
    }
    auto after = shard.read(0, 6)->to_vector<double>();
    for (std::size_t i = 0; i < w.size(); ++i)
      EXPECT_NEAR(after[i], w[i], 1e-5) << "optimizer " << static_cast<int>(kind) << " element " << i;
    // Untouched rows stay as they were (lazy: no decay, no moment update).
    for (int c = 0; c < dim; ++c)
      EXPECT_EQ(after[2 * dim + c], before.to_vector<double>()[2 * dim + c]);
    EXPECT_EQ(shard.state_bytes(), kind == sparse_optimizer::kind::sgd               ? 0u
                                   : kind == sparse_optimizer::kind::rowwise_adagrad ? 6u * 4
                                                                                     : 2u * 6 * dim * 4);
  }
}

// -- servers and trainers in one process -------------------------------------------------------------

// The seed topology's model (EmbeddingBag(100, 16, sum) on the servers, a
// data-parallel Linear(16, 8) on two trainers), synchronous, trained beside
// one process that computes the same average of the two trainers' losses.
TEST(ParameterServer, SynchronousTrainingEqualsOneProcess) {
  for (auto by : {sharding::row_ranges, sharding::hashed}) {
    local_ring ring(2);
    ASSERT_TRUE(ring.node);
    table_spec spec{.name = "emb", .rows = 100, .dim = 16, .seed = 9, .optimizer = {.lr = 0.05}, .shard_by = by};
    auto o = options_for({spec}, 2, 2);
    local_servers ps(*ring.node, o);
    ASSERT_TRUE(ps.server);
    ASSERT_EQ(ps.clients.size(), 2u);

    // The reference: one table, one linear layer, the mean of both losses.
    generator init{9};
    auto table = autograd::variable(randn({100, 16}, init), true);
    nn::linear reference_fc(16, 8, 1);
    optim::sgd reference_opt({{"table", table}}, {.lr = 0.05});
    optim::sgd reference_fc_opt(reference_fc.named_parameters(), {.lr = 0.05});

    constexpr int steps = 12;
    std::vector<std::vector<double>> losses(2, std::vector<double>(steps));
    std::vector<std::vector<batch>> batches(2);
    for (int i = 0; i < 2; ++i) {
      generator data{100 + static_cast<std::uint64_t>(i)};
      for (int s = 0; s < steps; ++s)
        batches[i].push_back(tutorial_batch(data, 100));
    }
    std::vector<std::shared_ptr<nn::linear>> fcs;
    ring.each([&](std::uint32_t i) {
      auto fc = std::make_shared<nn::linear>(16, 8, 1);
      auto dp = data_parallel::create(fc->named_parameters(), *ring.groups[i]);
      ASSERT_TRUE(dp) << dp.error().message();
      remote_embedding_bag emb(*ps.clients[i], "emb", bag_mode::sum);
      distributed_optimizer opt(std::make_unique<optim::sgd>(fc->named_parameters(), optim::sgd_options{.lr = 0.05}),
                                {&*ps.clients[i]});
      for (int s = 0; s < steps; ++s) {
        auto& b = batches[i][s];
        opt.zero_grad();
        auto loss = autograd::cross_entropy((*fc)(emb(b.ids, b.offsets)), b.targets);
        ASSERT_TRUE(dp->backward(loss));
        ASSERT_TRUE(opt.step());
        losses[i][s] = loss.item();
      }
      if (i == 0)
        fcs.push_back(fc);
    });
    for (int s = 0; s < steps; ++s) {
      reference_opt.zero_grad();
      reference_fc_opt.zero_grad();
      auto l0 = autograd::cross_entropy(
          reference_fc(autograd::embedding_bag(table, batches[0][s].ids, batches[0][s].offsets, bag_mode::sum)),
          batches[0][s].targets);
      auto l1 = autograd::cross_entropy(
          reference_fc(autograd::embedding_bag(table, batches[1][s].ids, batches[1][s].offsets, bag_mode::sum)),
          batches[1][s].targets);
      autograd::backward((l0 + l1) * 0.5);
      reference_opt.step();
      reference_fc_opt.step();
      EXPECT_NEAR(losses[0][s], l0.item(), 1e-5) << "step " << s;
      EXPECT_NEAR(losses[1][s], l1.item(), 1e-5) << "step " << s;
    }
    // step() does not wait for the servers to apply the last step (the
    // next step's lookups would): wait for it, bounded, before reading.
    for (int i = 0; i < 1000 && ps.server->stats().updates_applied < 2u * steps; ++i)
      std::this_thread::sleep_for(10ms);
    auto stats = ps.server->stats();
    EXPECT_EQ(stats.updates_applied, 2u * steps); // one per step on each of the 2 shards
    auto rows = ps.server->read_rows("emb", 0, 100);
    ASSERT_TRUE(rows) << rows.error().message();
    EXPECT_LT(max_abs_diff(*rows, table.data()), 1e-5);
    EXPECT_LT(max_abs_diff(fcs[0]->weight().data(), reference_fc.weight().data()), 1e-5);
    EXPECT_EQ(stats.rejected, 0u);
  }
}

TEST(ParameterServer, BadIdsAndOffsetsAreRefusedAndTheTableIsUntouched) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  table_spec spec{.name = "emb", .rows = 10, .dim = 4, .seed = 1};
  auto o = options_for({spec}, 2, 1);
  local_servers ps(**node, o);
  ASSERT_TRUE(ps.server);
  auto& client = *ps.clients[0];
  auto before = *ps.server->read_rows("emb", 0, 10);
  auto err = [&](tensor ids, tensor offsets, tensor weights = {}) {
    auto r = client.lookup("emb", ids, offsets, bag_mode::sum, weights);
    return r ? std::string("(accepted)") : r.error().message();
  };
  EXPECT_THAT(err(int64s({1, 10}), int64s({0})), HasSubstr("ids[1] = 10 is outside [0, 10)"));
  EXPECT_THAT(err(int64s({-3}), int64s({0})), HasSubstr("ids[0] = -3"));
  EXPECT_THAT(err(int64s({1, 2, 3}), int64s({0, 2, 1})), HasSubstr("offsets[2] = 1 is below offsets[1] = 2"));
  EXPECT_THAT(err(int64s({1, 2}), int64s({0, 5})), HasSubstr("offsets[1] = 5 is past the 2 ids"));
  EXPECT_THAT(err(int64s({1, 2}), int64s({1})), HasSubstr("offsets[0] is 1"));
  EXPECT_THAT(err(int64s({1, 2}), int64s({0}), tensor::ones({3})), HasSubstr("per-sample weights"));
  EXPECT_THAT(err(tensor::ones({2}), int64s({0})), HasSubstr("int64"));
  EXPECT_THAT(client.lookup("nope", int64s({1}), int64s({0}), bag_mode::sum).error().message(),
              HasSubstr("no table 'nope'"));
  auto grad = client.record_gradient("emb", int64s({1, 2}), int64s({0}), bag_mode::sum, {}, tensor::ones({2, 4}));
  EXPECT_THAT(grad.error().message(), HasSubstr("must be [1, 4]"));

  // Bytes from the network: malformed, ids of the other shard, unsorted
  // gradient rows, a wrong width: refused by the shard, counted.
  auto router = (*node)->router();
  auto shard0 = *actors::place::parse_named("worker0/cpu/ps0");
  auto send = [&](tensor bytes, std::uint64_t step = 1) {
    actors::tensor_message m;
    m.meta.kind = message_kind::parameters;
    m.meta.step = step;
    m.value = std::move(bytes);
    ASSERT_TRUE(router->send(shard0, std::move(m)));
  };
  send(tensor::zeros({7}, dtype::uint8));
  std::vector<std::int64_t> foreign{9}, zero_offset{0};
  send(ps_wire::encode_lookup(0, 0, zero_offset, foreign, {})); // row 9 is on shard 1
  auto unsorted = ps_wire::make_gradients(0, 0, 2, 4);
  unsorted.ids[0] = 3;
  unsorted.ids[1] = 1;
  std::fill(unsorted.rows, unsorted.rows + 8, 100.0f);
  send(unsorted.bytes);
  auto wide = ps_wire::make_gradients(0, 0, 1, 5);
  wide.ids[0] = 1;
  send(wide.bytes);
  send(ps_wire::encode_lookup(7, 0, zero_offset, std::vector<std::int64_t>{1}, {})); // no table 7
  for (int i = 0; i < 100 && ps.server->stats().rejected < 5; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(ps.server->stats().rejected, 5u);
  EXPECT_EQ(max_abs_diff(*ps.server->read_rows("emb", 0, 10), before), 0.0);
  // The shard still serves.
  auto ok = client.lookup("emb", int64s({1, 9}), int64s({0}), bag_mode::sum);
  ASSERT_TRUE(ok) << ok.error().message();
  auto expected = add(before.slice(0, 1, 2), before.slice(0, 9, 10));
  EXPECT_TRUE(allclose(*ok, expected, 1e-6, 1e-6));
}

TEST(ParameterServer, BoundedStalenessHoldsTheFastTrainerWithinItsBound) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  table_spec spec{.name = "emb", .rows = 10, .dim = 2, .seed = 1, .consistency = consistency::bounded(2)};
  auto o = options_for({spec}, 1, 2);
  o.timeout = 800ms;
  local_servers ps(**node, o);
  ASSERT_TRUE(ps.server);
  auto& fast = *ps.clients[0];
  auto& slow = *ps.clients[1];
  auto ids = int64s({1, 2});
  auto offsets = int64s({0});
  // The slow trainer stays at step 1; the fast one may look up steps 1..3
  // (slowest applied 0, + 1 + staleness 2) and is held at step 4.
  for (int s = 1; s <= 3; ++s) {
    ASSERT_EQ(fast.current_step(), static_cast<std::uint64_t>(s));
    auto r = fast.lookup("emb", ids, offsets, bag_mode::sum);
    ASSERT_TRUE(r) << "step " << s << ": " << r.error().message();
    ASSERT_TRUE(fast.record_gradient("emb", ids, offsets, bag_mode::sum, {}, tensor::ones({1, 2})));
    ASSERT_TRUE(fast.step());
  }
  auto held = fast.lookup("emb", ids, offsets, bag_mode::sum);
  ASSERT_FALSE(held);
  EXPECT_THAT(held.error().message(), HasSubstr("waited 800 ms"));
  EXPECT_THAT(held.error().message(), HasSubstr("trainer 1"));
  // Once the slow trainer's step 1 is applied, step 4 may run.
  auto released = std::async(std::launch::async, [&] { return fast.lookup("emb", ids, offsets, bag_mode::sum); });
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(slow.lookup("emb", ids, offsets, bag_mode::sum));
  ASSERT_TRUE(slow.step());
  auto r = released.get();
  EXPECT_TRUE(r) << r.error().message();
}

TEST(ParameterServer, AsynchronousLookupsNeverWait) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  table_spec spec{.name = "emb", .rows = 10, .dim = 2, .seed = 1, .optimizer = {.lr = 1.0},
                  .consistency = consistency::asynchronous(), .average_over_trainers = false};
  auto o = options_for({spec}, 1, 2);
  o.timeout = 2s;
  local_servers ps(**node, o);
  ASSERT_TRUE(ps.server);
  auto& fast = *ps.clients[0];
  auto before = *ps.server->read_rows("emb", 3, 1);
  for (int s = 1; s <= 20; ++s) {
    ASSERT_TRUE(fast.lookup("emb", int64s({3}), int64s({0}), bag_mode::sum));
    ASSERT_TRUE(fast.record_gradient("emb", int64s({3}), int64s({0}), bag_mode::sum, {}, tensor::ones({1, 2})));
    ASSERT_TRUE(fast.step());
  }
  // Applied on arrival: 20 SGD steps of lr 1 on row 3 once the last arrived.
  auto r = fast.lookup("emb", int64s({3}), int64s({0}), bag_mode::sum);
  ASSERT_TRUE(r);
  EXPECT_TRUE(allclose(*r, add(before, -20.0), 1e-5, 1e-5));
}

TEST(ParameterServer, RemoteEmbeddingIsABagOfOneIdPerElement) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  table_spec spec{.name = "emb", .rows = 20, .dim = 3, .seed = 4, .optimizer = {.lr = 1.0},
                  .consistency = consistency::asynchronous(), .average_over_trainers = false};
  auto o = options_for({spec}, 2, 1);
  local_servers ps(**node, o);
  ASSERT_TRUE(ps.server);
  generator init{4};
  auto table = randn({20, 3}, init);
  remote_embedding emb(*ps.clients[0], "emb");
  // The client is a value: moved after the module was made from it, the
  // module still uses its connection.
  parameter_client client = std::move(*ps.clients[0]);
  auto ids = tensor::from(std::vector<std::int64_t>{19, 0, 7, 7, 3, 12}, {2, 3});
  auto out = emb(ids);
  ASSERT_EQ(out.data().shape(), (dims{2, 3, 3}));
  EXPECT_TRUE(allclose(out.data(), index_select(table, 0, ids.reshape({6})).reshape({2, 3, 3}), 0, 0));
  // Its gradient: row 7 twice, the others once; SGD with lr 1 subtracts it.
  autograd::backward(autograd::sum(out));
  ASSERT_TRUE(client.step());
  auto after = client.lookup("emb", int64s({7}), int64s({0}), bag_mode::sum);
  ASSERT_TRUE(after);
  EXPECT_TRUE(allclose(*after, add(table.slice(0, 7, 8), -2.0), 1e-6, 1e-6));
}

// A trainer on a GPU place gets its rows on its device and may pass ids and
// gradients from there; the rows and updates equal a CPU trainer's. Without
// a GPU on an emulated device (emulated_device.hpp), which checks placement.
TEST(ParameterServer, ATrainerOnACudaPlaceGetsItsRowsOnItsDevice) {
  const test::cuda_or_emulated devices(1);
  const auto gpu = device::cuda(0);
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  table_spec spec{.name = "emb", .rows = 20, .dim = 3, .seed = 4, .optimizer = {.lr = 1.0},
                  .consistency = consistency::asynchronous(), .average_over_trainers = false};
  table_spec dense{.name = "w", .rows = 5, .dim = 3, .seed = 8, .optimizer = {.lr = 0.5}};
  auto o = options_for({spec, dense}, 2, 1);
  o.trainers = {"worker0/cuda:0"};
  local_servers ps(**node, o);
  ASSERT_TRUE(ps.server);
  generator init{4};
  auto table = randn({20, 3}, init);
  remote_embedding emb(*ps.clients[0], "emb");
  auto ids = tensor::from(std::vector<std::int64_t>{19, 0, 7, 7, 3, 12}, {2, 3}).to(gpu);
  auto out = emb(ids);
  ASSERT_EQ(out.data().where(), gpu);
  EXPECT_TRUE(allclose(out.data().to(device::cpu()),
                       index_select(table, 0, ids.to(device::cpu()).reshape({6})).reshape({2, 3, 3}), 0, 0));
  autograd::backward(autograd::sum(out)); // a gradient on the device
  auto& client = *ps.clients[0];
  generator dense_init{8};
  auto start = randn({5, 3}, dense_init);
  ASSERT_TRUE(client.push_dense("w", tensor::ones({5, 3}).to(gpu)));
  ASSERT_TRUE(client.step());
  auto after = client.lookup("emb", int64s({7}), int64s({0}), bag_mode::sum);
  ASSERT_TRUE(after) << after.error().message();
  EXPECT_EQ(after->where(), gpu);
  EXPECT_TRUE(allclose(after->to(device::cpu()), add(table.slice(0, 7, 8), -2.0), 1e-6, 1e-6));
  auto pulled = client.pull("w"); // step 2 waits for step 1's update (synchronous)
  ASSERT_TRUE(pulled) << pulled.error().message();
  EXPECT_EQ(pulled->where(), gpu);
  EXPECT_TRUE(allclose(pulled->to(device::cpu()), add(start, -0.5), 1e-6, 1e-6));
}

TEST(ParameterServer, MeanBagsAndPerSampleWeightsAcrossShardsAndTheirGradients) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  table_spec spec{.name = "emb", .rows = 30, .dim = 4, .seed = 6, .optimizer = {.lr = 1.0},
                  .consistency = consistency::asynchronous(), .shard_by = sharding::hashed,
                  .average_over_trainers = false};
  auto o = options_for({spec}, 3, 1);
  local_servers ps(**node, o);
  ASSERT_TRUE(ps.server);
  auto& client = *ps.clients[0];
  generator init{6};
  auto table = autograd::variable(randn({30, 4}, init), true);
  auto ids = int64s({0, 1, 2, 29, 7, 7, 13});
  auto offsets = int64s({0, 3, 3, 6}); // bags of 3, 0, 3 and 1 ids, spread over the 3 shards
  std::vector<float> w{0.5f, -1.0f, 2.0f, 1.5f, 0.25f, 0.75f, 3.0f};
  auto weights = tensor::from(w, {7});
  for (auto mode : {bag_mode::sum, bag_mode::mean}) {
    for (bool weighted : {false, true}) {
      auto got = client.lookup("emb", ids, offsets, mode, weighted ? weights : tensor{});
      ASSERT_TRUE(got) << got.error().message();
      // Reference: rows (scaled by their weights) summed per bag, / size for mean.
      auto rows = index_select(table.data(), 0, ids);
      if (weighted)
        rows = mul(rows, weights.reshape({7, 1}));
      auto expected = embedding_bag(rows, int64s({0, 1, 2, 3, 4, 5, 6}), offsets, mode);
      EXPECT_TRUE(allclose(*got, expected, 1e-5, 1e-6)) << "mode " << static_cast<int>(mode) << " weighted " << weighted;
    }
  }
  // The gradient of a mean, weighted bag: row id gets w * g[bag] / size.
  remote_embedding_bag emb(client, "emb", bag_mode::mean);
  auto out = emb(ids, offsets, weights);
  autograd::backward(autograd::sum(out));
  ASSERT_TRUE(client.step());
  // Expected update (SGD, lr 1): row 7 gets (0.25 + 0.75) / 3, row 13 gets 3 / 1, row 0 gets 0.5 / 3.
  auto read = [&](std::int64_t id) {
    for (int i = 0; i < 100; ++i) {
      auto r = ps.server->read_rows("emb", id, 1);
      if (r && max_abs_diff(*r, table.data().slice(0, id, id + 1)) > 0)
        return *r;
      std::this_thread::sleep_for(10ms);
    }
    return *ps.server->read_rows("emb", id, 1);
  };
  EXPECT_TRUE(allclose(read(7), add(table.data().slice(0, 7, 8), -1.0 / 3), 1e-5, 1e-6));
  EXPECT_TRUE(allclose(read(13), add(table.data().slice(0, 13, 14), -3.0), 1e-5, 1e-6));
  EXPECT_TRUE(allclose(read(0), add(table.data().slice(0, 0, 1), -0.5 / 3), 1e-5, 1e-6));
}

TEST(ParameterServer, DenseTensorsArePulledWholeAndUpdatedFromDenseGradients) {
  auto node = test::start_local_node();
  ASSERT_TRUE(node);
  table_spec spec{.name = "w", .rows = 5, .dim = 3, .seed = 8,
                  .optimizer = {.type = sparse_optimizer::kind::lazy_adam, .lr = 0.1}};
  auto o = options_for({spec}, 2, 2);
  local_servers ps(**node, o);
  ASSERT_TRUE(ps.server);
  generator init{8};
  auto start = randn({5, 3}, init);
  auto pulled = ps.clients[0]->pull("w");
  ASSERT_TRUE(pulled) << pulled.error().message();
  EXPECT_TRUE(allclose(*pulled, start, 0, 0));
  // Both trainers push a dense gradient; synchronous, averaged: Adam's first
  // step moves every element by lr * sign of the mean gradient (1).
  auto grad = tensor::ones({5, 3});
  for (auto& c : ps.clients) {
    ASSERT_TRUE(c->push_dense("w", grad));
    ASSERT_TRUE(c->step());
  }
  auto after = ps.clients[1]->pull("w"); // step 2: waits for step 1's update
  ASSERT_TRUE(after) << after.error().message();
  EXPECT_TRUE(allclose(*after, add(start, -0.1), 1e-5, 1e-5));
  EXPECT_THAT(ps.clients[0]->push_dense("w", tensor::ones({4, 3})).error().message(), HasSubstr("must be [5, 3]"));
}
