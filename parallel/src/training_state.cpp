#include "training_state.hpp"

#include <cctype>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/serialization/shard_writer.hpp"

namespace troupe::parallel {

tensor host_copy(const tensor& value, bool snapshot) {
  if (value.where().kind != device_kind::cpu)
    return value.to(device::cpu());
  return snapshot ? value.clone() : value;
}

namespace {

constexpr std::string_view model_prefix = "model.";
constexpr std::string_view optimizer_prefix = "optimizer.";
constexpr std::string_view step_name = "optimizer.step";

tensor_piece whole(std::string name, const tensor& value, bool snapshot) {
  auto kept = host_copy(value, snapshot);
  return split_piece(std::move(name), kept, kept.shape(), -1, 0);
}

error located(const checkpoint_reader& reader, const error& e) {
  return error(e.code(), fmt::format("checkpoint {}: {}", reader.directory().string(), e.message()));
}

/// Whether the checkpoint has tensor `name`, whole of `type` and `shape`.
expected<void> check_saved(const checkpoint_reader& reader, const std::string& name, dtype type, const dims& shape,
                           std::string_view owner) {
  const auto* saved = reader.find(name);
  if (saved == nullptr)
    return make_error(errc::state_mismatch, "checkpoint {} has no tensor '{}' (of the {})",
                      reader.directory().string(), name, owner);
  if (saved->type != type || saved->global_shape != shape)
    return make_error(errc::state_mismatch, "checkpoint {}: '{}' is {} {} there but {} {} in the {}",
                      reader.directory().string(), name, saved->type, saved->global_shape, type, shape, owner);
  return {};
}

/// Whether the checkpoint has tensor `name` with the type and shape
/// `expected_like` has.
expected<void> check_like(const checkpoint_reader& reader, const std::string& name, const tensor& expected_like,
                          std::string_view owner) {
  return check_saved(reader, name, expected_like.type(), expected_like.shape(), owner);
}

/// `optimizer.step`, the optimizer's step count; its absence means the
/// checkpoint holds no optimizer state.
expected<tensor> read_step_count(const checkpoint_reader& reader, std::string_view step = step_name) {
  const std::string name(step);
  if (reader.find(name) == nullptr)
    return make_error(errc::state_mismatch, "checkpoint {} has no optimizer state ('{}')",
                      reader.directory().string(), name);
  auto count = reader.read(name);
  if (!count)
    return located(reader, count.error());
  return count;
}

/// The parameter an optimizer state key `<parameter>.<state>` belongs to:
/// parameter names have dots, state names none. Empty without a dot.
std::string_view parameter_of(std::string_view key) {
  auto dot = key.rfind('.');
  return dot == std::string_view::npos ? std::string_view{} : key.substr(0, dot);
}

/// The saved tensor `name` whole, after check_like.
expected<tensor> read_like(const checkpoint_reader& reader, const std::string& name, const tensor& expected_like,
                           std::string_view owner) {
  if (auto ok = check_like(reader, name, expected_like, owner); !ok)
    return ok.error();
  auto value = reader.read(name);
  if (!value)
    return located(reader, value.error());
  return value;
}

} // namespace

state_names state_names::of_part(std::string_view part) {
  return {fmt::format("{}{}.", model_prefix, part), fmt::format("{}{}.", optimizer_prefix, part),
          fmt::format("{}{}.step", optimizer_prefix, part)};
}

std::vector<tensor_piece> model_pieces(const nn::module& model, bool snapshot, const state_names& names) {
  std::vector<tensor_piece> out;
  for (const auto& [name, value] : model.state_dict())
    out.push_back(whole(names.model + name, value, snapshot));
  return out;
}

std::vector<tensor_piece> optimizer_pieces(const optim::optimizer& optimizer, bool snapshot,
                                           const state_names& names) {
  std::vector<tensor_piece> out;
  for (const auto& [key, value] : optimizer.state_views())
    if (key != "step")
      out.push_back(whole(names.optimizer + key, value, snapshot));
  return out;
}

tensor_piece optimizer_step_piece(const optim::optimizer& optimizer, const state_names& names) {
  auto count = tensor::scalar(static_cast<double>(optimizer.step_count()), dtype::int64);
  return whole(names.step, count, false);
}

expected<void> write_shares(const std::filesystem::path& root, std::uint64_t step, const std::string& writer,
                            std::span<const state_share> shares) {
  shard_writer out(root, step, writer);
  try {
    for (const auto& share : shares)
      for (const auto& piece : share.pieces) {
        if (share.holders.empty())
          out.add(piece);
        else
          out.add(piece, share.holders);
      }
  } catch (const std::exception& e) {
    auto why = make_error(errc::invalid_argument, "checkpoint writer '{}': {}", writer, e.what());
    out.report_failure(why);
    return why;
  }
  auto written = out.write();
  if (!written) {
    out.report_failure(written.error());
    return written.error();
  }
  return {};
}

expected<void> check_model(const checkpoint_reader& reader, const nn::module& model, const state_names& names) {
  for (const auto& [name, value] : model.state_dict())
    if (auto ok = check_like(reader, names.model + name, value, "model"); !ok)
      return ok;
  return {};
}

expected<training_state_values> read_training_state(const checkpoint_reader& reader, const nn::module& model,
                                                    const optim::optimizer& optimizer, const state_names& names) {
  training_state_values out;
  for (const auto& [name, value] : model.state_dict()) {
    auto saved = read_like(reader, names.model + name, value, "model");
    if (!saved)
      return saved.error();
    out.model.emplace_back(name, std::move(*saved));
  }
  auto count = read_step_count(reader, names.step);
  if (!count)
    return count.error();
  std::set<std::string, std::less<>> parameters;
  for (const auto& [name, variable] : optimizer.parameters())
    parameters.insert(name);
  for (const auto& t : reader.manifest().tensors) {
    if (!t.name.starts_with(names.optimizer) || t.name == names.step)
      continue;
    std::string_view key = std::string_view(t.name).substr(names.optimizer.size());
    if (!parameters.contains(parameter_of(key)))
      continue;
    auto value = reader.read(t.name);
    if (!value)
      return located(reader, value.error());
    out.optimizer.emplace_back(std::string(key), std::move(*value));
  }
  out.optimizer.emplace_back("step", std::move(*count));
  return out;
}

expected<void> apply_training_state(training_state_values values, nn::module& model, optim::optimizer& optimizer) {
  if (auto loaded = optimizer.load_state_dict(std::move(values.optimizer)); !loaded)
    return loaded;
  return model.load_state_dict(values.model);
}

std::vector<state_share> sharded_training_shares(nn::module& model, const optim::optimizer& optimizer,
                                                 std::vector<std::string> split_holders,
                                                 std::vector<std::string> whole_holders,
                                                 std::vector<std::string> step_holders, bool snapshot) {
  // [0] this member's pieces, [1] what every member holds whole, [2] the step count
  std::vector<state_share> shares(3);
  shares[0].holders = std::move(split_holders);
  shares[1].holders = std::move(whole_holders);
  shares[2].holders = std::move(step_holders);
  std::map<std::string, tensor, std::less<>> parameters;
  for (auto& [fqn, p] : model.named_parameters())
    parameters.emplace(fqn, p.data());
  // Each parameter's state entries, found once (a parameter of several
  // pieces is visited once per piece).
  std::map<std::string, named_tensors, std::less<>> state_of;
  for (auto& [key, value] : optimizer.state_views())
    if (key != "step")
      state_of[std::string(parameter_of(key))].emplace_back(key, value);
  std::set<std::string, std::less<>> scalars;
  for (const auto& [fqn, shard] : parameter_shards(model)) {
    auto piece_of = [&, &shard = shard](const tensor& local) {
      auto value = shard.dim < 0 ? local : local.narrow(shard.dim, shard.local_offset, shard.size);
      return host_copy(value, snapshot);
    };
    auto& share = shares[shard.dim < 0 ? 1 : 0];
    share.pieces.push_back(split_piece(std::string(model_prefix) + fqn, piece_of(parameters.at(fqn)),
                                       shard.global_shape, shard.dim, shard.offset));
    for (const auto& [key, value] : state_of[fqn]) {
      if (value.shape() == parameters.at(fqn).shape())
        share.pieces.push_back(split_piece(std::string(optimizer_prefix) + key, piece_of(value), shard.global_shape,
                                           shard.dim, shard.offset));
      else if (scalars.insert(key).second) // a per-parameter count (Adam's step): the same on every member
        shares[1].pieces.push_back(whole(std::string(optimizer_prefix) + key, value, snapshot));
    }
  }
  for (const auto& [name, value] : model.state_dict()) // buffers: held whole by every member
    if (!parameters.contains(name))
      shares[1].pieces.push_back(whole(std::string(model_prefix) + name, value, snapshot));
  shares[2].pieces.push_back(optimizer_step_piece(optimizer));
  return shares;
}

expected<training_state_values> read_sharded_training_state(const checkpoint_reader& reader, nn::module& model) {
  auto count = read_step_count(reader);
  if (!count)
    return count.error();
  std::map<std::string, tensor, std::less<>> parameters;
  for (auto& [fqn, p] : model.named_parameters())
    parameters.emplace(fqn, p.data());
  // Each local tensor is assembled from its pieces' regions of the saved whole.
  std::map<std::string, tensor, std::less<>> model_values, optimizer_values;
  auto place = [&](std::map<std::string, tensor, std::less<>>& into, const std::string& key, const tensor& like,
                   const std::string& saved_name, const parameter_shard& shard) -> expected<void> {
    if (auto ok = check_saved(reader, saved_name, like.type(), shard.global_shape, "model"); !ok)
      return ok;
    tensor_region region{dims(shard.global_shape.size(), 0), shard.global_shape};
    if (shard.dim >= 0) {
      region.offset[static_cast<std::size_t>(shard.dim)] = shard.offset;
      region.shape[static_cast<std::size_t>(shard.dim)] = shard.size;
    }
    auto piece = reader.read(saved_name, region);
    if (!piece)
      return located(reader, piece.error());
    auto [it, fresh] = into.try_emplace(key, tensor{});
    if (fresh)
      it->second = tensor::empty(like.shape(), like.type());
    auto target = shard.dim < 0 ? it->second : it->second.narrow(shard.dim, shard.local_offset, shard.size);
    target.copy_from(*piece);
    return {};
  };
  // The saved optimizer state by parameter.
  std::map<std::string, std::vector<const checkpoint_tensor*>, std::less<>> state_of;
  for (const auto& t : reader.manifest().tensors)
    if (t.name.starts_with(optimizer_prefix) && t.name != step_name)
      state_of[std::string(parameter_of(std::string_view(t.name).substr(optimizer_prefix.size())))].push_back(&t);
  for (const auto& [fqn, shard] : parameter_shards(model)) {
    const auto& local = parameters.at(fqn);
    if (auto ok = place(model_values, fqn, local, std::string(model_prefix) + fqn, shard); !ok)
      return ok.error();
    for (const auto* saved : state_of[fqn]) {
      const auto key = saved->name.substr(optimizer_prefix.size());
      if (saved->global_shape.empty()) { // a per-parameter count, saved whole
        auto value = reader.read(saved->name);
        if (!value)
          return located(reader, value.error());
        optimizer_values[key] = std::move(*value);
      } else if (auto ok = place(optimizer_values, key, local, saved->name, shard); !ok) {
        return ok.error();
      }
    }
  }
  training_state_values out;
  for (const auto& [name, value] : model.state_dict()) {
    if (auto it = model_values.find(name); it != model_values.end()) {
      out.model.emplace_back(name, it->second);
      continue;
    }
    auto saved = read_like(reader, std::string(model_prefix) + name, value, "model"); // a buffer, whole
    if (!saved)
      return saved.error();
    out.model.emplace_back(name, std::move(*saved));
  }
  for (auto& [key, value] : optimizer_values)
    out.optimizer.emplace_back(key, std::move(value));
  out.optimizer.emplace_back("step", std::move(*count));
  return out;
}

std::vector<state_share> training_shares(const nn::module& model, const optim::optimizer& optimizer,
                                         std::vector<std::string> state_holders,
                                         std::vector<std::string> step_holders, bool snapshot,
                                         const state_names& names) {
  std::vector<state_share> shares(2);
  shares[0].pieces = model_pieces(model, snapshot, names);
  auto state = optimizer_pieces(optimizer, snapshot, names);
  shares[0].pieces.insert(shares[0].pieces.end(), std::make_move_iterator(state.begin()),
                          std::make_move_iterator(state.end()));
  shares[0].holders = std::move(state_holders);
  shares[1].pieces.push_back(optimizer_step_piece(optimizer, names));
  shares[1].holders = std::move(step_holders);
  return shares;
}

expected<void> save_training_state(nn::module& model, const optim::optimizer& optimizer,
                                   background_writer& thread, save_target target, bool asynchronous) {
  auto copy = [&model, &optimizer, target = std::move(target), asynchronous]() mutable {
    auto shares = target.sharded ? sharded_training_shares(model, optimizer, std::move(target.split_holders),
                                                           std::move(target.state_holders),
                                                           std::move(target.step_holders), asynchronous)
                                 : training_shares(model, optimizer, std::move(target.state_holders),
                                                   std::move(target.step_holders), asynchronous);
    return std::function<expected<void>()>(
      [shares = std::move(shares), root = std::move(target.root), step = target.step,
       writer = std::move(target.writer)] { return write_shares(root, step, writer, shares); });
  };
  if (asynchronous)
    return thread.submit_copy(std::move(copy));
  if (auto previous = thread.wait(); !previous)
    return previous;
  return copy()();
}

expected<void> load_training_state(nn::module& model, optim::optimizer& optimizer, background_writer& thread,
                                   const std::filesystem::path& directory, bool sharded) {
  if (auto previous = thread.wait(); !previous)
    return previous;
  auto reader = checkpoint_reader::open(directory);
  if (!reader)
    return reader.error();
  auto values = sharded ? read_sharded_training_state(*reader, model) : read_training_state(*reader, model, optimizer);
  if (!values)
    return values.error();
  if (auto loaded = apply_training_state(std::move(*values), model, optimizer); !loaded)
    return located(*reader, loaded.error());
  return {};
}

std::vector<std::string> split_names(std::string_view joined) {
  std::vector<std::string> out;
  while (!joined.empty()) {
    auto comma = joined.find(',');
    out.emplace_back(joined.substr(0, comma));
    joined = comma == std::string_view::npos ? std::string_view{} : joined.substr(comma + 1);
  }
  return out;
}

std::string writer_name(std::string_view name) {
  std::string out(name);
  for (auto& c : out)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      c = '-';
  if (out.empty() || out.front() == '.')
    out.insert(out.begin(), 'w');
  return out;
}

background_writer::background_writer() : thread_([this] { run(); }) {}

background_writer::~background_writer() {
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !busy_; });
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

