// The loopback TCP ceiling that the bulk data plane is measured against
// (docs/data_plane.md, bench/ttft_bench.py): how many bytes per second
// plain sockets move between two threads of one process with 1, 4 and 8
// connections, each sender writing --write_mib MiB at a time from one
// buffer and each receiver reading into one buffer (no copies, no checks:
// the link's own speed, which no protocol on top of it can beat).
//
// Prints one line per connection count and, with --json, the same as
// {"connections": {"1": GB/s, ...}}. Loopback stands in for the network on
// one machine; on two hosts, the numbers are those of the NIC path.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(int, gib, 8, "GiB moved per connection count");
ABSL_FLAG(int, write_mib, 4, "MiB per send()");
ABSL_FLAG(std::string, connections, "1,4,8", "connection counts to measure");
ABSL_FLAG(std::string, json, "", "also write the results here as JSON");

namespace {

// A listening loopback socket on a free port.
int Listen(uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(fd, 64) != 0) {
    std::perror("listen");
    return -1;
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

int Connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::perror("connect");
    return -1;
  }
  return fd;
}

// GB/s (1e9 B/s) of `bytes` over `n` connections; < 0 on a socket error.
double Measure(int n, uint64_t bytes, uint64_t write) {
  uint16_t port = 0;
  const int lfd = Listen(&port);
  if (lfd < 0) return -1;
  std::vector<int> out(n), in(n);
  for (int i = 0; i < n; ++i) {
    out[i] = Connect(port);
    in[i] = accept(lfd, nullptr, nullptr);
    if (out[i] < 0 || in[i] < 0) return -1;
  }
  close(lfd);
  const uint64_t each = bytes / n;
  std::vector<std::thread> threads;
  bool failed = false;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      std::vector<char> buf(write, 'x');
      for (uint64_t sent = 0; sent < each;) {
        const ssize_t w =
            send(out[i], buf.data(), std::min<uint64_t>(write, each - sent), 0);
        if (w <= 0) {
          failed = true;
          return;
        }
        sent += static_cast<uint64_t>(w);
      }
    });
    threads.emplace_back([&, i] {
      std::vector<char> buf(write);
      for (uint64_t got = 0; got < each;) {
        const ssize_t r = recv(in[i], buf.data(), write, 0);
        if (r <= 0) {
          failed = true;
          return;
        }
        got += static_cast<uint64_t>(r);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  for (int i = 0; i < n; ++i) {
    close(out[i]);
    close(in[i]);
  }
  return failed ? -1 : static_cast<double>(each * n) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const uint64_t bytes = uint64_t(absl::GetFlag(FLAGS_gib)) << 30;
  const uint64_t write = uint64_t(absl::GetFlag(FLAGS_write_mib)) << 20;
  std::vector<std::string> json;
  std::printf("loopback TCP, %d GiB per count, %d MiB writes, %u CPUs\n",
              absl::GetFlag(FLAGS_gib), absl::GetFlag(FLAGS_write_mib),
              std::thread::hardware_concurrency());
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_connections), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(c, &n) || n < 1 || n > 64) {
      std::fprintf(stderr, "--connections: '%s' is not 1 to 64\n",
                   std::string(c).c_str());
      return 2;
    }
    const double gbs = Measure(n, bytes, write);
    if (gbs < 0) return 1;
    std::printf("%2d connections: %6.1f GB/s\n", n, gbs);
    json.push_back(absl::StrCat("\"", n, "\": ", gbs));
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json))
        << "{\"connections\": {" << absl::StrJoin(json, ", ") << "}}\n";
  }
  return 0;
}
