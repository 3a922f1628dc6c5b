// Which GPU each member of a group holds (gpu_placement.hpp).
#include "gpu_placement.hpp"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/parallel/all_gather.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

namespace {

/// This machine: the kernel's boot id (processes that see the same one see
/// the same GPUs), or the host name where there is none.
std::uint64_t this_machine() {
  std::string id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> id;
  if (id.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    id = name;
  }
  return std::hash<std::string>{}(id);
}

} // namespace

expected<bool> every_member_has_its_own_gpu(reducer_group& group, device where) {
  require(where.kind == device_kind::cuda, "every_member_has_its_own_gpu: {} is not a GPU", where);
  // Three float64 values per member, each exact (the machine's hash in two
  // 32-bit halves), so every member compares the same numbers.
  const auto machine = this_machine();
  auto mine = tensor::from(std::vector<double>{static_cast<double>(machine >> 32),
                                               static_cast<double>(machine & 0xffffffffu),
                                               static_cast<double>(where.index)},
                           {3});
  auto all = all_gather(group, mine);
  if (!all)
    return all.error();
  const auto values = all->to_vector<double>();
  std::set<std::tuple<double, double, double>> gpus;
  for (std::size_t k = 0; k + 2 < values.size(); k += 3)
    if (!gpus.emplace(values[k], values[k + 1], values[k + 2]).second)
      return false;
  return true;
}

} // namespace troupe::parallel
