#pragma once
// Gradient buckets for data parallelism (issue 5): parameters grouped so that
// one collective moves many small gradients at once, in reverse order of
// registration — backward produces the last layers' gradients first, so the
// first bucket fills first and starts reducing while backward still runs on
// earlier layers (PyTorch DDP's reducer does the same).
//
// Every replica computes the same plan from the same parameter list, so the
// buckets, their layouts and the order they are reduced in agree without any
// message. A bucket holds one dtype; a parameter larger than the cap gets a
// bucket of its own. The first bucket has its own, smaller cap so the first
// collective starts early in backward.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel {

struct bucket_options {
  /// Cap on a bucket's bytes (PyTorch's bucket_cap_mb, 25 MiB).
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Cap on the first bucket (the last layers'), so reduction starts early.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  /// A model smaller than min_buckets x bucket_bytes is still split into
  /// about this many buckets: the cap shrinks to the model's bytes /
  /// min_buckets (never below first_bucket_bytes). With 25 MiB buckets a
  /// 32 MiB model was two buckets, the second complete only at the end of
  /// backward, so most of its reduction could not overlap anything. 1: the
  /// cap is bucket_bytes whatever the model's size (PyTorch DDP's rule).
  std::size_t min_buckets = 4;
};

/// One parameter's place in a bucket's flat buffer.
struct bucket_slot {
  std::size_t parameter = 0; ///< index into the parameter list
  std::int64_t offset = 0;   ///< first element in the bucket
  std::int64_t numel = 0;
  dims shape;
};

struct gradient_bucket {
  dtype type = dtype::float32;
  std::int64_t numel = 0;
  std::vector<bucket_slot> slots; ///< in the order their gradients are expected
  std::size_t bytes() const { return static_cast<std::size_t>(numel) * size_of(type); }
};

/// Groups `parameters` (nn::module::named_parameters order) into buckets.
/// Throws usage_error for an empty list, a dtype other than float32 or
/// float64 (what the reducers add), or min_buckets 0.
std::vector<gradient_bucket> plan_buckets(const nn::named_variables& parameters, const bucket_options& options = {});

/// A flat tensor of the bucket's size holding each parameter's current data
/// (to broadcast parameters), and the way back.
tensor pack_parameters(const gradient_bucket& bucket, const nn::named_variables& parameters);
void unpack_parameters(const gradient_bucket& bucket, const tensor& flat, const nn::named_variables& parameters);

/// "bucket 2: 3 parameters (4.0 MiB): 0.weight, 0.bias, 2.weight".
std::string describe(const gradient_bucket& bucket, const nn::named_variables& parameters);

} // namespace troupe::parallel
