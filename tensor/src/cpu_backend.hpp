#pragma once
// Private: the CPU backend (OpenBLAS for GEMM, plain loops elsewhere). Its
// kernels are split by concept over cpu_elementwise.cpp, cpu_reduce.cpp,
// cpu_linalg.cpp, cpu_index.cpp, cpu_nn.cpp and cpu_random.cpp.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::detail {

class cpu_backend final : public backend {
public:
  std::string_view name() const override { return "cpu"; }

  void unary(unary_op op, const tensor& a, double scalar, tensor& out) override;
  void binary(binary_op op, const tensor& a, const tensor& b, tensor& out) override;
  void axpy(tensor& a, const tensor& b, double alpha) override;
  void where(const tensor& cond, const tensor& a, const tensor& b, tensor& out) override;

  void reduce_rows(reduce_op op, const tensor& a, tensor& values, tensor& indices) override;
  void softmax(const tensor& a, bool log, tensor& out) override;
  void softmax_backward(const tensor& grad, const tensor& output, bool log,
                        tensor& out) override;
  void causal_softmax(const tensor& a, std::int64_t queries, double scale, tensor& out) override;
  void causal_softmax_backward(const tensor& grad, const tensor& output, std::int64_t queries, double scale,
                               tensor& out) override;
  void causal_attention(const tensor& qkv, std::int64_t heads, double scale, const tensor& dropout_mask, tensor& output,
                        tensor& weights) override;
  void causal_attention_backward(const tensor& grad, const tensor& qkv, const tensor& weights,
                                 const tensor& dropout_mask, std::int64_t heads, double scale,
                                 tensor& grad_qkv) override;
  void cross_entropy(const tensor& logits, const tensor& targets, tensor& loss,
                     tensor& log_sum_exp) override;
  void cross_entropy_backward(const tensor& grad, const tensor& logits, const tensor& targets,
                              const tensor& log_sum_exp, tensor& out) override;

  void gemm(const tensor& a, const tensor& b, tensor& out, double alpha, double beta) override;

  void index_select(const tensor& a, std::int64_t dim, const tensor& index,
                    tensor& out) override;
  void gather(const tensor& a, std::int64_t dim, const tensor& index, tensor& out) override;
  void scatter_add_(tensor& out, std::int64_t dim, const tensor& index,
                    const tensor& src) override;
  void index_add_(tensor& a, std::int64_t dim, const tensor& index, const tensor& src) override;
  void embedding_bag(const tensor& weight, const tensor& indices, const tensor& offsets, bool mean,
                     tensor& out) override;
  void embedding_bag_backward(const tensor& grad, const tensor& indices, const tensor& offsets,
                              bool mean, tensor& grad_weight) override;

  void im2col(const tensor& image, const conv_geometry& geometry, tensor& cols) override;
  void col2im(const tensor& cols, const conv_geometry& geometry, tensor& image) override;
  void max_pool2d(const tensor& input, std::int64_t kernel, std::int64_t stride, tensor& output,
                  tensor& indices) override;
  void max_pool2d_backward(const tensor& grad, const tensor& indices,
                           tensor& grad_input) override;
  void layer_norm(const tensor& input, const tensor& weight, const tensor& bias, double eps,
                  tensor& output, tensor& mean, tensor& rstd) override;
  void layer_norm_backward(const tensor& grad, const tensor& input, const tensor& mean,
                           const tensor& rstd, const tensor& weight, tensor& grad_input,
                           tensor& grad_weight, tensor& grad_bias) override;

  void fill_random(random_distribution what, const generator& gen, double a, double b,
                   tensor& out) override;

  /// One pass each (cpu_optim.cpp).
  void adam_step(tensor& param, const tensor& grad, tensor& m, tensor& v, const adam_step_args& step) override;
  void sgd_step(tensor& param, const tensor& grad, tensor& momentum_buffer, const sgd_step_args& step) override;
};

/// Causal softmax over `rows` contiguous rows of `cols` (cpu_reduce.cpp):
/// row r keeps its first min(r % queries + 1, cols) elements, y =
/// softmax(scale x) over them and 0 after; y may be x.
template <class T>
void causal_softmax_range(const T* x, T* y, std::int64_t rows, std::int64_t queries, std::int64_t cols, T scale);
/// Its gradient, scale y (g - <g, y>) on the kept elements; dx may be g.
template <class T>
void causal_softmax_backward_range(const T* g, const T* y, T* dx, std::int64_t rows, std::int64_t queries,
                                   std::int64_t cols, T scale);

