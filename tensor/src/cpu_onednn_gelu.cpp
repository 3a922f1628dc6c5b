// float32 GELU and its gradient through oneDNN's eltwise primitives
// (algorithms gelu_erf and gelu_tanh), for cpu_vector_math.hpp. SLEEF's erf costs about
// 3 ns per element here; oneDNN's JIT-compiled kernel is as fast as
// PyTorch's (bench/elementwise). float64 stays with SLEEF (oneDNN's
// eltwise has no f64).
//
// Primitives are made once per element count and algorithm
// (onednn_primitive_cache); each calling thread has its own stream.
// oneDNN runs on OpenMP here: every call pins the calling thread's team to
// one thread, the runtime's rule of one compute thread per actor.
#include <cstdint>
#include <memory>
#include <utility>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "cpu_onednn.hpp"
#include "cpu_vector_math.hpp"

namespace troupe::detail::vector_math {

namespace {

struct gelu_primitives {
  dnnl::eltwise_forward forward;
  dnnl::eltwise_backward backward;
};

dnnl::memory::desc flat(std::int64_t n) {
  return dnnl::memory::desc({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
}

std::shared_ptr<const gelu_primitives> primitives_for(std::int64_t n, dnnl::algorithm algorithm) {
  static onednn_primitive_cache<std::pair<std::int64_t, dnnl::algorithm>, gelu_primitives> made;
  return made.get(std::make_pair(n, algorithm), [&] {
    const auto& engine = onednn_engine();
    const auto md = flat(n);
    dnnl::eltwise_forward::primitive_desc forward(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, algorithm, md), engine);
    dnnl::eltwise_backward::primitive_desc backward(dnnl::eltwise_backward::desc(algorithm, md, md), engine, forward);
    return gelu_primitives{dnnl::eltwise_forward(forward), dnnl::eltwise_backward(backward)};
  });
}

dnnl::memory wrap(std::int64_t n, const float* data) {
  return dnnl::memory(flat(n), onednn_engine(), const_cast<float*>(data)); // read-only use
}

void run_forward(dnnl::algorithm algorithm, const float* x, float* y, std::int64_t n) {
  if (n == 0)
    return;
  omp_set_num_threads(1);
  auto p = primitives_for(n, algorithm);
  auto& stream = onednn_thread_stream();
  p->forward.execute(stream, {{DNNL_ARG_SRC, wrap(n, x)}, {DNNL_ARG_DST, wrap(n, y)}});
  stream.wait();
}

void run_backward(dnnl::algorithm algorithm, const float* grad, const float* x, float* y, std::int64_t n) {
  if (n == 0)
    return;
  omp_set_num_threads(1);
  auto p = primitives_for(n, algorithm);
  auto& stream = onednn_thread_stream();
  p->backward.execute(stream,
                      {{DNNL_ARG_SRC, wrap(n, x)}, {DNNL_ARG_DIFF_DST, wrap(n, grad)}, {DNNL_ARG_DIFF_SRC, wrap(n, y)}});
  stream.wait();
}

} // namespace

void gelu(const float* x, float* y, std::int64_t n) { run_forward(dnnl::algorithm::eltwise_gelu_erf, x, y, n); }

void gelu_backward(const float* grad, const float* x, float* y, std::int64_t n) {
  run_backward(dnnl::algorithm::eltwise_gelu_erf, grad, x, y, n);
}

namespace {

/// Whether oneDNN's gelu_tanh beats the exp form here (cpu_vector_math.hpp
/// says by how much): only with its AVX-512 kernels.
bool onednn_gelu_tanh() { return onednn_runs_avx512(); }

} // namespace

void gelu_tanh(const float* x, float* y, std::int64_t n) {
  if (onednn_gelu_tanh())
    run_forward(dnnl::algorithm::eltwise_gelu_tanh, x, y, n);
  else
    gelu_tanh_with_exp(x, y, n);
}

void gelu_tanh_backward(const float* grad, const float* x, float* y, std::int64_t n) {
  if (onednn_gelu_tanh())
    run_backward(dnnl::algorithm::eltwise_gelu_tanh, grad, x, y, n);
  else
    gelu_tanh_backward_with_exp(grad, x, y, n);
}

} // namespace troupe::detail::vector_math
