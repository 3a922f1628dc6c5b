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
// qkv, BLAS reads them in place, and y and dqkv are written in place with
// leading dimensions width and 3 width.
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
#include "openblas.hpp"
#include "troupe/tensor/parallel_for.hpp"

namespace troupe::detail {

namespace {

/// Rows of queries per GEMM: 32 rows of a head keep the blocks' products
/// in L1/L2 and skip 3/8 of the work at a sequence of 128.
constexpr std::int64_t query_block = 32;

/// C = A op(B) with row-major operands of the given leading dimensions.
struct matrix {
  const void* data;
  std::int64_t ld;
  bool transposed = false;
};

template <class T>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, matrix a, matrix b, T* c, std::int64_t ldc) {
  const auto ta = a.transposed ? CblasTrans : CblasNoTrans;
  const auto tb = b.transposed ? CblasTrans : CblasNoTrans;
  const auto bi = [](std::int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>)
    openblas().sgemm(CblasRowMajor, ta, tb, bi(m), bi(n), bi(k), 1.0f, static_cast<const float*>(a.data), bi(a.ld),
                     static_cast<const float*>(b.data), bi(b.ld), 0.0f, c, bi(ldc));
  else
    openblas().dgemm(CblasRowMajor, ta, tb, bi(m), bi(n), bi(k), 1.0, static_cast<const double*>(a.data), bi(a.ld),
                     static_cast<const double*>(b.data), bi(b.ld), 0.0, c, bi(ldc));
}

/// Where one (batch, head) pair's matrices lie.
template <class T> struct head_view {
  std::int64_t seq, head_size, width;
  const T* q; ///< [seq, head_size], leading dimension 3 width; k and v follow at + width, + 2 width

  std::int64_t qkv_ld() const { return 3 * width; }
  const T* k() const { return q + width; }
  const T* v() const { return q + 2 * width; }
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
/// [seq, seq] scratch, or both null.
template <class T> void head_forward(const head_view<T>& h, T scale, T* weights, T* y, const T* mask, T* kept) {
  const auto seq = h.seq, ld = h.qkv_ld();
  for (std::int64_t i0 = 0; i0 < seq; i0 += query_block) {
    const auto i1 = std::min(seq, i0 + query_block);
    gemm<T>(i1 - i0, i1, h.head_size, {h.q + i0 * ld, ld}, {h.k(), ld, true}, weights + i0 * seq, seq);
  }
  causal_softmax_range(weights, weights, seq, seq, seq, scale);
  const T* p = weights;
  if (mask != nullptr) {
    masked_lower(weights, mask, kept, seq);
    p = kept;
  }
  for (std::int64_t i0 = 0; i0 < seq; i0 += query_block) {
    const auto i1 = std::min(seq, i0 + query_block);
    gemm<T>(i1 - i0, h.head_size, i1, {p + i0 * seq, seq}, {h.v(), ld}, y + i0 * h.width, h.width);
  }
}

/// dy: the head's output gradient (leading dimension width); dqkv: the
/// head's q columns in grad_qkv (k and v follow as in qkv); dscores:
/// [seq, seq] scratch; mask and kept as in head_forward.
template <class T>
void head_backward(const head_view<T>& h, T scale, const T* weights, const T* dy, T* dqkv, T* dscores,
                   const T* mask, T* kept) {
  const auto seq = h.seq, ld = h.qkv_ld(), hs = h.head_size;
  for (std::int64_t i0 = 0; i0 < seq; i0 += query_block) {
    const auto i1 = std::min(seq, i0 + query_block);
    gemm<T>(i1 - i0, i1, hs, {dy + i0 * h.width, h.width}, {h.v(), ld, true}, dscores + i0 * seq, seq);
  }
  const T* p = weights;
  if (mask != nullptr) {
    masked_lower(dscores, mask, dscores, seq); // d(P .* M) .* M = dP
    masked_lower(weights, mask, kept, seq);
    p = kept;
  }
  causal_softmax_backward_range(dscores, weights, dscores, seq, seq, seq, scale);
  for (std::int64_t i0 = 0; i0 < seq; i0 += query_block) {
    const auto i1 = std::min(seq, i0 + query_block);
    gemm<T>(i1 - i0, hs, i1, {dscores + i0 * seq, seq}, {h.k(), ld}, dqkv + i0 * ld, ld);
  }
  T* dk = dqkv + h.width;
  T* dv = dqkv + 2 * h.width;
  for (std::int64_t j0 = 0; j0 < seq; j0 += query_block) {
    const auto j1 = std::min(seq, j0 + query_block);
    gemm<T>(j1 - j0, hs, seq - j0, {dscores + j0 * seq + j0, seq, true}, {h.q + j0 * ld, ld}, dk + j0 * ld, ld);
    gemm<T>(j1 - j0, hs, seq - j0, {p + j0 * seq + j0, seq, true}, {dy + j0 * h.width, h.width}, dv + j0 * ld,
            ld);
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
    parallel_for(batch * heads, heads_grain, [&](std::int64_t first, std::int64_t last) {
      std::vector<T> kept(mask != nullptr ? static_cast<std::size_t>(seq * seq) : 0);
      for (auto bh = first; bh < last; ++bh) {
        const auto b = bh / heads, head = bh % heads;
        const head_view<T> h{seq, hs, width, x + b * seq * 3 * width + head * hs};
        head_forward(h, static_cast<T>(scale), w + bh * seq * seq, y + b * seq * width + head * hs,
                     mask != nullptr ? mask + bh * seq * seq : nullptr, kept.data());
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
    parallel_for(batch * heads, heads_grain, [&](std::int64_t first, std::int64_t last) {
      std::vector<T> dscores(static_cast<std::size_t>(seq * seq));
      std::vector<T> kept(mask != nullptr ? static_cast<std::size_t>(seq * seq) : 0);
      for (auto bh = first; bh < last; ++bh) {
        const auto b = bh / heads, head = bh % heads;
        const auto at = b * seq * 3 * width + head * hs;
        const head_view<T> h{seq, hs, width, x + at};
        head_backward(h, static_cast<T>(scale), w + bh * seq * seq, dy + b * seq * width + head * hs, dx + at,
                      dscores.data(), mask != nullptr ? mask + bh * seq * seq : nullptr, kept.data());
      }
    });
  });
}

} // namespace troupe::detail
