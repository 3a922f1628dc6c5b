// CPU indexing kernels. ops.cpp has validated every index, so the loops
// here index memory without checks. Accumulating kernels visit indices in
// order, so repeated indices add up deterministically.
#include <cstring>

#include "cpu_backend.hpp"
#include "dispatch.hpp"

namespace troupe::detail {

namespace {

/// Strides of `t` with `dim` zeroed: the indexed dimension's position comes
/// from the index values instead of from the iteration.
dims without_dim(const tensor& t, std::int64_t dim) {
  auto strides = t.strides();
  strides[dim] = 0;
  return strides;
}

/// The [bag begin, bag end) ranges of embedding_bag.
std::pair<std::int64_t, std::int64_t> bag_range(const std::int64_t* offsets, std::int64_t bags,
                                                std::int64_t n, std::int64_t bag) {
  return {offsets[bag], bag + 1 < bags ? offsets[bag + 1] : n};
}

} // namespace

// Rows of contiguous tensors along dim 0 (embeddings, their gradients) are
// copied and added as flat runs; a view per row cost more than the row's
// arithmetic at GPT widths. Other layouts go through views.
namespace {
bool rows_are_flat(const tensor& a, std::int64_t dim, const tensor& b) {
  return dim == 0 && a.is_contiguous() && b.is_contiguous() && a.type() == b.type() && a.rank() >= 1;
}
} // namespace

void cpu_backend::index_select(const tensor& a, std::int64_t dim, const tensor& index,
                               tensor& out) {
  const auto* at = base_of<std::int64_t>(index) + index.offset();
  const auto step = index.strides()[0];
  if (rows_are_flat(a, dim, out) && a.size(0) > 0) {
    const auto row_bytes = a.nbytes() / static_cast<std::size_t>(a.size(0));
    const auto* src = static_cast<const std::byte*>(a.raw_data());
    auto* dst = static_cast<std::byte*>(out.raw_data());
    for (std::int64_t j = 0; j < index.numel(); ++j)
      std::memcpy(dst + static_cast<std::size_t>(j) * row_bytes,
                  src + static_cast<std::size_t>(at[j * step]) * row_bytes, row_bytes);
    return;
  }
  for (std::int64_t j = 0; j < index.numel(); ++j) {
    auto dst = out.select(dim, j);
    dst.copy_from(a.select(dim, at[j * step]));
  }
}

void cpu_backend::gather(const tensor& a, std::int64_t dim, const tensor& index, tensor& out) {
  const auto a_strides = without_dim(a, dim);
  const auto dim_stride = a.strides()[dim];
  const auto* at = base_of<std::int64_t>(index);
  dispatch_any(a.type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = base_of<T>(a);
    T* y = base_of<T>(out);
    for_each_row<3>(index.shape(), {&out.strides(), &index.strides(), &a_strides},
                    {out.offset(), index.offset(), a.offset()},
                    [&](auto off, std::int64_t n, auto step) {
                      for (std::int64_t i = 0; i < n; ++i)
                        y[off[0] + i * step[0]] =
                            x[off[2] + i * step[2] + at[off[1] + i * step[1]] * dim_stride];
                    });
  });
}

void cpu_backend::scatter_add_(tensor& out, std::int64_t dim, const tensor& index,
                               const tensor& src) {
  const auto out_strides = without_dim(out, dim);
  const auto dim_stride = out.strides()[dim];
  const auto* at = base_of<std::int64_t>(index);
  dispatch_arithmetic(out.type(), "cpu index", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* s = base_of<T>(src);
    T* y = base_of<T>(out);
    for_each_row<3>(index.shape(), {&out_strides, &index.strides(), &src.strides()},
                    {out.offset(), index.offset(), src.offset()},
                    [&](auto off, std::int64_t n, auto step) {
                      for (std::int64_t i = 0; i < n; ++i)
                        y[off[0] + i * step[0] + at[off[1] + i * step[1]] * dim_stride] +=
                            s[off[2] + i * step[2]];
                    });
  });
}

void cpu_backend::index_add_(tensor& a, std::int64_t dim, const tensor& index, const tensor& src) {
  const auto* at = base_of<std::int64_t>(index) + index.offset();
  const auto step = index.strides()[0];
  if (rows_are_flat(a, dim, src) && a.size(0) > 0 && (a.type() == dtype::float32 || a.type() == dtype::float64)) {
    // The same additions in the same order as the per-row axpy below.
    const auto row = a.numel() / a.size(0);
    dispatch_floating(a.type(), "index_add_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* y = a.data<T>();
      const T* x = src.data<T>();
      for (std::int64_t j = 0; j < index.numel(); ++j) {
        T* dst = y + at[j * step] * row;
        const T* from = x + j * row;
        for (std::int64_t k = 0; k < row; ++k)
          dst[k] += from[k];
      }
    });
    return;
  }
  for (std::int64_t j = 0; j < index.numel(); ++j) {
    auto dst = a.select(dim, at[j * step]);
    axpy(dst, src.select(dim, j), 1.0);
  }
}

void cpu_backend::embedding_bag(const tensor& weight, const tensor& indices, const tensor& offsets,
                                bool mean, tensor& out) {
  const auto d = weight.size(1);
  const auto n = indices.numel();
  const auto bags = offsets.numel();
  const auto* idx = indices.data<std::int64_t>();
  const auto* off = offsets.data<std::int64_t>();
  dispatch_floating(weight.type(), "embedding_bag", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* w = weight.data<T>();
    T* y = out.data<T>();
    for (std::int64_t bag = 0; bag < bags; ++bag) {
      T* row = y + bag * d;
      std::fill(row, row + d, T(0));
      auto [begin, end] = bag_range(off, bags, n, bag);
      for (auto i = begin; i < end; ++i) {
        const T* src = w + idx[i] * d;
        for (std::int64_t j = 0; j < d; ++j)
          row[j] += src[j];
      }
      if (mean && end > begin) {
        const T inv = T(1) / static_cast<T>(end - begin);
        for (std::int64_t j = 0; j < d; ++j)
          row[j] *= inv;
      }
    }
  });
}

void cpu_backend::embedding_bag_backward(const tensor& grad, const tensor& indices,
                                         const tensor& offsets, bool mean, tensor& grad_weight) {
  const auto d = grad_weight.size(1);
  const auto n = indices.numel();
  const auto bags = offsets.numel();
  const auto* idx = indices.data<std::int64_t>();
  const auto* off = offsets.data<std::int64_t>();
  dispatch_floating(grad.type(), "embedding_bag_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad.data<T>();
    T* gw = grad_weight.data<T>();
    for (std::int64_t bag = 0; bag < bags; ++bag) {
      auto [begin, end] = bag_range(off, bags, n, bag);
      if (end == begin)
        continue;
      const T scale = mean ? T(1) / static_cast<T>(end - begin) : T(1);
      const T* row = g + bag * d;
      for (auto i = begin; i < end; ++i) {
        T* dst = gw + idx[i] * d;
        for (std::int64_t j = 0; j < d; ++j)
          dst[j] += scale * row[j];
      }
    }
  });
}

} // namespace troupe::detail
