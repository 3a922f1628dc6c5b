#include "cpu_onednn_matmul.hpp"

#include <array>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <tuple>
#include <vector>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "cpu_onednn.hpp"
#include "troupe/tensor/cpu_blas.hpp"
#include "troupe/tensor/intra_op_threads.hpp"

namespace troupe::detail {

namespace {

/// Where oneDNN was measured faster, in multiply-adds: below the window
/// OpenBLAS's small-matrix path wins; above it (a tensor-parallel block's
/// products at width 2048) the two are even forward and OpenBLAS is ahead
/// on the weights' gradient.
constexpr std::int64_t least_macs = std::int64_t{1} << 19;
constexpr std::int64_t most_macs = std::int64_t{1} << 30;

bool enabled() {
  static const bool on = [] {
    const char* choice = std::getenv("TROUPE_GEMM");
    if (choice != nullptr && std::string_view(choice) == "openblas")
      return false;
    return onednn_runs_avx512();
  }();
  return on;
}

/// A row-major [rows, cols] operand with leading dimension ld, or its
/// transpose as it lies in memory.
dnnl::memory::desc operand(std::int64_t rows, std::int64_t cols, std::int64_t ld, bool transposed) {
  return dnnl::memory::desc({rows, cols}, dnnl::memory::data_type::f32,
                            transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

struct product_key {
  std::array<std::int64_t, 6> sizes; // m, n, k, lda, ldb, ldc
  bool a_transposed, b_transposed;
  float alpha, beta;

  auto tie() const { return std::tie(sizes, a_transposed, b_transposed, alpha, beta); }
  bool operator<(const product_key& other) const { return tie() < other.tie(); }
};

struct product {
  dnnl::matmul::primitive_desc description;
  dnnl::matmul primitive;
};

/// The scratchpad is the caller's (user mode), so one primitive may run on
/// several threads at once.
std::shared_ptr<const product> product_for(const product_key& key) {
  static onednn_primitive_cache<product_key, product> made;
  return made.get(key, [&] {
    const auto [m, n, k, lda, ldb, ldc] = key.sizes;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.alpha != 1.0f)
      attr.set_output_scales(0, {key.alpha});
    if (key.beta != 0.0f) {
      dnnl::post_ops sum;
      sum.append_sum(key.beta);
      attr.set_post_ops(sum);
    }
    const dnnl::matmul::desc desc(operand(m, k, lda, key.a_transposed), operand(k, n, ldb, key.b_transposed),
                                  operand(m, n, ldc, false));
    dnnl::matmul::primitive_desc description(desc, attr, onednn_engine());
    return product{description, dnnl::matmul(description)};
  });
}

dnnl::memory wrap(const dnnl::memory::desc& desc, const void* data) {
  return dnnl::memory(desc, onednn_engine(), const_cast<void*>(data)); // inputs are only read
}

} // namespace

bool onednn_sgemm(bool a_transposed, bool b_transposed, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc) {
  const auto macs = m * n * k;
  if (macs < least_macs || macs > most_macs || !enabled())
    return false;
  const auto p = product_for({{m, n, k, lda, ldb, ldc}, a_transposed, b_transposed, alpha, beta});
  const auto scratch_desc = p->description.scratchpad_desc();
  thread_local std::vector<std::byte> scratch;
  if (scratch.size() < scratch_desc.get_size())
    scratch.resize(scratch_desc.get_size());
  auto& stream = onednn_thread_stream();
  // oneDNN runs on OpenMP: a team of the intra-op thread count (one unless
  // the user set more), as OpenBLAS would have used.
  omp_set_num_threads(intra_op_threads());
  p->primitive.execute(stream, {{DNNL_ARG_SRC, wrap(p->description.src_desc(), a)},
                                {DNNL_ARG_WEIGHTS, wrap(p->description.weights_desc(), b)},
                                {DNNL_ARG_DST, wrap(p->description.dst_desc(), c)},
                                {DNNL_ARG_SCRATCHPAD, wrap(scratch_desc, scratch.data())}});
  stream.wait();
  return true;
}

} // namespace troupe::detail

namespace troupe {

std::string_view float32_gemm() {
  return detail::enabled() ? "oneDNN matmul (AVX-512) from 2^19 to 2^30 multiply-adds, OpenBLAS outside"
                           : "OpenBLAS";
}

} // namespace troupe
