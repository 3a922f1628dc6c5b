// parallel::checkpoints: what each rank writes, and the coordinator's commit.
#include "troupe/parallel/checkpoints.hpp"

#include <algorithm>
#include <charconv>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "pipeline_state.hpp"
#include "ps_checkpoint.hpp"
#include "remote_module_checkpoint.hpp"
#include "tensor_parallel_pipeline_access.hpp"
#include "training_state.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/peer_monitor.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/parallel/hybrid.hpp"
#include "troupe/parallel/parameter_server.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/parallel/remote_module.hpp"
#include "troupe/serialization/checkpoint_directory.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

namespace {

constexpr std::string_view generator_prefix = "generator.";

std::vector<std::string> numbered(std::string_view prefix, std::uint32_t count) {
  std::vector<std::string> out;
  for (std::uint32_t i = 0; i < count; ++i)
    out.push_back(fmt::format("{}{}", prefix, i));
  return out;
}

/// "<seed> <offset>" of a metadata value, or nullopt.
std::optional<generator> parse_stream(std::string_view text) {
  generator out;
  auto space = text.find(' ');
  if (space == std::string_view::npos)
    return std::nullopt;
  auto seed = text.substr(0, space);
  auto offset = text.substr(space + 1);
  auto [a, ea] = std::from_chars(seed.data(), seed.data() + seed.size(), out.seed);
  auto [b, eb] = std::from_chars(offset.data(), offset.data() + offset.size(), out.offset);
  if (ea != std::errc{} || eb != std::errc{} || a != seed.data() + seed.size() ||
      b != offset.data() + offset.size() || seed.empty() || offset.empty())
    return std::nullopt;
  return out;
}

} // namespace

struct checkpoints::impl {
  /// A model and optimizer of this process, written as `writer`.
  struct local_state {
    nn::module* model;
    optim::optimizer* optimizer;
    std::string writer;
    std::vector<std::string> holders; ///< empty: this writer alone
    bool sharded = false;             ///< tensor-parallel pieces
    /// Tensor-parallel with replicas: the writers holding this member's pieces.
    std::vector<std::string> split_holders{};
  };
  /// A pipeline's stages; stage s's state held alike by state_holders[s].
  struct stage_group {
    pipeline* stages;
    std::vector<std::vector<std::string>> state_holders;
    /// A tensor_parallel_pipeline's: stage s saves its pieces, the split
    /// ones held alike by split_holders[s].
    bool sharded = false;
    std::vector<std::vector<std::string>> split_holders{};
  };

  /// A parameter server's shards, reached through a trainer's client;
  /// `index` tells tracked servers apart in writer names and metadata.
  struct server_group {
    parameter_client* client;
    std::uint16_t index;
  };

  /// A remote module's host, reached through a caller's handle.
  struct module_host {
    remote_module* module;
  };

  /// The first rank the job lost, if any: the coordinator stops waiting for
  /// reports then (that rank's will never come).
  struct loss_watch {
    std::mutex mutex;
    std::optional<std::string> lost;
  };

  ~impl() {
    (void)thread.wait(); // while a lost rank still ends the coordinator's wait
    if (node != nullptr)
      node->remove_peer_lost_handler(peer_lost_handler);
  }

  checkpoint_options options;
  actors::node* node = nullptr;
  std::uint64_t peer_lost_handler = 0;
  std::shared_ptr<loss_watch> losses = std::make_shared<loss_watch>();
  /// The job's rank; without a job, 0 or the tracked replica's rank.
  std::uint32_t rank = 0;
  bool in_job = false;
  std::vector<local_state> locals;
  std::vector<stage_group> pipelines;
  std::vector<server_group> servers;
  std::vector<module_host> modules;
  std::vector<std::pair<std::string, generator*>> streams;
  /// Coordinator: every writer of the checkpoint (this process's and the
  /// others'); the stages' optimizers' step is held alike by all stages.
  std::vector<std::string> writers;
  std::vector<std::string> stage_writers;
  std::int64_t last_step = 0;
  std::size_t replica_groups = 0;
  std::size_t tensor_groups = 0;
  /// Declared last: destroyed (its write finished) before what it reads.
  background_writer thread;

  /// In a job, checkpoint_options::coordinator; else 0.
  std::uint32_t coordinator_rank = 0;
  bool coordinator() const { return rank == coordinator_rank; }
  /// No directory: checkpointing is off.
  bool off() const;

