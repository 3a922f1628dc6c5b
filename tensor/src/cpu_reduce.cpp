// CPU row reductions, softmax, causal softmax and cross-entropy. Sums go through row_sum (cpu_backend.hpp),
// whose order depends only on the row length; softmax goes to the AVX2 row
// kernels of cpu_vector_math.hpp where the CPU has them, and the loops
// below are its scalar path (TROUPE_VECTOR_MATH=off).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cpu_backend.hpp"
#include "cpu_vector_math.hpp"
#include "dispatch.hpp"
#include "troupe/tensor/parallel_for.hpp"

namespace troupe::detail {

namespace {

/// Rows per intra-op range for rows of `cols` exponentials: about 4K.
std::int64_t rows_grain(std::int64_t cols) {
  return std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(cols, 1));
}

template <class T> bool is_nan(T x) {
  return x != x; // NOLINT: true only for floating NaN
}

/// y[j] = exp(y[j]) over a contiguous row (the scalar path).
template <class T> void exp_in_place(T* y, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j)
    y[j] = std::exp(y[j]);
}

} // namespace

void cpu_backend::reduce_rows(reduce_op op, const tensor& a, tensor& values, tensor& indices) {
  const auto rows = a.size(0);
  const auto cols = a.size(1);
  const auto row_stride = a.strides()[0];
  const auto col_stride = a.strides()[1];
  dispatch_arithmetic(a.type(), "cpu reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = base_of<T>(a) + a.offset();
    T* v = values.data<T>();
    std::int64_t* at = indices.defined() ? indices.data<std::int64_t>() : nullptr;
    if (op == reduce_op::sum && row_stride == 1 && col_stride != 1 && rows > 1) {
      if constexpr (std::is_floating_point_v<T>)
        if (vector_math::available()) { // the same sums, the blocks in vector lanes
          // A tile of the rows at a time (side_by_side_tile_bytes).
          const std::int64_t tile = std::min<std::int64_t>(rows, side_by_side_tile_bytes / sizeof(T));
          std::vector<T> lanes(static_cast<std::size_t>(8 * tile));
          auto block = [&](const T* first, std::int64_t count, T* sums) {
            for (std::int64_t r0 = 0; r0 < rows; r0 += tile)
              vector_math::side_by_side_block(first + r0, std::min(tile, rows - r0), count, col_stride, lanes.data(),
                                              sums + r0);
          };
          pairwise_side_by_side(x, rows, cols, col_stride, v, block);
          return;
        }
      row_sums_side_by_side(x, rows, cols, col_stride, v); // same sums, read a line at a time
      return;
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * row_stride;
      if (op == reduce_op::sum) {
        v[r] = row_sum(row, cols, col_stride);
        continue;
      }
      // max: the first maximum wins; a NaN counts as the maximum (torch).
      T best = row[0];
      std::int64_t best_at = 0;
      for (std::int64_t j = 1; j < cols && !is_nan(best); ++j) {
        const T y = row[j * col_stride];
        if (y > best || is_nan(y)) {
          best = y;
          best_at = j;
        }
      }
      v[r] = best;
      if (at != nullptr)
        at[r] = best_at;
    }
  });
}

void cpu_backend::softmax(const tensor& a, bool log, tensor& out) {
  const auto rows = a.size(0);
  const auto cols = a.size(1);
  dispatch_floating(a.type(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = a.data<T>();
    T* y = out.data<T>();
    parallel_for(rows, rows_grain(cols), [&](std::int64_t first, std::int64_t last) {
      if (vector_math::available()) {
        vector_math::softmax_rows(x + first * cols, y + first * cols, last - first, cols, log);
        return;
      }
      for (std::int64_t r = first; r < last; ++r) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        T top = xr[0];
        for (std::int64_t j = 1; j < cols; ++j)
          top = std::max(top, xr[j]);
        for (std::int64_t j = 0; j < cols; ++j)
          yr[j] = xr[j] - top;
        exp_in_place(yr, cols);
        const T total = row_sum(yr, cols, 1);
        if (log) {
          const T shift = top + std::log(total);
          for (std::int64_t j = 0; j < cols; ++j)
            yr[j] = xr[j] - shift;
        } else {
          const T inv = T(1) / total;
          for (std::int64_t j = 0; j < cols; ++j)
            yr[j] *= inv;
        }
      }
    });
  });
}

