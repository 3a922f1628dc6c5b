#pragma once
// Parameter servers: embedding tables (and dense tensors stored as tables of
// one row) sharded over K server actors, looked up by trainers with
// embedding-bag semantics and updated from sparse row gradients by an
// optimizer whose state lives on the server.
//
// examples/parameter_server_demo.cpp runs a master (rank 0), one server
// (rank 1) holding the table "emb" (100 rows of 16, SGD with lr 0.05) and
// two trainers (ranks 2 and 3) whose dense layer `fc` is data parallel.
// From examples/parameter_server_demo.cpp:
//
//   ps.servers = {job.places()[1]};
//   ps.trainers = {job.places()[2], job.places()[3]};
//   ...
//   auto server = job.must(parallel::parameter_server::host(job, ps), "parameter server");
//   ...
//   auto client = job.must(parallel::parameter_client::connect(job, ps), "parameter client");
//   ...
//   parallel::remote_embedding_bag emb(client, "emb", bag_mode::sum);
//   parallel::distributed_optimizer optimizer(std::make_unique<optim::sgd>(fc->named_parameters(), optim::sgd_options{.lr = 0.05}),
//                                             {&client});
//   ...
//   loss = autograd::cross_entropy((*fc)(emb(b.ids, b.offsets)), b.targets);
//   job.must(dp.backward(loss), fmt::format("step {}", step));
//   job.must(optimizer.step(), fmt::format("step {}", step));
//
// The server rank then serves (job.serve()). emb(ids, offsets) is looked up
// on the servers and pooled there; backward averages the dense gradients
// (data_parallel.hpp) and records the sparse rows; the distributed
// optimizer's step() takes the local step and pushes the rows to their
// shards.
//
// Each server shard is an actor: one thread owning its rows and optimizer
// state, fed by the node's router (requests arrive from the data plane's
// thread and are queued). A lookup goes to the shards that hold its ids;
// each returns the partial bag sums of its rows, so the reply is
// [bags, dim] whatever the bag sizes. Backward turns the bag gradients into
// per-id rows, coalesced (unique ids, rows summed) on the trainer, and
// step() sends each shard its ids and rows: never a table-sized tensor.
//
// Consistency (per table):
//   synchronous  step t's update is applied once every trainer's gradient
//                for t arrived, summed (averaged by default, like DDP); a
//                lookup for step t is answered once step t-1 is applied. Equals
//                one process training on all trainers' batches.
//   asynchronous each trainer's gradient is applied on arrival; lookups are
//                answered at once.
//   bounded(s)   applied on arrival; a lookup of a trainer for step t waits
//                until every trainer's update for step t-1-s was applied, so
//                no trainer runs more than s steps ahead of the slowest.
//
// Bad input (ids outside the table or negative, offsets that decrease or
// overrun, gradient rows that disagree with the ids) is an error naming the
// value, on the trainer before anything is sent, and again on the server for
// bytes from the network: the table is never touched by a bad request.
// A lost server fails the trainers' next call naming the shard; a lost
// trainer fails the synchronous tables' waiting lookups naming it, and every
// wait is bounded by `timeout`.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/parallel/distributed_optimizer.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {
class job;
namespace actors {
class node;
}
} // namespace troupe

namespace troupe::parallel {

/// How a server applies a table's gradient rows; its state lives on the server.
struct sparse_optimizer {
  enum class kind {
    sgd,             ///< w -= lr * g
    rowwise_adagrad, ///< a += mean(g^2) per row; w -= lr * g / (sqrt(a) + eps)
    lazy_adam,       ///< Adam moments of the touched rows only (torch.optim.SparseAdam)
  };
  kind type = kind::sgd;
  double lr = 0.01;
  double eps = 1e-8;
  double beta1 = 0.9;
  double beta2 = 0.999;
};

struct consistency {
  enum class kind { synchronous, asynchronous, bounded };
  kind type = kind::synchronous;
  /// bounded: how many steps a trainer may run ahead of the slowest.
  std::uint32_t staleness = 0;

  static consistency synchronous() { return {}; }
  static consistency asynchronous() { return {kind::asynchronous, 0}; }
  static consistency bounded(std::uint32_t steps) { return {kind::bounded, steps}; }
};

/// Which shard holds row `id` of a table over K shards.
enum class sharding {
  row_ranges, ///< contiguous ranges of ceil(rows / K) rows
  hashed,     ///< id mod K (spreads hot low ids of a Zipf distribution)
};

struct table_spec {
  std::string name;
  std::int64_t rows = 0;
  std::int64_t dim = 0;
  /// Initial rows: normal(0, init_std) from Philox with `seed`, element
  /// (r, c) at counter r * dim + c: the same values however the table is
  /// sharded, and equal to randn({rows, dim}, generator{seed}) * init_std.
  double init_std = 1.0;
  std::uint64_t seed = 0;
  sparse_optimizer optimizer{};
  struct consistency consistency {};
  sharding shard_by = sharding::row_ranges;
  /// Divide gradients by the number of trainers (DDP's average); false sums.
  bool average_over_trainers = true;
};

struct parameter_server_options {
  std::vector<table_spec> tables;
  /// One "<node>/<device>" place per server shard; shard k's actor is
  /// registered as "<place>/ps<k>".
  std::vector<std::string> servers;
  /// One "<node>/<device>" place per trainer (the servers' clients, in
  /// order); trainer i's reply actor is "<place>/ps_client<i>".
  std::vector<std::string> trainers;
  /// Bound on every wait: joining, a lookup held by a server for its
  /// consistency (then failed naming the missing trainers); a trainer waits
  /// twice this for a reply.
  std::chrono::milliseconds timeout{10000};
};

/// Per-shard counters (parameter_server::stats()).
struct parameter_server_stats {
  std::uint64_t lookups = 0;         ///< lookup requests answered
  std::uint64_t ids_looked_up = 0;   ///< ids pooled into replies
  std::uint64_t gradient_pushes = 0; ///< gradient messages received
  std::uint64_t rows_updated = 0;    ///< rows the optimizer wrote
  std::uint64_t updates_applied = 0; ///< optimizer applications (per step in synchronous mode)
  std::uint64_t rejected = 0;        ///< malformed or invalid requests
  std::uint64_t table_bytes = 0;     ///< rows held by this process's shards
  std::uint64_t state_bytes = 0;     ///< optimizer state held
};

/// The server shards placed on this node. Destroying it (or the job's
/// finish) stops them.
class parameter_server {
public:
  /// Starts every shard of `options.servers` that is placed on this node,
  /// registers it, and waits until the trainers' reply actors are registered.
  static expected<parameter_server> host(troupe::job& job, parameter_server_options options);
  static expected<parameter_server> host(actors::node& node, parameter_server_options options);
  ~parameter_server();
  parameter_server(parameter_server&&) noexcept;
  parameter_server& operator=(parameter_server&&) noexcept;
  parameter_server(const parameter_server&) = delete;
  parameter_server& operator=(const parameter_server&) = delete;