  /// Whether a model of this process (`model.<name>`) and a remote
  /// module (`model.<module>.`) would save the same names.
  void check_parts_apart() const {
    for (const auto& m : modules) {
      const auto& part = remote_module_access::options(*m.module).name;
      for (const auto& local : locals)
        for (const auto& [name, value] : local.model->state_dict())
          require(!name.starts_with(part + "."),
                  "checkpoints: the model's '{}' and remote module '{}' would be saved under the same name "
                  "'model.{}'; name the remote module apart",
                  name, part, name);
    }
  }

  /// Every model of this process is tracked here, so that none saves a
  /// remote module's names.
  void add_local(local_state local) {
    locals.push_back(std::move(local));
    check_parts_apart();
  }

  void add_writers(const std::vector<std::string>& names) {
    for (const auto& name : names) {
      require(std::find(writers.begin(), writers.end(), name) == writers.end(),
              "checkpoints: '{}' is tracked twice", name);
      writers.push_back(name);
    }
  }

  expected<void> save(std::int64_t step);
  expected<std::int64_t> load(const std::filesystem::path& directory);
};

expected<checkpoints> checkpoints::create(troupe::job& job, checkpoint_options options) {
  auto made = create(std::move(options));
  if (made) {
    auto& state = *made->impl_;
    require(state.options.coordinator < job.world_size(),
            "checkpoints: options.coordinator is rank {} but the job has {} ranks", state.options.coordinator,
            job.world_size());
    state.rank = job.rank();
    state.coordinator_rank = state.options.coordinator;
    state.in_job = true;
    state.node = &job.node();
    state.peer_lost_handler = state.node->on_peer_lost([watch = state.losses](const actors::peer_lost& lost) {
      std::lock_guard lock(watch->mutex);
      if (!watch->lost)
        watch->lost = fmt::format("{} was lost ({})", lost.node, lost.reason);
    });
  }
  return made;
}

expected<checkpoints> checkpoints::create(checkpoint_options options) {
  require(options.every >= 0, "checkpoints: options.every is {}; it must be 0 (never) or positive", options.every);
  auto state = std::make_unique<impl>();
  state->options = std::move(options);
  return checkpoints(std::move(state));
}

checkpoints::checkpoints(std::unique_ptr<impl> state) : impl_(std::move(state)) {}
checkpoints::~checkpoints() = default;
checkpoints::checkpoints(checkpoints&&) noexcept = default;
checkpoints& checkpoints::operator=(checkpoints&&) noexcept = default;

const checkpoint_options& checkpoints::options() const noexcept { return impl_->options; }

void checkpoints::track(nn::module& model, optim::optimizer& optimizer) {
  require(impl_->coordinator(),
          "checkpoints: rank {} tracks a model of its own; only the coordinator (rank {}) may, other ranks "
          "track replicas (track(model, optimizer, data_parallel)) or serve pipeline stages",
          impl_->rank, impl_->coordinator_rank);
  // Its names are the model's: a second model of this process's own would
  // save the same names.
  require(std::none_of(impl_->locals.begin(), impl_->locals.end(), [](const auto& l) { return l.holders.empty(); }),
          "checkpoints: this process tracks a second model of its own; checkpoints save one model by its names");
  auto writer = fmt::format("rank-{}", impl_->rank);
  impl_->add_writers({writer});
  impl_->add_local({&model, &optimizer, std::move(writer), {}});
}

void checkpoints::track(nn::module& model, optim::optimizer& optimizer, data_parallel& replicas) {
  auto& group = replicas.group();
  if (!impl_->in_job) // replicas as threads of one program: replica 0 coordinates
    impl_->rank = group.rank();
  require(!impl_->coordinator() || group.rank() == 0,
          "checkpoints: the coordinator (rank {}) is replica {} of its group; it must be replica 0",
          impl_->coordinator_rank, group.rank());
  // Every replica names the writers alike: by the order in which its
  // data-parallel groups were tracked, and the replicas' ranks.
  auto holders = numbered(fmt::format("data-parallel-{}.replica-", impl_->replica_groups++), group.size());
  if (impl_->coordinator())
    impl_->add_writers(holders);
  impl_->add_local({&model, &optimizer, holders[group.rank()], holders});
}

