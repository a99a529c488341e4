// Runs the built kvharbord as a child process on a free loopback port, for
// tests of what only a real process shows: signal handling and the
// reflection service as grpcurl sees it, and its memory as /proc reports it.
// Header-only; used by the server and reflection test binaries and by
// bench/server_memory_under_load.cc.
#ifndef KVHARBOR_TESTS_SERVER_SUBPROCESS_H_
#define KVHARBOR_TESTS_SERVER_SUBPROCESS_H_

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kvharbor {
namespace testing {

// A port that was free a moment ago (bind to 0, read it back, close).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// The kvharbord of the build a bench binary (build/bench/NAME) belongs to.
inline std::string KvharbordBesideBench() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "kvharbord";
  std::string dir(self, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));  // .../build/bench
  dir = dir.substr(0, dir.rfind('/'));  // .../build
  return dir + "/server/kvharbord";
}

class Kvharbord {
 public:
  // Starts `binary` with --listen on a free port, no metrics endpoint (its
  // default port would collide between parallel tests) plus `extra_args`,
  // which may override both. With `output_path`, its stdout and stderr go
  // to that file. `extra_env` ("NAME=VALUE") is added to this process's
  // environment for the child only.
  Kvharbord(const std::string& binary, std::vector<std::string> extra_args,
            const std::string& output_path = "",
            std::vector<std::string> extra_env = {}) {
    port_ = FreePort();
    std::vector<std::string> args = {
        binary, "--listen=127.0.0.1:" + std::to_string(port_),
        "--metrics_listen=", "--log_level=warn"};
    for (std::string& a : extra_args) args.push_back(std::move(a));
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (!output_path.empty()) {
      posix_spawn_file_actions_addopen(&fa, 1, output_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    // extra_env first: of equal names, getenv (and glibc's tunables) read
    // the first.
    std::vector<char*> envp;
    for (std::string& e : extra_env) envp.push_back(e.data());
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, binary.c_str(), &fa, nullptr, argv.data(),
                    envp.data()) != 0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Kvharbord() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Kvharbord(const Kvharbord&) = delete;
  Kvharbord& operator=(const Kvharbord&) = delete;

  bool started() const { return pid_ > 0 && port_ > 0; }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // A channel that reconnects quickly while the daemon comes up; true once
  // it is connected (within `timeout`).
  std::shared_ptr<grpc::Channel> Connect(
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
    auto ch = grpc::CreateCustomChannel(
        address(), grpc::InsecureChannelCredentials(), args);
    const auto end = std::chrono::system_clock::now() + timeout;
    if (!ch->WaitForConnected(end)) return nullptr;
    return ch;
  }

  void Signal(int sig) { kill(pid_, sig); }

  // Waits up to `timeout` for the process to exit; its wait status, or -1
  // when it is still running.
  int WaitExit(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_SERVER_SUBPROCESS_H_
