#include "training_state.hpp"

#include <cctype>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "troupe/serialization/shard_writer.hpp"

namespace troupe::parallel {

namespace {

constexpr std::string_view model_prefix = "model.";
constexpr std::string_view optimizer_prefix = "optimizer.";
constexpr std::string_view step_name = "optimizer.step";

tensor_piece whole(std::string name, const tensor& value, bool snapshot) {
  auto kept = snapshot ? value.clone() : value;
  return split_piece(std::move(name), kept, kept.shape(), -1, 0);
}

error located(const checkpoint_reader& reader, const error& e) {
  return error(e.code(), fmt::format("checkpoint {}: {}", reader.directory().string(), e.message()));
}

/// Whether the checkpoint has tensor `name` with the type and shape
/// `expected_like` has.
expected<void> check_like(const checkpoint_reader& reader, const std::string& name, const tensor& expected_like,
                          std::string_view owner) {
  const auto* saved = reader.find(name);
  if (saved == nullptr)
    return make_error(errc::state_mismatch, "checkpoint {} has no tensor '{}' (of the {})",
                      reader.directory().string(), name, owner);
  if (saved->type != expected_like.type() || saved->global_shape != expected_like.shape())
    return make_error(errc::state_mismatch, "checkpoint {}: '{}' is {} {} there but {} {} in the {}",
                      reader.directory().string(), name, saved->type, saved->global_shape, expected_like.type(),
                      expected_like.shape(), owner);
  return {};
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

std::vector<tensor_piece> model_pieces(const nn::module& model, bool snapshot) {
  std::vector<tensor_piece> out;
  for (const auto& [name, value] : model.state_dict())
    out.push_back(whole(std::string(model_prefix) + name, value, snapshot));
  return out;
}

std::vector<tensor_piece> optimizer_pieces(const optim::optimizer& optimizer) {
  std::vector<tensor_piece> out;
  for (const auto& [key, value] : optimizer.state_dict())
    if (key != "step")
      out.push_back(whole(std::string(optimizer_prefix) + key, value, false));
  return out;
}

tensor_piece optimizer_step_piece(const optim::optimizer& optimizer) {
  auto count = tensor::scalar(static_cast<double>(optimizer.step_count()), dtype::int64);
  return whole(std::string(step_name), count, false);
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

expected<void> check_model(const checkpoint_reader& reader, const nn::module& model) {
  for (const auto& [name, value] : model.state_dict())
    if (auto ok = check_like(reader, std::string(model_prefix) + name, value, "model"); !ok)
      return ok;
  return {};
}

expected<training_state_values> read_training_state(const checkpoint_reader& reader, const nn::module& model,
                                                    const optim::optimizer& optimizer) {
  training_state_values out;
  for (const auto& [name, value] : model.state_dict()) {
    auto saved = read_like(reader, std::string(model_prefix) + name, value, "model");
    if (!saved)
      return saved.error();
    out.model.emplace_back(name, std::move(*saved));
  }
  if (reader.find(step_name) == nullptr)
    return make_error(errc::state_mismatch, "checkpoint {} has no optimizer state ('{}')",
                      reader.directory().string(), step_name);
  std::set<std::string, std::less<>> parameters;
  for (const auto& [name, variable] : optimizer.parameters())
    parameters.insert(name);
  for (const auto& t : reader.manifest().tensors) {
    if (!t.name.starts_with(optimizer_prefix) || t.name == step_name)
      continue;
    // `<parameter>.<state>`: parameter names have dots, state names none.
    std::string_view key = std::string_view(t.name).substr(optimizer_prefix.size());
    auto dot = key.rfind('.');
    if (dot == std::string_view::npos || !parameters.contains(key.substr(0, dot)))
      continue;
    auto value = reader.read(t.name);
    if (!value)
      return located(reader, value.error());
    out.optimizer.emplace_back(std::string(key), std::move(*value));
  }
  auto count = reader.read(step_name);
  if (!count)
    return located(reader, count.error());
  out.optimizer.emplace_back("step", std::move(*count));
  return out;
}

expected<void> apply_training_state(const training_state_values& values, nn::module& model,
                                    optim::optimizer& optimizer) {
  if (auto loaded = optimizer.load_state_dict(values.optimizer); !loaded)
    return loaded;
  return model.load_state_dict(values.model);
}

std::vector<state_share> training_shares(const nn::module& model, const optim::optimizer& optimizer,
                                         std::vector<std::string> state_holders,
                                         std::vector<std::string> step_holders, bool snapshot) {
  std::vector<state_share> shares(2);
  shares[0].pieces = model_pieces(model, snapshot);
  auto state = optimizer_pieces(optimizer);
  shares[0].pieces.insert(shares[0].pieces.end(), std::make_move_iterator(state.begin()),
                          std::make_move_iterator(state.end()));
  shares[0].holders = std::move(state_holders);
  shares[1].pieces.push_back(optimizer_step_piece(optimizer));
  shares[1].holders = std::move(step_holders);
  return shares;
}

expected<void> save_training_state(const nn::module& model, const optim::optimizer& optimizer,
                                   background_writer& thread, save_target target, bool asynchronous) {
  auto shares = training_shares(model, optimizer, std::move(target.state_holders),
                                std::move(target.step_holders), asynchronous);
  auto write = [shares = std::move(shares), root = std::move(target.root), step = target.step,
                writer = std::move(target.writer)] { return write_shares(root, step, writer, shares); };
  if (asynchronous)
    return thread.submit(std::move(write));
  if (auto previous = thread.wait(); !previous)
    return previous;
  return write();
}

expected<void> load_training_state(nn::module& model, optim::optimizer& optimizer, background_writer& thread,
                                   const std::filesystem::path& directory) {
  if (auto previous = thread.wait(); !previous)
    return previous;
  auto reader = checkpoint_reader::open(directory);
  if (!reader)
    return reader.error();
  auto values = read_training_state(*reader, model, optimizer);
  if (!values)
    return values.error();
  if (auto loaded = apply_training_state(*values, model, optimizer); !loaded)
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
  std::unique_lock lock(mutex_);
  if (auto idle = wait_idle(lock); !idle)
    return idle;
  pending_ = std::move(write);
  busy_ = true;
  changed_.notify_all();
  return {};
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
    auto write = std::move(pending_);
    pending_ = nullptr;
    lock.unlock();
    expected<void> done = make_error(errc::io_error, "checkpoint write threw");
    try {
      done = write();
    } catch (const std::exception& e) {
      done = make_error(errc::io_error, "checkpoint write: {}", e.what());
    }
    lock.lock();
    if (!done)
      failed_ = done.error();
    busy_ = false;
    changed_.notify_all();
  }
}

} // namespace troupe::parallel
