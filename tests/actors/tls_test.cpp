// Mutual TLS between nodes: incomplete or inconsistent TLS settings are
// refused before CAF's module starts; nodes with certificates from the job's
// CA connect; a peer with another CA's certificate, or without TLS, is
// rejected with an error and without hanging.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include <caf/all.hpp>

#include "node_child.hpp"
#include "process_support.hpp"
#include "test_certs.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/tls.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::actors;
using troupe::test::child_process;

namespace {

using troupe::test::cert_dir;
using troupe::test::remove_certs;

tls_options certs(const std::string& node, const std::string& ca = "ca") {
  return {cert_dir() + "/" + node + ".pem", cert_dir() + "/" + node + ".key", cert_dir() + "/" + ca + ".pem", ""};
}

std::string error_of(const tls_options& tls) {
  auto ok = validate(tls);
  return ok ? "(no error)" : ok.error().message();
}

std::vector<std::string> tls_flags(const tls_options& tls) {
  return {"--troupe.tls.certificate=" + tls.certificate, "--troupe.tls.key=" + tls.key,
          "--troupe.tls.ca=" + tls.ca_file};
}

child_process start_worker(std::uint16_t port, std::vector<std::string> extra) {
  std::vector<std::string> args{"--node-child", "--troupe.coordinator=127.0.0.1:" + std::to_string(port),
                                "--troupe.rank=1", "--troupe.world-size=2", "--troupe.listen-address=127.0.0.1",
                                "--troupe.join-timeout=2s", "--troupe.name=worker1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return child_process::start(child_process::self_path(), args,
                              {"TROUPE_COORDINATOR=", "TROUPE_RANK=", "TROUPE_WORLD_SIZE=", "TROUPE_NODE_NAME="});
}

std::unique_ptr<node> start_tls_coordinator() {
  node_options options;
  options.name = "worker0";
  options.world_size = 2;
  options.listen_address = "127.0.0.1";
  options.tls = certs("node");
  auto started = node::start(options);
  EXPECT_TRUE(started) << started.error().message();
  return started ? std::move(*started) : nullptr;
}

} // namespace

TEST(Tls, IncompleteSettingsAreRefusedBeforeStarting) {
  auto full = certs("node");
  EXPECT_TRUE(validate(full)) << error_of(full);
  auto no_key = full;
  no_key.key.clear();
  EXPECT_EQ(error_of(no_key),
            "TLS needs a certificate, a key and a CA, but the key (tls.key) is not set; anonymous TLS is refused");
  auto no_ca = full;
  no_ca.ca_file.clear();
  EXPECT_NE(error_of(no_ca).find("the CA (tls.ca) is not set"), std::string::npos);
  auto missing = full;
  missing.certificate = cert_dir() + "/nope.pem";
  EXPECT_EQ(error_of(missing),
            "TLS certificate file \"" + missing.certificate + "\" cannot be read: No such file or directory");

  // And node::start refuses too, naming the node.
  node_options options;
  options.name = "worker0";
  options.tls = no_key;
  auto started = node::start(options);
  ASSERT_FALSE(started);
  EXPECT_EQ(started.error().message().rfind("node worker0: TLS needs a certificate", 0), 0u)
    << started.error().message();
}

TEST(Tls, BadKeysAndForeignCertificatesAreRefused) {
  auto encrypted = certs("encrypted");
  EXPECT_NE(error_of(encrypted).find("encrypted and the passphrase is not set"), std::string::npos)
    << error_of(encrypted);
  encrypted.passphrase = "wrong";
  EXPECT_NE(error_of(encrypted).find("the passphrase is wrong"), std::string::npos) << error_of(encrypted);
  encrypted.passphrase = "troupe-test";
  EXPECT_TRUE(validate(encrypted)) << error_of(encrypted);

  auto mismatch = certs("node");
  mismatch.key = cert_dir() + "/node2.key";
  EXPECT_NE(error_of(mismatch).find("does not match certificate"), std::string::npos) << error_of(mismatch);

  auto foreign = certs("rogue", "ca");
  EXPECT_NE(error_of(foreign).find("is not signed by CA"), std::string::npos) << error_of(foreign);
}

TEST(Tls, NodesWithCertificatesFromTheJobsCaConnect) {
  auto coordinator = start_tls_coordinator();
  ASSERT_TRUE(coordinator);
  test::add_test_factories(*coordinator);
  auto worker = start_worker(coordinator->port(), tls_flags(certs("node2")));
  ASSERT_TRUE(worker.wait_for("READY", 15s)) << worker.output();
  ASSERT_TRUE(coordinator->wait_for_nodes(2, 10s));
  auto adder = coordinator->spawn_remote(*place::parse("worker1/cpu/adder"), "adder", caf::make_message(40));
  ASSERT_TRUE(adder) << adder.error().message();
  caf::scoped_actor self{coordinator->system()};
  int sum = 0;
  self->request(*adder, 5s, 2).receive([&](const std::string&, int value) { sum = value; }, [](caf::error&) {});
  EXPECT_EQ(sum, 42);
  *adder = nullptr;
  worker.close_stdin();
  EXPECT_TRUE(worker.exited(10s));
}

TEST(Tls, PeersWithAForeignCertificateOrWithoutTlsAreRejected) {
  auto coordinator = start_tls_coordinator();
  ASSERT_TRUE(coordinator);
  // Consistent in itself (its own CA signs it), but not the job's CA.
  auto start = std::chrono::steady_clock::now();
  auto rogue = start_worker(coordinator->port(), tls_flags(certs("rogue", "rogue-ca")));
  auto status = rogue.exited(10s);
  ASSERT_TRUE(status) << "the rogue peer hangs: " << rogue.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << rogue.output();
  EXPECT_NE(rogue.output().find("could not join coordinator"), std::string::npos) << rogue.output();
  // A plain peer speaks BASP into a TLS socket.
  auto plain = start_worker(coordinator->port(), {});
  status = plain.exited(10s);
  ASSERT_TRUE(status) << "the plain peer hangs: " << plain.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << plain.output();
  EXPECT_LT(test::seconds_since(start), 8.0);
  EXPECT_EQ(*coordinator->nodes(), (std::vector<std::string>{"worker0"}));
}

int main(int argc, char** argv) {
  if (troupe::test::is_node_child(argc, argv))
    return troupe::test::run_node_child(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  testing::AddGlobalTestEnvironment(new remove_certs);
  return RUN_ALL_TESTS();
}
