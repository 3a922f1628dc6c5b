// Parameter-server tables in distributed checkpoints (checkpoints::track of
// a parameter_client, parallel/src/ps_checkpoint.hpp): two trainers train
// three tables (SGD, row-wise Adagrad, lazy Adam) on server shards, save at
// step 3 with k shards and resume at k' shards or another sharding; the
// losses after the resume, the rows and the optimizer state must be exactly
// those of an uninterrupted run. Lookups here are bags of one id, so no sum
// over shards is involved and every layout computes the same bits. Then
// what may go wrong: a table of another shape, name or optimizer, a damaged
// shard file, bad checkpoint requests on the wire: refused, naming it,
// before any shard changes.
#include "troupe/parallel/checkpoints.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ps_wire.hpp"
#include "ring_support.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/parallel/parameter_server.hpp"
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

struct ps_layout {
  std::uint32_t shards;
  sharding by;
};

/// One table per sparse optimizer; row counts that no shard count divides.
std::vector<table_spec> tables(sharding by) {
  using kind = sparse_optimizer::kind;
  return {
    {.name = "sgd", .rows = 23, .dim = 4, .seed = 1, .optimizer = {.type = kind::sgd, .lr = 0.1}, .shard_by = by},
    {.name = "adagrad", .rows = 17, .dim = 3, .seed = 2, .optimizer = {.type = kind::rowwise_adagrad, .lr = 0.1},
     .shard_by = by},
    {.name = "adam", .rows = 19, .dim = 5, .seed = 3, .optimizer = {.type = kind::lazy_adam, .lr = 0.01},
     .shard_by = by},
  };
}

/// The state tensors of each table in a checkpoint.
const std::vector<std::pair<std::string, std::string>>& saved_tensors() {
  static const std::vector<std::pair<std::string, std::string>> names{
    {"sgd", "parameter_server.sgd"},
    {"adagrad", "parameter_server.adagrad"},
    {"adagrad", "optimizer.parameter_server.adagrad.sum"},
    {"adam", "parameter_server.adam"},
    {"adam", "optimizer.parameter_server.adam.exp_avg"},
    {"adam", "optimizer.parameter_server.adam.exp_avg_sq"},
    {"adam", "optimizer.parameter_server.adam.step"},
  };
  return names;
}

/// Step `step` of trainer `trainer`: six ids of every table (a function of
/// the step, so a resumed run sees what an uninterrupted one saw), a mean
/// squared error against random targets, the rows' gradients pushed.
double train_step(parameter_client& client, const std::vector<table_spec>& specs, std::int64_t step,
                  std::uint32_t trainer) {
  generator gen{1000 + 10 * static_cast<std::uint64_t>(step) + trainer};
  std::optional<autograd::variable> total;
  for (const auto& spec : specs) {
    auto ids = randint({6}, gen, 0, spec.rows);
    auto targets = randn({6, spec.dim}, gen);
    remote_embedding emb(client, spec.name);
    auto loss = autograd::mse_loss(emb(ids), autograd::variable(targets));
    total = total ? *total + loss : loss;
  }
  autograd::backward(*total);
  auto stepped = client.step();
  EXPECT_TRUE(stepped) << stepped.error().message();
  return total->item();
}

/// The servers' options: every shard on node `server_node`, the trainers
/// on worker0.
parameter_server_options server_options(ps_layout layout, std::vector<table_spec> specs, std::uint32_t trainers,
                                        const std::string& server_node) {
  parameter_server_options o;
  o.tables = std::move(specs);
  o.servers.assign(layout.shards, server_node + "/cpu");
  o.trainers.assign(trainers, "worker0/cpu");
  o.timeout = 30s;
  return o;
}

bool is_server_child(int argc, char** argv) { return argc > 1 && std::string_view(argv[1]) == "--ps-child"; }

