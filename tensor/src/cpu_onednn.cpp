#include "cpu_onednn.hpp"

namespace troupe::detail {

const dnnl::engine& onednn_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& onednn_thread_stream() {
  thread_local dnnl::stream stream(onednn_engine());
  return stream;
}

bool onednn_runs_avx512() {
  // The ISA values are sets of bits; AVX2 with VNNI is numerically larger
  // than AVX-512 without containing it.
  static const bool avx512 = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return (isa & core) == core;
  }();
  return avx512;
}

} // namespace troupe::detail
