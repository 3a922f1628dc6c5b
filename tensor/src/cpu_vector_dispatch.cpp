// Which vector kernels run, and their entry points (cpu_vector_math.hpp):
// each runs the AVX-512 copy of its kernel where avx512_chosen(), the AVX2
// copy elsewhere. Compiled for any x86-64, like its callers.
#include <cstdlib>
#include <string_view>

#include "cpu_vector_math.hpp"
#include "troupe/tensor/cpu_vector_kernels.hpp"

namespace troupe::detail::vector_math {

namespace {

enum class copy { none, avx2, avx512 };

/// The copy this process runs, from the CPU and TROUPE_VECTOR_MATH, read
/// once: "off" keeps glibc's scalar functions (bitwise-equal results between
/// machines with and without AVX2, and A/B timings); "avx2" keeps the AVX2
/// copies on a CPU with AVX-512 (the AVX2 results there, and A/B timings).
copy chosen_copy() noexcept {
  static const copy chosen = [] {
    const char* setting = std::getenv("TROUPE_VECTOR_MATH");
    const std::string_view asked = setting != nullptr ? setting : "";
    if (asked == "off" || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
      return copy::none;
    if (asked != "avx2" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
      return copy::avx512;
    return copy::avx2;
  }();
  return chosen;
}

} // namespace

bool available() noexcept { return chosen_copy() != copy::none; }

bool avx512_chosen() noexcept { return chosen_copy() == copy::avx512; }

void exp(const float* x, float* y, std::int64_t n) {
  avx512_chosen() ? avx512::exp(x, y, n) : avx2::exp(x, y, n);
}
void exp(const double* x, double* y, std::int64_t n) {
  avx512_chosen() ? avx512::exp(x, y, n) : avx2::exp(x, y, n);
}
void tanh(const float* x, float* y, std::int64_t n) {
  avx512_chosen() ? avx512::tanh(x, y, n) : avx2::tanh(x, y, n);
}
void tanh(const double* x, double* y, std::int64_t n) {
  avx512_chosen() ? avx512::tanh(x, y, n) : avx2::tanh(x, y, n);
}
void sigmoid(const float* x, float* y, std::int64_t n) {
  avx512_chosen() ? avx512::sigmoid(x, y, n) : avx2::sigmoid(x, y, n);
}
void sigmoid(const double* x, double* y, std::int64_t n) {
  avx512_chosen() ? avx512::sigmoid(x, y, n) : avx2::sigmoid(x, y, n);
}
void gelu(const double* x, double* y, std::int64_t n) {
  avx512_chosen() ? avx512::gelu(x, y, n) : avx2::gelu(x, y, n);
}
void gelu_backward(const double* grad, const double* x, double* y, std::int64_t n) {
  avx512_chosen() ? avx512::gelu_backward(grad, x, y, n) : avx2::gelu_backward(grad, x, y, n);
}
void gelu_tanh_with_exp(const float* x, float* y, std::int64_t n) {
  avx512_chosen() ? avx512::gelu_tanh_with_exp(x, y, n) : avx2::gelu_tanh_with_exp(x, y, n);
}
void gelu_tanh_backward_with_exp(const float* grad, const float* x, float* y, std::int64_t n) {
  avx512_chosen() ? avx512::gelu_tanh_backward_with_exp(grad, x, y, n) : avx2::gelu_tanh_backward_with_exp(grad, x, y, n);
}
void gelu_tanh(const double* x, double* y, std::int64_t n) {
  avx512_chosen() ? avx512::gelu_tanh(x, y, n) : avx2::gelu_tanh(x, y, n);
}
void gelu_tanh_backward(const double* grad, const double* x, double* y, std::int64_t n) {
  avx512_chosen() ? avx512::gelu_tanh_backward(grad, x, y, n) : avx2::gelu_tanh_backward(grad, x, y, n);
}
void softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t n, bool log) {
  avx512_chosen() ? avx512::softmax_rows(x, y, rows, n, log) : avx2::softmax_rows(x, y, rows, n, log);
}
void softmax_rows(const double* x, double* y, std::int64_t rows, std::int64_t n, bool log) {
  avx512_chosen() ? avx512::softmax_rows(x, y, rows, n, log) : avx2::softmax_rows(x, y, rows, n, log);
}
void softmax_backward_rows(const float* grad, const float* y, float* dx, std::int64_t rows, std::int64_t n, bool log) {
  avx512_chosen() ? avx512::softmax_backward_rows(grad, y, dx, rows, n, log) : avx2::softmax_backward_rows(grad, y, dx, rows, n, log);
}
void softmax_backward_rows(const double* grad, const double* y, double* dx, std::int64_t rows, std::int64_t n, bool log) {
  avx512_chosen() ? avx512::softmax_backward_rows(grad, y, dx, rows, n, log) : avx2::softmax_backward_rows(grad, y, dx, rows, n, log);
}
void causal_softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t queries, std::int64_t n, float scale) {
  avx512_chosen() ? avx512::causal_softmax_rows(x, y, rows, queries, n, scale) : avx2::causal_softmax_rows(x, y, rows, queries, n, scale);
}
void causal_softmax_rows(const double* x, double* y, std::int64_t rows, std::int64_t queries, std::int64_t n, double scale) {
  avx512_chosen() ? avx512::causal_softmax_rows(x, y, rows, queries, n, scale) : avx2::causal_softmax_rows(x, y, rows, queries, n, scale);
}
void causal_softmax_backward_rows(const float* grad, const float* y, float* dx, std::int64_t rows, std::int64_t queries, std::int64_t n, float scale) {
  avx512_chosen() ? avx512::causal_softmax_backward_rows(grad, y, dx, rows, queries, n, scale) : avx2::causal_softmax_backward_rows(grad, y, dx, rows, queries, n, scale);
}
void causal_softmax_backward_rows(const double* grad, const double* y, double* dx, std::int64_t rows, std::int64_t queries, std::int64_t n, double scale) {
  avx512_chosen() ? avx512::causal_softmax_backward_rows(grad, y, dx, rows, queries, n, scale) : avx2::causal_softmax_backward_rows(grad, y, dx, rows, queries, n, scale);
}
void side_by_side_block(const float* x, std::int64_t rows, std::int64_t n, std::int64_t step, float* lanes, float* out) {
  avx512_chosen() ? avx512::side_by_side_block(x, rows, n, step, lanes, out) : avx2::side_by_side_block(x, rows, n, step, lanes, out);
}
void side_by_side_block(const double* x, std::int64_t rows, std::int64_t n, std::int64_t step, double* lanes, double* out) {
  avx512_chosen() ? avx512::side_by_side_block(x, rows, n, step, lanes, out) : avx2::side_by_side_block(x, rows, n, step, lanes, out);
}
void log_sum_exp_rows(const float* x, float* lse, std::int64_t rows, std::int64_t n) {
  avx512_chosen() ? avx512::log_sum_exp_rows(x, lse, rows, n) : avx2::log_sum_exp_rows(x, lse, rows, n);
}
void log_sum_exp_rows(const double* x, double* lse, std::int64_t rows, std::int64_t n) {
  avx512_chosen() ? avx512::log_sum_exp_rows(x, lse, rows, n) : avx2::log_sum_exp_rows(x, lse, rows, n);
}
void exp_scaled(const float* x, float shift, float scale, float* y, std::int64_t n) {
  avx512_chosen() ? avx512::exp_scaled(x, shift, scale, y, n) : avx2::exp_scaled(x, shift, scale, y, n);
}
void exp_scaled(const double* x, double shift, double scale, double* y, std::int64_t n) {
  avx512_chosen() ? avx512::exp_scaled(x, shift, scale, y, n) : avx2::exp_scaled(x, shift, scale, y, n);
}
void layer_norm(const layer_norm_rows<float>& rows) {
  avx512_chosen() ? avx512::layer_norm(rows) : avx2::layer_norm(rows);
}
void layer_norm(const layer_norm_rows<double>& rows) {
  avx512_chosen() ? avx512::layer_norm(rows) : avx2::layer_norm(rows);
}
void layer_norm_backward(const layer_norm_backward_rows<float>& rows) {
  avx512_chosen() ? avx512::layer_norm_backward(rows) : avx2::layer_norm_backward(rows);
}
void layer_norm_backward(const layer_norm_backward_rows<double>& rows) {
  avx512_chosen() ? avx512::layer_norm_backward(rows) : avx2::layer_norm_backward(rows);
}

void philox_words(std::uint64_t seed, std::uint64_t start, std::int64_t n, std::uint32_t* w0, std::uint32_t* w1) {
  avx512_chosen() ? avx512::philox_words(seed, start, n, w0, w1) : avx2::philox_words(seed, start, n, w0, w1);
}
void dropout_mask(std::uint64_t seed, std::uint64_t start, std::int64_t n, float p, float scale, float* y) {
  avx512_chosen() ? avx512::dropout_mask(seed, start, n, p, scale, y) : avx2::dropout_mask(seed, start, n, p, scale, y);
}
void to_bfloat16(const float* x, std::uint16_t* y, std::int64_t n) {
  avx512_chosen() ? avx512::to_bfloat16(x, y, n) : avx2::to_bfloat16(x, y, n);
}
void from_bfloat16(const std::uint16_t* x, float* y, std::int64_t n) {
  avx512_chosen() ? avx512::from_bfloat16(x, y, n) : avx2::from_bfloat16(x, y, n);
}

} // namespace troupe::detail::vector_math

namespace troupe {

std::string_view cpu_vector_kernels() {
  if (!detail::vector_math::available())
    return "scalar";
  return detail::vector_math::avx512_chosen() ? "AVX-512" : "AVX2";
}

} // namespace troupe
