// GEMM throughput: troupe::matmul against OpenBLAS's cblas_sgemm called
// directly on the same buffers, in interleaved rounds of the same run, with a
// correctness column (max |difference| between the two results). Both call
// the OpenBLAS troupe loaded, with the kernel troupe chose (printed).
//
//   build/bench/gemm [--json] [--rounds=5]
#include <dlfcn.h>

#include <cblas.h>

#include "report.hpp"
#include "troupe/tensor/cpu_blas.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;

namespace {

struct shape_case {
  const char* name;
  std::int64_t m, k, n;
  bool transpose_b; // B given as a transposed view, as Linear's weight is
};

} // namespace

int main(int argc, char** argv) {
  bench::check_flags("gemm", argc, argv, {"rounds="});
  bench::report out("gemm", argc, argv);
  auto rounds = static_cast<int>(bench::int_option(argc, argv, "rounds", 5, 1, 1000));
  const shape_case cases[] = {
      {"1024x1024x1024", 1024, 1024, 1024, false},
      {"256x1024x1024 (B^T view)", 256, 1024, 1024, true},
  };
  // The copy troupe loaded at start-up (RTLD_NOLOAD: never a second one).
  void* openblas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
  auto* cblas_sgemm = openblas ? reinterpret_cast<decltype(&::cblas_sgemm)>(dlsym(openblas, "cblas_sgemm")) : nullptr;
  if (cblas_sgemm == nullptr) {
    fmt::print(stderr, "gemm: OpenBLAS is not loaded in this process: {}\n", dlerror());
    return 1;
  }
  generator gen{42};
  for (const auto& c : cases) {
    auto a = rand({c.m, c.k}, gen, -1, 1);
    // b_rows holds B row-major ([k, n]) or, for the transposed case, B^T
    // row-major ([n, k]) so B itself is the strided view b_rows.t().
    auto b_rows = c.transpose_b ? rand({c.n, c.k}, gen, -1, 1) : rand({c.k, c.n}, gen, -1, 1);
    auto b = c.transpose_b ? b_rows.t() : b_rows;
    auto direct = tensor::zeros({c.m, c.n});
    std::vector<double> ours, theirs;
    tensor result;
    for (int r = 0; r < rounds; ++r) {
      ours.push_back(bench::time_per_call([&] { result = matmul(a, b); }));
      theirs.push_back(bench::time_per_call([&] {
        if (c.transpose_b) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(c.m), int(c.n), int(c.k), 1.0f,
                      a.data<float>(), int(c.k), b_rows.data<float>(),
                      int(c.k), 0.0f, direct.data<float>(), int(c.n));
        } else {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(c.m), int(c.n), int(c.k), 1.0f,
                      a.data<float>(), int(c.k), b_rows.data<float>(), int(c.n), 0.0f, direct.data<float>(),
                      int(c.n));
        }
      }));
    }
    auto flops = 2.0 * double(c.m) * double(c.k) * double(c.n);
    auto diff = max_abs_diff(result, direct);
    out.add({c.name, "GFLOP/s", flops / bench::median(ours) / 1e9, "GFLOP/s", "OpenBLAS cblas_sgemm",
             flops / bench::median(theirs) / 1e9, fmt::format("max|diff|={:.2g}{}", diff, diff > 1e-3 ? " WRONG" : "")});
  }
  out.print();
}
