// Data parallelism: buckets filled by grad-ready hooks and reduced on a
// thread of their own while backward runs (data_parallel.hpp).
#include "troupe/parallel/data_parallel.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "troupe/actors/trace.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/broadcast.hpp"
#include "troupe/parallel/ring_allreduce.hpp"
#include "troupe/tensor/error.hpp"
#ifdef TROUPE_HAVE_NCCL
#include "troupe/parallel/nccl_communicator.hpp"
#endif

#include "gpu_placement.hpp"
#include "reducer_member.hpp"

namespace troupe::parallel {

namespace {

double ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

} // namespace

struct data_parallel::impl {
  using clock = std::chrono::steady_clock;
  struct bucket_state {
    tensor flat;                ///< this pass's gradients, then their average
    std::vector<bool> filled;   ///< per slot
    std::size_t pending = 0;    ///< slots not yet filled
    bool queued = false;
    std::uint64_t id = 0;       ///< collective id
    clock::time_point started, finished;
  };

  impl(nn::named_variables parameters, reducer_group group, data_parallel_options options);
  ~impl();
  void gradient_ready(std::size_t parameter);
  /// Queues every bucket, in order, up to the first incomplete one.
  void queue_ready_buckets();
  void queue(std::size_t bucket);
  void reduction_loop();
  void reset_pass();
  /// A fresh flat buffer for bucket `b`.
  tensor bucket_buffer(std::size_t b);
  /// A gradient where its bucket lies: on the host when the ring reduces a
  /// device's buckets (device_reduction::host_ring).
  tensor to_bucket(const tensor& grad) const { return uses_nccl() ? grad : grad.to(device::cpu()); }
  /// Reduces one bucket in place (NCCL or the ring).
  expected<void> reduce(std::size_t bucket);
  expected<void> nccl_broadcast(const tensor& flat);
  expected<void> backward(const autograd::variable& loss);
  expected<void> synchronize();

  nn::named_variables parameters_;
  /// A handle on the group's member, declared before the members that use
  /// it (the NCCL communicator, the buckets), so destroyed after them.
  reducer_group group_;
  device where_;                             ///< the parameters' device
#ifdef TROUPE_HAVE_NCCL
  std::optional<nccl_communicator> nccl_;    ///< CUDA parameters only
#endif
  data_parallel_options options_;
  std::string name_;
  std::vector<gradient_bucket> buckets_;
  /// parameter index -> (bucket, slot)
  std::vector<std::pair<std::size_t, std::size_t>> slot_of_;
  std::vector<std::size_t> hook_ids_;
  bool final_pass_ = true;
  /// Trace rows: backward under "<node>/<device>/replica<rank>", the
  /// buckets' allreduce under the reducer's place.
  trace::name_id trace_name_, trace_reducer_, trace_backward_, trace_allreduce_;

  // Shared with the reduction thread (mutex_).
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<bucket_state> state_;
  std::size_t next_to_queue_ = 0;
  std::deque<std::size_t> work_;
  std::size_t done_ = 0;
  std::optional<troupe::error> failure_;
  bool stopping_ = false;
  data_parallel_stats stats_;
  std::thread reducer_thread_;

