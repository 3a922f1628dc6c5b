# Finds CAF 0.17 as Debian packages it (libcaf-dev): no CMake config and no
# pkg-config file, so locate headers and libraries ourselves and create
# imported targets CAF::core, CAF::io and CAF::openssl.
find_path(CAF_INCLUDE_DIR caf/config.hpp)
find_library(CAF_CORE_LIBRARY caf_core)
find_library(CAF_IO_LIBRARY caf_io)
find_library(CAF_OPENSSL_LIBRARY caf_openssl)

if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_version_line REGEX "#define CAF_VERSION [0-9]+")
  string(REGEX MATCH "[0-9]+" _caf_version "${_caf_version_line}")
  math(EXPR CAF_VERSION_MAJOR "${_caf_version} / 10000")
  math(EXPR CAF_VERSION_MINOR "(${_caf_version} / 100) % 100")
  math(EXPR CAF_VERSION_PATCH "${_caf_version} % 100")
  set(CAF_VERSION "${CAF_VERSION_MAJOR}.${CAF_VERSION_MINOR}.${CAF_VERSION_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY
  VERSION_VAR CAF_VERSION)

if(CAF_FOUND AND NOT TARGET CAF::core)
  find_package(OpenSSL REQUIRED)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
                        INTERFACE_LINK_LIBRARIES Threads::Threads)
  add_library(CAF::io UNKNOWN IMPORTED)
  set_target_properties(CAF::io PROPERTIES IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
                        INTERFACE_LINK_LIBRARIES CAF::core)
  add_library(CAF::openssl UNKNOWN IMPORTED)
  set_target_properties(CAF::openssl PROPERTIES IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
                        INTERFACE_LINK_LIBRARIES "CAF::io;OpenSSL::SSL;OpenSSL::Crypto")
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY)
