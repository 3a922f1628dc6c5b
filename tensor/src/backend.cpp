#include "troupe/tensor/backend.hpp"

#include <array>

#include "cpu_backend.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {

backend::~backend() = default;

void backend::bmm(const tensor& a, const tensor& b, tensor& out) {
  for (std::int64_t i = 0; i < out.size(0); ++i) {
    auto slice = out.select(0, i);
    gemm(a.select(0, i), b.select(0, i), slice, 1.0, 0.0);
  }
}

namespace {

// One slot per device_kind. Registration happens at start-up, before ops
// run, so the table needs no lock.
std::array<backend*, 2>& registry() {
  static detail::cpu_backend cpu;
  static std::array<backend*, 2> table{&cpu, nullptr};
  return table;
}

} // namespace

backend& backend_for(device where, const char* op) {
  auto slot = static_cast<std::size_t>(where.kind);
  auto& table = registry();
  auto* found = slot < table.size() ? table[slot] : nullptr;
  require(found != nullptr, "{}: no backend for device {} in this build", op, where);
  return *found;
}

void register_backend(device_kind kind, backend* implementation) {
  auto slot = static_cast<std::size_t>(kind);
  TROUPE_ASSERT(slot < registry().size(), "register_backend: unknown device kind {}", slot);
  registry()[slot] = implementation;
}

} // namespace troupe
