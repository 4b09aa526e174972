// Certificates for the TLS tests, made with the openssl command-line tool in a directory of the
// test's: a CA and a server certificate it signs (for 127.0.0.1 and localhost), a client
// certificate it signs (CN=alice, O=team), a self-signed client certificate (CN=mallory) and a
// second, unrelated CA with a server certificate of its own. Files are world-readable (tenants
// run under other uids in the tests); nothing here is a secret outside the test.
#pragma once

#include <string>

namespace gmux::testing {

struct TestPki {
  std::string dir;
  std::string ca() const { return dir + "/ca.pem"; }
  std::string server_cert() const { return dir + "/server.pem"; }
  std::string server_key() const { return dir + "/server.key"; }
  std::string client_cert() const { return dir + "/client.pem"; }
  std::string client_key() const { return dir + "/client.key"; }
  std::string rogue_cert() const { return dir + "/rogue.pem"; }
  std::string rogue_key() const { return dir + "/rogue.key"; }
  std::string other_ca() const { return dir + "/other-ca.pem"; }
  std::string other_server_cert() const { return dir + "/other-server.pem"; }
  std::string other_server_key() const { return dir + "/other-server.key"; }
};

// Makes every file in `dir` (created if missing). Empty string on success, else what failed
// (with openssl's output).
std::string MakeTestPki(const std::string& dir, TestPki* out);

}  // namespace gmux::testing
