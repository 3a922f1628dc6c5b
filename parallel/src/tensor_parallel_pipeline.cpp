// Tensor x pipeline (x data) parallelism (tensor_parallel_pipeline.hpp).
#include "troupe/parallel/tensor_parallel_pipeline.hpp"

#include <optional>
#include <thread>

#include <fmt/format.h>

#include "concurrent_pipelines.hpp"
#include "pipeline_state.hpp"
#include "tensor_parallel_pipeline_access.hpp"
#include "troupe/job.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

struct tensor_parallel_pipeline::state {
  std::optional<mesh> layout;
  std::uint32_t data = 1, tensor = 1;
  /// Every rank's tensor-parallel group, by mesh rank: the layers keep
  /// handles of their own, these only outlive the joins.
  std::vector<std::optional<reducer_group>> groups;
  /// By d T + t.
  std::vector<std::shared_ptr<nn::sequential>> models;
  /// By d T + t; declared last, so stopped before the rest goes.
  std::vector<pipeline> pipelines;
};

namespace {

void validate(const tensor_parallel_pipeline_options& o) {
  require(o.tensor >= 1 && o.data >= 1, "tensor_parallel_pipeline: {} tensor ranks and {} replicas; need at least one",
          o.tensor, o.data);
  require(static_cast<bool>(o.model) && static_cast<bool>(o.loss),
          "tensor_parallel_pipeline: give a model factory and a loss factory");
  require(!o.pipeline.model && !o.pipeline.loss && o.pipeline.name.empty() && !o.pipeline.replication,
          "tensor_parallel_pipeline: leave the pipeline's model, loss, name and replication unset (they come from "
          "the tensor-parallel options)");
  require(o.pipeline.in_this_process,
          "tensor_parallel_pipeline: stages in other processes are not supported yet; set in_this_process");
  require(!o.pipeline.places.empty(), "tensor_parallel_pipeline: no places; give one place per stage");
}

} // namespace

expected<tensor_parallel_pipeline> tensor_parallel_pipeline::create(actors::node& node,
                                                                    tensor_parallel_pipeline_options options) {
  validate(options);
  auto st = std::make_unique<state>();
  st->data = options.data;
  st->tensor = options.tensor;
  const auto stages = static_cast<std::uint32_t>(options.pipeline.places.size());
  const auto T = options.tensor, D = options.data;
  // Rank (d P + p) T + t sits at stage p's place.
  std::vector<std::string> places;
  for (std::uint32_t d = 0; d < D; ++d)
    for (std::uint32_t p = 0; p < stages; ++p)
      for (std::uint32_t t = 0; t < T; ++t)
        places.push_back(options.pipeline.places[p]);
  auto layout = mesh::create({{"data", D}, {"pipeline", stages}, {"tensor", T}}, places);
  if (!layout)
    return layout.error_value();
  st->layout.emplace(std::move(*layout));
  const auto& grid = *st->layout;

  // Join every group at once (a join waits for its members).
  st->groups.resize(grid.size());
  std::vector<std::optional<troupe::error>> failures(grid.size());
  {
    std::vector<std::thread> joins;
    for (std::uint32_t rank = 0; rank < grid.size(); ++rank)
      joins.emplace_back([&, rank] {
        auto o = grid.group_options(rank, "tensor");
        o.timeout = options.pipeline.timeout;
        auto joined = reducer_group::join(node, o);
        if (joined)
          st->groups[rank].emplace(std::move(*joined));
        else
          failures[rank] = joined.error_value();
      });
    for (auto& j : joins)
      j.join();
  }
  for (std::uint32_t rank = 0; rank < grid.size(); ++rank)
    if (failures[rank])
      return make_error(failures[rank]->code(), "tensor_parallel_pipeline: rank {}'s tensor-parallel group: {}", rank,
                        failures[rank]->message());

  // Each (d, t)'s model: stage p's layers from the model built over (d, p, t)'s group.
  auto split = options.pipeline.split;
  for (std::uint32_t d = 0; d < D; ++d)
    for (std::uint32_t t = 0; t < T; ++t) {
      auto assembled = std::make_shared<nn::sequential>();
      for (std::uint32_t p = 0; p < stages; ++p) {
        auto whole = options.model(*st->groups[(d * stages + p) * T + t]);
        require(whole != nullptr && whole->size() > 0, "tensor_parallel_pipeline: the model factory gave no layers");
        if (split.boundaries.empty()) {
          require(stages <= whole->size(), "tensor_parallel_pipeline: {} stages for a model of {} layers", stages,
                  whole->size());
          split = even(stages, whole->size());
        }
        require(split.layers() == whole->size(), "tensor_parallel_pipeline: the partition covers {} layers but the "
                "model has {}", split.layers(), whole->size());
        for (auto i = split.begin(p); i < split.end(p); ++i)
          assembled->append(whole->at(i)); // named by index, as in the whole model
      }
      st->models.push_back(std::move(assembled));
    }

  for (std::uint32_t d = 0; d < D; ++d)
    for (std::uint32_t t = 0; t < T; ++t) {
      auto o = options.pipeline;
      o.model = st->models[d * T + t];
      o.split = split;
      o.loss = options.loss(*st->groups[(d * stages + stages - 1) * T + t]);
      o.name = fmt::format("d{}.t{}", d, t);
      o.fixed_order = true;
      if (D > 1) {
        pipeline_replication r;
        r.index = d;
        r.places.assign(D, options.pipeline.places);
        r.tag = fmt::format("t{}", t);
        o.replication = std::move(r);
      }
      auto made = pipeline::create(node, std::move(o));
      if (!made)
        return make_error(made.error_value().code(), "tensor_parallel_pipeline: replica {}, tensor rank {}: {}", d, t,
                          made.error_value().message());
      st->pipelines.push_back(std::move(*made));
    }
  return tensor_parallel_pipeline(std::move(st));
}