void checkpoints::track(nn::module& model, optim::optimizer& optimizer, reducer_group& tensor_group) {
  if (!impl_->in_job) // members as threads of one program: member 0 coordinates
    impl_->rank = tensor_group.rank();
  require(!impl_->coordinator() || tensor_group.rank() == 0,
          "checkpoints: the coordinator (rank {}) is member {} of its tensor-parallel group; it must be member 0",
          impl_->coordinator_rank, tensor_group.rank());
  auto members = numbered(fmt::format("tensor-parallel-{}.rank-", impl_->tensor_groups++), tensor_group.size());
  if (impl_->coordinator())
    impl_->add_writers(members);
  impl_->add_local({&model, &optimizer, members[tensor_group.rank()], members, true});
}

void checkpoints::track(nn::module& model, optim::optimizer& optimizer, reducer_group& tensor_group,
                        data_parallel& replicas) {
  auto& data_group = replicas.group();
  const auto t = tensor_group.rank();
  const auto r = data_group.rank();
  if (!impl_->in_job) // ranks as threads of one program: member 0 of replica 0 coordinates
    impl_->rank = t == 0 && r == 0 ? 0 : 1;
  require(!impl_->coordinator() || (t == 0 && r == 0),
          "checkpoints: the coordinator (rank {}) is tensor-parallel member {} of replica {}; it must be member 0 "
          "of replica 0",
          impl_->coordinator_rank, t, r);
  const auto group = impl_->tensor_groups++;
  auto name = [&](std::uint32_t member, std::uint32_t replica) {
    return fmt::format("tensor-parallel-{}.rank-{}.replica-{}", group, member, replica);
  };
  std::vector<std::string> everyone, mine;
  for (std::uint32_t member = 0; member < tensor_group.size(); ++member)
    for (std::uint32_t replica = 0; replica < data_group.size(); ++replica)
      everyone.push_back(name(member, replica));
  for (std::uint32_t replica = 0; replica < data_group.size(); ++replica)
    mine.push_back(name(t, replica));
  if (impl_->coordinator())
    impl_->add_writers(everyone);
  impl_->add_local({&model, &optimizer, name(t, r), everyone, true, mine});
}

void checkpoints::track(pipeline& stages) {
  require(impl_->coordinator() && impl_->coordinator_rank == 0,
          "checkpoints: rank {} tracks a pipeline; the driver (rank 0) does, and coordinates", impl_->rank);
  auto& state = pipeline_access::state(stages);
  auto writers = state.checkpoint_writers();
  impl_->add_writers(writers);
  impl_->stage_writers.insert(impl_->stage_writers.end(), writers.begin(), writers.end());
  impl_->pipelines.push_back({&stages, std::vector<std::vector<std::string>>(writers.size())});
}

void checkpoints::track(hybrid_pipeline& replicas) {
  require(impl_->coordinator() && impl_->coordinator_rank == 0,
          "checkpoints: rank {} tracks a pipeline; the driver (rank 0) does, and coordinates", impl_->rank);
  std::vector<std::vector<std::string>> per_replica;
  for (std::size_t k = 0; k < replicas.replicas(); ++k)
    per_replica.push_back(pipeline_access::state(replicas.replica(k)).checkpoint_writers());
  const auto stages = per_replica.front().size();
  std::vector<std::vector<std::string>> holders(stages);
  for (std::size_t s = 0; s < stages; ++s)
    for (const auto& writers : per_replica)
      holders[s].push_back(writers.at(s));
  for (std::size_t k = 0; k < replicas.replicas(); ++k) {
    impl_->add_writers(per_replica[k]);
    impl_->stage_writers.insert(impl_->stage_writers.end(), per_replica[k].begin(), per_replica[k].end());
    impl_->pipelines.push_back({&replicas.replica(k), holders});
  }
}

