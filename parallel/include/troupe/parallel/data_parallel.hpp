#pragma once
// Data parallelism (issue 5): every replica holds the whole model (or one
// pipeline stage), computes gradients on its own shard of the batch, and the
// replicas average their gradients through a ring of reducer actors while
// backward is still running.
//
// From examples/data_parallel_demo.cpp:
//
//   auto model = recipe.model(); // every rank: the same model from the same seed
//   model->to(where);
//   auto dp = job.must(parallel::data_parallel::create(job, model->named_parameters(), {.buckets = {bucket_bytes}}));
//   auto optimizer = recipe.optimizer(model->named_parameters());
//   ...
//   optimizer->zero_grad();
//   auto loss = recipe.loss((*model)(autograd::variable(x.to(where))), y.to(where));
//   job.must(dp.backward(loss), fmt::format("step {}", step.number()));
//   optimizer->step();
//
// create(job, ...) makes every rank of the job a replica in one reducer
// group of its own; create(parameters, group) takes a group the caller
// joined (examples/parameter_server_demo.cpp makes its two trainers one).
// Both return expected<data_parallel>, a movable value. backward() returns
// an error naming a lost replica; once it succeeds every replica holds the
// same averaged gradients, so the optimizer steps agree.
//
// How it overlaps. The parameters are grouped into buckets (gradient_bucket.hpp,
// reverse order of registration). A grad-ready hook on every parameter copies
// its gradient into its bucket's flat buffer the moment backward has finished
// it; when a bucket's last gradient is in, the bucket is queued for a ring
// allreduce (average) on this object's reduction thread, and backward goes on
// with earlier layers. Buckets are queued strictly in bucket order (a full
// bucket waits for the ones before it), so every replica issues the same
// collectives in the same order and the collective ids match without a
// message. After backward, synchronize() waits for the rest and makes every
// parameter's gradient a view of its bucket's averaged values.
//
// Equal results. The ring reduces each element exactly once, on its owner, in
// one fixed order, and the others copy the owner's result: every replica gets
// bitwise the same averaged gradient, so identical optimizers keep the
// replicas bitwise identical. At creation rank 0's parameters are broadcast
// to all (as PyTorch DDP does), so replicas start identical even if their
// initialisation differed. With equal shards, the average of the replicas'
// mean-loss gradients is the gradient of the whole batch's mean loss:
// N replicas with batch b train like one process with batch N·b.
//
// Accumulation. set_final_pass(false) makes the hooks do nothing: gradients
// accumulate locally over several backward passes (PyTorch's no_sync), and
// synchronize() then reduces the accumulated values. Parameters that got no
// gradient in a pass contribute zeros.
//
// Devices. Parameters on a CUDA device (all on one) keep their buckets on
// that device, and the buckets are reduced by an NCCL communicator
// (nccl_communicator.hpp) that create() bootstraps over the same reducer
// ring; on the CPU the ring itself reduces them. A CUDA model in a build
// without NCCL is an error at create().
//
// Failure. A replica that dies or hangs fails its neighbours' collectives
// within the group's timeout with an error naming it (reducer_group.hpp);
// backward()/synchronize() return that error, and the object refuses to
// continue (its replicas are no longer in step).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/parallel/gradient_bucket.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe {
class job;
}

