// The guarded control plane (actors/src/control_plane_*.hpp): a connection
// reaches CAF's BASP broker only after it has proved membership of the job
// (TLS certificate when the job uses TLS, then the preamble with the job
// token); strangers of every kind are closed with a rate-limited log line,
// within a deadline, and a link that is already up never notices them.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "control_plane_connect.hpp"
#include "control_plane_listener.hpp"
#include "control_plane_preamble.hpp"
#include "control_plane_tls.hpp"
#include "process_support.hpp"
#include "test_certs.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::actors;
namespace cp = troupe::actors::control_plane;

namespace {

constexpr std::uint64_t job_token = 0x5eed5eed12345678ull;

using troupe::test::cert_dir;
using troupe::test::remove_certs;

std::shared_ptr<const cp::tls_context> tls_of(const std::string& node, const std::string& ca = "ca") {
  auto context =
    cp::tls_context::load({cert_dir() + "/" + node + ".pem", cert_dir() + "/" + node + ".key", cert_dir() + "/" + ca + ".pem", ""});
  EXPECT_TRUE(context) << context.error().message();
  return context ? *context : nullptr;
}

caf::behavior echo() {
  return {[](int x) { return x + 1; }};
}

// One CAF system with a middleman: a "node" for these tests.
struct system_under_test {
  caf::actor_system_config config;
  std::unique_ptr<caf::actor_system> system;
  system_under_test() {
    config.load<caf::io::middleman>();
    config.set("middleman.heartbeat-interval", caf::timespan{200ms});
    config.set("middleman.connection-timeout", caf::timespan{2s});
    system = std::make_unique<caf::actor_system>(config);
  }
};

// The listening side with short bounds, so that the tests stay short.
struct guarded_server : system_under_test {
  caf::actor published;
  std::uint16_t port = 0;
  explicit guarded_server(std::shared_ptr<const cp::tls_context> tls = nullptr, std::size_t max_pending = 8) {
    published = system->spawn(echo);
    cp::listener_options options;
    options.node_name = "worker0";
    options.token = job_token;
    options.tls = std::move(tls);
    options.max_pending = max_pending;
    options.handshake_timeout = 600ms;
    options.log_interval = 300ms;
    auto bound = cp::publish(*system, published, 0, "127.0.0.1", options);
    EXPECT_TRUE(bound) << bound.error().message();
    port = bound ? *bound : 0;
  }
  ~guarded_server() { caf::anon_send_exit(published, caf::exit_reason::user_shutdown); }
};

// A member's round trip through the established link.
bool answers(caf::actor_system& system, const caf::actor& remote, int x = 41) {
  caf::scoped_actor self{system};
  bool ok = false;
  self->request(remote, 3s, x).receive([&](int y) { ok = y == x + 1; }, [](caf::error&) {});
  return ok;
}

int raw_connect(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const void* data, std::size_t size) {
  auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    auto n = ::send(fd, bytes, size, MSG_NOSIGNAL);
    if (n <= 0)
      return; // the node closed it already
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}

// True once the node has closed `fd` (EOF or reset), within `limit`. Bytes
// the node sends first (a TLS alert) are read and skipped.
bool closed_by_node(int fd, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  char buffer[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= 0ms)
      return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
      return false;
    auto n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0)
      return true;
  }
}

std::vector<char> basp_header(std::mt19937_64& rng, std::uint8_t operation, std::uint32_t payload_len) {
  std::vector<char> h(32);
  h[0] = static_cast<char>(operation);
  for (int i = 0; i < 4; ++i)
    h[4 + i] = static_cast<char>(payload_len >> (24 - 8 * i)); // CAF writes big endian
  for (int i = 8; i < 32; ++i)
    h[i] = static_cast<char>(rng());
  h[31] = 1; // a small destination actor id, as a real header would have
  return h;
}

// Every way of being a stranger that does not need TLS; each returns the
// bytes sent on a fresh connection. A truncated preamble is only closed at
// the deadline, so it is included on request.
std::vector<std::vector<char>> stranger_payloads(std::mt19937_64& rng, bool truncated = false) {
  std::vector<std::vector<char>> out;
  std::vector<char> random(1 + rng() % 4096);
  for (auto& c : random)
    c = static_cast<char>(rng());
  out.push_back(random);
  for (std::uint8_t op = 0; op < 7; ++op)
    out.push_back(basp_header(rng, op, 0xfffffff0u)); // a huge payload size, every operation
  auto wrong = cp::encode_preamble(job_token ^ 1);
  out.emplace_back(reinterpret_cast<const char*>(wrong.data()), reinterpret_cast<const char*>(wrong.data()) + 32);
  auto right = cp::encode_preamble(job_token);
  if (truncated)
    out.emplace_back(reinterpret_cast<const char*>(right.data()), reinterpret_cast<const char*>(right.data()) + 13);
  std::vector<char> tls_like = {0x16, 0x03, 0x01, 0x02, 0x00};
  tls_like.resize(517, 0x41);
  out.push_back(tls_like);
  return out;
}

} // namespace

