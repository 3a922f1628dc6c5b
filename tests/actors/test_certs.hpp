#pragma once
// The test certificates (scripts/make_test_certs.sh), made once per test
// binary in a temporary directory that a gtest environment removes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace troupe::test {

inline const std::string& cert_dir() {
  static const std::string dir = [] {
    auto path = std::filesystem::temp_directory_path() / ("troupe_certs_" + std::to_string(getpid()));
    auto command = std::string(TROUPE_SOURCE_DIR) + "/scripts/make_test_certs.sh " + path.string() + " >/dev/null";
    if (std::system(command.c_str()) != 0)
      ADD_FAILURE() << "make_test_certs.sh failed";
    return path.string();
  }();
  return dir;
}

/// Register with testing::AddGlobalTestEnvironment(new remove_certs).
struct remove_certs : ::testing::Environment {
  void TearDown() override { std::filesystem::remove_all(cert_dir()); }
};

} // namespace troupe::test