void checkpoints::track(tensor_parallel_pipeline& stages) {
  require(impl_->coordinator() && impl_->coordinator_rank == 0,
          "checkpoints: rank {} tracks a pipeline; the driver (rank 0) does, and coordinates", impl_->rank);
  auto pipelines = tensor_parallel_pipeline_access::pipelines(stages);
  const auto T = tensor_parallel_pipeline_access::tensor(stages);
  std::vector<std::vector<std::string>> writers; // by d T + t, then stage
  for (auto* p : pipelines)
    writers.push_back(pipeline_access::state(*p).checkpoint_writers());
  const auto count = writers.front().size();
  // Stage s: what its members hold whole, every (d, t) alike; a split
  // piece, the replicas d of its tensor rank t alike.
  std::vector<std::vector<std::string>> whole(count);
  for (std::size_t s = 0; s < count; ++s)
    for (const auto& w : writers)
      whole[s].push_back(w.at(s));
  for (std::size_t k = 0; k < pipelines.size(); ++k) {
    std::vector<std::vector<std::string>> split(count);
    for (std::size_t s = 0; s < count; ++s)
      for (std::size_t other = k % T; other < pipelines.size(); other += T)
        split[s].push_back(writers[other].at(s));
    impl_->add_writers(writers[k]);
    impl_->stage_writers.insert(impl_->stage_writers.end(), writers[k].begin(), writers[k].end());
    impl_->pipelines.push_back({pipelines[k], whole, true, std::move(split)});
  }
}

void checkpoints::track(parameter_client& client) {
  if (!impl_->in_job) // trainers as threads of one program: trainer 0 coordinates
    impl_->rank = client.trainer_index();
  require(impl_->servers.size() < 65535, "checkpoints: more than 65535 parameter servers tracked");
  const auto index = static_cast<std::uint16_t>(impl_->servers.size());
  if (impl_->coordinator())
    impl_->add_writers(parameter_server_writers(index, parameter_server_access::options(client)));
  impl_->servers.push_back({&client, index});
}

void checkpoints::track(remote_module& module) {
  const auto caller = remote_module_access::caller(module);
  if (!impl_->in_job) // callers as threads of one program: caller 0 coordinates
    impl_->rank = caller;
  const auto& name = remote_module_access::options(module).name;
  for (const auto& other : impl_->modules)
    require(remote_module_access::options(*other.module).name != name,
            "checkpoints: remote module '{}' is tracked twice", name);
  if (impl_->coordinator())
    impl_->add_writers({remote_module_writer(name)});
  impl_->modules.push_back({&module});
  impl_->check_parts_apart();
}

void checkpoints::track(std::string name, generator& stream) {
  require(impl_->coordinator(), "checkpoints: rank {} tracks random stream '{}'; only the coordinator's are saved",
          impl_->rank, name);
  impl_->streams.emplace_back(std::move(name), &stream);
}

bool checkpoints::impl::off() const { return options.directory.empty(); }

expected<std::int64_t> checkpoints::resume() {
  if (impl_->off())
    return std::int64_t{0};
  // A restarted job saves the steps after its checkpoint again: a staging
  // directory the dead run left holds its writers' reports, which the
  // coordinator would take for this run's and commit (renaming the
  // directory while this run's writer still writes into it). No writer of
  // this run has written yet: stages and parameter servers write when the
  // coordinator asks, replicas after a step that needs the coordinator's.
  if (impl_->coordinator()) {
    if (auto previous = impl_->thread.wait(); !previous)
      return previous.error();
    if (auto discarded = discard_staging(impl_->options.directory); !discarded)
      return make_error(discarded.error().code(), "resume: {}", discarded.error().message());
  }
  auto latest = latest_checkpoint(impl_->options.directory);
  if (!latest)
    return latest.error();
  if (!*latest)
    return std::int64_t{0};
  return load(**latest);
}

expected<std::int64_t> checkpoints::load(const std::filesystem::path& directory) { return impl_->load(directory); }

expected<void> checkpoints::save(std::int64_t step) { return impl_->save(step); }

expected<void> checkpoints::save_if_due(std::int64_t step) {
  if (impl_->off() || impl_->options.every == 0 || step % impl_->options.every != 0)
    return {};
  return save(step);
}

expected<void> checkpoints::wait() { return impl_->thread.wait(); }