TEST(ControlPlanePreamble, NamesWhatIsWrong) {
  auto good = cp::encode_preamble(job_token);
  EXPECT_TRUE(cp::check_preamble(good, job_token));
  auto error_of = [](std::span<const std::byte> bytes) {
    auto ok = cp::check_preamble(bytes, job_token);
    return ok ? std::string("(accepted)") : ok.error().message();
  };
  EXPECT_EQ(error_of(std::span(good).first(31)), "the preamble has 31 bytes, not 32");
  auto bad = good;
  bad[0] = std::byte{'X'};
  EXPECT_NE(error_of(bad).find("not \"TROUPEcp\""), std::string::npos);
  bad = good;
  bad[8] = std::byte{2};
  EXPECT_EQ(error_of(bad), "preamble version 2 (this node speaks 1)");
  bad = good;
  bad[27] = std::byte{1};
  EXPECT_EQ(error_of(bad), "the preamble's reserved fields are not 0");
  EXPECT_EQ(error_of(cp::encode_preamble(0)), "the preamble carries no job token");
  auto wrong = error_of(cp::encode_preamble(job_token + 1));
  EXPECT_NE(wrong.find("wrong job token"), std::string::npos);
  EXPECT_EQ(wrong.find(fmt::format("{}", job_token)), std::string::npos) << "the error must not reveal the token";
}

TEST(ControlPlaneGuard, AMemberJoinsAndAWrongTokenIsRefusedAndLogged) {
  guarded_server server;
  system_under_test client;
  auto remote = cp::connect(*client.system, "127.0.0.1", server.port, job_token, nullptr, 5s);
  ASSERT_TRUE(remote) << remote.error().message();
  EXPECT_TRUE(answers(*client.system, *remote));

  testing::internal::CaptureStderr();
  system_under_test other_job;
  auto start = std::chrono::steady_clock::now();
  auto refused = cp::connect(*other_job.system, "127.0.0.1", server.port, job_token + 1, nullptr, 3s);
  EXPECT_FALSE(refused);
  EXPECT_LT(test::seconds_since(start), 2.5) << "a refused member must fail quickly, not at its deadline";
  std::this_thread::sleep_for(100ms);
  auto log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("troupe: node worker0 refused a control-plane connection from 127.0.0.1:"), std::string::npos)
    << log;
  EXPECT_NE(log.find("wrong job token"), std::string::npos) << log;
  EXPECT_TRUE(answers(*client.system, *remote)) << "the member's link must survive the refusal";
}

TEST(ControlPlaneGuard, StrangersAreClosedAndAnEstablishedLinkNeverNotices) {
  guarded_server server;
  system_under_test client;
  auto remote = cp::connect(*client.system, "127.0.0.1", server.port, job_token, nullptr, 5s);
  ASSERT_TRUE(remote) << remote.error().message();
  std::mt19937_64 rng(7);
  testing::internal::CaptureStderr();
  int closed = 0, total = 0;
  for (int round = 0; round < 20; ++round) {
    for (auto& payload : stranger_payloads(rng, round == 0)) {
      int fd = raw_connect(server.port);
      ASSERT_GE(fd, 0);
      send_all(fd, payload.data(), payload.size());
      closed += closed_by_node(fd, 2s) ? 1 : 0;
      ++total;
      ::close(fd);
    }
    ASSERT_TRUE(answers(*client.system, *remote, round)) << "round " << round;
  }
  auto log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(closed, total) << "every stranger must be closed by the node";
  EXPECT_NE(log.find("no troupe preamble"), std::string::npos) << log;
  EXPECT_NE(log.find("more refused since the last report"), std::string::npos)
    << "hundreds of refusals in a few seconds must be summarised: " << log;
  auto lines = std::count(log.begin(), log.end(), '\n');
  EXPECT_LT(lines, total / 4) << "refusals are logged at a bounded rate: " << log;
}