expected<tensor_parallel_pipeline> tensor_parallel_pipeline::create(troupe::job& job,
                                                                    tensor_parallel_pipeline_options options) {
  auto made = create(job.node(), std::move(options));
  if (made)
    for (auto& p : made->state_->pipelines)
      p.state_->stop_with(job);
  return made;
}

tensor_parallel_pipeline::tensor_parallel_pipeline(std::unique_ptr<state> st) : state_(std::move(st)) {}
tensor_parallel_pipeline::~tensor_parallel_pipeline() = default;
tensor_parallel_pipeline::tensor_parallel_pipeline(tensor_parallel_pipeline&&) noexcept = default;
tensor_parallel_pipeline& tensor_parallel_pipeline::operator=(tensor_parallel_pipeline&&) noexcept = default;

expected<double> tensor_parallel_pipeline::train_step(const tensor& inputs, const tensor& targets) {
  const auto T = state_->tensor;
  // Pipeline d T + t takes replica d's shard; the tensor ranks of a
  // replica compute the same loss.
  auto losses = train_together(
      state_->pipelines, inputs, targets, state_->data, [T](std::size_t k) { return static_cast<std::int64_t>(k / T); },
      [this](std::size_t k) { return name(k); }, "tensor_parallel_pipeline::train_step");
  if (!losses)
    return losses.error_value();
  double sum = 0;
  for (std::size_t k = 0; k < losses->size(); k += T)
    sum += (*losses)[k];
  return sum / static_cast<double>(state_->data);
}

expected<void> tensor_parallel_pipeline::synchronize() {
  return synchronize_together(state_->pipelines, [this](std::size_t k) { return name(k); });
}

std::vector<pipeline*> tensor_parallel_pipeline_access::pipelines(tensor_parallel_pipeline& tp) {
  std::vector<pipeline*> out;
  for (auto& p : tp.state_->pipelines)
    out.push_back(&p);
  return out;
}

std::uint32_t tensor_parallel_pipeline_access::tensor(const tensor_parallel_pipeline& tp) { return tp.state_->tensor; }

std::string tensor_parallel_pipeline::name(std::size_t k) const {
  return fmt::format("replica {}, tensor rank {}", k / state_->tensor, k % state_->tensor);
}

const mesh& tensor_parallel_pipeline::layout() const {
  return *state_->layout;
}

nn::sequential& tensor_parallel_pipeline::model(std::uint32_t data, std::uint32_t tensor) {
  require(data < state_->data && tensor < state_->tensor,
          "tensor_parallel_pipeline::model: replica {} and tensor rank {} of {} x {}", data, tensor, state_->data,
          state_->tensor);
  return *state_->models[data * state_->tensor + tensor];
}

} // namespace troupe::parallel
