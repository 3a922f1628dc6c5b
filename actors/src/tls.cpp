#include "troupe/actors/tls.hpp"

#include "tls_files.hpp"

#include <cstdio>
#include <cstring>
#include <memory>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

namespace troupe::actors {

namespace {

std::string openssl_reason() {
  auto code = ERR_get_error();
  ERR_clear_error();
  if (code == 0)
    return "no detail from OpenSSL";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

// Never let OpenSSL prompt on the terminal: hand it the configured
// passphrase (possibly empty, which fails an encrypted key cleanly).
int passphrase_callback(char* buffer, int size, int, void* user) {
  auto* passphrase = static_cast<const std::string*>(user);
  auto n = static_cast<int>(std::min<std::size_t>(passphrase->size(), static_cast<std::size_t>(size)));
  std::memcpy(buffer, passphrase->data(), static_cast<std::size_t>(n));
  return n;
}

troupe::expected<void> readable(const std::string& path, std::string_view what) {
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (!file)
    return make_error(errc::io_error, "TLS {} file \"{}\" cannot be read: {}", what, path, std::strerror(errno));
  std::fclose(file);
  return {};
}

} // namespace

troupe::expected<SSL_CTX*> load_ssl_context(const tls_options& tls) {
  // All three or nothing: with only some keys CAF would still verify peers,
  // and with none it silently uses anonymous ciphers.
  const std::pair<const std::string*, std::string_view> required[] = {
    {&tls.certificate, "certificate (tls.certificate)"}, {&tls.key, "key (tls.key)"}, {&tls.ca_file, "CA (tls.ca)"}};
  for (auto [value, what] : required)
    if (value->empty())
      return make_error(errc::invalid_argument,
                        "TLS needs a certificate, a key and a CA, but the {} is not set; anonymous TLS is refused",
                        what);
  for (auto [path, what] : {std::pair{&tls.certificate, "certificate"}, {&tls.key, "key"}, {&tls.ca_file, "CA"}})
    if (auto ok = readable(*path, what); !ok)
      return ok.error();

  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> context(SSL_CTX_new(TLS_method()), &SSL_CTX_free);
  if (!context)
    return make_error(errc::io_error, "TLS: cannot create an OpenSSL context: {}", openssl_reason());
  ERR_clear_error();
  SSL_CTX_set_default_passwd_cb(context.get(), passphrase_callback);
  SSL_CTX_set_default_passwd_cb_userdata(context.get(), const_cast<std::string*>(&tls.passphrase));
  if (SSL_CTX_use_certificate_chain_file(context.get(), tls.certificate.c_str()) != 1)
    return make_error(errc::invalid_argument, "TLS certificate \"{}\" is not a PEM certificate: {}", tls.certificate,
                      openssl_reason());
  // Load the key by hand: decrypting it and matching it to the certificate
  // are different mistakes and get different messages.
  std::unique_ptr<BIO, decltype(&BIO_free)> key_file(BIO_new_file(tls.key.c_str(), "r"), &BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
    key_file ? PEM_read_bio_PrivateKey(key_file.get(), nullptr, passphrase_callback,
                                       const_cast<std::string*>(&tls.passphrase))
             : nullptr,
    &EVP_PKEY_free);
  if (!key)
    return make_error(errc::invalid_argument,
                      "TLS key \"{}\" cannot be loaded (not a PEM key, or encrypted and the passphrase is {}): {}",
                      tls.key, tls.passphrase.empty() ? "not set" : "wrong", openssl_reason());
  if (SSL_CTX_use_PrivateKey(context.get(), key.get()) != 1)
    return make_error(errc::invalid_argument, "TLS key \"{}\" does not match certificate \"{}\": {}", tls.key,
                      tls.certificate, openssl_reason());
  if (SSL_CTX_check_private_key(context.get()) != 1)
    return make_error(errc::invalid_argument, "TLS key \"{}\" does not match certificate \"{}\": {}", tls.key,
                      tls.certificate, openssl_reason());
  if (SSL_CTX_load_verify_locations(context.get(), tls.ca_file.c_str(), nullptr) != 1)
    return make_error(errc::invalid_argument, "TLS CA \"{}\" is not a PEM certificate: {}", tls.ca_file,
                      openssl_reason());
  // The node's own certificate must chain to the CA, or every peer would
  // reject it after the connection is up, far from the cause.
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> check(X509_STORE_CTX_new(), &X509_STORE_CTX_free);
  if (!check || X509_STORE_CTX_init(check.get(), SSL_CTX_get_cert_store(context.get()),
                                    SSL_CTX_get0_certificate(context.get()), nullptr) != 1)
    return make_error(errc::io_error, "TLS: cannot set up certificate verification: {}", openssl_reason());
  if (X509_verify_cert(check.get()) != 1)
    return make_error(errc::invalid_argument, "TLS certificate \"{}\" is not signed by CA \"{}\": {}",
                      tls.certificate, tls.ca_file,
                      X509_verify_cert_error_string(X509_STORE_CTX_get_error(check.get())));
  // The key is loaded; the callback's pointer to `tls` must not outlive it.
  SSL_CTX_set_default_passwd_cb(context.get(), nullptr);
  SSL_CTX_set_default_passwd_cb_userdata(context.get(), nullptr);
  return context.release();
}

troupe::expected<void> validate(const tls_options& tls) {
  auto context = load_ssl_context(tls);
  if (!context)
    return context.error();
  SSL_CTX_free(*context);
  return {};
}

} // namespace troupe::actors
