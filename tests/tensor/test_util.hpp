#pragma once
// Helpers shared by the tensor tests: deterministic inputs, float64
// references and finite differences.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "troupe/tensor/ops.hpp"

namespace troupe::test {

/// A tensor of the given shape and dtype holding `values` (row-major).
inline tensor make(const std::vector<double>& values, const dims& shape,
                   dtype type = dtype::float64) {
  return tensor::from(values, shape).to(type);
}

/// Reproducible values in [-1, 1) (a fixed Philox stream per seed).
inline tensor sample(const dims& shape, std::uint64_t seed = 1, dtype type = dtype::float64) {
  generator gen{seed, 0};
  return rand(shape, gen, -1.0, 1.0, dtype::float64).to(type);
}

inline std::vector<double> values(const tensor& t) {
  return t.to_vector<double>();
}

/// Element-by-element comparison with an absolute-plus-relative tolerance.
inline void expect_close(const tensor& actual, const std::vector<double>& expected, double tol) {
  auto got = values(actual);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], tol * (1.0 + std::abs(expected[i]))) << "at element " << i;
}

inline void expect_close(const tensor& actual, const tensor& expected, double tol) {
  ASSERT_EQ(actual.shape(), expected.shape());
  expect_close(actual, values(expected), tol);
}

/// Central finite differences of a scalar function of a float64 tensor.
inline std::vector<double> numeric_gradient(const std::function<double(const tensor&)>& f,
                                            const tensor& x, double eps = 1e-6) {
  std::vector<double> grad(static_cast<std::size_t>(x.numel()));
  auto base = values(x);
  for (std::size_t i = 0; i < base.size(); ++i) {
    auto plus = base;
    auto minus = base;
    plus[i] += eps;
    minus[i] -= eps;
    grad[i] = (f(make(plus, x.shape())) - f(make(minus, x.shape()))) / (2 * eps);
  }
  return grad;
}

/// sum(a * w) as a double: a scalar loss whose gradient with respect to a is w.
inline double weighted_sum(const tensor& a, const tensor& w) {
  return sum(mul(a, w)).item();
}

/// The message of the usage_error that `f` throws (fails the test if none).
template <class F> std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const usage_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected usage_error";
  return {};
}

} // namespace troupe::test