  bool uses_nccl() const {
#ifdef TROUPE_HAVE_NCCL
    return nccl_.has_value();
#else
    return false;
#endif
  }
};

std::string data_parallel_stats::summary() const {
  return fmt::format("reduction hidden behind backward {:.0f}%", 100 * hidden_fraction());
}

expected<data_parallel> data_parallel::create(troupe::job& job, nn::named_variables parameters,
                                              data_parallel_options options) {
  auto group = reducer_group::join(job);
  if (!group)
    return group.error();
  return create(std::move(parameters), *group, std::move(options));
}

expected<bool> data_parallel::replicas_identical() {
  std::vector<autograd::variable> values;
  for (const auto& [name, parameter] : impl_->parameters_)
    values.push_back(parameter);
  return parallel::replicas_identical(impl_->group_, values);
}

namespace {

/// For parameters on a GPU, `asked`, or for automatic NCCL where every
/// replica has a GPU of its own (the same decision on every replica).
expected<device_reduction> agree_on_reduction(reducer_group& group, device where, device_reduction asked,
                                              const std::string& name) {
  if (where.kind != device_kind::cuda)
    return device_reduction::host_ring; // the ring, as always on the CPU; nothing to agree on
  if (asked != device_reduction::automatic)
    return asked;
  auto own = every_member_has_its_own_gpu(group, where);
  if (!own)
    return make_error(own.error().code(), "{}: agreeing on how to reduce: {}", name, own.error().message());
#ifdef TROUPE_HAVE_NCCL
  return *own ? device_reduction::nccl : device_reduction::host_ring;
#else
  return device_reduction::host_ring;
#endif
}

} // namespace

expected<data_parallel> data_parallel::create(nn::named_variables parameters, reducer_group& group,
                                              data_parallel_options options) {
  auto dp = std::make_unique<impl>(std::move(parameters), reducer_group_access::share(group), std::move(options));
  auto reduction = agree_on_reduction(group, dp->where_, dp->options_.reduction, dp->name_);
  if (!reduction)
    return reduction.error();
  dp->options_.reduction = *reduction;
  if (dp->where_.kind == device_kind::cuda && dp->options_.reduction == device_reduction::nccl) {
#ifdef TROUPE_HAVE_NCCL
    // A collective of the group: NCCL's unique id travels over the ring.
    auto nccl = nccl_communicator::create(group, {.where = dp->where_, .timeout = dp->options_.nccl_timeout});
    if (!nccl)
      return make_error(nccl.error().code(), "{}: {}", dp->name_, nccl.error().message());
    dp->nccl_.emplace(std::move(*nccl));
#else
    return make_error(errc::invalid_argument,
                      "{}: the parameters are on {} but this build has no NCCL (reduction = "
                      "device_reduction::host_ring reduces through the host)",
                      dp->name_, dp->where_);
#endif
  }
  if (dp->options_.broadcast_parameters) {
    // Rank 0's values, bucket by bucket, in the same order on every rank.
    for (const auto& bucket : dp->buckets_) {
      auto flat = pack_parameters(bucket, dp->parameters_);
      if (!dp->uses_nccl())
        flat = flat.to(device::cpu()); // the ring carries host memory
      auto ok = dp->uses_nccl() ? dp->nccl_broadcast(flat) : broadcast(group, flat, {.root = 0});
      if (!ok)
        return make_error(ok.error().code(), "{}: copying rank 0's parameters failed: {}", dp->name_,
                          ok.error().message());
      if (group.rank() != 0)
        unpack_parameters(bucket, flat.to(dp->where_), dp->parameters_);
    }
  }
  return data_parallel(std::move(dp));
}

data_parallel::data_parallel(std::unique_ptr<impl> state) : impl_(std::move(state)) {}
data_parallel::~data_parallel() = default;
data_parallel::data_parallel(data_parallel&&) noexcept = default;
data_parallel& data_parallel::operator=(data_parallel&&) noexcept = default;
expected<void> data_parallel::backward(const autograd::variable& loss) { return impl_->backward(loss); }
expected<void> data_parallel::synchronize() { return impl_->synchronize(); }
void data_parallel::set_final_pass(bool final_pass) noexcept { impl_->final_pass_ = final_pass; }
const std::vector<gradient_bucket>& data_parallel::buckets() const noexcept { return impl_->buckets_; }
const nn::named_variables& data_parallel::parameters() const noexcept { return impl_->parameters_; }
reducer_group& data_parallel::group() noexcept { return impl_->group_; }
const std::string& data_parallel::name() const noexcept { return impl_->name_; }
device_reduction data_parallel::reduction() const noexcept {
  return impl_->uses_nccl() ? device_reduction::nccl : device_reduction::host_ring;
}

data_parallel::impl::impl(nn::named_variables parameters, reducer_group group, data_parallel_options options)
    : parameters_(std::move(parameters)), group_(std::move(group)),
      where_(parameters_.empty() ? device::cpu() : parameters_.front().second.data().where()),
      options_(std::move(options)),
      name_(options_.name.empty() ? fmt::format("replica {}", group_.rank()) : options_.name),
      buckets_(plan_buckets(parameters_, options_.buckets)), slot_of_(parameters_.size()),
      trace_name_(trace::intern(
          group_.place_of(group_.rank()).with_name(fmt::format("replica{}", group_.rank())).to_string())),
      trace_reducer_(trace::intern(group_.place_of(group_.rank()).to_string())), trace_backward_(trace::intern("backward")),
      trace_allreduce_(trace::intern("allreduce")) {
  for (const auto& [name, p] : parameters_)
    require(p.data().where() == where_, "{}: parameter {} is on {} but the first one is on {}; a replica's "
            "parameters must share one device", name_, name, p.data().where(), where_);
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t s = 0; s < buckets_[b].slots.size(); ++s)
      slot_of_[buckets_[b].slots[s].parameter] = {b, s};
  state_.resize(buckets_.size());
  reset_pass();
  for (std::size_t k = 0; k < parameters_.size(); ++k)
    hook_ids_.push_back(parameters_[k].second.add_grad_ready_hook([this, k](autograd::variable&) { gradient_ready(k); }));
  reducer_thread_ = std::thread([this] { reduction_loop(); });
}

