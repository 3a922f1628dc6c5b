#pragma once
// A program's `--name=value` flags, read strictly: the one parser behind
// troupe::job's flags, the examples and the benchmarks. Each value is
// checked when it is read; a bad value or an argument nobody read is
// collected as a usage error naming the flag, the value and what was
// expected, and finish() reports them all at once ("--steps is 'x' but must
// be an integer in [1, 1000000]; unknown argument '--stpes=5'").
// `--troupe.*` arguments belong to the node (actors/node_options.hpp) and
// are never "unknown" here.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe {

class command_line {
public:
  command_line(int argc, const char* const* argv);

  /// `--name=value` as an integer in [low, high]; `fallback` when absent.
  std::int64_t integer(std::string_view name, std::int64_t fallback, std::int64_t low, std::int64_t high);
  /// `--name=value` as a finite number in [low, high]; `fallback` when absent.
  double number(std::string_view name, double fallback, double low, double high);
  /// `--name=value` as one of `allowed`; `fallback` when absent.
  std::string choice(std::string_view name, std::string fallback, const std::vector<std::string>& allowed);
  /// `--name=value` as given; `fallback` when absent.
  std::string text(std::string_view name, std::string fallback);
  /// `--name=cpu` or `--name=cuda:N`, a device this machine has (a CUDA
  /// ordinal it lacks is a usage error saying why); `fallback` when absent.
  troupe::device device_here(std::string_view name, troupe::device fallback);
  /// `--name=1,2,4`: positive integers; `fallback` when absent.
  std::vector<std::int64_t> integers(std::string_view name, std::vector<std::int64_t> fallback);
  /// The switch `--name` (no value) is present.
  bool has(std::string_view name);

  /// Records a usage error of the program's own (a flag that depends on
  /// another); finish() reports it with the others.
  void reject(std::string message);
  /// Call after reading every flag: the collected errors, each unread
  /// argument among them, as one invalid_argument error; none: success.
  expected<void> finish();

  /// The usage errors so far (bad values, reject()), without the check for
  /// unread arguments: for programs that list their flags themselves.
  const std::vector<std::string>& rejected() const { return errors_; }

  /// The program's name (argv[0] without its directory), for messages.
  const std::string& program() const { return program_; }

private:
  /// The value of `--name=...`, marking the argument read.
  const std::string* take(std::string_view name);

  std::string program_;
  std::vector<std::string> args_;
  std::set<std::size_t> used_;
  std::vector<std::string> errors_;
};

} // namespace troupe
