#pragma once
// The options the one-process training benchmarks share (gpt_step,
// cnn_step): which device, which models, where PyTorch and its peer script
// are, and whether to run the peer at all.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "report.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/device.hpp"

namespace troupe::bench {

struct training_step_options {
  std::string device_name; ///< "cpu" or "cuda:0"
  device where;
  std::vector<std::string> models; ///< as --models listed them
  std::string python;              ///< the interpreter that has PyTorch
  std::string peer_script;         ///< its path, for a build tree copied to another machine
  bool peers = true;               ///< false with --no-peers

  /// Whether --models named `model`.
  bool wants(std::string_view model) const { return std::find(models.begin(), models.end(), model) != models.end(); }
};

/// --device=cpu|cuda:0, --models (a comma-separated list of `known`, by
/// default `default_models`), --python, --peer (by default `default_peer`,
/// under the source tree) and --no-peers. A bad --device or model is said
/// on stderr, naming the option, and gives nullopt (the caller exits 2).
inline std::optional<training_step_options> parse_training_step_options(std::string_view bench, int argc, char** argv,
                                                                        const std::string& default_models,
                                                                        const std::vector<std::string>& known,
                                                                        const std::string& default_peer) {
  training_step_options o;
  o.device_name = option(argc, argv, "device", "cpu");
  if (o.device_name != "cpu" && o.device_name != "cuda:0") {
    std::fprintf(stderr, "%.*s: --device: '%s' is not cpu or cuda:0\n", static_cast<int>(bench.size()), bench.data(),
                 o.device_name.c_str());
    return std::nullopt;
  }
  o.where = o.device_name == "cpu" ? device::cpu() : device::cuda(0);
  const auto models = option(argc, argv, "models", default_models);
  for (std::size_t begin = 0; begin <= models.size();) {
    auto end = std::min(models.find(',', begin), models.size());
    auto name = models.substr(begin, end - begin);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string listed;
      for (const auto& k : known)
        listed += (listed.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "%.*s: --models: '%s' is not one of %s\n", static_cast<int>(bench.size()), bench.data(),
                   name.c_str(), listed.c_str());
      return std::nullopt;
    }
    o.models.push_back(name);
    begin = end + 1;
  }
  o.python = option(argc, argv, "python", "/usr/bin/python3");
  o.peer_script = option(argc, argv, "peer", default_peer);
  for (int i = 1; i < argc; ++i)
    o.peers &= std::string_view(argv[i]) != "--no-peers";
  return o;
}

/// True, having printed a report that says so, when the options ask for a
/// CUDA device this machine lacks: nothing to measure, and the benchmark
/// exits 0.
inline bool said_no_device(const training_step_options& o, const report& out) {
  if (o.where.kind != device_kind::cuda || cuda_device_count() > 0)
    return false;
  out.note("no CUDA device ({}): nothing measured", cuda_unavailable_reason());
  out.print();
  return true;
}

} // namespace troupe::bench
