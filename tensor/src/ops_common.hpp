#pragma once
// Private: the argument checks shared by the ops_*.cpp files. Each throws
// usage_error naming the op and the offending values (docs/style.md, tier 2).
#include <vector>

#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::detail {

inline void require_defined(const char* op, const tensor& t, const char* what) {
  require(t.defined(), "{}: {} is undefined", op, what);
}

inline void require_same_device(const char* op, const tensor& a, const tensor& b) {
  require(a.where() == b.where(), "{}: operands are on different devices: {} and {}", op,
          a.where(), b.where());
}

inline void require_same_dtype(const char* op, const tensor& a, const tensor& b) {
  require(a.type() == b.type(), "{}: dtypes differ: {} and {}", op, a.type(), b.type());
}

inline void require_floating(const char* op, const tensor& t) {
  require(t.type() == dtype::float32 || t.type() == dtype::float64,
          "{}: expected float32 or float64, got {}", op, t.type());
}

/// float32, float64, int64 or int32.
inline void require_arithmetic(const char* op, const tensor& t) {
  require(t.type() == dtype::float32 || t.type() == dtype::float64 || t.type() == dtype::int64 ||
              t.type() == dtype::int32,
          "{}: expected float32, float64, int64 or int32, got {}", op, t.type());
}

inline void require_index(const char* op, const tensor& t, const char* what) {
  require_defined(op, t, what);
  require(t.type() == dtype::int64, "{}: {} must be int64, got {}", op, what, t.type());
}

inline void require_rank(const char* op, const tensor& t, std::int64_t rank, const char* what) {
  require(t.rank() == rank, "{}: expected {} of rank {}, got shape {}", op, what, rank, t.shape());
}

/// All values of a CPU int64 tensor, for validation before a kernel runs.
inline std::vector<std::int64_t> index_values(const tensor& index) {
  return index.to_vector<std::int64_t>();
}

/// Checks that every index lies in [0, bound); names the first bad one.
inline void require_indices_below(const char* op, const tensor& index, std::int64_t bound,
                                  std::int64_t dim, const dims& shape) {
  auto values = index_values(index);
  for (std::size_t i = 0; i < values.size(); ++i)
    require(values[i] >= 0 && values[i] < bound,
            "{}: index {} (at position {}) is out of range [0, {}) for dimension {} of {}", op,
            values[i], i, bound, dim, shape);
}

} // namespace troupe::detail
