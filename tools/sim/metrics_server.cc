// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvblock::sim {
namespace {

constexpr int kPollMs = 100;          // how soon the thread sees stop_.
constexpr int kRequestMs = 1000;      // the most a request may take to come.
constexpr size_t kMaxRequest = 8192;  // bytes of a request line and headers.

// Writes all of `data`, giving up on an error (the scraper went away).
void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// `headers`: more header lines, each ending in CRLF.
std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body, absl::string_view headers = "") {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", headers,
                      "Connection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    int32_t port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port must be in [0, 65535], got ", port));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics server: socket: ", std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    // A port that cannot be bound (taken, or privileged) is the flag's
    // fault, as a --kv_events endpoint's.
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port: cannot listen on 127.0.0.1:", port, ": ",
                     std::strerror(error)));
  }
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(fd, ntohs(address.sin_port)));
}

MetricsServer::MetricsServer(int listen_fd, int32_t port)
    : listen_fd_(listen_fd), port_(port), thread_([this] { Serve(); }) {}

MetricsServer::~MetricsServer() {
  stop_.store(true, std::memory_order_relaxed);
  thread_.join();
  close(listen_fd_);
}

void MetricsServer::Set(std::string text) {
  const std::lock_guard<std::mutex> lock(mutex_);
  text_ = std::move(text);
}

void MetricsServer::Serve() {
  while (!stop_.load(std::memory_order_relaxed)) {
    pollfd listening{.fd = listen_fd_, .events = POLLIN, .revents = 0};
    if (poll(&listening, 1, kPollMs) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    close(fd);
  }
}

void MetricsServer::Answer(int fd) {
  std::string request;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kRequestMs);
  while (!absl::StrContains(request, "\r\n\r\n") &&
         request.size() < kMaxRequest) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd readable{.fd = fd, .events = POLLIN, .revents = 0};
    if (left.count() <= 0 || poll(&readable, 1, left.count()) <= 0) return;
    char buffer[1024];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  const absl::string_view line =
      absl::string_view(request).substr(0, request.find("\r\n"));
  if (!absl::StartsWith(line, "GET ")) {
    // RFC 9110: a 405 names the methods the target takes.
    WriteAll(fd, Response("405 Method Not Allowed", "text/plain",
                          "only GET /metrics\n", "Allow: GET\r\n"));
    return;
  }
  const absl::string_view target = line.substr(4, line.find(' ', 4) - 4);
  if (target != "/metrics" && !absl::StartsWith(target, "/metrics?")) {
    WriteAll(fd, Response("404 Not Found", "text/plain",
                          "kvblock-sim serves /metrics\n"));
    return;
  }
  std::string text;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    text = text_;
  }
  WriteAll(
      fd, Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", text));
}

}  // namespace kvblock::sim
