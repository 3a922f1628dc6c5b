#pragma once
// Pipelines across processes: every process of the job registers the stage
// factory with the same recipe (the same model from the same seed), and the
// driver's pipeline spawns each stage on its place's node, where the factory
// builds the whole model, keeps its slice and sends tensors through the
// node's tensor_router (UCX data plane, or CAF over TLS). The model is built
// under nn::deferred_init: only the kept layers get values, so a stage
// process holds its slice, not the model (the driver's pipeline::create(job)
// alike for the stages it hosts).
//
// Every process gives the job the recipe before job.start() (job.hpp).
// From examples/license_corpus.hpp:
//
//   return {[config] { return std::static_pointer_cast<nn::sequential>(std::make_shared<nn::gpt>(config)); },
//           parallel::adam_factory({.lr = 3e-3, .weight_decay = 0.01}, true),
//
// job.host_stages registers the factory (register_stage_factory); a program
// with a node of its own calls register_stage_factory and
// pipeline_options_from.
#include <functional>
#include <memory>

#include "troupe/actors/fwd.hpp"
#include "troupe/parallel/pipeline.hpp"

namespace troupe::parallel {

/// What every process needs to build any stage of the pipeline.
struct stage_recipe {
  /// Builds the whole model; every process must get the same parameters
  /// (nn::module::reset_parameters with a fixed seed does it). It runs under
  /// nn::deferred_init: values come from the layers' init rules or from
  /// load_state_dict; a value the factory changes otherwise (an in-place
  /// scale) is not what a stage gets.
  std::function<std::shared_ptr<nn::sequential>()> model;
  optimizer_factory optimizer;
  loss_function loss;
};

/// Registers the "troupe.pipeline_stage" factory on `node`. Call it on every
/// node that may host a stage, before the driver creates the pipeline.
void register_stage_factory(actors::node& node, stage_recipe recipe);

/// Pipeline options with the recipe's model (built here, for the
/// partition), optimizer and loss. Set places, split, schedule and
/// micro-batches, then pipeline::create(node, options).
pipeline_options pipeline_options_from(const stage_recipe& recipe);

} // namespace troupe::parallel
