#pragma once
// A job's distributed checkpoints: save the training state wherever it
// lives (pipeline stages in other processes, data-parallel replicas, this
// process), resume from the latest complete checkpoint, at any layout.
//
// From examples/data_parallel_demo.cpp:
//
//   auto ckpt = job.must(parallel::checkpoints::create(job, {.directory = directory, .every = every}));
//   ckpt.track(*model, *optimizer, dp);
//   const auto done = job.must(ckpt.resume(), "resume");
//   for (auto step : job.steps(steps, done)) {
//   ...
//     job.must(ckpt.save_if_due(step), fmt::format("checkpoint at step {}", step.number()));
//   }
//   job.must(ckpt.wait(), "the last checkpoint");
//
// What is saved. Every tracked model's state_dict and its optimizer's state,
// by the whole model's names (`model.fc1.weight`,
// `optimizer.fc1.weight.exp_avg`, `optimizer.step`), and each tracked random
// stream (the data order) in the manifest's metadata. Every writer writes its
// own shard file in parallel: each pipeline stage in its own process, each
// data-parallel replica a share of the replicated state (spread over the
// replicas by name, not all by rank 0), each parameter-server shard its
// rows and sparse optimizer state (`parameter_server.<table>`,
// `optimizer.parameter_server.<table>.<state>`) in its own process, each
// remote module's host its module as the part `<name>` of the model. The
// coordinator (the job's rank 0, or checkpoint_options::coordinator) then
// commits: it waits for every writer's report, writes the manifest
// last and renames the directory (checkpoint_directory.hpp), keeping the
// newest `keep_last`. A save cut short (a killed rank) leaves no checkpoint,
// and the previous one stays loadable. Writers and coordinator share only
// the directory: across hosts it must be on a shared file system.
//
// Asynchronous saving. The files are written on a thread of each writer
// while training goes on, and the values saved are exactly those at the
// call. A model this process holds is copied before save() returns;
// pipeline stages copy theirs on their threads while the next step's
// forward and backward run, and their next optimizer step waits for the
// copy. The next save() (and wait(), and the destructor) waits for the
// previous one and reports its failure.
//
// Loading at another layout. Names are the whole model's, so a checkpoint
// saved by a 3-stage pipeline loads into 2 stages with another split, into
// data-parallel replicas or into one process: each loads the names it holds.
// A table saved by 2 server shards loads into 3 or 1, by row ranges or
// hashed, whatever sharding saved it.
//
// Parameter servers: every trainer tracks its parameter_client, and the
// coordinator must be a trainer (examples/parameter_server_demo.cpp sets
// `.coordinator` to trainer 0's rank; its rank 0 is a master that trains
// nothing). A save holds the shards' state of the
// trainers' last step: each shard copies its tables once every synchronous
// table has applied that step (the saving trainer pushes no later step
// before the copy, so none can be applied meanwhile; later rows other
// trainers pushed stay pending and are redone after a resume). Asynchronous
// and bounded tables are copied as they stand when the request arrives.
// resume() on a trainer returns once every shard holds the loaded tables,
// and the trainer continues at the step after the saved one.
// Before any stage or replica loads, the model's names, dtypes and shapes
// are checked against the manifest (an error names the first that does not
// match); a damaged shard is an error naming the file and tensor (its
// CRC32C), and a pipeline that failed to load refuses further steps.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe {
class job;
}

namespace troupe::parallel {

class pipeline;
class hybrid_pipeline;
class data_parallel;
class reducer_group;
class parameter_client;
class remote_module;
class tensor_parallel_pipeline;

struct checkpoint_options {
  /// Where the job's checkpoints live (`step-<N>` directories; created
  /// when missing). Empty: checkpointing is off (save() does nothing,
  /// resume() returns 0), so a program may pass an optional flag through.
  std::filesystem::path directory{};
  /// save_if_due(step) saves at multiples of this step; 0: never.
  std::int64_t every = 0;
  /// Complete checkpoints kept, newest first; 0 keeps all.
  std::size_t keep_last = 2;
  /// save() returns once the state is copied and writes it meanwhile.
  /// Off: save() returns once this rank's shards are durable and, on the
  /// coordinator, the checkpoint is committed.
  bool asynchronous = true;
  /// Bound on the coordinator's wait for every writer's report, and on each
  /// stage's reply.
  std::chrono::milliseconds timeout{120000};
  /// The job's rank that coordinates (writes the manifest, commits, saves
  /// its random streams): the driver for pipelines, trainer 0's rank when
  /// parameter servers are tracked and rank 0 is no trainer. The same on
  /// every rank.
  std::uint32_t coordinator = 0;
};

class checkpoints {
public:
  /// This rank's checkpoints of the job's state; options.coordinator (rank
  /// 0 unless set) coordinates.
  static expected<checkpoints> create(troupe::job& job, checkpoint_options options);
  /// Without a job: a program of one process, the coordinator; or one of
  /// a program's data-parallel replicas (threads), where replica 0 of the
  /// tracked group coordinates.
  static expected<checkpoints> create(checkpoint_options options);
  /// Waits for the save in flight.
  ~checkpoints();
  checkpoints(checkpoints&&) noexcept;
  checkpoints& operator=(checkpoints&&) noexcept;

