// Bucket planning and parameter packing (gradient_bucket.hpp).
#include "troupe/parallel/gradient_bucket.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

std::vector<gradient_bucket> plan_buckets(const nn::named_variables& parameters, const bucket_options& options) {
  require(!parameters.empty(), "plan_buckets: the model has no parameters");
  require(options.min_buckets >= 1, "plan_buckets: min_buckets is 0 but must be at least 1");
  std::size_t total = 0;
  for (const auto& [name, p] : parameters)
    total += static_cast<std::size_t>(p.numel()) * size_of(p.type());
  const auto shrunk = std::max(options.first_bucket_bytes, (total + options.min_buckets - 1) / options.min_buckets);
  const auto bucket_cap = std::min(options.bucket_bytes, shrunk);
  std::vector<gradient_bucket> buckets;
  // Reverse registration order approximates the order backward finishes
  // gradients in (output layers first).
  for (std::size_t k = parameters.size(); k-- > 0;) {
    const auto& [name, p] = parameters[k];
    require(p.type() == dtype::float32 || p.type() == dtype::float64,
            "plan_buckets: parameter {} is {}; the reducers add float32 or float64 only", name, p.type());
    const auto bytes = static_cast<std::size_t>(p.numel()) * size_of(p.type());
    // The bucket being filled is capped by first_bucket_bytes while it is
    // the first one.
    const auto cap = buckets.size() == 1 ? std::min(options.first_bucket_bytes, bucket_cap) : bucket_cap;
    const bool fits = !buckets.empty() && buckets.back().type == p.type() && buckets.back().bytes() + bytes <= cap;
    if (!fits)
      buckets.push_back({p.type(), 0, {}});
    auto& b = buckets.back();
    b.slots.push_back({k, b.numel, p.numel(), p.shape()});
    b.numel += p.numel();
  }
  return buckets;
}

tensor pack_parameters(const gradient_bucket& bucket, const nn::named_variables& parameters) {
  auto flat = tensor::empty({bucket.numel}, bucket.type, parameters.at(bucket.slots.front().parameter).second.data().where());
  for (const auto& s : bucket.slots)
    flat.slice(0, s.offset, s.offset + s.numel).copy_from(parameters.at(s.parameter).second.data().reshape({s.numel}));
  return flat;
}

void unpack_parameters(const gradient_bucket& bucket, const tensor& flat, const nn::named_variables& parameters) {
  for (const auto& s : bucket.slots) {
    tensor target = parameters.at(s.parameter).second.data();
    target.copy_from(flat.slice(0, s.offset, s.offset + s.numel).view(s.shape));
  }
}

std::string describe(const gradient_bucket& bucket, const nn::named_variables& parameters) {
  std::string names;
  for (const auto& s : bucket.slots)
    names += (names.empty() ? "" : ", ") + parameters.at(s.parameter).first;
  return fmt::format("{} parameters ({:.2f} MiB, {}): {}", bucket.slots.size(),
                     static_cast<double>(bucket.bytes()) / (1 << 20), bucket.type, names);
}

} // namespace troupe::parallel
