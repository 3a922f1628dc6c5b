#pragma once
// Mutual TLS between nodes. troupe does the TLS of the control plane itself
// (docs/design.md, "Trust at the edges"); these settings name the files, and
// troupe refuses to run with anything less than certificate + key + CA
// (an anonymous fallback would authenticate nobody).
#include <string>

#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

struct tls_options {
  std::string certificate; ///< PEM certificate (chain) of this node
  std::string key;         ///< PEM private key of that certificate
  std::string ca_file;     ///< PEM CA that signs every node's certificate
  std::string passphrase;  ///< for an encrypted key; empty if not encrypted

  /// True when any TLS file is configured (TLS is then required in full).
  bool requested() const { return !certificate.empty() || !key.empty() || !ca_file.empty(); }
};

/// Checks that certificate, key and CA are all set and readable, that the key
/// decrypts with the passphrase and matches the certificate, and that the CA
/// signs the certificate. The error names the file and what is wrong.
troupe::expected<void> validate(const tls_options& tls);

} // namespace troupe::actors