namespace troupe::parallel {

/// How replicas whose parameters are on a CUDA device reduce their buckets.
enum class device_reduction {
  /// Decided by create(), the same on every replica: NCCL where every
  /// replica's parameters are on a GPU no other replica uses (by machine
  /// and ordinal), the host ring otherwise (replicas sharing a GPU, a build
  /// without NCCL). It costs one small all-gather of the replicas on GPUs,
  /// so replicas on the CPU beside replicas on GPUs must say host_ring.
  automatic,
  /// NCCL on the device (one GPU per replica).
  nccl,
  /// Through the host: each bucket is copied to host memory, reduced by the
  /// group's ring (shared memory on one host), and copied back. For
  /// replicas that share a GPU (NCCL refuses two ranks on one device) or a
  /// build without NCCL; slower than NCCL.
  host_ring,
};

struct data_parallel_options {
  bucket_options buckets{};
  /// Copy rank 0's parameters to every replica at creation.
  bool broadcast_parameters = true;
  /// For errors and traces; default "replica <rank>".
  std::string name{};
  /// CUDA parameters: bound on NCCL's bootstrap and on each collective.
  std::chrono::milliseconds nccl_timeout{60000};
  /// CUDA parameters: NCCL, the host ring, or whichever fits (above).
  device_reduction reduction = device_reduction::automatic;
};

/// Timings of the last synchronized step (steady clock, milliseconds).
struct data_parallel_stats {
  std::size_t buckets = 0;
  std::uint64_t bytes = 0;
  /// backward(): its autograd pass; 0 when the caller ran backward itself.
  double backward_ms = 0;
  /// Time the bucket collectives ran, summed.
  double reduce_ms = 0;
  /// The part of reduce_ms before backward ended (hidden behind it).
  double hidden_ms = 0;
  /// How long synchronize() waited after backward ended.
  double exposed_ms = 0;
  double hidden_fraction() const { return reduce_ms > 0 ? hidden_ms / reduce_ms : 0.0; }
  /// "reduction hidden behind backward 94%", for progress lines.
  std::string summary() const;
};

class data_parallel {
public:
  /// Installs the hooks and starts the reduction thread; with
  /// `broadcast_parameters`, copies rank 0's parameters to every replica
  /// first (a collective: every replica must call create). The object
  /// shares `group`'s member: the group handle may go first. Throws
  /// usage_error for a parameter list plan_buckets refuses; errors from the
  /// ring are values.
  static expected<data_parallel> create(nn::named_variables parameters, reducer_group& group,
                                        data_parallel_options options = {});
  /// Every rank of the job a replica: joins a reducer group of the whole
  /// job (reducer_group::join(job)) that the object keeps, then as above.
  static expected<data_parallel> create(troupe::job& job, nn::named_variables parameters,
                                        data_parallel_options options = {});

  /// Whether every replica's parameters equal rank 0's bit for bit (a
  /// collective: replicas_identical below over this object's parameters).
  expected<bool> replicas_identical();

  /// Removes the hooks, finishes the collective in progress (bounded by the
  /// group's timeout) and stops the reduction thread.
  ~data_parallel();
  data_parallel(data_parallel&&) noexcept;
  data_parallel& operator=(data_parallel&&) noexcept;
  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  /// autograd::backward(loss) with buckets reducing as it runs, then
  /// synchronize(). Records both in the trace (kinds "backward" and
  /// "allreduce") when tracing is on. A backward that throws (a remote
  /// module's host lost) is this call's error, and the replica's from then on.
  expected<void> backward(const autograd::variable& loss);

  /// Waits for every bucket of this pass (queuing the ones backward did not
  /// complete), then sets each parameter's gradient to the replicas'
  /// average. Errors name the replica that failed.
  expected<void> synchronize();

  /// false: backward passes only accumulate locally (see "Accumulation").
  void set_final_pass(bool final_pass) noexcept;

  const std::vector<gradient_bucket>& buckets() const noexcept;
  const nn::named_variables& parameters() const noexcept;
  reducer_group& group() noexcept;
  const std::string& name() const noexcept;
  /// How the buckets are reduced: nccl, or host_ring (the ring, for
  /// parameters on the CPU too); never automatic.
  device_reduction reduction() const noexcept;
  data_parallel_stats last_stats() const;

private:
  struct impl; // the buckets, the hooks' state and the reduction thread (data_parallel.cpp)
  explicit data_parallel(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

/// Whether every replica's `parameters` equal rank 0's bit for bit (a
/// collective: every rank of `group` calls it with its own parameters, in
/// the same order). Rank 0's values are broadcast and compared on each
/// rank; the verdicts are summed over the ring, so every rank gets the
/// same answer.
expected<bool> replicas_identical(reducer_group& group, const std::vector<autograd::variable>& parameters);

} // namespace troupe::parallel
