#pragma once
// The checked OpenSSL context behind tls.hpp's validate(): certificate,
// key (decrypted with the passphrase) and CA loaded, the key matching the
// certificate and the certificate signed by the CA.
#include "troupe/actors/tls.hpp"
#include "troupe/tensor/expected.hpp"

using SSL_CTX = struct ssl_ctx_st;

namespace troupe::actors {

/// A new context the caller frees (SSL_CTX_free); the error names the file
/// and what is wrong with it.
troupe::expected<SSL_CTX*> load_ssl_context(const tls_options& tls);

} // namespace troupe::actors
