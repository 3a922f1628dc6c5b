// A distributed checkpoint saved at one layout and loaded at another. Three
// writers (in a job: three actors, each writing its own shard in parallel)
// hold a small model tensor-parallel style: fc1.weight split by rows over
// ranks 0-1, fc2.weight split by columns over ranks 0-2, and optimizer.steps
// replicated on all three (written once, by the holder its name hashes to).
// The coordinator commits; a reader then loads fc2.weight split by rows
// instead, and the whole of every tensor.
//
//   build/examples/sharded_checkpoint --dir=/tmp/ckpt
//   build/bin/troupe-checkpoint inspect /tmp/ckpt
//
// prints:
//   committed /tmp/ckpt/step-100: 3 tensors in 3 shard files   (step-200 when run again)
//   fc2.weight rows 0-1 of [4, 9]: 0 0.333333 0.666667 1 ...
//   fc2.weight rows 2-3 of [4, 9]: 6 6.33333 6.66667 7 ...
//   fc1.weight [6, 5] sum 18.75, fc2.weight [4, 9] sum 210, optimizer.steps [5] sum -5.49755e+12
// Element i of each tensor is i * 0.25 - 3 (float32), i / 3 (float64) or
// i * 1000003 - 2^40 (int64): tests/serialization/read_safetensors.py
// checks the exported values against the same formulas.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "troupe/command_line.hpp"
#include "troupe/serialization/checkpoint_directory.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/serialization/shard_writer.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;

namespace {

int fail(const error& e) { return fmt::print(stderr, "sharded_checkpoint: {}\n", e.message()), 1; }

} // namespace

int main(int argc, char** argv) {
  command_line cli(argc, argv);
  const std::string root = cli.text("dir", "/tmp/troupe-sharded-checkpoint");
  if (auto usage = cli.finish(); !usage)
    return fmt::print(stderr, "sharded_checkpoint: {}\n", usage.error().message()), 2;

  // The step after the latest checkpoint's, so that every run saves anew.
  std::uint64_t step = 100;
  auto latest = latest_checkpoint(root);
  if (!latest)
    return fail(latest.error());
  if (*latest)
    if (auto previous = checkpoint_reader::open(**latest))
      step = previous->step() + 100;
  // Element i: i * 0.25 - 3, i / 3 and i * 1000003 - 2^40.
  auto fc1 = add(mul(arange(0, 30, 1, dtype::float32), 0.25), -3.0).reshape({6, 5});
  auto fc2 = div(arange(0, 36, 1, dtype::float64), tensor::scalar(3.0, dtype::float64)).reshape({4, 9});
  auto steps = add(mul(arange(0, 5, 1, dtype::int64), 1000003), -1099511627776.0);
  const std::vector<std::string> ranks{"rank-0", "rank-1", "rank-2"};
  std::vector<checkpoint_tensor> written; // what the coordinator collects
  for (std::int64_t r = 0; r < 3; ++r) {
    shard_writer writer(root, step, ranks[static_cast<std::size_t>(r)]);
    if (r < 2)
      writer.add(split_piece("fc1.weight", fc1.narrow(0, 3 * r, 3), fc1.shape(), 0, 3 * r));
    writer.add(split_piece("fc2.weight", fc2.narrow(1, 3 * r, 3), fc2.shape(), 1, 3 * r));
    writer.add(split_piece("optimizer.steps", steps, steps.shape(), -1, 0), ranks);
    auto pieces = writer.write();
    if (!pieces)
      return fail(pieces.error());
    written.insert(written.end(), pieces->begin(), pieces->end());
  }
  commit_options options;
  options.step = step;
  options.metadata = {{"data_position", "batch 1600"}};
  options.keep_last = 2;
  auto committed = commit_checkpoint(root, written, options);
  if (!committed)
    return fail(committed.error());
  fmt::print("committed {}: 3 tensors in 3 shard files\n", committed->string());

  auto reader = checkpoint_reader::open(*committed);
  if (!reader)
    return fail(reader.error());
  for (std::int64_t row = 0; row < 4; row += 2) {
    auto rows = reader->read("fc2.weight", {{row, 0}, {2, 9}}); // split by rows now
    if (!rows)
      return fail(rows.error());
    auto values = rows->to_vector<double>();
    fmt::print("fc2.weight rows {}-{} of [4, 9]: {:g} ...\n", row, row + 1,
               fmt::join(values.begin(), values.begin() + 4, " "));
  }
  std::vector<std::string> sums;
  for (const auto& t : reader->manifest().tensors) {
    auto whole = reader->read(t.name);
    if (!whole)
      return fail(whole.error());
    double sum = 0;
    for (auto x : whole->to_vector<double>())
      sum += x;
    sums.push_back(fmt::format("{} {} sum {:g}", t.name, t.global_shape, sum));
  }
  fmt::print("{}\n", fmt::join(sums, ", "));
  return 0;
}
