// The optimizers' fused steps on the CPU (backend.hpp: adam_step): one pass
// over the parameter, its gradient and its state, computed in double per
// element and stored in the parameter's dtype. Where the CPU has AVX2 the
// elements go through vector_math::adam_step, which gives the loop's bits.
#include <cmath>
#include <cstdint>

#include "cpu_backend.hpp"
#include "cpu_vector_math.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/parallel_for.hpp"

namespace troupe::detail {

namespace {

template <class T>
void adam_elements(T* p, const T* g, T* m, T* v, std::int64_t n, const vector_math::adam_scalars& s) {
  for (std::int64_t i = 0; i < n; ++i) {
    double param = static_cast<double>(p[i]) * s.decay;
    double gi = static_cast<double>(g[i]) + s.l2 * static_cast<double>(p[i]);
    double mi = s.beta1 * m[i] + (1.0 - s.beta1) * gi;
    double vi = s.beta2 * v[i] + (1.0 - s.beta2) * gi * gi;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(param - s.step_size * mi / (std::sqrt(vi) / s.bias_correction2_sqrt + s.eps));
  }
}

template <class T>
void adam_over(tensor& param, const tensor& grad, tensor& m, tensor& v, const vector_math::adam_scalars& s) {
  T* p = param.data<T>();
  const T* g = grad.data<T>();
  T* mp = m.data<T>();
  T* vp = v.data<T>();
  const bool vector = vector_math::available();
  // Every element's update is independent; ranges start on whole vectors.
  parallel_for(
    param.numel(), 16384,
    [&](std::int64_t begin, std::int64_t end) {
      if (vector)
        vector_math::adam_step(p + begin, g + begin, mp + begin, vp + begin, end - begin, s);
      else
        adam_elements(p + begin, g + begin, mp + begin, vp + begin, end - begin, s);
    },
    64);
}

} // namespace

void cpu_backend::adam_step(tensor& param, const tensor& grad, tensor& m, tensor& v, const adam_step_args& a) {
  for (const tensor* t : {&grad, static_cast<const tensor*>(&m), static_cast<const tensor*>(&v)})
    require(t->type() == param.type() && t->numel() == param.numel() && t->is_contiguous(),
            "adam_step: the gradient and state must be contiguous {} of {} elements like the parameter",
            param.type(), param.numel());
  require(param.is_contiguous(), "adam_step: the parameter must be contiguous");
  const vector_math::adam_scalars s{a.beta1, a.beta2, a.eps, a.step_size, a.bias_correction2_sqrt, a.l2, a.decay};
  if (param.type() == dtype::float32)
    adam_over<float>(param, grad, m, v, s);
  else if (param.type() == dtype::float64)
    adam_over<double>(param, grad, m, v, s);
  else
    backend::adam_step(param, grad, m, v, a);
}

} // namespace troupe::detail
