// Joining and splitting, creation (arange, random draws) and comparison.
#include <cmath>
#include <limits>

#include "ops_common.hpp"

namespace troupe {

using namespace detail;

// -- joining and splitting ------------------------------------------------------

tensor cat(const std::vector<tensor>& parts, std::int64_t dim) {
  require(!parts.empty(), "cat: no tensors to concatenate");
  const auto& first = parts.front();
  require_defined("cat", first, "part 0");
  require(first.rank() >= 1, "cat: cannot concatenate rank-0 tensors");
  auto d = normalize_dim(dim, first.rank(), "cat");
  auto shape = first.shape();
  shape[d] = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const auto& part = parts[i];
    require(part.defined(), "cat: part {} is undefined", i);
    require_same_device("cat", first, part);
    require(part.type() == first.type(), "cat: part {} is {} but part 0 is {}", i, part.type(),
            first.type());
    require(part.rank() == first.rank(), "cat: part {} has shape {} but part 0 has {}", i,
            part.shape(), first.shape());
    for (std::int64_t k = 0; k < first.rank(); ++k)
      require(k == d || part.shape()[k] == first.shape()[k],
              "cat: part {} has shape {} but part 0 has {} (dimension {} differs)", i, part.shape(),
              first.shape(), k);
    shape[d] += part.shape()[d];
  }
  backend_for(first.where(), "cat");
  auto out = tensor::empty(shape, first.type(), first.where());
  std::int64_t at = 0;
  for (const auto& part : parts) {
    auto slot = out.narrow(d, at, part.shape()[d]);
    slot.copy_from(part);
    at += part.shape()[d];
  }
  return out;
}

tensor stack(const std::vector<tensor>& parts, std::int64_t dim) {
  require(!parts.empty(), "stack: no tensors to stack");
  require_defined("stack", parts.front(), "part 0");
  auto d = normalize_dim(dim, parts.front().rank() + 1, "stack");
  std::vector<tensor> expanded;
  expanded.reserve(parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    require(parts[i].defined(), "stack: part {} is undefined", i);
    require(parts[i].shape() == parts.front().shape(), "stack: part {} has shape {} but part 0 has {}",
            i, parts[i].shape(), parts.front().shape());
    expanded.push_back(parts[i].unsqueeze(d));
  }
  return cat(expanded, d);
}

std::vector<tensor> split(const tensor& a, std::int64_t size, std::int64_t dim) {
  require_defined("split", a, "input");
  auto d = normalize_dim(dim, a.rank(), "split");
  require(size > 0, "split: piece size must be positive, got {}", size);
  const auto n = a.shape()[d];
  if (n == 0)
    return {a};
  std::vector<tensor> pieces;
  for (std::int64_t start = 0; start < n; start += size)
    pieces.push_back(a.narrow(d, start, std::min(size, n - start)));
  return pieces;
}

std::vector<tensor> chunk(const tensor& a, std::int64_t chunks, std::int64_t dim) {
  require_defined("chunk", a, "input");
  require(chunks > 0, "chunk: number of chunks must be positive, got {}", chunks);
  auto d = normalize_dim(dim, a.rank(), "chunk");
  // torch.chunk: pieces of ceil(n / chunks), so there may be fewer than
  // `chunks` of them.
  const auto n = a.shape()[d];
  return split(a, std::max<std::int64_t>((n + chunks - 1) / chunks, 1), d);
}

// -- creation ---------------------------------------------------------------------

tensor arange(double start, double end, double step, dtype type) {
  require(std::isfinite(start) && std::isfinite(end) && std::isfinite(step) && step != 0.0,
          "arange: invalid range start {} end {} step {}", start, end, step);
  const bool integral_type = type == dtype::int64 || type == dtype::int32;
  require(integral_type || type == dtype::float32 || type == dtype::float64,
          "arange: unsupported dtype {}", type);
  // As documented in ops.hpp: integral results need integral start and step.
  if (integral_type && (start != std::floor(start) || step != std::floor(step)))
    type = dtype::float32;
  const auto count = std::max<double>(0.0, std::ceil((end - start) / step));
  require(count < static_cast<double>(std::numeric_limits<std::int64_t>::max() / 16),
          "arange: range start {} end {} step {} is too long", start, end, step);
  auto n = static_cast<std::int64_t>(count);
  auto values = tensor::empty({n}, dtype::float64);
  auto* v = values.data<double>();
  for (std::int64_t i = 0; i < n; ++i)
    v[i] = start + static_cast<double>(i) * step;
  return values.to(type);
}

namespace {

tensor draw(const char* op, random_distribution what, const dims& shape, generator& gen, double a,
            double b, dtype type, device where) {
  auto& kernels = backend_for(where, op);
  auto out = tensor::empty(shape, type, where);
  kernels.fill_random(what, gen, a, b, out);
  gen.offset += static_cast<std::uint64_t>(out.numel());
  return out;
}

void require_floating_type(const char* op, dtype type) {
  require(type == dtype::float32 || type == dtype::float64, "{}: expected float32 or float64, got {}",
          op, type);
}

} // namespace

tensor rand(const dims& shape, generator& gen, double low, double high, dtype type, device where) {
  require_floating_type("rand", type);
  require(low < high, "rand: empty interval [{}, {})", low, high);
  return draw("rand", random_distribution::uniform, shape, gen, low, high, type, where);
}

tensor randn(const dims& shape, generator& gen, double mean, double stddev, dtype type, device where) {
  require_floating_type("randn", type);
  require(stddev >= 0.0, "randn: negative standard deviation {}", stddev);
  return draw("randn", random_distribution::normal, shape, gen, mean, stddev, type, where);
}

tensor randint(const dims& shape, generator& gen, std::int64_t low, std::int64_t high, device where) {
  require(low < high, "randint: empty interval [{}, {})", low, high);
  // The bounds travel to the kernel as doubles: keep them exact.
  constexpr std::int64_t limit = std::int64_t{1} << 53;
  require(low >= -limit && high <= limit, "randint: bounds [{}, {}) must lie within +-2^53", low,
          high);
  return draw("randint", random_distribution::integer, shape, gen, static_cast<double>(low),
              static_cast<double>(high), dtype::int64, where);
}

// -- comparison ----------------------------------------------------------------------

bool allclose(const tensor& a, const tensor& b, double rtol, double atol) {
  require(a.defined() && b.defined(), "allclose: undefined operand");
  if (a.shape() != b.shape())
    return false;
  auto x = a.to_vector<double>();
  auto y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(std::abs(x[i] - y[i]) <= atol + rtol * std::abs(y[i])))
      return false; // also catches NaN, which compares false
  return true;
}

double max_abs_diff(const tensor& a, const tensor& b) {
  require(a.defined() && b.defined(), "max_abs_diff: undefined operand");
  require(a.shape() == b.shape(), "max_abs_diff: shapes differ: {} and {}", a.shape(), b.shape());
  auto x = a.to_vector<double>();
  auto y = b.to_vector<double>();
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(x[i] - y[i]);
    if (std::isnan(d))
      return d;
    worst = std::max(worst, d);
  }
  return worst;
}

} // namespace troupe
