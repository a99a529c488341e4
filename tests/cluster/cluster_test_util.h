// Test fixtures of the cluster tests: an etcd server and kvharbord daemons
// as child processes on loopback (real processes, so that a test can
// SIGKILL or SIGSTOP one), and the workload's token and page generators.
// Header-only; one test owns each object (not thread-safe).
#ifndef KVHARBOR_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_
#define KVHARBOR_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "cluster/etcd_client.h"
#include "kvharbor/client.h"
#include "tests/server/subprocess.h"  // FreePort
#include "tests/skip.h"
#include "tests/temp_dir.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

extern char** environ;

namespace kvharbor {
namespace testing {

// A child process with stdout and stderr in `log`; SIGKILLed and reaped on
// destruction unless it already exited.
class ChildProcess {
 public:
  ChildProcess(std::vector<std::string> args, const std::string& log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&fa);
  }
  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }
  // Whether it still runs (reaps it, and remembers how it ended, if not).
  bool Alive() {
    if (pid_ <= 0) return false;
    if (waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }
  int exit_status() const { return exit_status_; }
  // SIGSTOP and wait until every thread is stopped: kill() returns before
  // a busy thread on another core has taken the signal.
  bool Stop(absl::Duration timeout = absl::Seconds(5)) {
    Signal(SIGSTOP);
    const absl::Time end = absl::Now() + timeout;
    const std::string dir = "/proc/" + std::to_string(pid_) + "/task";
    while (absl::Now() < end) {
      bool all = true;
      for (const auto& task : std::filesystem::directory_iterator(dir)) {
        std::ifstream stat(task.path() / "stat");
        std::string text((std::istreambuf_iterator<char>(stat)), {});
        const size_t paren = text.rfind(')');
        all = all && paren != std::string::npos && paren + 2 < text.size() &&
              text[paren + 2] == 'T';
      }
      if (all) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);  // a stopped child must run to die
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int exit_status_ = 0;
};

// The etcd on PATH (Debian's etcd-server, which scripts/install_deps.sh
// installs), or "" when there is none.
inline std::string EtcdBinary() {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "";
  size_t begin = 0;
  while (begin <= dirs.size()) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(begin, end - begin);
    const std::string candidate = (dir.empty() ? "." : dir) + "/etcd";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  return "";
}

// True, with the test marked skipped (tests/skip.h: CTest reports it as
// skipped, not passed), when there is no etcd; the caller then returns.
inline bool SkipWithoutEtcd() {
  if (!EtcdBinary().empty()) return false;
  MarkSkipped(
      "no etcd on PATH (apt-get install etcd-server; CI gets it from "
      "scripts/install_deps.sh)");
  return true;
}

// A single-node etcd on free loopback ports with its data in `dir`.
class EtcdServer {
 public:
  // Ports 0 pick free ones; a restart passes the previous ones again.
  explicit EtcdServer(const std::string& dir, int client_port = 0,
                      int peer_port = 0) {
    client_port_ = client_port != 0 ? client_port : FreePort();
    peer_port_ = peer_port != 0 ? peer_port : FreePort();
    const int peer = peer_port_;
    const std::string client =
        "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{EtcdBinary(), "--name=test",
                                 "--data-dir=" + dir + "/etcd",
                                 "--listen-client-urls=" + client,
                                 "--advertise-client-urls=" + client,
                                 "--listen-peer-urls=" + peer_url,
                                 "--initial-advertise-peer-urls=" + peer_url,
                                 "--initial-cluster=test=" + peer_url,
                                 "--logger=zap", "--log-level=error"},
        dir + "/etcd.log");
  }
  std::string endpoint() const {
    return "http://127.0.0.1:" + std::to_string(client_port_);
  }
  cluster::EtcdOptions options() const {
    cluster::EtcdOptions o;
    o.endpoints = {endpoint()};
    o.request_timeout = absl::Seconds(2);
    return o;
  }
  // True once etcd answers a range request (within `timeout`).
  bool WaitReady(absl::Duration timeout = absl::Seconds(15)) {
    cluster::EtcdClient c(options());
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (c.RangePrefix("/").ok()) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }
  ChildProcess& process() { return *process_; }
  int client_port() const { return client_port_; }
  int peer_port() const { return peer_port_; }

 private:
  int client_port_ = 0;
  int peer_port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

// kvharbord on a fixed loopback port (so a restart keeps its address),
// registered in etcd when `etcd_endpoint` is set.
class DaemonProcess {
 public:
  DaemonProcess(const TempDir& dir, int port, const std::string& etcd_endpoint,
                const std::string& prefix)
      : port_(port) {
    std::string yaml = "store:\n  pool_budget_bytes: 256MiB\n";
    if (!etcd_endpoint.empty()) {
      yaml += "cluster:\n  etcd_endpoints: [" + etcd_endpoint +
              "]\n  key_prefix: " + prefix + "\n  lease_ttl_s: 2\n";
    }
    config_ = dir.Write("kvharbord_" + std::to_string(port) + ".yaml", yaml);
    log_ = dir.path + "/kvharbord_" + std::to_string(port) + ".log";
    Start();
  }
  void Start() {
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{KVHARBORD_PATH, "--config=" + config_,
                                 "--listen=" + address(),
                                 "--metrics_listen=", "--log_level=warn"},
        log_);
  }
  // A client of this daemon alone, connected within `timeout`. A fresh
  // channel per attempt: one channel's reconnect backoff would outlast a
  // daemon that comes up while it waits.
  std::unique_ptr<Client> Connect(absl::Duration timeout = absl::Seconds(10)) {
    ClientOptions o;
    o.address = address();
    o.default_timeout = absl::Seconds(5);
    o.own_connection = true;
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      auto c = Client::Create(o);
      REQUIRE(c.ok());
      auto st = (*c)->Stats("", CallOptions::Timeout(absl::Seconds(2)));
      if (st.ok()) return std::move(*c);
      last_error_ = st.status().ToString();
      absl::SleepFor(absl::Milliseconds(50));
    }
    return nullptr;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  ChildProcess& process() { return *process_; }
  // What the daemon logged (for a failing test's message).
  std::string Log() const {
    std::ifstream in(log_);
    return last_error_ + "\n" +
           std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  int port_;
  std::string last_error_;  // of the last failed Connect attempt
  std::string config_;
  std::string log_;
  std::unique_ptr<ChildProcess> process_;
};

// Polls `pred` every 20 ms for up to `timeout`; its last value.
template <typename Pred>
bool WaitFor(Pred pred, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return pred();
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_
