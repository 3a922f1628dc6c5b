#pragma once
// Private: opening a CUDA library on first use (cublas_library.hpp says why
// troupe does not link cuBLAS and cuDNN).
#include <initializer_list>
#include <string>

namespace troupe::detail::cuda {

/// dlopen()s the first of `names` that opens (RTLD_LOCAL: troupe resolves
/// what it calls, nothing else sees it); nullptr when none does, with every
/// loader message in `why`.
void* open_first_library(std::initializer_list<const char*> names, std::string& why);

/// Whether `soname` is loaded in this process, by troupe or anyone else.
bool library_loaded(const char* soname);

} // namespace troupe::detail::cuda
