// `kvharbor cluster status` as a user runs it: members from etcd and from a
// static list, a dead member shown as down with exit status 1, and flag
// errors naming the flag.
#include <stdio.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <string>

#include "tests/cluster/cluster_test_util.h"

#ifndef KVHARBOR_CLI_PATH
#error "KVHARBOR_CLI_PATH (the built kvharbor CLI) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliResult RunCli(const std::string& args) {
  const std::string cmd = std::string(KVHARBOR_CLI_PATH) + " " + args + " 2>&1";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

int CountLinesWith(const std::string& text, const std::string& a,
                   const std::string& b) {
  int n = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    if (line.find(a) != std::string::npos &&
        line.find(b) != std::string::npos) {
      ++n;
    }
    start = end + 1;
  }
  return n;
}

TEST_CASE("kvharbor cluster status lists members, pages and dead ones") {
  if (SkipWithoutEtcd()) return;
  TempDir dir;
  EtcdServer etcd(dir.path);
  REQUIRE(etcd.WaitReady());
  const std::string prefix = "/cli-test/";
  DaemonProcess a(dir, FreePort(), etcd.endpoint(), prefix);
  DaemonProcess b(dir, FreePort(), etcd.endpoint(), prefix);
  auto client = a.Connect();
  REQUIRE(client != nullptr);
  REQUIRE(b.Connect() != nullptr);
  // Two pages cached on a: the status shows them.
  client::NamespaceSpec spec;
  spec.name = "ns";
  spec.geometry = {2, 2, 16, 16, client::DType::kFP32};
  REQUIRE(client->CreateNamespace(spec).ok());
  std::vector<int32_t> tokens(32, 7);
  std::vector<uint8_t> pages(2 * spec.geometry.PageBytes(), 1);
  REQUIRE(client->Insert("ns", tokens, pages, spec.geometry.PageBytes()).ok());

  // A daemon registers in etcd just after it starts serving, so a client
  // can connect a moment before its key exists.
  const std::string status_cmd = "cluster status --etcd=" + etcd.endpoint() +
                                 " --etcd_prefix=" + prefix +
                                 " --timeout_ms=2000";
  CliResult r;
  WaitFor(
      [&] {
        r = RunCli(status_cmd);
        return r.output.find("2 member(s)") != std::string::npos;
      },
      absl::Seconds(10));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("2 member(s)") != std::string::npos);
  CHECK(CountLinesWith(r.output, a.address(), " up ") == 1);
  CHECK(CountLinesWith(r.output, b.address(), " up ") == 1);
  // a's row: 1 namespace, 2 pages.
  CHECK(CountLinesWith(r.output, a.address(), "  1      2 ") == 1);

  // A static list with a dead member: shown down, exit status 1.
  const std::string dead = "127.0.0.1:" + std::to_string(FreePort());
  r = RunCli("cluster status --members=" + a.address() + "," + dead +
             " --timeout_ms=1000");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(CountLinesWith(r.output, dead, " down ") == 1);
  CHECK(r.output.find("1 of 2 member(s) did not answer") != std::string::npos);

  r = RunCli("cluster status");
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--etcd/--members/--dns") != std::string::npos);
  r = RunCli("cluster status --members=nohostport");
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--members") != std::string::npos);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
