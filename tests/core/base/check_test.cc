// KVH_CHECK (core/base/check.h): a passing check does nothing and evaluates
// its condition once; a failing one prints where and why, then aborts (run
// in a forked child so the test process survives).
#include "core/base/check.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

namespace kvharbor {
namespace {

TEST_CASE("KVH_CHECK passes silently and evaluates its condition once",
          "[check]") {
  int calls = 0;
  KVH_CHECK(++calls == 1, "never printed %d", calls);
  CHECK(calls == 1);
}

TEST_CASE("A failing KVH_CHECK prints file, condition and message, and aborts",
          "[check]") {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(pipe_fds[1], STDERR_FILENO);
    const int slot = 7;
    KVH_CHECK(slot < 4, "slot %d of %d", slot, 4);
    ::_exit(0);  // not reached
  }
  ::close(pipe_fds[1]);
  std::string err;
  char buf[256];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) {
    err.append(buf, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK(err.find("check_test.cc:") != std::string::npos);
  CHECK(err.find("check failed: slot < 4: slot 7 of 4") != std::string::npos);
}

}  // namespace
}  // namespace kvharbor
