// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "test_util.h"

namespace kvblock::sim {
namespace {

// Sends `request` to 127.0.0.1:`port` and reads the answer to its end.
std::string Ask(int32_t port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) ==
          0);
  REQUIRE(send(fd, request.data(), request.size(), 0) ==
          static_cast<ssize_t>(request.size()));
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) {
    answer.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

std::unique_ptr<MetricsServer> StartOk(int32_t port) {
  auto server = MetricsServer::Start(port);
  REQUIRE_OK(server);
  return *std::move(server);
}

TEST_CASE("GET /metrics answers the latest text") {
  std::unique_ptr<MetricsServer> server = StartOk(0);
  REQUIRE(server->port() > 0);
  server->Set("a_total 1\n");
  server->Set("a_total 2\n");
  const std::string answer =
      Ask(server->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(absl::StartsWith(answer, "HTTP/1.1 200 OK\r\n"));
  CHECK(absl::StrContains(
      answer,
      "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  CHECK(absl::StrContains(answer, "\r\nContent-Length: 10\r\n"));
  CHECK(absl::EndsWith(answer, "\r\n\r\na_total 2\n"));
  // Query strings are Prometheus's own (e.g. name[]=); the text is whole.
  CHECK(absl::EndsWith(Ask(server->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
                       "a_total 2\n"));
}

TEST_CASE("Other paths and methods are refused") {
  std::unique_ptr<MetricsServer> server = StartOk(0);
  CHECK(absl::StartsWith(Ask(server->port(), "GET / HTTP/1.1\r\n\r\n"),
                         "HTTP/1.1 404 Not Found\r\n"));
  CHECK(absl::StartsWith(Ask(server->port(), "GET /metricsx HTTP/1.1\r\n\r\n"),
                         "HTTP/1.1 404"));
  const std::string post =
      Ask(server->port(), "POST /metrics HTTP/1.1\r\n\r\n");
  CHECK(absl::StartsWith(post, "HTTP/1.1 405 Method Not Allowed\r\n"));
  // RFC 9110 section 15.5.6: a 405 says which methods the target takes.
  CHECK(absl::StrContains(post, "\r\nAllow: GET\r\n"));
  // Past 8 KiB the request stops being read.
  CHECK(absl::StartsWith(Ask(server->port(), std::string(9000, 'x')),
                         "HTTP/1.1 405"));
  // A request that never ends is dropped after a second; the next is served.
  CHECK(Ask(server->port(), "GET /metrics HTTP/1.1\r\n").empty());
  CHECK(absl::StartsWith(Ask(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"),
                         "HTTP/1.1 200 OK\r\n"));
}

TEST_CASE("Start refuses a bad port and one in use, naming it") {
  for (const int32_t port : {-2, 65536, 1 << 30}) {
    auto server = MetricsServer::Start(port);
    REQUIRE_STATUS_IS(server, kInvalidArgument);
    CHECK(absl::StrContains(server.status().message(),
                            absl::StrCat("must be in [0, 65535], got ", port)));
  }
  std::unique_ptr<MetricsServer> first = StartOk(0);
  // A port in use is the flag's fault (kvblock-sim exits 2), as a
  // --kv_events endpoint's.
  auto second = MetricsServer::Start(first->port());
  REQUIRE_STATUS_IS(second, kInvalidArgument);
  CHECK(absl::StrContains(
      second.status().message(),
      absl::StrCat("--metrics_port: cannot listen on 127.0.0.1:",
                   first->port())));
  // The first still answers.
  CHECK(absl::StartsWith(Ask(first->port(), "GET /metrics HTTP/1.1\r\n\r\n"),
                         "HTTP/1.1 200 OK\r\n"));
}

}  // namespace
}  // namespace kvblock::sim
