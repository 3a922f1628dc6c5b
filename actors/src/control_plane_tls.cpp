#include "control_plane_tls.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <mutex>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <caf/io/network/stream_impl.hpp>

#include "tls_files.hpp"

namespace troupe::actors::control_plane {

namespace {

namespace net = caf::io::network;

// Empties this thread's OpenSSL error queue and returns its first entry as
// text: called after every failed call, so no stale entry can make a later
// call on another session of this thread look fatal.
std::string drain_errors() {
  std::string first;
  while (auto code = ERR_get_error()) {
    if (first.empty()) {
      char text[256];
      ERR_error_string_n(code, text, sizeof text);
      first = text;
    }
  }
  return first;
}

// A socket BIO whose writes never raise SIGPIPE. OpenSSL's own socket BIO
// writes with write(2): a peer that closed first (a stranger mid-handshake, a
// node that stopped) would kill the whole process with SIGPIPE. send(2) with
// MSG_NOSIGNAL reports EPIPE instead, which fails only this session. The fd
// is the caller's to close.
int socket_write(BIO* bio, const char* data, int length) {
  BIO_clear_retry_flags(bio);
  auto n = ::send(static_cast<int>(BIO_get_fd(bio, nullptr)), data, static_cast<std::size_t>(length),
                  MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    BIO_set_retry_write(bio);
  return static_cast<int>(n);
}

int socket_read(BIO* bio, char* data, int length) {
  BIO_clear_retry_flags(bio);
  auto n = ::recv(static_cast<int>(BIO_get_fd(bio, nullptr)), data, static_cast<std::size_t>(length), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    BIO_set_retry_read(bio);
  return static_cast<int>(n);
}

long socket_ctrl(BIO* bio, int command, long number, void* pointer) {
  switch (command) {
    case BIO_C_SET_FD:
      BIO_set_data(bio, reinterpret_cast<void*>(static_cast<std::intptr_t>(*static_cast<int*>(pointer))));
      BIO_set_init(bio, 1);
      return 1;
    case BIO_C_GET_FD:
      if (!BIO_get_init(bio))
        return -1;
      if (pointer)
        *static_cast<int*>(pointer) = static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(bio)));
      return static_cast<long>(reinterpret_cast<std::intptr_t>(BIO_get_data(bio)));
    case BIO_CTRL_FLUSH:
      return 1;
    default:
      (void)number;
      return 0;
  }
}

const BIO_METHOD* nosignal_socket_method() {
  static BIO_METHOD* method = [] {
    auto* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                           "troupe socket without SIGPIPE");
    BIO_meth_set_write(m, socket_write);
    BIO_meth_set_read(m, socket_read);
    BIO_meth_set_ctrl(m, socket_ctrl);
    return m;
  }();
  return method;
}

std::string failure_reason(SSL* ssl, int code) {
  std::string why;
  switch (code) {
    case SSL_ERROR_ZERO_RETURN:
      why = "the peer closed the TLS session";
      break;
    case SSL_ERROR_SYSCALL:
      why = "the connection closed during TLS";
      break;
    default:
      why = "TLS failed";
  }
  auto detail = drain_errors();
  if (!detail.empty())
    why += ": " + detail;
  if (auto verify = SSL_get_verify_result(ssl); verify != X509_V_OK)
    why += fmt::format(" (certificate: {})", X509_verify_cert_error_string(verify));
  return why;
}

tls_step step_of(SSL* ssl, int result, std::string& why) {
  switch (int code = SSL_get_error(ssl, result)) {
    case SSL_ERROR_WANT_READ:
      return tls_step::want_read;
    case SSL_ERROR_WANT_WRITE:
      return tls_step::want_write;
    default:
      why = failure_reason(ssl, code);
      return tls_step::failed;
  }
}

// CAF's stream calls these on the middleman thread; the session was
// established before the scribe existed.
class session_policy {
public:
  explicit session_policy(ssl_ptr session) : session_(std::move(session)) {}

  caf::io::network::rw_state read_some(std::size_t& result, net::native_socket, void* buffer, std::size_t length) {
    return transfer(result, length, [&](tls_step& step, std::string& why) {
      return read_step(session_.get(), buffer, length, step, why);
    });
  }

