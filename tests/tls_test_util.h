// TestPki: certificates made at test time with the openssl CLI (installed by
// scripts/install_deps.sh): a CA, a server certificate for 127.0.0.1 and
// kvharbor.test signed by it, a client certificate signed by it, and a
// second, untrusted CA with a "rogue" client certificate of its own.
//
// Test-only, header-only. The files live in the TempDir the object owns and
// disappear with it. Not thread-safe (one test owns it).
#ifndef KVHARBOR_TESTS_TLS_TEST_UTIL_H_
#define KVHARBOR_TESTS_TLS_TEST_UTIL_H_

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <string>

#include "tests/temp_dir.h"

namespace kvharbor {
namespace testing {

class TestPki {
 public:
  TestPki() {
    // P-256 keys: fast to make, accepted by gRPC's TLS stack. Short
    // validity; the files are gone when the test ends anyway.
    const std::string script = R"(set -e
cd "$1"
ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -days 2 -subj "/CN=$1" -keyout "$1.key" -out "$1.crt"
}
cert() {  # name, issuing CA, subjectAltName, extendedKeyUsage
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=$1" -keyout "$1.key" -out "$1.csr"
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$3" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" \
    -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt"
}
ca ca
ca other_ca
cert server ca "IP:127.0.0.1,DNS:kvharbor.test" serverAuth
cert client ca "DNS:client.test" clientAuth
cert rogue other_ca "DNS:rogue.test" clientAuth
)";
    const std::string path = dir_.Write("make_pki.sh", script);
    const std::string cmd =
        "sh '" + path + "' '" + dir_.path + "' > '" + dir_.path + "/log' 2>&1";
    INFO("openssl failed; see " << dir_.path << "/log");
    REQUIRE(std::system(cmd.c_str()) == 0);
  }

  std::string File(const std::string& name) const {
    return dir_.path + "/" + name;
  }
  std::string ca() const { return File("ca.crt"); }
  std::string other_ca() const { return File("other_ca.crt"); }
  std::string server_cert() const { return File("server.crt"); }
  std::string server_key() const { return File("server.key"); }
  std::string client_cert() const { return File("client.crt"); }
  std::string client_key() const { return File("client.key"); }
  std::string rogue_cert() const { return File("rogue.crt"); }
  std::string rogue_key() const { return File("rogue.key"); }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
};

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_TLS_TEST_UTIL_H_
