#pragma once
// A float64 finite-difference gradient checker for autograd functions.
//
// For f(x_1..x_k) with any output shape it draws a fixed random weight w
// shaped like the output and compares grad(sum(f * w)) from autograd against
// central differences (f(x + eps e_j) - f(x - eps e_j)) . w / (2 eps) for every
// element j of every input.
#include <cmath>
#include <functional>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::autograd::testing {

using function_of_inputs = std::function<variable(const std::vector<variable>&)>;

struct gradcheck_options {
  double eps = 1e-6;
  double rtol = 1e-5;
  double atol = 1e-7;
  std::uint64_t seed = 20240607;
};

/// A float64 tensor of standard normal values from a fixed stream.
inline tensor random_tensor(const dims& shape, std::uint64_t seed, double mean = 0.0,
                            double stddev = 1.0) {
  generator gen{seed, 0};
  return randn(shape, gen, mean, stddev, dtype::float64);
}

/// Like random_tensor, with values in [0.5, 0.5 + |N(0,1)|]: safe for log,
/// sqrt and division.
inline tensor positive_tensor(const dims& shape, std::uint64_t seed) {
  return abs(random_tensor(shape, seed)) + 0.5;
}

inline ::testing::AssertionResult gradcheck(const function_of_inputs& f,
                                            const std::vector<tensor>& inputs,
                                            gradcheck_options options = {}) {
  std::vector<tensor> values;
  std::vector<variable> leaves;
  for (const auto& t : inputs) {
    if (t.type() != dtype::float64)
      return ::testing::AssertionFailure() << "gradcheck needs float64 inputs, got "
                                           << fmt::format("{}", t);
    values.push_back(t.clone());
    leaves.emplace_back(values.back(), true);
  }
  auto out = f(leaves);
  if (!out.requires_grad())
    return ::testing::AssertionFailure() << "the output does not require a gradient";
  auto weight = random_tensor(out.shape(), options.seed);
  auto analytic = grad(std::span<const variable>(&out, 1), std::span<const tensor>(&weight, 1),
                       leaves);

  // Numeric: evaluate on plain leaves sharing `values`, perturbed in place.
  no_grad_guard no_grad;
  std::vector<variable> plain;
  for (const auto& t : values)
    plain.emplace_back(t, false);
  auto objective = [&] { return sum(mul(f(plain).data(), weight)).item(); };

  for (std::size_t i = 0; i < values.size(); ++i) {
    auto expected = analytic[i].defined() ? analytic[i].contiguous()
                                          : tensor::zeros(values[i].shape(), dtype::float64);
    if (expected.shape() != values[i].shape())
      return ::testing::AssertionFailure()
             << fmt::format("input {}: gradient shape {} but input shape {}", i, expected.shape(),
                            values[i].shape());
    auto analytic_values = expected.to_vector<double>();
    double* x = values[i].data<double>();
    for (std::int64_t j = 0; j < values[i].numel(); ++j) {
      const double original = x[j];
      x[j] = original + options.eps;
      const double plus = objective();
      x[j] = original - options.eps;
      const double minus = objective();
      x[j] = original;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double got = analytic_values[static_cast<std::size_t>(j)];
      if (!(std::abs(got - numeric) <= options.atol + options.rtol * std::abs(numeric)))
        return ::testing::AssertionFailure()
               << fmt::format("input {} element {}: autograd {} but finite differences {}", i, j,
                              got, numeric);
    }
  }
  return ::testing::AssertionSuccess();
}

} // namespace troupe::autograd::testing