TEST(ControlPlaneGuard, SilentAndSlowClientsAreClosedAtTheDeadlineAndCannotLockMembersOut) {
  guarded_server server(nullptr, /*max_pending=*/8);
  testing::internal::CaptureStderr();
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i)
    silent.push_back(raw_connect(server.port));
  int slow = raw_connect(server.port);
  // A member still gets in while strangers hold more than the bound open.
  system_under_test client;
  auto remote = cp::connect(*client.system, "127.0.0.1", server.port, job_token, nullptr, 5s);
  ASSERT_TRUE(remote) << remote.error().message();
  EXPECT_TRUE(answers(*client.system, *remote));
  // The slow one sends a byte of a real preamble every 100 ms: not enough.
  auto preamble = cp::encode_preamble(job_token);
  auto start = std::chrono::steady_clock::now();
  bool slow_closed = false;
  for (std::size_t i = 0; i < preamble.size() && !slow_closed; ++i) {
    send_all(slow, &preamble[i], 1);
    slow_closed = closed_by_node(slow, 100ms);
  }
  EXPECT_TRUE(slow_closed || closed_by_node(slow, 1s));
  EXPECT_LT(test::seconds_since(start), 1.5) << "the deadline is 600 ms";
  int closed = 0;
  for (int fd : silent) {
    closed += fd >= 0 && closed_by_node(fd, 1500ms) ? 1 : 0;
    ::close(fd);
  }
  ::close(slow);
  EXPECT_EQ(closed, 20) << "every silent connection is closed by the deadline or by eviction";
  std::this_thread::sleep_for(350ms); // one more log interval for the summary line
  auto log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused a control-plane connection"), std::string::npos) << log;
  EXPECT_TRUE(answers(*client.system, *remote));
}

// The mechanism behind "TLS did not help" (docs/design.md): a failed
// handshake used to leave OpenSSL's per-thread error queue full, and the
// next healthy link on the middleman's thread read it as its own failure.
TEST(ControlPlaneGuard, WithTlsFailedHandshakesOfStrangersNeverBreakAMembersLink) {
  guarded_server server(tls_of("node"));
  system_under_test client;
  auto remote = cp::connect(*client.system, "127.0.0.1", server.port, job_token, tls_of("node2"), 5s);
  ASSERT_TRUE(remote) << remote.error().message();
  EXPECT_TRUE(answers(*client.system, *remote));

  // A real TLS client without a certificate, one with another CA's, and
  // plain garbage; the member's link keeps answering between them.
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> anonymous(SSL_CTX_new(TLS_client_method()), &SSL_CTX_free);
  SSL_CTX_set_verify(anonymous.get(), SSL_VERIFY_NONE, nullptr);
  auto rogue = tls_of("rogue", "rogue-ca");
  std::mt19937_64 rng(11);
  testing::internal::CaptureStderr();
  for (int round = 0; round < 30; ++round) {
    int fd = raw_connect(server.port);
    ASSERT_GE(fd, 0);
    SSL* ssl = SSL_new(anonymous.get());
    SSL_set_fd(ssl, fd);
    (void)SSL_connect(ssl); // the server asks for a certificate and fails the handshake
    ERR_clear_error();
    SSL_free(ssl);
    EXPECT_TRUE(closed_by_node(fd, 2s));
    ::close(fd);

    system_under_test outsider;
    EXPECT_FALSE(cp::connect(*outsider.system, "127.0.0.1", server.port, job_token, rogue, 2s));

    for (auto& payload : stranger_payloads(rng)) {
      fd = raw_connect(server.port);
      send_all(fd, payload.data(), payload.size());
      EXPECT_TRUE(closed_by_node(fd, 2s));
      ::close(fd);
    }
    ASSERT_TRUE(answers(*client.system, *remote, round)) << "round " << round;
  }
  // A member of another job (right CA, wrong token) is refused too.
  system_under_test other_job;
  EXPECT_FALSE(cp::connect(*other_job.system, "127.0.0.1", server.port, job_token + 1, tls_of("node2"), 3s));
  std::this_thread::sleep_for(350ms);
  auto log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused a control-plane connection"), std::string::npos) << log;
  EXPECT_TRUE(answers(*client.system, *remote));
}

// A peer that closed first (a stranger mid-handshake, a node that stopped)
// must fail only that session: OpenSSL's socket BIO writes with write(2),
// whose SIGPIPE would end the whole process (seen once in ctest).
TEST(ControlPlaneTls, WritingToAPeerThatClosedFailsTheSessionWithoutSigpipe) {
  auto context = tls_of("node");
  ASSERT_TRUE(context);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ::close(pair[1]); // the peer is gone before the first byte
  auto session = context->session(pair[0], false);
  ASSERT_TRUE(session) << session.error().message();
  std::string why;
  EXPECT_EQ(cp::handshake_step(session->get(), false, why), cp::tls_step::failed);
  EXPECT_FALSE(why.empty());
  cp::tls_step step{};
  char byte = 'x';
  EXPECT_EQ(cp::write_step(session->get(), &byte, 1, step, why), -1);
  EXPECT_EQ(step, cp::tls_step::failed);
  ::close(pair[0]);
}

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::AddGlobalTestEnvironment(new remove_certs);
  return RUN_ALL_TESTS();
}