expected<void> background_writer::submit(std::function<expected<void>()> write) {
  return submit_copy([write = std::move(write)]() mutable { return std::move(write); });
}

expected<void> background_writer::write(std::function<expected<void>()> write, bool asynchronous) {
  if (asynchronous)
    return submit(std::move(write));
  if (auto previous = wait(); !previous)
    return previous;
  return write();
}

expected<void> background_writer::submit_copy(std::function<std::function<expected<void>()>()> copy) {
  std::unique_lock lock(mutex_);
  if (auto idle = wait_idle(lock); !idle)
    return idle;
  pending_ = std::move(copy);
  busy_ = copying_ = true;
  changed_.notify_all();
  return {};
}

void background_writer::wait_for_copy() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !copying_; });
}

expected<void> background_writer::wait() {
  std::unique_lock lock(mutex_);
  return wait_idle(lock);
}

expected<void> background_writer::wait_idle(std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [&] { return !busy_; });
  if (!failed_)
    return {};
  auto why = std::move(*failed_);
  failed_.reset();
  return why;
}

void background_writer::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || pending_; });
    if (!pending_)
      return;
    auto copy = std::move(pending_);
    pending_ = nullptr;
    lock.unlock();
    std::function<expected<void>()> write;
    expected<void> done = make_error(errc::io_error, "checkpoint write threw");
    try {
      write = copy();
    } catch (const std::exception& e) {
      done = make_error(errc::io_error, "checkpoint copy: {}", e.what());
    }
    lock.lock();
    copying_ = false; // the state may change now
    changed_.notify_all();
    lock.unlock();
    if (write) {
      try {
        done = write();
      } catch (const std::exception& e) {
        done = make_error(errc::io_error, "checkpoint write: {}", e.what());
      }
    }
    lock.lock();
    if (!done)
      failed_ = done.error();
    busy_ = false;
    changed_.notify_all();
  }
}

} // namespace troupe::parallel
