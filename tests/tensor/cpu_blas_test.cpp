// troupe loads OpenBLAS itself (tensor/src/openblas.hpp): with nothing set
// in the environment it runs the kernel named from the CPU's features, with
// one thread, and leaves the environment as it found it; a kernel the user
// names wins. Each case runs in a child process with a chosen environment,
// because OpenBLAS reads its environment once, when it is loaded.
#include <dlfcn.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "troupe/tensor/cpu_blas.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe {
namespace {

constexpr const char* child_marker = "TROUPE_CPU_BLAS_TEST_CHILD";

/// In the child: what it saw, one line.
std::string describe_this_process() {
  void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
  auto threads = lib ? reinterpret_cast<int (*)()>(dlsym(lib, "openblas_get_num_threads")) : nullptr;
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const char* env_threads = std::getenv("OPENBLAS_NUM_THREADS");
  // A GEMM through the loaded library, checked by hand: [1 2; 3 4]^2.
  auto a = tensor::from<float>({1, 2, 3, 4}, {2, 2});
  auto p = matmul(a, a);
  bool right = p.at({0, 0}) == 7 && p.at({0, 1}) == 10 && p.at({1, 0}) == 15 && p.at({1, 1}) == 22;
  return "kernel=" + std::string(blas_kernel()) + " env=" + (env ? env : "unset") +
         " env_threads=" + (env_threads ? env_threads : "unset") +
         " threads=" + std::to_string(threads ? threads() : -1) + " gemm=" + (right ? "right" : "WRONG");
}

/// Runs this test binary's ChildReports case under `environment` and
/// returns its line.
std::string run_child(const std::string& environment) {
  auto command = "env -u OPENBLAS_CORETYPE -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS " + environment + " " +
                 child_marker + "=1 /proc/" + std::to_string(::getpid()) +
                 "/exe --gtest_filter=CpuBlas.ChildReports 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr)
    return "popen failed";
  std::string out;
  std::array<char, 512> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) {
    std::string line = buffer.data();
    if (line.rfind("kernel=", 0) == 0)
      out = line.substr(0, line.find('\n'));
  }
  ::pclose(pipe);
  return out;
}

TEST(CpuBlas, ChildReports) {
  if (std::getenv(child_marker) == nullptr)
    GTEST_SKIP() << "runs only as the child of the cases below";
  std::printf("%s\n", describe_this_process().c_str());
}

TEST(CpuBlas, NothingSetRunsTheKernelNamedFromTheCpuWithOneThread) {
  auto expected_kernel = std::string(blas_kernel_for_this_cpu());
  auto line = run_child("");
  if (expected_kernel.empty()) {
    // A CPU without AVX2: OpenBLAS decides; only the rest is troupe's.
    EXPECT_NE(line.find(" env=unset env_threads=unset threads=1 gemm=right"), std::string::npos) << line;
    return;
  }
  EXPECT_EQ(line, "kernel=" + expected_kernel + " env=unset env_threads=unset threads=1 gemm=right");
}

TEST(CpuBlas, TheUsersChoiceWins) {
  if (blas_kernel_for_this_cpu().empty())
    GTEST_SKIP() << "this CPU has no AVX2, which the Haswell kernel needs";
  EXPECT_EQ(run_child("OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=2"),
            "kernel=Haswell env=Haswell env_threads=2 threads=2 gemm=right");
}

} // namespace
} // namespace troupe
