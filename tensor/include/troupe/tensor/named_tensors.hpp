#pragma once
// An ordered list of named tensors: the currency of state_dicts and
// checkpoint files.
#include <string>
#include <utility>
#include <vector>

#include "troupe/tensor/tensor.hpp"

namespace troupe {

/// Name → tensor pairs in a stable order (parameter registration order), as
/// produced by `module::state_dict()` and optimizer state dicts and written
/// by serialization/checkpoint_file.hpp. Lives here so serialization/ need
/// not depend on autograd/.
using named_tensors = std::vector<std::pair<std::string, tensor>>;

/// The tensor named `name`, or an undefined tensor.
inline tensor find_tensor(const named_tensors& list, const std::string& name) {
  for (const auto& [key, value] : list)
    if (key == name)
      return value;
  return {};
}

} // namespace troupe