/// worker1: hosts every shard of the layout TROUPE_TEST_PS_SHARDS and
/// TROUPE_TEST_PS_SHARDING say (2 trainers on worker0) until stdin closes;
/// the shards save and load their checkpoint files from this process.
int run_server_child(int argc, char** argv) {
  const char* shards = std::getenv("TROUPE_TEST_PS_SHARDS");
  const char* by = std::getenv("TROUPE_TEST_PS_SHARDING");
  if (shards == nullptr || by == nullptr)
    return 4;
  const ps_layout layout{static_cast<std::uint32_t>(std::stoul(shards)),
                         std::string_view(by) == "hashed" ? sharding::hashed : sharding::row_ranges};
  return test::serve_as_child_node(argc, argv, [&](actors::node& node) -> std::function<void()> {
    auto server = parameter_server::host(node, server_options(layout, tables(layout.by), 2, "worker1"));
    if (!server) {
      std::printf("HOST ERROR %s\n", server.error().message().c_str());
      return {};
    }
    auto hosted = std::make_shared<parameter_server>(std::move(*server));
    return [hosted] { hosted->stop(); };
  });
}

/// Where the shards run: in this process, or in a child process (worker1).
enum class servers_in { this_process, another_process };

struct run_result {
  std::int64_t resumed_at = -1;
  std::optional<std::string> resume_error;
  std::vector<std::map<std::int64_t, double>> losses; ///< per trainer: step -> loss
  std::map<std::string, tensor> rows;                 ///< per table, in id order, after the run
};

/// A job of `trainers` trainer threads and `layout.shards` server shards
/// (on this node, or on worker1 in a child process): resumes from
/// `directory`, trains to `last`, saving every 3 steps (asynchronously
/// unless told).
run_result run(const fs::path& directory, ps_layout layout, int last, std::vector<table_spec> specs,
               std::uint32_t trainers = 2, bool asynchronous = true, servers_in where = servers_in::this_process) {
  run_result out;
  out.losses.resize(trainers);
  const bool remote = where == servers_in::another_process;
  // Declared before the clients: the servers' process ends (its stdin
  // closed, then killed by pid if need be) after they are gone.
  test::cluster servers;
  std::unique_ptr<actors::node> local;
  actors::node* node = nullptr;
  if (remote) {
    // The child inherits the layout through its environment.
    ::setenv("TROUPE_TEST_PS_SHARDS", std::to_string(layout.shards).c_str(), 1);
    ::setenv("TROUPE_TEST_PS_SHARDING", layout.by == sharding::hashed ? "hashed" : "row_ranges", 1);
    test::start_cluster(servers, 2, "--ps-child");
    node = servers.coordinator.get();
  } else {
    auto started = test::start_local_node();
    EXPECT_TRUE(started) << started.error().message();
    if (started)
      local = std::move(*started);
    node = local.get();
  }
  if (node == nullptr)
    return out;
  const auto o = server_options(layout, std::move(specs), trainers, remote ? "worker1" : "worker0");
  std::optional<std::future<expected<parameter_server>>> hosted;
  if (!remote)
    hosted = std::async(std::launch::async, [&] { return parameter_server::host(*node, o); });
  std::vector<std::optional<parameter_client>> clients(trainers);
  for (std::uint32_t i = 0; i < trainers; ++i) {
    auto c = parameter_client::connect(*node, o, i);
    EXPECT_TRUE(c) << c.error().message();
    if (c)
      clients[i].emplace(std::move(*c));
  }
  std::optional<parameter_server> server;
  if (hosted) {
    auto s = hosted->get();
    EXPECT_TRUE(s) << s.error().message();
    if (!s)
      return out;
    server.emplace(std::move(*s));
  }
  if (std::any_of(clients.begin(), clients.end(), [](auto& c) { return !c; }))
    return out;

  std::vector<std::thread> threads;
  std::mutex mutex;
  for (std::uint32_t i = 0; i < trainers; ++i)
    threads.emplace_back([&, i] {
      auto ckpt = checkpoints::create(
        {.directory = directory, .every = saved_at, .keep_last = 0, .asynchronous = asynchronous, .timeout = 20s});
      ASSERT_TRUE(ckpt) << ckpt.error().message();
      ckpt->track(*clients[i]);
      auto done = ckpt->resume();
      if (!done) {
        std::lock_guard lock(mutex);
        if (i == 0)
          out.resume_error = done.error().message();
        return;
      }
      if (i == 0)
        out.resumed_at = *done;
      for (auto step = *done + 1; step <= last; ++step) {
        auto loss = train_step(*clients[i], o.tables, step, i);
        out.losses[i][step] = loss;
        auto saved = ckpt->save_if_due(step);
        ASSERT_TRUE(saved) << saved.error().message();
      }
      auto finished = ckpt->wait();
      EXPECT_TRUE(finished) << finished.error().message();
    });
  for (auto& t : threads)
    t.join();
  // Every row in id order, looked up as a bag of its own (exact).
  for (const auto& spec : o.tables) {
    auto rows = clients[0]->pull(spec.name);
    EXPECT_TRUE(rows) << rows.error().message();
    if (rows)
      out.rows[spec.name] = *rows;
  }
  clients.clear();
  server.reset();
  return out;
}