  caf::io::network::rw_state write_some(std::size_t& result, net::native_socket, const void* buffer,
                                        std::size_t length) {
    return transfer(result, length, [&](tls_step& step, std::string& why) {
      return write_step(session_.get(), buffer, length, step, why);
    });
  }

  // Decrypted bytes OpenSSL holds are invisible to poll(): read them now.
  bool must_read_more(net::native_socket, std::size_t threshold) {
    return static_cast<std::size_t>(SSL_pending(session_.get())) >= threshold;
  }

private:
  template <class Step> caf::io::network::rw_state transfer(std::size_t& result, std::size_t length, Step step_once) {
    result = 0;
    if (length == 0)
      return caf::io::network::rw_state::indeterminate;
    tls_step step;
    std::string why;
    auto n = step_once(step, why);
    if (n < 0)
      return caf::io::network::rw_state::failure;
    result = static_cast<std::size_t>(n); // 0: would block, poll again
    return caf::io::network::rw_state::success;
  }

  ssl_ptr session_;
};

// CAF's own scribe_impl with the session in place of plain TCP.
class tls_scribe final : public caf::io::scribe {
public:
  tls_scribe(net::default_multiplexer& backend, int fd, ssl_ptr session)
    : scribe(net::conn_hdl_from_socket(fd)), stream_(backend, fd, std::move(session)) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) {
      launched_ = true;
      stream_.start(this);
    }
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = net::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string{};
  }
  std::uint16_t port() const override {
    auto x = net::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

private:
  bool launched_ = false;
  net::stream_impl<session_policy> stream_;
};

} // namespace

void ssl_deleter::operator()(SSL* ssl) const noexcept {
  SSL_free(ssl);
}

troupe::expected<std::shared_ptr<tls_context>> tls_context::load(const tls_options& options) {
  auto context = load_ssl_context(options);
  if (!context)
    return context.error();
  SSL_CTX_set_min_proto_version(*context, TLS1_2_VERSION);
  // Mutual: a peer without a certificate signed by the job's CA is refused
  // during the handshake, on both sides.
  SSL_CTX_set_verify(*context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // CAF's stream may retry a write from a reallocated buffer.
  SSL_CTX_set_mode(*context, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return std::shared_ptr<tls_context>(new tls_context(*context));
}

tls_context::~tls_context() {
  SSL_CTX_free(context_);
}

troupe::expected<ssl_ptr> tls_context::session(int fd, bool server) const {
  ERR_clear_error();
  ssl_ptr ssl(SSL_new(context_));
  BIO* bio = ssl ? BIO_new(nosignal_socket_method()) : nullptr;
  if (!bio)
    return make_error(errc::io_error, "TLS: cannot create a session: {}", drain_errors());
  BIO_set_fd(bio, fd, BIO_NOCLOSE);
  SSL_set_bio(ssl.get(), bio, bio); // the session owns the BIO from here
  if (server)
    SSL_set_accept_state(ssl.get());
  else
    SSL_set_connect_state(ssl.get());
  return ssl;
}

tls_step handshake_step(SSL* ssl, bool server, std::string& why) {
  ERR_clear_error();
  auto result = server ? SSL_accept(ssl) : SSL_connect(ssl);
  if (result == 1)
    return tls_step::done;
  return step_of(ssl, result, why);
}

namespace {

template <class Call> long io_step(SSL* ssl, tls_step& step, std::string& why, Call call) {
  ERR_clear_error();
  auto n = call();
  if (n > 0) {
    step = tls_step::done;
    return n;
  }
  step = step_of(ssl, n, why);
  return step == tls_step::failed ? -1 : 0;
}

} // namespace

long read_step(SSL* ssl, void* buffer, std::size_t length, tls_step& step, std::string& why) {
  return io_step(ssl, step, why, [&] { return SSL_read(ssl, buffer, static_cast<int>(length)); });
}

long write_step(SSL* ssl, const void* buffer, std::size_t length, tls_step& step, std::string& why) {
  return io_step(ssl, step, why, [&] { return SSL_write(ssl, buffer, static_cast<int>(length)); });
}

caf::io::scribe_ptr make_tls_scribe(caf::io::network::default_multiplexer& backend, int fd, ssl_ptr session) {
  return caf::make_counted<tls_scribe>(backend, fd, std::move(session));
}

} // namespace troupe::actors::control_plane
