// The CPU kernel of causal self-attention (ops.hpp's causal_attention): per
// batch and head, GEMMs straight on the heads' columns of qkv and of the
// output, and only over the blocks of the score matrix that the causal
// mask keeps.
//
// Why one op. Composed, attention copies q, k and v out of qkv into
// [batch * heads, seq, head size] (three copies forward, three more for
// their gradients backward, and one each way for y), then multiplies full
// [seq, seq] score matrices of which the mask throws away almost half. Here
// a head's q, k and v are matrices with leading dimension 3 width inside
// qkv, the products read them in place, and y and dqkv are written in place
// with leading dimensions width and 3 width. Only K^T and V^T are copied, a
// head at a time ([head size, seq], small_gemm's B is never transposed).
//
// Blocks. Queries are taken in blocks of `query_block` rows; block
// [i0, i1) needs only keys [0, i1). With 4 blocks per sequence the GEMMs
// do 10/16 of the full products' work; the softmax writes exact zeros
// above the diagonal, so the diagonal blocks' upper triangles contribute
// nothing to the products that read them.
//
// The backward, for one head with P the saved weights and dY its output's
// gradient:
//   dP = dY V^T (blocks of query rows, keys up to the block's end)
//   dS = causal_softmax_backward(dP, P)  (in place)
//   dQ = dS K,  dK = dS^T Q,  dV = P^T dY
// where dK and dV take, for a block of keys [j0, j1), only the queries
// [j0, seq) that can see them.
//
// Dropout on the weights. With a mask M (0 or 1 / (1 - p) per weight,
// drawn by the caller as the composed dropout would draw it) the forward
// multiplies P .* M into a head-sized scratch and takes y from it, keeping
// P as the weights; the backward multiplies dY V^T by M before the
// softmax's gradient and rebuilds P .* M for dV. So attention with dropout
// stays one op: no copies of the heads and only the kept blocks' products,
// where composing it costs both.
#include <algorithm>
#include <vector>

#include "cpu_backend.hpp"
#include "dispatch.hpp"
#include "cpu_small_gemm.hpp"
#include "troupe/tensor/parallel_for.hpp"