/// Tensor `name` of the checkpoint in `directory` with its rows in id order
/// (a hashed table's rows are saved shard-major).
tensor in_id_order(const fs::path& directory, const std::string& name) {
  auto reader = checkpoint_reader::open(directory);
  EXPECT_TRUE(reader) << reader.error().message();
  if (!reader)
    return {};
  auto saved = reader->read(name);
  EXPECT_TRUE(saved) << saved.error().message();
  if (!saved || saved->rank() == 0)
    return saved ? *saved : tensor{};
  const auto table = name.substr(name.find("parameter_server.") + 17, std::string::npos);
  const auto key = "parameter_server." + table.substr(0, table.find('.')) + ".layout";
  std::string layout;
  for (const auto& [k, v] : reader->manifest().metadata)
    if (k == key)
      layout = v;
  EXPECT_FALSE(layout.empty()) << "no " << key;
  const auto shards = std::stoll(layout.substr(layout.find(' ') + 1));
  if (layout.starts_with("row_ranges") || shards == 1)
    return *saved;
  const auto rows = saved->shape()[0];
  auto out = saved->clone();
  for (std::int64_t id = 0; id < rows; ++id) {
    const auto k = id % shards;
    const auto from = k * (rows / shards) + std::min(k, rows % shards) + id / shards;
    out.slice(0, id, id + 1).copy_from(saved->slice(0, from, from + 1));
  }
  return out;
}

fs::path fresh_directory(const std::string& name) {
  auto dir = fs::temp_directory_path() / fmt::format("troupe-ps-checkpoints-{}-{}", ::getpid(), name);
  fs::remove_all(dir);
  return dir;
}

/// The uninterrupted run: one shard, row ranges, steps 1..6.
struct reference_run {
  fs::path directory = fresh_directory("reference");
  run_result result = run(directory, {1, sharding::row_ranges}, last_step, tables(sharding::row_ranges));
  ~reference_run() { fs::remove_all(directory); }
};

const reference_run& reference() {
  static const reference_run r;
  return r;
}

void expect_equal_state(const fs::path& directory, const run_result& result) {
  const auto& ref = reference();
  for (const auto& [table, rows] : ref.result.rows) {
    ASSERT_TRUE(result.rows.contains(table)) << table;
    EXPECT_EQ(max_abs_diff(result.rows.at(table), rows), 0.0) << "rows of table " << table;
  }
  const auto step = fmt::format("step-{}", last_step);
  for (const auto& [table, name] : saved_tensors()) {
    auto expected_value = in_id_order(ref.directory / step, name);
    auto value = in_id_order(directory / step, name);
    ASSERT_TRUE(value.defined() && expected_value.defined()) << name;
    EXPECT_EQ(value.shape(), expected_value.shape()) << name;
    EXPECT_EQ(max_abs_diff(value.to(dtype::float64), expected_value.to(dtype::float64)), 0.0) << name;
  }
}

