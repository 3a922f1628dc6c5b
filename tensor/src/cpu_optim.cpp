// The optimizers' fused steps on the CPU (backend.hpp: adam_step, sgd_step):
// one pass over the parameter, its gradient and its state, split over the
// intra-op threads on whole vectors. Adam computes in double per element and
// stores in the parameter's dtype; where the CPU has AVX2 its elements go
// through vector_math::adam_step, which gives the loop's bits.
#include <cmath>
#include <cstdint>
#include <initializer_list>

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

/// SGD in the parameter's own type with the hyper-parameters hoisted into
/// locals, as torch.optim.SGD does: the loop vectorises and the update
/// stays memory-bound.
template <class T> void sgd_elements(T* p, const T* g, T* buf, std::int64_t n, const sgd_step_args& s) {
  const T lr = static_cast<T>(s.lr);
  const T decay = static_cast<T>(s.weight_decay);
  if (buf == nullptr) {
    if (decay == T(0)) {
      for (std::int64_t i = 0; i < n; ++i)
        p[i] -= lr * g[i];
    } else {
      for (std::int64_t i = 0; i < n; ++i)
        p[i] -= lr * (g[i] + decay * p[i]);
    }
    return;
  }
  const T momentum = static_cast<T>(s.momentum);
  const T keep = static_cast<T>(1.0 - s.dampening);
  for (std::int64_t i = 0; i < n; ++i) {
    T d = g[i] + decay * p[i];
    T b = s.first ? d : momentum * buf[i] + keep * d;
    buf[i] = b;
    p[i] -= lr * (s.nesterov ? d + momentum * b : b);
  }
}

template <class T> void sgd_over(tensor& param, const tensor& grad, tensor& buffer, const sgd_step_args& s) {
  T* p = param.data<T>();
  const T* g = grad.data<T>();
  T* buf = buffer.defined() ? buffer.data<T>() : nullptr;
  parallel_for(
    param.numel(), 16384,
    [&](std::int64_t begin, std::int64_t end) {
      sgd_elements(p + begin, g + begin, buf ? buf + begin : nullptr, end - begin, s);
    },
    64);
}

/// The optimizer steps' operands: contiguous, of the parameter's dtype and size.
void require_like_parameter(const char* op, const tensor& param, std::initializer_list<const tensor*> others) {
  require(param.is_contiguous(), "{}: the parameter must be contiguous", op);
  for (const tensor* t : others)
    require(t->type() == param.type() && t->numel() == param.numel() && t->is_contiguous(),
            "{}: the gradient and state must be contiguous {} of {} elements like the parameter", op, param.type(),
            param.numel());
}

} // namespace

void cpu_backend::sgd_step(tensor& param, const tensor& grad, tensor& buffer, const sgd_step_args& s) {
  if (buffer.defined())
    require_like_parameter("sgd_step", param, {&grad, &buffer});
  else
    require_like_parameter("sgd_step", param, {&grad});
  if (param.type() == dtype::float32)
    sgd_over<float>(param, grad, buffer, s);
  else if (param.type() == dtype::float64)
    sgd_over<double>(param, grad, buffer, s);
  else
    backend::sgd_step(param, grad, buffer, s);
}

void cpu_backend::adam_step(tensor& param, const tensor& grad, tensor& m, tensor& v, const adam_step_args& a) {
  require_like_parameter("adam_step", param, {&grad, &m, &v});
  const vector_math::adam_scalars s{a.beta1, a.beta2, a.eps, a.step_size, a.bias_correction2_sqrt, a.l2, a.decay};
  if (param.type() == dtype::float32)
    adam_over<float>(param, grad, m, v, s);
  else if (param.type() == dtype::float64)
    adam_over<double>(param, grad, m, v, s);
  else
    backend::adam_step(param, grad, m, v, a);
}

} // namespace troupe::detail
