#include "library_loading.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

namespace troupe::detail::cuda {

void* open_first_library(std::initializer_list<const char*> names, std::string& why) {
  for (const char* name : names) {
    if (void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL))
      return handle;
    why += fmt::format("{}{}", why.empty() ? "" : "; ", ::dlerror());
  }
  return nullptr;
}

bool library_loaded(const char* soname) {
  void* handle = ::dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr)
    return false;
  ::dlclose(handle); // NOLOAD counted a reference
  return true;
}

} // namespace troupe::detail::cuda