/// Saves at step 3 with `saved`, resumes with `resumed`: the losses of steps
/// 4..6, the rows and the optimizer state at step 6 are the reference's.
void check_resume(ps_layout saved, ps_layout resumed, bool asynchronous = true,
                  servers_in where = servers_in::this_process) {
  const auto& ref = reference();
  ASSERT_EQ(ref.result.losses[0].size(), static_cast<std::size_t>(last_step));
  auto dir = fresh_directory(fmt::format("{}-{}", saved.shards, resumed.shards));
  auto first = run(dir, saved, saved_at, tables(saved.by), 2, asynchronous, where);
  EXPECT_EQ(first.resumed_at, 0);
  auto latest = latest_checkpoint(dir);
  ASSERT_TRUE(latest && *latest) << "no checkpoint was committed";
  EXPECT_EQ((*latest)->filename(), fmt::format("step-{}", saved_at));

  auto second = run(dir, resumed, last_step, tables(resumed.by), 2, asynchronous, where);
  ASSERT_FALSE(second.resume_error) << *second.resume_error;
  EXPECT_EQ(second.resumed_at, saved_at);
  for (std::uint32_t i = 0; i < 2; ++i) {
    for (int step = 1; step <= saved_at; ++step)
      EXPECT_EQ(first.losses[i].at(step), ref.result.losses[i].at(step)) << "trainer " << i << " step " << step;
    EXPECT_EQ(second.losses[i].size(), static_cast<std::size_t>(last_step - saved_at));
    for (int step = saved_at + 1; step <= last_step; ++step)
      EXPECT_EQ(second.losses[i].at(step), ref.result.losses[i].at(step)) << "trainer " << i << " step " << step;
  }
  expect_equal_state(dir, second);
  fs::remove_all(dir);
}

/// The initial rows of `spec` (Philox: the same however it is sharded).
tensor initial_rows(const table_spec& spec) {
  generator gen{spec.seed};
  return randn({spec.rows, spec.dim}, gen, 0.0, spec.init_std);
}

} // namespace

TEST(ParameterServerCheckpoints, EveryLayoutTrainsTheSameBits) {
  const auto& ref = reference();
  ASSERT_EQ(ref.result.losses.size(), 2u);
  ASSERT_EQ(ref.result.losses[1].size(), static_cast<std::size_t>(last_step));
  // The losses move: the tables learn.
  EXPECT_NE(ref.result.losses[0].at(1), ref.result.losses[0].at(last_step));
  for (ps_layout layout : {ps_layout{3, sharding::hashed}, ps_layout{2, sharding::row_ranges}}) {
    auto dir = fresh_directory("uninterrupted");
    auto result = run(dir, layout, last_step, tables(layout.by));
    for (std::uint32_t i = 0; i < 2; ++i)
      EXPECT_EQ(result.losses[i], ref.result.losses[i]) << layout.shards << " shards, trainer " << i;
    expect_equal_state(dir, result);
    fs::remove_all(dir);
  }
}

TEST(ParameterServerCheckpoints, OneShardResumesOnTwo) { check_resume({1, sharding::row_ranges}, {2, sharding::row_ranges}); }

TEST(ParameterServerCheckpoints, TwoShardsResumeOnThree) {
  check_resume({2, sharding::row_ranges}, {3, sharding::row_ranges});
}

TEST(ParameterServerCheckpoints, ThreeShardsResumeOnOne) {
  check_resume({3, sharding::row_ranges}, {1, sharding::row_ranges});
}

TEST(ParameterServerCheckpoints, RowRangesResumeHashedOnAsManyShards) {
  check_resume({2, sharding::row_ranges}, {2, sharding::hashed});
}

TEST(ParameterServerCheckpoints, HashedThreeResumeAsRowRangesOnTwoSynchronously) {
  check_resume({3, sharding::hashed}, {2, sharding::row_ranges}, false);
}

TEST(ParameterServerCheckpoints, ShardsInAServingProcessWriteTheirOwnFilesAndResumeAtAnotherCount) {
  // The shards live in a child process (worker1): they write and read
  // their files there, and the requests cross the data plane.
  check_resume({2, sharding::row_ranges}, {3, sharding::hashed}, true, servers_in::another_process);
}

