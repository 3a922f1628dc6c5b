#include "cublas_library.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include "library_loading.hpp"
#include "troupe/tensor/cuda.hpp"

#define TROUPE_CUBLAS_TEXT(x) #x
#define TROUPE_CUBLAS_MAJOR_TEXT(x) TROUPE_CUBLAS_TEXT(x)

namespace troupe::detail::cuda {

namespace {

/// The soname this build compiled against, then the file CMake found.
const char* const candidates[] = {"libcublas.so." TROUPE_CUBLAS_MAJOR_TEXT(CUBLAS_VER_MAJOR), TROUPE_CUBLAS_LIBRARY_PATH};

cublas_library open_cublas() {
  std::string why;
  void* handle = open_first_library({candidates[0], candidates[1]}, why);
  if (handle == nullptr)
    throw cuda_error(fmt::format("cannot load cuBLAS: {}", why));
  auto symbol = [&](const char* name) {
    void* found = ::dlsym(handle, name);
    if (found == nullptr)
      throw cuda_error(fmt::format("cuBLAS ({}) has no function {}", candidates[0], name));
    return found;
  };
  cublas_library lib;
  lib.create = reinterpret_cast<decltype(lib.create)>(symbol("cublasCreate_v2"));
  lib.destroy = reinterpret_cast<decltype(lib.destroy)>(symbol("cublasDestroy_v2"));
  lib.set_stream = reinterpret_cast<decltype(lib.set_stream)>(symbol("cublasSetStream_v2"));
  lib.sgemm_strided_batched = reinterpret_cast<decltype(lib.sgemm_strided_batched)>(symbol("cublasSgemmStridedBatched"));
  lib.dgemm_strided_batched = reinterpret_cast<decltype(lib.dgemm_strided_batched)>(symbol("cublasDgemmStridedBatched"));
  lib.status_string = reinterpret_cast<decltype(lib.status_string)>(symbol("cublasGetStatusString"));
  return lib;
}

} // namespace

const cublas_library& cublas_library::get() {
  static const cublas_library lib = open_cublas(); // a throw leaves it to the next call
  return lib;
}

bool cublas_library::loaded() {
  return library_loaded(candidates[0]);
}

} // namespace troupe::detail::cuda