expected<void> checkpoints::impl::save(std::int64_t step) {
  require(step > last_step, "checkpoints: save({}) after save({}); steps must increase", step, last_step);
  if (off())
    return {};
  // The previous save first: one at a time, and its failure is reported here.
  if (auto previous = thread.wait(); !previous)
    return previous;
  last_step = step;
  const auto at = static_cast<std::uint64_t>(step);
  const bool asynchronous = options.asynchronous;

  // What this process writes, copied now when the write comes later.
  std::vector<std::pair<std::string, std::vector<state_share>>> mine;
  for (const auto& local : locals)
    mine.emplace_back(local.writer,
                      local.sharded
                        ? sharded_training_shares(*local.model, *local.optimizer, local.split_holders,
                                                  local.holders, local.holders, asynchronous)
                        : training_shares(*local.model, *local.optimizer, local.holders, local.holders, asynchronous));
  // The stages copy (or write) theirs before they answer.
  for (auto& group : pipelines)
    if (auto saved = pipeline_access::state(*group.stages)
                       .save_stages(options.directory, at, group.state_holders, stage_writers, asynchronous,
                                    group.sharded, group.split_holders);
        !saved)
      return saved;

  checkpoint_metadata metadata;
  // The parameter servers' shards copy their tables once each synchronous
  // table has applied the trainers' last step (ps_checkpoint.hpp), and
  // write them from their own processes.
  const auto root_text = options.directory.string();
  if (coordinator())
    for (auto& group : servers) {
      const auto table_step = parameter_server_access::last_step(*group.client);
      const ps_wire::checkpoint_request request{.server = group.index, .asynchronous = asynchronous,
                                                .checkpoint_step = at, .table_step = table_step,
                                                .directory = root_text};
      if (auto saved = parameter_server_access::ask_every_shard(*group.client, ps_wire::op::save, request,
                                                                options.timeout);
          !saved)
        return make_error(saved.error().code(), "checkpoint of step {}: {}", step, saved.error().message());
      auto entries = parameter_server_metadata(parameter_server_access::options(*group.client), group.index,
                                               table_step);
      metadata.insert(metadata.end(), entries.begin(), entries.end());
    }
  // Each remote module's host copies its module once it has applied the
  // coordinator's last step, and writes it from its own process.
  if (coordinator())
    for (auto& [module] : modules) {
      const auto module_step = remote_module_access::last_step(*module);
      const ps_wire::checkpoint_request request{.asynchronous = asynchronous, .checkpoint_step = at,
                                                .table_step = module_step, .directory = root_text};
      if (auto saved = remote_module_access::ask_host(*module, ps_wire::op::save, request, options.timeout); !saved)
        return make_error(saved.error().code(), "checkpoint of step {}: {}", step, saved.error().message());
      metadata.emplace_back(remote_module_step_key(remote_module_access::options(*module).name),
                            std::to_string(module_step));
    }
  for (const auto& [name, stream] : streams)
    metadata.emplace_back(std::string(generator_prefix) + name, fmt::format("{} {}", stream->seed, stream->offset));

  auto write = [mine = std::move(mine), root = options.directory, at, coordinate = coordinator(),
                all = writers, timeout = options.timeout, keep_last = options.keep_last,
                metadata = std::move(metadata), watch = losses]() -> expected<void> {
    for (const auto& [writer, shares] : mine)
      if (auto ok = write_shares(root, at, writer, shares); !ok)
        return ok;
    if (!coordinate)
      return {};
    auto written = collect_reports(root, at, all, timeout, [&watch]() {
      std::lock_guard lock(watch->mutex);
      return watch->lost;
    });
    if (!written)
      return written.error();
    auto committed = commit_checkpoint(root, *written, {at, metadata, keep_last});
    if (!committed)
      return committed.error();
    return {};
  };
  return thread.write(std::move(write), asynchronous);
}