void cpu_backend::softmax_backward(const tensor& grad, const tensor& output, bool log,
                                   tensor& out) {
  const auto rows = grad.size(0);
  const auto cols = grad.size(1);
  dispatch_floating(grad.type(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad.data<T>();
    const T* y = output.data<T>();
    T* dx = out.data<T>();
    parallel_for(rows, rows_grain(cols), [&](std::int64_t first, std::int64_t last) {
      if (vector_math::available()) {
        const auto at = first * cols;
        vector_math::softmax_backward_rows(g + at, y + at, dx + at, last - first, cols, log);
        return;
      }
      for (std::int64_t r = first; r < last; ++r) {
        const T* gr = g + r * cols;
        const T* yr = y + r * cols;
        T* dr = dx + r * cols;
        if (log) {
          // y = log softmax(x): dx = g - softmax(x) * sum(g).
          const T total = row_sum(gr, cols, 1);
          std::copy(yr, yr + cols, dr);
          exp_in_place(dr, cols);
          for (std::int64_t j = 0; j < cols; ++j)
            dr[j] = gr[j] - dr[j] * total;
        } else {
          // y = softmax(x): dx = y * (g - <g, y>).
          for (std::int64_t j = 0; j < cols; ++j)
            dr[j] = gr[j] * yr[j];
          const T dot = row_sum(dr, cols, 1);
          for (std::int64_t j = 0; j < cols; ++j)
            dr[j] = yr[j] * (gr[j] - dot);
        }
      }
    });
  });
}

template <class T>
void causal_softmax_range(const T* x, T* y, std::int64_t rows, std::int64_t queries, std::int64_t cols, T scale) {
  if (vector_math::available()) {
    vector_math::causal_softmax_rows(x, y, rows, queries, cols, scale);
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const auto kept = std::min(r % queries + 1, cols);
    const T top = *std::max_element(xr, xr + kept); // scale > 0: max of scale x is scale top
    for (std::int64_t j = 0; j < kept; ++j)
      yr[j] = (xr[j] - top) * scale;
    exp_in_place(yr, kept);
    const T inv = T(1) / row_sum(yr, kept, 1);
    for (std::int64_t j = 0; j < kept; ++j)
      yr[j] *= inv;
    std::fill(yr + kept, yr + cols, T(0));
  }
}

template <class T>
void causal_softmax_backward_range(const T* g, const T* y, T* dx, std::int64_t rows, std::int64_t queries,
                                   std::int64_t cols, T scale) {
  if (vector_math::available()) {
    vector_math::causal_softmax_backward_rows(g, y, dx, rows, queries, cols, scale);
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* gr = g + r * cols;
    const T* yr = y + r * cols;
    T* dr = dx + r * cols;
    const auto kept = std::min(r % queries + 1, cols);
    // dr may be gr (the attention's backward works in place), so the
    // products are summed from a buffer of their own.
    thread_local std::vector<T> products;
    products.resize(static_cast<std::size_t>(kept));
    for (std::int64_t j = 0; j < kept; ++j)
      products[static_cast<std::size_t>(j)] = gr[j] * yr[j];
    const T dot = row_sum(products.data(), kept, 1);
    for (std::int64_t j = 0; j < kept; ++j)
      dr[j] = yr[j] * (gr[j] - dot) * scale;
    std::fill(dr + kept, dr + cols, T(0));
  }
}

template void causal_softmax_range(const float*, float*, std::int64_t, std::int64_t, std::int64_t, float);
template void causal_softmax_range(const double*, double*, std::int64_t, std::int64_t, std::int64_t, double);
template void causal_softmax_backward_range(const float*, const float*, float*, std::int64_t, std::int64_t,
                                            std::int64_t, float);
template void causal_softmax_backward_range(const double*, const double*, double*, std::int64_t, std::int64_t,
                                            std::int64_t, double);