TEST(ParameterServerCheckpoints, ASaveWaitingForALateTrainerFailsNamingIt) {
  // Trainer 1 stops after step 2: the shards hold the save of step 3 for
  // the server's timeout, then refuse it naming the trainer; nothing commits.
  auto node = test::start_local_node();
  ASSERT_TRUE(node) << node.error().message();
  auto o = server_options({2, sharding::row_ranges}, tables(sharding::row_ranges), 2, "worker0");
  o.timeout = 1s;
  auto hosted = std::async(std::launch::async, [&] { return parameter_server::host(**node, o); });
  std::vector<std::optional<parameter_client>> clients(2);
  for (std::uint32_t i = 0; i < 2; ++i) {
    auto c = parameter_client::connect(**node, o, i);
    ASSERT_TRUE(c) << c.error().message();
    clients[i].emplace(std::move(*c));
  }
  auto server = hosted.get();
  ASSERT_TRUE(server) << server.error().message();
  const auto dir = fresh_directory("late-trainer");
  std::optional<std::string> refused;
  std::thread late([&] {
    for (int step = 1; step < saved_at; ++step)
      train_step(*clients[1], o.tables, step, 1);
  });
  for (int step = 1; step <= saved_at; ++step)
    train_step(*clients[0], o.tables, step, 0);
  late.join();
  {
    auto ckpt = checkpoints::create({.directory = dir, .every = saved_at, .asynchronous = false, .timeout = 20s});
    ASSERT_TRUE(ckpt) << ckpt.error().message();
    ckpt->track(*clients[0]);
    auto saved = ckpt->save(saved_at);
    ASSERT_FALSE(saved) << "a save of step 3 without trainer 1's gradients was accepted";
    refused = saved.error().message();
  }
  EXPECT_THAT(*refused, HasSubstr("the save of step 3 waited 1000 ms"));
  EXPECT_THAT(*refused, HasSubstr("trainer 1 (worker0/cpu) at step 2"));
  auto latest = latest_checkpoint(dir);
  ASSERT_TRUE(latest);
  EXPECT_FALSE(*latest) << "a checkpoint was committed";
  clients.clear();
  fs::remove_all(dir);
}

/// Saves at step 3 with two shards, then resumes with `changed` tables:
/// the resume fails with `message`, and no shard's rows changed.
void check_refused(std::vector<table_spec> changed, const std::vector<std::string>& message,
                   const std::function<void(const fs::path&)>& damage = {}) {
  auto dir = fresh_directory("refused");
  auto first = run(dir, {2, sharding::row_ranges}, saved_at, tables(sharding::row_ranges), 1);
  ASSERT_EQ(first.resumed_at, 0);
  if (damage)
    damage(dir / fmt::format("step-{}", saved_at));
  auto second = run(dir, {2, sharding::row_ranges}, saved_at, changed, 1);
  ASSERT_TRUE(second.resume_error) << "the resume was not refused";
  for (const auto& part : message)
    EXPECT_THAT(*second.resume_error, HasSubstr(part));
  for (const auto& spec : changed) {
    ASSERT_TRUE(second.rows.contains(spec.name));
    EXPECT_EQ(max_abs_diff(second.rows.at(spec.name), initial_rows(spec)), 0.0)
      << "table " << spec.name << " changed although the resume was refused";
  }
  fs::remove_all(dir);
}

TEST(ParameterServerCheckpoints, ATableOfAnotherShapeIsRefusedNamingIt) {
  auto changed = tables(sharding::row_ranges);
  changed[1].rows = 18;
  check_refused(changed, {"'parameter_server.adagrad'", "[17, 3]", "[18, 3]", "parameter-server table 'adagrad'"});
}

TEST(ParameterServerCheckpoints, ATableOfAnotherNameIsRefusedNamingIt) {
  auto changed = tables(sharding::row_ranges);
  changed[2].name = "embedding";
  check_refused(changed, {"no parameter-server table 'embedding'"});
}