expected<std::int64_t> checkpoints::impl::load(const std::filesystem::path& directory) {
  if (auto previous = thread.wait(); !previous)
    return previous.error();
  auto reader = checkpoint_reader::open(directory);
  if (!reader)
    return reader.error();
  // Everything checked before anything loads: names, dtypes, shapes, streams.
  for (const auto& local : locals)
    if (!local.sharded) // a split model's pieces are checked as they are read
      if (auto ok = check_model(*reader, *local.model); !ok)
        return ok.error();
  for (auto& group : pipelines)
    if (!group.sharded) // a tensor-parallel stage's pieces are checked as they are read
      if (auto ok = check_model(*reader, *pipeline_access::state(*group.stages).options_.model); !ok)
        return ok.error();
  std::vector<std::uint64_t> table_steps;
  for (const auto& group : servers) {
    if (coordinator())
      if (auto ok = check_parameter_server(*reader, parameter_server_access::options(*group.client), group.index); !ok)
        return ok.error();
    auto table_step = saved_table_step(*reader, group.index);
    if (!table_step)
      return table_step.error();
    table_steps.push_back(*table_step);
  }
  std::vector<std::uint64_t> module_steps;
  for (const auto& [module] : modules) {
    auto module_step = saved_module_step(*reader, remote_module_access::options(*module).name);
    if (!module_step)
      return module_step.error();
    module_steps.push_back(*module_step);
  }
  std::vector<generator> restored;
  for (const auto& [name, stream] : streams) {
    auto key = std::string(generator_prefix) + name;
    auto found = std::find_if(reader->manifest().metadata.begin(), reader->manifest().metadata.end(),
                              [&](const auto& entry) { return entry.first == key; });
    if (found == reader->manifest().metadata.end())
      return make_error(errc::state_mismatch, "checkpoint {} has no random stream '{}'", directory.string(), name);
    auto parsed = parse_stream(found->second);
    if (!parsed)
      return make_error(errc::malformed_message, "checkpoint {}: random stream '{}' is '{}', not '<seed> <offset>'",
                        directory.string(), name, found->second);
    restored.push_back(*parsed);
  }

  std::vector<training_state_values> values;
  for (const auto& local : locals) {
    auto read = local.sharded ? read_sharded_training_state(*reader, *local.model)
                              : read_training_state(*reader, *local.model, *local.optimizer);
    if (!read)
      return read.error();
    values.push_back(std::move(*read));
  }
  // Every shard reads its rows first; none changes unless all could.
  const auto directory_text = directory.string();
  auto ask_shards = [&](std::size_t i, ps_wire::op kind) -> expected<void> {
    const ps_wire::checkpoint_request request{.server = servers[i].index, .checkpoint_step = reader->step(),
                                              .table_step = table_steps[i],
                                              .directory = kind == ps_wire::op::load ? std::string_view(directory_text)
                                                                                     : std::string_view{}};
    if (auto ok = parameter_server_access::ask_every_shard(*servers[i].client, kind, request, options.timeout); !ok)
      return make_error(ok.error().code(), "checkpoint {}: {}", directory_text, ok.error().message());
    return {};
  };
  // Every remote module's host reads and checks its state first, too.
  auto ask_hosts = [&](ps_wire::op kind) -> expected<void> {
    for (std::size_t i = 0; i < modules.size(); ++i) {
      const ps_wire::checkpoint_request request{.checkpoint_step = reader->step(), .table_step = module_steps[i],
                                                .directory = kind == ps_wire::op::load
                                                               ? std::string_view(directory_text)
                                                               : std::string_view{}};
      if (auto ok = remote_module_access::ask_host(*modules[i].module, kind, request, options.timeout); !ok)
        return make_error(ok.error().code(), "checkpoint {}: {}", directory_text, ok.error().message());
    }
    return {};
  };
  if (coordinator()) {
    for (std::size_t i = 0; i < servers.size(); ++i)
      if (auto ok = ask_shards(i, ps_wire::op::load); !ok)
        return ok.error();
    if (auto ok = ask_hosts(ps_wire::op::load); !ok)
      return ok.error();
  }
  for (std::size_t i = 0; i < locals.size(); ++i)
    if (auto ok = apply_training_state(std::move(values[i]), *locals[i].model, *locals[i].optimizer); !ok)
      return make_error(ok.error().code(), "checkpoint {}: {}", directory.string(), ok.error().message());
  for (auto& group : pipelines)
    if (auto ok = pipeline_access::state(*group.stages).load_stages(directory, group.sharded); !ok)
      return ok.error();
  // The coordinator applies the shards' loads; every trainer then waits
  // until its shards hold them before it looks anything up.
  for (std::size_t i = 0; i < servers.size(); ++i) {
    if (auto ok = ask_shards(i, coordinator() ? ps_wire::op::apply_load : ps_wire::op::await_load); !ok)
      return ok.error();
    parameter_server_access::continue_after(*servers[i].client, table_steps[i]);
  }
  // The hosts hold a caller's forwards of later steps until they applied
  // the load.
  if (coordinator())
    if (auto ok = ask_hosts(ps_wire::op::apply_load); !ok)
      return ok.error();
  for (std::size_t i = 0; i < modules.size(); ++i)
    remote_module_access::continue_after(*modules[i].module, module_steps[i]);
  for (std::size_t i = 0; i < streams.size(); ++i)
    *streams[i].second = restored[i];
  last_step = static_cast<std::int64_t>(reader->step());
  return last_step;
}

} // namespace troupe::parallel