data_parallel::impl::~impl() {
  for (std::size_t k = 0; k < parameters_.size(); ++k)
    parameters_[k].second.remove_grad_ready_hook(hook_ids_[k]);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  reducer_thread_.join();
}

void data_parallel::impl::reset_pass() {
  // Called with no collective in flight (creation, end of synchronize).
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    auto& st = state_[b];
    st.flat = tensor{};
    st.filled.assign(buckets_[b].slots.size(), false);
    st.pending = buckets_[b].slots.size();
    st.queued = false;
  }
  next_to_queue_ = 0;
  done_ = 0;
}

tensor data_parallel::impl::bucket_buffer(std::size_t b) {
  // Buckets the ring reduces (CPU ones, and CUDA ones reduced through the
  // host) lie in the node's shared arena, where the other replicas of a
  // same-host group read them in place (reducer_group::buffer).
  if (!uses_nccl())
    return group_.buffer({buckets_[b].numel}, buckets_[b].type);
  return tensor::empty({buckets_[b].numel}, buckets_[b].type, where_);
}

void data_parallel::impl::gradient_ready(std::size_t parameter) {
  if (!final_pass_)
    return; // accumulating locally; synchronize() packs the sums
  const auto [b, s] = slot_of_[parameter];
  auto& st = state_[b];
  const auto& slot = buckets_[b].slots[s];
  require(!st.queued && !st.filled[s],
          "{}: the gradient of {} became ready twice before synchronize(); call set_final_pass(false) "
          "for the backward passes that only accumulate",
          name_, parameters_[parameter].first);
  // A fresh buffer per pass (the caching allocator makes it cheap): the
  // previous pass's gradients are views of the old one and stay valid.
  if (!st.flat.defined())
    st.flat = bucket_buffer(b);
  st.flat.slice(0, slot.offset, slot.offset + slot.numel)
    .copy_from(to_bucket(parameters_[parameter].second.grad().reshape({slot.numel})));
  st.filled[s] = true;
  if (--st.pending == 0)
    queue_ready_buckets();
}

void data_parallel::impl::queue_ready_buckets() {
  while (next_to_queue_ < buckets_.size() && state_[next_to_queue_].pending == 0)
    queue(next_to_queue_++);
}

void data_parallel::impl::queue(std::size_t b) {
  auto& st = state_[b];
  // The id is taken here, in bucket order, on the thread that runs backward:
  // the same sequence on every replica.
  st.id = group_.next_id();
  st.queued = true;
  {
    std::lock_guard lock(mutex_);
    work_.push_back(b);
  }
  wake_.notify_all();
}

void data_parallel::impl::reduction_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !work_.empty(); });
    if (work_.empty())
      return; // stopping, nothing queued
    const auto b = work_.front();
    work_.pop_front();
    auto& st = state_[b];
    const bool skip = failure_.has_value(); // the ring is broken: do not wait on it again
    lock.unlock();
    st.started = clock::now();
    expected<void> ok;
    if (!skip) {
      trace::handler_start(trace_reducer_, trace::message_info(trace_allreduce_, {}, buckets_[b].bytes()));
      ok = reduce(b);
      trace::handler_end(trace_reducer_, trace_allreduce_);
    }
    st.finished = clock::now();
    lock.lock();
    if (!ok && !failure_)
      failure_ = make_error(ok.error().code(), "{}: reducing gradient bucket {} failed: {}", name_, b,
                            ok.error().message());
    ++done_;
    wake_.notify_all();
  }
}

expected<void> data_parallel::impl::reduce(std::size_t b) {
  auto& st = state_[b];
#ifdef TROUPE_HAVE_NCCL
  if (nccl_)
    return nccl_->allreduce(st.flat, reduce_op::average);
#endif
  return ring_allreduce(group_, st.flat, {.op = reduce_op::average, .context_id = st.id});
}

