// RedisServer: redis-server as a child process on a free loopback port,
// driven through hiredis with pipelined SETs and GETs of page-sized values;
// the Redis baseline of the benchmarks that compare a fetch path with a GET
// (insert_fetch_bench, gpu_tier_bench). Header-only: each bench/*.cc is its
// own binary.
//
// Memory: the server process and the hiredis context belong to the
// RedisServer (killed and freed on destruction); values are copied into the
// caller's buffers. Not thread-safe (one connection).
#ifndef KVHARBOR_BENCH_REDIS_SERVER_H_
#define KVHARBOR_BENCH_REDIS_SERVER_H_

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace kvharbor {
namespace bench {

using RedisClock = std::chrono::steady_clock;

// `name` itself when it holds a '/', else the first executable of that
// name in PATH; "" when none.
inline std::string FindInPath(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    return access(name.c_str(), X_OK) == 0 ? name : "";
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// redis-server as a child process, killed on destruction.
class RedisServer {
 public:
  ~RedisServer() {
    if (ctx_ != nullptr) redisFree(ctx_);
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Empty on success, else why Redis is skipped.
  std::string Start(const std::string& binary) {
    port_ = FreeLoopbackPort();
    if (port_ < 0) return "no free loopback port";
    const std::string port = std::to_string(port_);
    pid_ = fork();
    if (pid_ == 0) {
      if (freopen("/dev/null", "w", stdout) == nullptr) _exit(127);
      execl(binary.c_str(), "redis-server", "--port", port.c_str(), "--bind",
            "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize",
            "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    if (pid_ < 0) return "fork failed";
    const auto give_up = RedisClock::now() + std::chrono::seconds(10);
    while (RedisClock::now() < give_up) {
      timeval tv{1, 0};
      ctx_ = redisConnectWithTimeout("127.0.0.1", port_, tv);
      if (ctx_ != nullptr && ctx_->err == 0) {
        ctx_->reader->maxbuf = 0;  // keep the read buffer between replies
        return "";
      }
      if (ctx_ != nullptr) redisFree(ctx_);
      ctx_ = nullptr;
      usleep(20000);
    }
    return "redis-server did not accept connections within 10 s";
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  // Pipelines `n` SETs of key i -> values + i * size.
  bool Set(const std::string& prefix, size_t first, size_t n,
           const uint8_t* values, size_t size) {
    for (size_t i = 0; i < n; ++i) {
      const std::string key = absl::StrCat(prefix, first + i);
      redisAppendCommand(ctx_, "SET %b %b", key.data(), key.size(),
                         values + i * size, size);
    }
    return Drain(
        n, [](redisReply* r, size_t) { return r->type == REDIS_REPLY_STATUS; });
  }
  // Pipelines `n` GETs, copying value i to dst + i * size.
  bool Get(const std::string& prefix, size_t first, size_t n, uint8_t* dst,
           size_t size) {
    for (size_t i = 0; i < n; ++i) {
      const std::string key = absl::StrCat(prefix, first + i);
      redisAppendCommand(ctx_, "GET %b", key.data(), key.size());
    }
    return Drain(n, [dst, size](redisReply* r, size_t i) {
      if (r->type != REDIS_REPLY_STRING || r->len != size) return false;
      std::memcpy(dst + i * size, r->str, size);
      return true;
    });
  }
  bool FlushAll() {
    redisReply* r = static_cast<redisReply*>(redisCommand(ctx_, "FLUSHALL"));
    const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (r != nullptr) freeReplyObject(r);
    return ok;
  }

 private:
  bool Drain(size_t n, const std::function<bool(redisReply*, size_t)>& f) {
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
      void* reply = nullptr;
      if (redisGetReply(ctx_, &reply) != REDIS_OK || reply == nullptr) {
        return false;
      }
      ok = f(static_cast<redisReply*>(reply), i) && ok;
      freeReplyObject(reply);
    }
    return ok;
  }

  pid_t pid_ = -1;
  int port_ = -1;
  redisContext* ctx_ = nullptr;
};

}  // namespace bench
}  // namespace kvharbor

#endif  // KVHARBOR_BENCH_REDIS_SERVER_H_