  /// Sums over the shards on this node.
  parameter_server_stats stats() const;
  /// A copy of `table`'s rows [first, first + count) held here (tests,
  /// checks); errc::invalid_argument when a row is not on this node.
  expected<tensor> read_rows(const std::string& table, std::int64_t first, std::int64_t count) const;
  /// Stops the shards (idempotent).
  void stop();

  struct state;

private:
  explicit parameter_server(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

/// A trainer's connection to every shard; its step() sends the step's
/// gradient rows (a distributed_optimizer calls it).
class parameter_client final : public remote_parameters {
public:
  /// Registers this trainer's reply actor and waits until every shard is
  /// registered. The trainer is entry `trainer` of `options.trainers`, or
  /// (-1) the first one placed on this node.
  static expected<parameter_client> connect(troupe::job& job, parameter_server_options options);
  static expected<parameter_client> connect(actors::node& node, parameter_server_options options,
                                            std::int64_t trainer = -1);
  ~parameter_client() override;
  parameter_client(parameter_client&&) noexcept;
  parameter_client& operator=(parameter_client&&) noexcept;
  parameter_client(const parameter_client&) = delete;
  parameter_client& operator=(const parameter_client&) = delete;

  /// The step the next lookups and step() belong to (starts at 1).
  std::uint64_t current_step() const;

  /// Bag lookups of `table` for the current step: `ids` [n] int64, `offsets`
  /// [bags] int64 (bag b is ids[offsets[b] : offsets[b+1]], the last runs to
  /// n, an empty bag is zeros), optional `per_sample_weights` [n] float32,
  /// each on any device. Returns [bags, dim] on the trainer place's device
  /// (the shards keep their rows in host memory). Blocks until every shard
  /// involved answered.
  expected<tensor> lookup(const std::string& table, const tensor& ids, const tensor& offsets, bag_mode mode,
                          const tensor& per_sample_weights = {});

  /// The gradient of a lookup's output: recorded as coalesced rows of the
  /// current step, sent by step().
  expected<void> record_gradient(const std::string& table, const tensor& ids, const tensor& offsets, bag_mode mode,
                                 const tensor& per_sample_weights, const tensor& grad_output);

  /// A dense tensor kept on the servers is a table whose rows are its first
  /// dimension: pull() reads all of it ([rows, dim], every shard's part),
  /// push_dense() records a gradient for all of it (sent by step(), applied
  /// by the table's optimizer like any rows).
  expected<tensor> pull(const std::string& table);
  expected<void> push_dense(const std::string& table, const tensor& grad);

  /// Sends each shard this step's coalesced gradient rows of every table
  /// (an empty message where a trainer has none: synchronous tables count
  /// on every trainer), then moves to the next step. Never waits for the
  /// update: the next step's lookups do, as the table's consistency says.
  expected<void> step() override;

  /// Forgets the current step's recorded gradients (zero_grad).
  void zero_grad() override;

  const parameter_server_options& options() const;
  std::uint32_t trainer_index() const;

  /// Unregisters the reply actor; later calls fail (idempotent; the
  /// destructor and the job's finish call it).
  void shutdown();

  struct state;

private:
  friend class remote_embedding_bag; // keeps the state, so the client may move
  friend struct parameter_server_access; // checkpoints of the shards (parallel/src)
  explicit parameter_client(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

/// torch.nn.EmbeddingBag whose table lives on the parameter servers: forward
/// looks the bags up, backward records the sparse gradient with the client.
class remote_embedding_bag {
public:
  /// Uses `client`'s connection (kept alive by this module, whatever
  /// becomes of the client object).
  remote_embedding_bag(parameter_client& client, std::string table, bag_mode mode = bag_mode::sum);

  /// [bags, dim]; throws usage_error (bad ids or offsets) or
  /// std::runtime_error (a lost server, a timeout) with the client's message.
  autograd::variable operator()(const tensor& ids, const tensor& offsets, const tensor& per_sample_weights = {});

private:
  std::shared_ptr<parameter_client::state> client_;
  std::string table_;
  bag_mode mode_;
};

/// torch.nn.Embedding whose table lives on the parameter servers: a bag of
/// one id per element, shaped ids.shape() + [dim].
class remote_embedding {
public:
  remote_embedding(parameter_client& client, std::string table) : bag_(client, std::move(table), bag_mode::sum) {}
  /// `ids` int64 of any shape.
  autograd::variable operator()(const tensor& ids);

private:
  remote_embedding_bag bag_;
};

} // namespace troupe::parallel
