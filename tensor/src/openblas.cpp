#include "openblas.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "troupe/tensor/cpu_blas.hpp"

#ifndef TROUPE_OPENBLAS_SONAME
#define TROUPE_OPENBLAS_SONAME "libopenblas.so.0"
#endif

namespace troupe::detail {

namespace {

/// Sets an environment variable for the duration of a scope, then puts back
/// what was there (or nothing).
class scoped_env {
public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name))
      old_ = old;
    ::setenv(name, value, 1);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  ~scoped_env() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

private:
  const char* name_;
  std::optional<std::string> old_;
};

[[noreturn]] void cannot_load(const char* what) {
  std::fprintf(stderr, "troupe: cannot load OpenBLAS (%s): %s; install libopenblas0 (scripts/setup.sh does)\n",
               TROUPE_OPENBLAS_SONAME, what);
  std::abort();
}

openblas_library load() {
  std::optional<scoped_env> core, threads;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    if (auto name = blas_kernel_for_this_cpu(); !name.empty())
      core.emplace("OPENBLAS_CORETYPE", std::string(name).c_str());
  }
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr)
    threads.emplace("OPENBLAS_NUM_THREADS", "1");
  // RTLD_GLOBAL is not needed: troupe resolves what it calls here. If the
  // process already linked OpenBLAS, this returns that copy, initialised
  // with whatever its environment said.
  void* handle = ::dlopen(TROUPE_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr)
    cannot_load(::dlerror());
  auto symbol = [&](const char* name) {
    void* found = ::dlsym(handle, name);
    if (found == nullptr)
      cannot_load(name);
    return found;
  };
  openblas_library lib;
  lib.sgemm = reinterpret_cast<decltype(lib.sgemm)>(symbol("cblas_sgemm"));
  lib.dgemm = reinterpret_cast<decltype(lib.dgemm)>(symbol("cblas_dgemm"));
  lib.set_num_threads = reinterpret_cast<decltype(lib.set_num_threads)>(symbol("openblas_set_num_threads"));
  using corename_fn = char* (*)();
  lib.core = reinterpret_cast<corename_fn>(symbol("openblas_get_corename"))();
  return lib;
}

// Load while the process is still single-threaded (library initialisation):
// setenv is not safe beside other threads reading the environment.
[[maybe_unused]] const openblas_library& loaded_at_start = openblas();

} // namespace

const openblas_library& openblas() {
  static const openblas_library lib = load();
  return lib;
}

} // namespace troupe::detail

namespace troupe {

std::string_view blas_kernel_for_this_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512bf16"))
    return "Cooperlake";
  if (avx512)
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return "Haswell";
#endif
  return {};
}

std::string_view blas_kernel() {
  return detail::openblas().core;
}

} // namespace troupe