TEST(ParameterServerCheckpoints, AnotherOptimizerIsRefusedNamingItsState) {
  auto changed = tables(sharding::row_ranges);
  changed[0].optimizer.type = sparse_optimizer::kind::rowwise_adagrad;
  check_refused(changed, {"no tensor 'optimizer.parameter_server.sgd.sum'"});
}

TEST(ParameterServerCheckpoints, ADamagedShardFileIsRefusedAndNoShardChanges) {
  // Shard 1's file is damaged; shard 0 reads its own rows first but must
  // not apply them, since the whole server loads or none of it.
  check_refused(tables(sharding::row_ranges), {"parameter-server-0.shard-1.shard", "parameter_server.sgd"},
                [](const fs::path& step) {
                  // A byte of shard 1's piece of table 'sgd' (its range from the manifest).
                  auto reader = checkpoint_reader::open(step);
                  ASSERT_TRUE(reader) << reader.error().message();
                  const auto* sgd = reader->find("parameter_server.sgd");
                  ASSERT_NE(sgd, nullptr);
                  std::optional<checkpoint_piece> target;
                  for (const auto& piece : sgd->pieces)
                    if (piece.file == "parameter-server-0.shard-1.shard")
                      target = piece;
                  ASSERT_TRUE(target) << "shard 1 wrote no piece of table 'sgd'";
                  std::fstream f(step / target->file, std::ios::in | std::ios::out | std::ios::binary);
                  const auto at = static_cast<std::streamoff>(target->byte_offset + target->byte_count / 2);
                  char byte = 0;
                  f.seekg(at);
                  f.read(&byte, 1);
                  byte = static_cast<char>(byte ^ 0x5a);
                  f.seekp(at);
                  f.write(&byte, 1);
                  ASSERT_TRUE(f.good());
                });
}

TEST(ParameterServerCheckpoints, BadCheckpointRequestsAreRefusedNamingWhatIsWrong) {
  auto decode_error = [](const tensor& bytes) {
    auto r = ps_wire::decode(bytes);
    return r ? std::string("(accepted)") : r.error().message();
  };
  ps_wire::checkpoint_request request{.server = 0, .trainer = 1, .checkpoint_step = 3, .table_step = 3,
                                      .directory = "/tmp/x"};
  auto good = ps_wire::decode(ps_wire::encode_checkpoint(ps_wire::op::save, request));
  ASSERT_TRUE(good) << good.error().message();
  EXPECT_EQ(good->kind, ps_wire::op::save);
  EXPECT_EQ(good->checkpoint.directory, "/tmp/x");
  EXPECT_EQ(good->checkpoint.trainer, 1u);
  std::string long_directory(ps_wire::max_directory_bytes + 1, 'a');
  auto too_long = request;
  too_long.directory = long_directory;
  EXPECT_THAT(decode_error(ps_wire::encode_checkpoint(ps_wire::op::save, too_long)), HasSubstr("4097 bytes"));
  auto none = request;
  none.directory = "";
  EXPECT_THAT(decode_error(ps_wire::encode_checkpoint(ps_wire::op::load, none)), HasSubstr("0 bytes of directory"));
  EXPECT_THAT(decode_error(ps_wire::encode_checkpoint(ps_wire::op::await_load, request)), HasSubstr("takes none"));
  std::string with_nul("/tmp/a\0b", 8);
  auto nul = request;
  nul.directory = with_nul;
  EXPECT_THAT(decode_error(ps_wire::encode_checkpoint(ps_wire::op::save, nul)), HasSubstr("NUL"));
  auto asynchronous_load = request;
  asynchronous_load.asynchronous = true;
  EXPECT_THAT(decode_error(ps_wire::encode_checkpoint(ps_wire::op::load, asynchronous_load)),
              HasSubstr("unknown checkpoint request flags"));
}

} // namespace troupe::parallel

int main(int argc, char** argv) {
  if (troupe::parallel::is_server_child(argc, argv))
    return troupe::parallel::run_server_child(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