namespace troupe::detail {

namespace {

/// Rows of queries per GEMM: 32 rows of a head keep the blocks' products
/// in L1/L2 and skip 3/8 of the work at a sequence of 128.
constexpr std::int64_t query_block = 32;

/// Where one (batch, head) pair's matrices lie.
template <class T> struct head_view {
  std::int64_t seq, head_size, width;
  const T* q; ///< [seq, head_size], leading dimension 3 width; k and v follow at + width, + 2 width

  std::int64_t qkv_ld() const { return 3 * width; }
  const T* k() const { return q + width; }
  const T* v() const { return q + 2 * width; }
};

/// The products of one head, one per block of query (or key) rows, made
/// once per op for its shapes and shared by every head: S = Q K^T and
/// Y = P V forward; dP = dY V^T, dQ = dS K, dK = dS^T Q and dV = P^T dY
/// backward. K^T and V^T are read from a head-sized copy (small_gemm's
/// B is never transposed).
template <class T> struct head_products {
  std::vector<small_gemm<T>> scores, values, weights_grad, query_grad, key_grad, value_grad;

  head_products(std::int64_t seq, std::int64_t hs, std::int64_t width) {
    const auto ld = 3 * width;
    for (std::int64_t i0 = 0; i0 < seq; i0 += query_block) {
      const auto i1 = std::min(seq, i0 + query_block), rows = i1 - i0;
      scores.emplace_back(rows, i1, hs, ld, false, seq, seq);
      values.emplace_back(rows, hs, i1, seq, false, ld, width);
      weights_grad.emplace_back(rows, i1, hs, width, false, seq, seq);
      query_grad.emplace_back(rows, hs, i1, seq, false, ld, ld);
      key_grad.emplace_back(rows, hs, seq - i0, seq, true, ld, ld);
      value_grad.emplace_back(rows, hs, seq - i0, seq, true, width, ld);
    }
  }
};

/// out = a .* mask over the causal part of a head's [seq, seq] (row i:
/// columns [0, i]). Above the diagonal out keeps what it held: a scratch
/// starts as zeros and is only ever written here, so the diagonal blocks'
/// products read zeros there, as they read the softmax's.
template <class T> void masked_lower(const T* a, const T* mask, T* out, std::int64_t seq) {
  for (std::int64_t i = 0; i < seq; ++i)
    for (std::int64_t j = 0; j <= i; ++j)
      out[i * seq + j] = a[i * seq + j] * mask[i * seq + j];
}

/// weights: the head's [seq, seq], contiguous; y: its output columns
/// (leading dimension width); mask and kept: the head's dropout mask and a
/// [seq, seq] scratch, or both null; kt: [head_size, seq] scratch.
template <class T>
void head_forward(const head_products<T>& products, const head_view<T>& h, T scale, T* weights, T* y, const T* mask,
                  T* kept, T* kt) {
  const auto seq = h.seq, ld = h.qkv_ld();
  transpose_small(h.k(), ld, seq, h.head_size, kt);
  for (std::size_t b = 0; b < products.scores.size(); ++b) {
    const auto i0 = static_cast<std::int64_t>(b) * query_block;
    products.scores[b](h.q + i0 * ld, kt, weights + i0 * seq);
  }
  causal_softmax_range(weights, weights, seq, seq, seq, scale);
  const T* p = weights;
  if (mask != nullptr) {
    masked_lower(weights, mask, kept, seq);
    p = kept;
  }
  for (std::size_t b = 0; b < products.values.size(); ++b) {
    const auto i0 = static_cast<std::int64_t>(b) * query_block;
    products.values[b](p + i0 * seq, h.v(), y + i0 * h.width);
  }
}

/// dy: the head's output gradient (leading dimension width); dqkv: the
/// head's q columns in grad_qkv (k and v follow as in qkv); dscores:
/// [seq, seq] scratch; mask and kept as in head_forward; vt: [head_size,
/// seq] scratch.
template <class T>
void head_backward(const head_products<T>& products, const head_view<T>& h, T scale, const T* weights, const T* dy,
                   T* dqkv, T* dscores, const T* mask, T* kept, T* vt) {
  const auto seq = h.seq, ld = h.qkv_ld();
  transpose_small(h.v(), ld, seq, h.head_size, vt);
  for (std::size_t b = 0; b < products.weights_grad.size(); ++b) {
    const auto i0 = static_cast<std::int64_t>(b) * query_block;
    products.weights_grad[b](dy + i0 * h.width, vt, dscores + i0 * seq);
  }
  const T* p = weights;
  if (mask != nullptr) {
    masked_lower(dscores, mask, dscores, seq); // d(P .* M) .* M = dP
    masked_lower(weights, mask, kept, seq);
    p = kept;
  }
  causal_softmax_backward_range(dscores, weights, dscores, seq, seq, seq, scale);
  T* dk = dqkv + h.width;
  T* dv = dqkv + 2 * h.width;
  for (std::size_t b = 0; b < products.query_grad.size(); ++b) {
    const auto i0 = static_cast<std::int64_t>(b) * query_block;
    products.query_grad[b](dscores + i0 * seq, h.k(), dqkv + i0 * ld);
    // Keys [i0, i1) are seen by queries [i0, seq) only.
    products.key_grad[b](dscores + i0 * seq + i0, h.q + i0 * ld, dk + i0 * ld);
    products.value_grad[b](p + i0 * seq + i0, dy + i0 * h.width, dv + i0 * ld);
  }
}

/// Pairs (batch, head) per intra-op range: a head's work is already
/// thousands of multiply-adds, so ranges need only a few.
constexpr std::int64_t heads_grain = 4;

} // namespace

void cpu_backend::causal_attention(const tensor& qkv, std::int64_t heads, double scale, const tensor& dropout_mask,
                                   tensor& output, tensor& weights) {
  const auto batch = qkv.size(0), seq = qkv.size(1), width = qkv.size(2) / 3, hs = width / heads;
  dispatch_floating(qkv.type(), "causal_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = qkv.data<T>();
    const T* mask = dropout_mask.defined() ? dropout_mask.data<T>() : nullptr;
    T* y = output.data<T>();
    T* w = weights.data<T>();
    const head_products<T> products(seq, hs, width);
    parallel_for(batch * heads, heads_grain, [&](std::int64_t first, std::int64_t last) {
      std::vector<T> kept(mask != nullptr ? static_cast<std::size_t>(seq * seq) : 0);
      std::vector<T> kt(static_cast<std::size_t>(hs * seq));
      for (auto bh = first; bh < last; ++bh) {
        const auto b = bh / heads, head = bh % heads;
        const head_view<T> h{seq, hs, width, x + b * seq * 3 * width + head * hs};
        head_forward(products, h, static_cast<T>(scale), w + bh * seq * seq, y + b * seq * width + head * hs,
                     mask != nullptr ? mask + bh * seq * seq : nullptr, kept.data(), kt.data());
      }
    });
  });
}

void cpu_backend::causal_attention_backward(const tensor& grad, const tensor& qkv, const tensor& weights,
                                            const tensor& dropout_mask, std::int64_t heads, double scale,
                                            tensor& grad_qkv) {
  const auto batch = qkv.size(0), seq = qkv.size(1), width = qkv.size(2) / 3, hs = width / heads;
  dispatch_floating(qkv.type(), "causal_attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = qkv.data<T>();
    const T* dy = grad.data<T>();
    const T* w = weights.data<T>();
    const T* mask = dropout_mask.defined() ? dropout_mask.data<T>() : nullptr;
    T* dx = grad_qkv.data<T>();
    const head_products<T> products(seq, hs, width);
    parallel_for(batch * heads, heads_grain, [&](std::int64_t first, std::int64_t last) {
      std::vector<T> dscores(static_cast<std::size_t>(seq * seq));
      std::vector<T> kept(mask != nullptr ? static_cast<std::size_t>(seq * seq) : 0);
      std::vector<T> vt(static_cast<std::size_t>(hs * seq));
      for (auto bh = first; bh < last; ++bh) {
        const auto b = bh / heads, head = bh % heads;
        const auto at = b * seq * 3 * width + head * hs;
        const head_view<T> h{seq, hs, width, x + at};
        head_backward(products, h, static_cast<T>(scale), w + bh * seq * seq, dy + b * seq * width + head * hs,
                      dx + at, dscores.data(), mask != nullptr ? mask + bh * seq * seq : nullptr, kept.data(),
                      vt.data());
      }
    });
  });
}

} // namespace troupe::detail