expected<void> data_parallel::impl::nccl_broadcast([[maybe_unused]] const tensor& flat) {
#ifdef TROUPE_HAVE_NCCL
  return nccl_->broadcast(flat, 0);
#else
  return make_error(errc::invalid_argument, "{}: no NCCL in this build", name_);
#endif
}

expected<void> data_parallel::impl::backward(const autograd::variable& loss) {
  const auto started = clock::now();
  trace::handler_start(trace_name_, trace::message_info(trace_backward_));
  try {
    autograd::backward(loss);
  } catch (const std::exception& e) {
    // A node of the graph failed (a remote module's host was lost): the
    // pass is half reduced, and the replica cannot go on.
    trace::handler_end(trace_name_, trace_backward_);
    auto why = make_error(errc::io_error, "{}: backward failed: {}", name_, e.what());
    std::lock_guard lock(mutex_);
    if (!failure_)
      failure_ = why;
    return why;
  }
  trace::handler_end(trace_name_, trace_backward_);
  const auto backward_ms = ms(clock::now() - started);
  auto ok = synchronize();
  std::lock_guard lock(mutex_);
  stats_.backward_ms = backward_ms;
  return ok;
}

expected<void> data_parallel::impl::synchronize() {
  const auto backward_end = clock::now();
  {
    std::lock_guard lock(mutex_);
    if (failure_ && done_ == next_to_queue_)
      return *failure_;
  }
  // Buckets backward did not complete: slots whose hook did not fire (an
  // accumulation pass, or a parameter this pass did not use) take the
  // parameter's accumulated gradient, or zeros.
  for (std::size_t b = next_to_queue_; b < buckets_.size(); ++b) {
    auto& st = state_[b];
    if (!st.flat.defined())
      st.flat = bucket_buffer(b);
    for (std::size_t s = 0; s < buckets_[b].slots.size(); ++s) {
      if (st.filled[s])
        continue;
      const auto& slot = buckets_[b].slots[s];
      auto part = st.flat.slice(0, slot.offset, slot.offset + slot.numel);
      auto grad = parameters_[slot.parameter].second.grad();
      if (grad.defined())
        part.copy_from(to_bucket(grad.reshape({slot.numel})));
      else
        part.fill(0.0);
      st.filled[s] = true;
    }
    st.pending = 0;
  }
  queue_ready_buckets();

  std::optional<troupe::error> failed;
  {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return done_ == buckets_.size(); });
    failed = failure_;
  }
  const auto waited = clock::now();
  if (failed) {
    reset_pass();
    return *failed;
  }
  data_parallel_stats stats;
  stats.buckets = buckets_.size();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const auto& st = state_[b];
    stats.bytes += buckets_[b].bytes();
    stats.reduce_ms += ms(st.finished - st.started);
    stats.hidden_ms += ms(std::max(st.started, std::min(st.finished, backward_end)) - st.started);
    for (const auto& slot : buckets_[b].slots) {
      auto averaged = st.flat.slice(0, slot.offset, slot.offset + slot.numel).view(slot.shape);
      if (averaged.where() != where_)
        averaged = averaged.to(where_); // reduced on the host
      parameters_[slot.parameter].second.set_grad(std::move(averaged));
    }
  }
  stats.exposed_ms = ms(waited - backward_end);
  reset_pass();
  std::lock_guard lock(mutex_);
  stats_ = stats;
  return {};
}

data_parallel_stats data_parallel::last_stats() const {
  std::lock_guard lock(impl_->mutex_);
  return impl_->stats_;
}

expected<bool> replicas_identical(reducer_group& group, const std::vector<autograd::variable>& parameters) {
  bool same = true;
  for (const auto& parameter : parameters) {
    // Compared in host memory: the ring carries host tensors.
    const auto mine = parameter.data().contiguous().to(device::cpu());
    auto root = mine.clone();
    if (auto sent = broadcast(group, root, {.root = 0}); !sent)
      return sent.error();
    same = same && std::memcmp(mine.raw_data(), root.raw_data(), mine.nbytes()) == 0;
  }
  auto votes = tensor::full({1}, same ? 1.0 : 0.0, dtype::float64);
  if (auto summed = ring_allreduce(group, votes); !summed)
    return summed.error();
  return votes.item() == static_cast<double>(group.size());
}

} // namespace troupe::parallel