  /// A model and optimizer this process alone holds (a one-process
  /// program, the driver's own state). Coordinator only (usage_error).
  void track(nn::module& model, optim::optimizer& optimizer);
  /// A model and optimizer every replica of `replicas` holds alike; every
  /// replica tracks its own. Replicated state is written once, spread over
  /// the replicas. The coordinator must be the group's rank 0.
  void track(nn::module& model, optim::optimizer& optimizer, data_parallel& replicas);
  /// A model split over `tensor_group` (tensor_parallel.hpp: sharded
  /// modules): every member tracks its own and saves its pieces with their
  /// global shapes and offsets (what all hold whole, once); loading reads
  /// each member's pieces from a checkpoint of any layout, one process or
  /// another degree. The coordinator must be the group's rank 0.
  void track(nn::module& model, optim::optimizer& optimizer, reducer_group& tensor_group);
  /// A tensor-parallel model whose members each have data-parallel
  /// `replicas` (a mesh {data, tensor}): each member's pieces are written
  /// once, spread over its replicas. The coordinator must be member 0 of
  /// replica 0.
  void track(nn::module& model, optim::optimizer& optimizer, reducer_group& tensor_group, data_parallel& replicas);
  /// The pipeline's stages, each saving and loading its own layers and
  /// optimizer state in its process. The driver tracks it.
  void track(pipeline& stages);
  /// Every replica's stages; stage s's state is written once, spread over
  /// the replicas of stage s.
  void track(hybrid_pipeline& replicas);
  /// A tensor x pipeline (x data) layout (tensor_parallel_pipeline.hpp):
  /// every stage of every (replica, tensor rank) saves its pieces with their
  /// global shapes from its thread, a split piece written once over the
  /// replicas, what the stage's members hold whole once; loads at any
  /// layout, one process or a tensor-parallel group of another degree. The
  /// driver tracks it.
  void track(tensor_parallel_pipeline& stages);
  /// The parameter server `client` reaches (parameter_server.hpp): every
  /// trainer tracks its client, and the coordinator must be one of them
  /// (trainer 0 of trainers as threads of one program). On save, each
  /// server shard writes its rows and optimizer state from its own process,
  /// once every synchronous table has applied the trainers' last step;
  /// resume() loads the tables at any shard count and sharding, and each
  /// trainer continues at the step after the saved one.
  void track(parameter_client& client);
  /// A remote module (remote_module.hpp): every caller tracks its handle,
  /// and the coordinator must be one of them (caller 0 of callers as
  /// threads of one program). On save, the host writes the module and its
  /// optimizer state (`model.<name>.`, `optimizer.<name>.`) from its own
  /// process once it has applied the coordinator's last step; on resume it
  /// loads them, and every caller continues at the step after that one.
  void track(remote_module& module);
  /// A random stream of the coordinator's (the data order, dropout): its
  /// seed and position go into the metadata and are restored by resume().
  /// Other ranks make their data a function of the step instead.
  void track(std::string name, generator& stream);

  /// Loads the latest complete checkpoint into everything tracked and
  /// returns its step; 0 when there is none (a fresh start). Call it before
  /// the first step: on the coordinator it first removes the staging
  /// directories of saves that never committed (discard_staging()), so that
  /// a restarted job's saves of the same steps start afresh.
  expected<std::int64_t> resume();
  /// Loads the checkpoint in `directory` (a `step-<N>` directory); its step.
  expected<std::int64_t> load(const std::filesystem::path& directory);
  /// Saves everything tracked as step `step` (> 0, above the last save's).
  /// Every rank that tracks state calls it (the driver alone for
  /// pipelines). Errors: a writer or stage failed (named), the previous
  /// asynchronous save failed.
  expected<void> save(std::int64_t step);
  /// save(step) at multiples of `every`; nothing otherwise.
  expected<void> save_if_due(std::int64_t step);
  /// Waits for the asynchronous save in flight; its error.
  expected<void> wait();

  const checkpoint_options& options() const noexcept;

private:
  struct impl;
  explicit checkpoints(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::parallel
