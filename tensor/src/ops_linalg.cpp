// Matrix products. Layout decisions (transpose flags, leading dimensions)
// belong to the backend; here only shapes, dtypes and devices are checked.
#include "ops_common.hpp"

namespace troupe {

using namespace detail;

namespace {

void check_operands(const char* op, const tensor& a, const tensor& b) {
  require_defined(op, a, "first operand");
  require_defined(op, b, "second operand");
  require_same_device(op, a, b);
  require_same_dtype(op, a, b);
  require_floating(op, a);
}

} // namespace

tensor matmul(const tensor& a, const tensor& b) {
  check_operands("matmul", a, b);
  require(a.rank() == 2 && b.rank() == 2, "matmul: expected 2-D operands, got {} and {}", a.shape(),
          b.shape());
  require(a.shape()[1] == b.shape()[0], "matmul: inner dimensions differ: {} x {}", a.shape(),
          b.shape());
  auto& kernels = backend_for(a.where(), "matmul");
  auto out = tensor::empty({a.shape()[0], b.shape()[1]}, a.type(), a.where());
  kernels.gemm(a, b, out, 1.0, 0.0);
  return out;
}

tensor bmm(const tensor& a, const tensor& b) {
  check_operands("bmm", a, b);
  require(a.rank() == 3 && b.rank() == 3, "bmm: expected 3-D operands, got {} and {}", a.shape(),
          b.shape());
  require(a.shape()[0] == b.shape()[0], "bmm: batch sizes differ: {} x {}", a.shape(), b.shape());
  require(a.shape()[2] == b.shape()[1], "bmm: inner dimensions differ: {} x {}", a.shape(),
          b.shape());
  auto& kernels = backend_for(a.where(), "bmm");
  auto out = tensor::empty({a.shape()[0], a.shape()[1], b.shape()[2]}, a.type(), a.where());
  kernels.bmm(a, b, out);
  return out;
}

void addmm_(tensor& out, const tensor& a, const tensor& b, double alpha, double beta) {
  check_operands("addmm_", a, b);
  require_defined("addmm_", out, "output");
  require_same_device("addmm_", out, a);
  require_same_dtype("addmm_", out, a);
  require(a.rank() == 2 && b.rank() == 2 && out.rank() == 2,
          "addmm_: expected 2-D operands, got {} += {} x {}", out.shape(), a.shape(), b.shape());
  require(a.shape()[1] == b.shape()[0], "addmm_: inner dimensions differ: {} x {}", a.shape(),
          b.shape());
  require(out.shape()[0] == a.shape()[0] && out.shape()[1] == b.shape()[1],
          "addmm_: output shape {} does not match {} x {}", out.shape(), a.shape(), b.shape());
  backend_for(out.where(), "addmm_").gemm(a, b, out, alpha, beta);
}

} // namespace troupe