void cpu_backend::causal_softmax(const tensor& a, std::int64_t queries, double scale, tensor& out) {
  const auto rows = a.size(0);
  const auto cols = a.size(1);
  dispatch_floating(a.type(), "causal_softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = a.data<T>();
    T* y = out.data<T>();
    // Ranges of whole [queries, keys] matrices: a row's mask is its index
    // modulo `queries`.
    parallel_for(
        rows, std::max(queries, rows_grain(cols)),
        [&](std::int64_t first, std::int64_t last) {
          causal_softmax_range(x + first * cols, y + first * cols, last - first, queries, cols, static_cast<T>(scale));
        },
        queries);
  });
}

void cpu_backend::causal_softmax_backward(const tensor& grad, const tensor& output, std::int64_t queries,
                                          double scale, tensor& out) {
  const auto rows = grad.size(0);
  const auto cols = grad.size(1);
  dispatch_floating(grad.type(), "causal_softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad.data<T>();
    const T* y = output.data<T>();
    T* dx = out.data<T>();
    parallel_for(
        rows, std::max(queries, rows_grain(cols)),
        [&](std::int64_t first, std::int64_t last) {
          const auto at = first * cols;
          causal_softmax_backward_range(g + at, y + at, dx + at, last - first, queries, cols, static_cast<T>(scale));
        },
        queries);
  });
}

void cpu_backend::cross_entropy(const tensor& logits, const tensor& targets, tensor& loss,
                                tensor& log_sum_exp) {
  const auto rows = logits.size(0);
  const auto cols = logits.size(1);
  const auto* at = base_of<std::int64_t>(targets) + targets.offset();
  const auto step = targets.strides()[0];
  dispatch_floating(logits.type(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = logits.data<T>();
    T* lse = log_sum_exp.data<T>();
    parallel_for(rows, rows_grain(cols), [&](std::int64_t first, std::int64_t last) {
      if (vector_math::available()) {
        vector_math::log_sum_exp_rows(x + first * cols, lse + first, last - first, cols);
      } else {
        for (std::int64_t r = first; r < last; ++r) {
          const T* xr = x + r * cols;
          const T top = *std::max_element(xr, xr + cols);
          T lane[8] = {};
          for (std::int64_t j = 0; j < cols; ++j)
            lane[j % 8] += std::exp(xr[j] - top);
          lse[r] =
              top + std::log(((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])));
        }
      }
    });
    // The rows' losses summed in double, eight lanes by row: their order
    // depends only on the row count.
    double lane[8] = {};
    for (std::int64_t r = 0; r < rows; ++r)
      lane[r % 8] += static_cast<double>(lse[r]) - static_cast<double>(x[r * cols + at[r * step]]);
    const double total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    *loss.data<T>() = static_cast<T>(total / static_cast<double>(rows));
  });
}

void cpu_backend::cross_entropy_backward(const tensor& grad, const tensor& logits, const tensor& targets,
                                         const tensor& log_sum_exp, tensor& out) {
  const auto rows = logits.size(0);
  const auto cols = logits.size(1);
  const auto* at = base_of<std::int64_t>(targets) + targets.offset();
  const auto step = targets.strides()[0];
  dispatch_floating(logits.type(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = logits.data<T>();
    const T* lse = base_of<T>(log_sum_exp) + log_sum_exp.offset();
    const auto lse_step = log_sum_exp.strides()[0];
    T* dx = out.data<T>();
    // dL/dx = grad (softmax(x) - onehot) / n, softmax(x) = exp(x - lse).
    const T scale = static_cast<T>(grad.item() / static_cast<double>(rows));
    parallel_for(rows, rows_grain(cols), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t r = first; r < last; ++r) {
        const T* xr = x + r * cols;
        T* dr = dx + r * cols;
        const T shift = lse[r * lse_step];
        if (vector_math::available())
          vector_math::exp_scaled(xr, shift, scale, dr, cols);
        else
          for (std::int64_t j = 0; j < cols; ++j)
            dr[j] = std::exp(xr[j] - shift) * scale;
        dr[at[r * step]] -= scale;
      }
    });
  });
}

} // namespace troupe::detail