/// Typed pointer to a tensor's storage base (element 0 of the storage, not
/// of the view): for_each_row offsets are relative to it.
template <class T> T* base_of(const tensor& t) {
  return static_cast<T*>(t.memory()->data());
}

/// Sum of n elements `step` apart: pairwise (as NumPy) over blocks of at
/// most 128 summed in eight fixed lanes. The order depends only on n, never
/// on the layout, so results are deterministic; the error grows with
/// log(n), not n; and the lanes still vectorise.
template <class T> T row_sum(const T* x, std::int64_t n, std::int64_t step) {
  if (n > 128) {
    auto half = n / 2;
    half -= half % 8;
    return row_sum(x, half, step) + row_sum(x + half * step, n - half, step);
  }
  T lane[8] = {};
  std::int64_t i = 0;
  if (step == 1) {
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j)
        lane[j] += x[i + j];
  } else {
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j)
        lane[j] += x[(i + j) * step];
  }
  T total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i)
    total += x[i * step];
  return total;
}

/// Bytes of each of the eight lanes of side-by-side partial sums taken at a
/// time: the eight stay in L1 while a block's lines stream past them.
inline constexpr std::int64_t side_by_side_tile_bytes = 1024;

/// The recursion of row_sums_side_by_side: the n elements of each of the
/// `rows` are halved as row_sum halves them, `block(x, count, out)` sums
/// blocks of at most 128 (for every row at once, as row_sum sums a block),
/// and the halves' sums are added as row_sum adds them.
template <class T, class Block>
void pairwise_side_by_side(const T* x, std::int64_t rows, std::int64_t n, std::int64_t step, T* out, Block& block) {
  if (n > 128) {
    auto half = n / 2;
    half -= half % 8;
    pairwise_side_by_side(x, rows, half, step, out, block);
    std::vector<T> right(static_cast<std::size_t>(rows));
    pairwise_side_by_side(x + half * step, rows, n - half, step, right.data(), block);
    for (std::int64_t r = 0; r < rows; ++r)
      out[r] = out[r] + right[static_cast<std::size_t>(r)];
    return;
  }
  block(x, n, out);
}

/// out[r] = row_sum(x + r, n, step) for every r in [0, rows), bitwise: the
/// same additions in the same order, but made for a tile of neighbouring r
/// at once. For a reduction whose rows lie side by side in memory (the
/// column sums of a row-major matrix, such as a bias gradient), row_sum
/// reads one element per cache line, `step` bytes apart; this reads each
/// line once and vectorises across r. (With AVX2, cpu_reduce.cpp sums the
/// blocks with vector_math::side_by_side_block instead.)
template <class T> void row_sums_side_by_side(const T* x, std::int64_t rows, std::int64_t n, std::int64_t step, T* out) {
  auto block = [rows, step](const T* first, std::int64_t count, T* sums) {
    constexpr std::int64_t tile = side_by_side_tile_bytes / static_cast<std::int64_t>(sizeof(T));
    for (std::int64_t r0 = 0; r0 < rows; r0 += tile) {
      const auto width = std::min(tile, rows - r0);
      T lane[8][tile] = {};
      std::int64_t i = 0;
      for (; i + 8 <= count; i += 8)
        for (int j = 0; j < 8; ++j) {
          const T* src = first + (i + j) * step + r0;
          for (std::int64_t r = 0; r < width; ++r)
            lane[j][r] += src[r];
        }
      T* dst = sums + r0;
      for (std::int64_t r = 0; r < width; ++r)
        dst[r] = ((lane[0][r] + lane[1][r]) + (lane[2][r] + lane[3][r])) +
                 ((lane[4][r] + lane[5][r]) + (lane[6][r] + lane[7][r]));
      for (; i < count; ++i) {
        const T* src = first + i * step + r0;
        for (std::int64_t r = 0; r < width; ++r)
          dst[r] += src[r];
      }
    }
  };
  pairwise_side_by_side(x, rows, n, step, out, block);
}

} // namespace troupe::detail
