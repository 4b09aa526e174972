#include "runtime/test_pki.h"

#include <sys/stat.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace gmux::testing {

namespace {

// Runs a shell command; empty on success, else the command and its output.
std::string Run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return "cannot run: " + cmd;
  std::array<char, 512> buf{};
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int rc = ::pclose(p);
  return rc == 0 ? "" : cmd + "\n" + out;
}

}  // namespace

std::string MakeTestPki(const std::string& dir, TestPki* out) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ::chmod(dir.c_str(), 0755);
  const std::string d = "'" + dir + "'";
  const std::string key = "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes ";
  const std::string sign = "openssl x509 -req -days 2 -set_serial ";
  for (const std::string& cmd : {
           // The CA, and a server certificate for the loopback address and name.
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
           "-subj '/CN=gmux test CA' -keyout " + d + "/ca.key -out " + d + "/ca.pem",
           key + "-subj '/CN=localhost' -keyout " + d + "/server.key -out " + d + "/server.csr",
           "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > " + d + "/server.ext",
           sign + "11 -in " + d + "/server.csr -CA " + d + "/ca.pem -CAkey " + d +
               "/ca.key -extfile " + d + "/server.ext -out " + d + "/server.pem",
           // A client certificate the CA signs, and one nobody signs.
           key + "-subj '/O=team/CN=alice' -keyout " + d + "/client.key -out " + d +
               "/client.csr",
           sign + "12 -in " + d + "/client.csr -CA " + d + "/ca.pem -CAkey " + d +
               "/ca.key -out " + d + "/client.pem",
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
           "-subj '/CN=mallory' -keyout " + d + "/rogue.key -out " + d + "/rogue.pem",
           // An unrelated CA and its own server certificate for the same names.
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
           "-subj '/CN=other CA' -keyout " + d + "/other-ca.key -out " + d + "/other-ca.pem",
           key + "-subj '/CN=localhost' -keyout " + d + "/other-server.key -out " + d +
               "/other-server.csr",
           sign + "13 -in " + d + "/other-server.csr -CA " + d + "/other-ca.pem -CAkey " + d +
               "/other-ca.key -extfile " + d + "/server.ext -out " + d + "/other-server.pem",
           "chmod 0644 " + d + "/*",
       }) {
    if (std::string err = Run(cmd); !err.empty()) return err;
  }
  out->dir = dir;
  return "";
}

}  // namespace gmux::testing
