// A minimal HTTP/1.1 GET over a plain socket, for the metrics endpoint tests
// (so that the tests see exactly the bytes a scraper gets, headers
// included). Header-only, test-only; no state.
#ifndef KVHARBOR_TESTS_SERVER_HTTP_GET_H_
#define KVHARBOR_TESTS_SERVER_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace kvharbor {
namespace testing {

struct HttpResponse {
  int status = 0;  // 0: no connection or no parsable response
  std::string headers;
  std::string body;
};

// `extra_headers`: lines to add, each ending in "\r\n".
inline HttpResponse HttpGet(int port, const std::string& path,
                            const std::string& extra_headers = "") {
  HttpResponse r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                          extra_headers + "Connection: close\r\n\r\n";
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(req.size())) {
    close(fd);
    return r;
  }
  std::string all;
  char buf[8192];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) all.append(buf, n);
  close(fd);
  const size_t end = all.find("\r\n\r\n");
  if (all.compare(0, 9, "HTTP/1.1 ") != 0 || end == std::string::npos) {
    return r;
  }
  r.status = std::atoi(all.c_str() + 9);
  r.headers = all.substr(0, end);
  r.body = all.substr(end + 4);
  return r;
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_SERVER_HTTP_GET_H_
