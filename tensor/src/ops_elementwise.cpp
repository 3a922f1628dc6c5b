// Elementwise ops and broadcasting: check, broadcast by stride-0 expansion,
// then one backend kernel call.
#include <algorithm>

#include "ops_common.hpp"

namespace troupe {

using namespace detail;

dims broadcast_shapes(const dims& a, const dims& b, const char* op) {
  const auto rank = std::max(a.size(), b.size());
  dims out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    // Align from the right; missing leading dimensions count as 1.
    const auto da = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    const auto db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    require(da == db || da == 1 || db == 1, "{}: shapes {} and {} cannot be broadcast", op, a, b);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

tensor sum_to(const tensor& t, const dims& shape) {
  require_defined("sum_to", t, "input");
  if (t.shape() == shape)
    return t;
  require(shape.size() <= t.shape().size() && broadcast_shapes(shape, t.shape(), "sum_to") == t.shape(),
          "sum_to: shape {} does not broadcast to {}", shape, t.shape());
  const auto lead = t.shape().size() - shape.size();
  dims reduce;
  for (std::size_t i = 0; i < t.shape().size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && t.shape()[i] != 1))
      reduce.push_back(static_cast<std::int64_t>(i));
  if (reduce.empty())
    return t.reshape(shape);
  return sum(t, reduce, true).reshape(shape);
}

namespace {

enum class operand_types : std::uint8_t { floating, arithmetic };

tensor binary_elementwise(const char* op, binary_op kind, const tensor& a, const tensor& b,
                          operand_types allowed) {
  require_defined(op, a, "first operand");
  require_defined(op, b, "second operand");
  require_same_device(op, a, b);
  require_same_dtype(op, a, b);
  if (allowed == operand_types::floating)
    require_floating(op, a);
  else
    require_arithmetic(op, a);
  auto shape = broadcast_shapes(a.shape(), b.shape(), op);
  auto& kernels = backend_for(a.where(), op);
  auto out = tensor::empty(shape, a.type(), a.where());
  kernels.binary(kind, a.expand(shape), b.expand(shape), out);
  return out;
}

tensor unary_elementwise(const char* op, unary_op kind, const tensor& a, double scalar,
                         operand_types allowed) {
  require_defined(op, a, "operand");
  if (allowed == operand_types::floating)
    require_floating(op, a);
  else
    require_arithmetic(op, a);
  auto& kernels = backend_for(a.where(), op);
  auto out = tensor::empty(a.shape(), a.type(), a.where());
  kernels.unary(kind, a, scalar, out);
  return out;
}

} // namespace

tensor add(const tensor& a, const tensor& b) {
  return binary_elementwise("add", binary_op::add, a, b, operand_types::arithmetic);
}
tensor sub(const tensor& a, const tensor& b) {
  return binary_elementwise("sub", binary_op::sub, a, b, operand_types::arithmetic);
}
tensor mul(const tensor& a, const tensor& b) {
  return binary_elementwise("mul", binary_op::mul, a, b, operand_types::arithmetic);
}
tensor div(const tensor& a, const tensor& b) {
  return binary_elementwise("div", binary_op::div, a, b, operand_types::floating);
}
tensor maximum(const tensor& a, const tensor& b) {
  return binary_elementwise("maximum", binary_op::maximum, a, b, operand_types::floating);
}
tensor greater(const tensor& a, const tensor& b) {
  return binary_elementwise("greater", binary_op::greater, a, b, operand_types::floating);
}

tensor add(const tensor& a, double b) {
  return unary_elementwise("add", unary_op::add_scalar, a, b, operand_types::arithmetic);
}
tensor mul(const tensor& a, double b) {
  return unary_elementwise("mul", unary_op::mul_scalar, a, b, operand_types::arithmetic);
}
tensor neg(const tensor& a) {
  return unary_elementwise("neg", unary_op::neg, a, 0.0, operand_types::arithmetic);
}

void add_(tensor& a, const tensor& b, double alpha) {
  require_defined("add_", a, "destination");
  require_defined("add_", b, "source");
  require_same_device("add_", a, b);
  require_same_dtype("add_", a, b);
  require_arithmetic("add_", a);
  require(b.rank() <= a.rank() && broadcast_shapes(a.shape(), b.shape(), "add_") == a.shape(),
          "add_: source shape {} does not broadcast to destination shape {}", b.shape(), a.shape());
  backend_for(a.where(), "add_").axpy(a, b.expand(a.shape()), alpha);
}

void mul_(tensor& a, double factor) {
  require_defined("mul_", a, "operand");
  require_arithmetic("mul_", a);
  backend_for(a.where(), "mul_").unary(unary_op::mul_scalar, a, factor, a);
}

tensor where(const tensor& cond, const tensor& a, const tensor& b) {
  require_defined("where", cond, "condition");
  require_defined("where", a, "first operand");
  require_defined("where", b, "second operand");
  require_same_device("where", cond, a);
  require_same_device("where", a, b);
  require_same_dtype("where", a, b);
  require_arithmetic("where", a);
  auto shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  auto& kernels = backend_for(a.where(), "where");
  auto out = tensor::empty(shape, a.type(), a.where());
  kernels.where(cond.expand(shape), a.expand(shape), b.expand(shape), out);
  return out;
}

// -- math -----------------------------------------------------------------------

tensor exp(const tensor& a) {
  return unary_elementwise("exp", unary_op::exp, a, 0.0, operand_types::floating);
}
tensor log(const tensor& a) {
  return unary_elementwise("log", unary_op::log, a, 0.0, operand_types::floating);
}
tensor tanh(const tensor& a) {
  return unary_elementwise("tanh", unary_op::tanh, a, 0.0, operand_types::floating);
}
tensor sqrt(const tensor& a) {
  return unary_elementwise("sqrt", unary_op::sqrt, a, 0.0, operand_types::floating);
}
tensor pow(const tensor& a, double exponent) {
  return unary_elementwise("pow", unary_op::pow, a, exponent, operand_types::floating);
}
tensor abs(const tensor& a) {
  return unary_elementwise("abs", unary_op::abs, a, 0.0, operand_types::arithmetic);
}
tensor relu(const tensor& a) {
  return unary_elementwise("relu", unary_op::relu, a, 0.0, operand_types::floating);
}
tensor gelu(const tensor& a, gelu_approximation approximate) {
  const auto op = approximate == gelu_approximation::tanh ? unary_op::gelu_tanh : unary_op::gelu;
  return unary_elementwise("gelu", op, a, 0.0, operand_types::floating);
}
tensor sigmoid(const tensor& a) {
  return unary_elementwise("sigmoid", unary_op::sigmoid, a, 0.0, operand_types::floating);
}

tensor relu_backward(const tensor& grad, const tensor& input) {
  return binary_elementwise("relu_backward", binary_op::relu_backward, grad, input,
                            operand_types::floating);
}
tensor gelu_backward(const tensor& grad, const tensor& input, gelu_approximation approximate) {
  const auto op = approximate == gelu_approximation::tanh ? binary_op::gelu_tanh_backward : binary_op::gelu_backward;
  return binary_elementwise("gelu_backward", op, grad, input, operand_types::floating);
}
tensor sigmoid_backward(const tensor& grad, const tensor& output) {
  return binary_elementwise("sigmoid_backward", binary_op::sigmoid_backward, grad, output,
                            operand_types::floating);
}
tensor tanh_backward(const tensor& grad, const tensor& output) {
  return binary_elementwise("tanh_backward", binary_op::tanh_backward, grad, output,
                            operand_types::floating);
}

} // namespace troupe
