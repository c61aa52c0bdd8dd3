// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// kvblock-sim --serve --metrics_port: the library's metrics (kvblock/
// metrics.h, in the Prometheus text format) over HTTP on loopback, for a
// Prometheus server or `curl http://127.0.0.1:PORT/metrics` to scrape. The
// scheduler's thread hands it each new text (Set, between steps); a thread
// of its own answers: GET /metrics with the latest text (200, Prometheus's
// content type), another path 404, another method 405, each connection one
// request then closed. A minimal server: one connection at a time, a
// request read for at most a second and 8 KiB; what a serving engine would
// put behind its own HTTP server.
//
// Thread safety: Set and port may be called from any thread.
#ifndef KVBLOCK_TOOLS_SIM_METRICS_SERVER_H_
#define KVBLOCK_TOOLS_SIM_METRICS_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace kvblock::sim {

class MetricsServer {
 public:
  // Listens on 127.0.0.1:`port` (0: a free port, see port()) and starts
  // the thread. InvalidArgument for a port outside [0, 65535]; Unavailable,
  // naming the port and the system's reason, when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(int32_t port);

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  // Stops the thread (within its poll interval) and closes the socket.
  ~MetricsServer();

  // The port as bound.
  int32_t port() const { return port_; }
  // The text the next scrapes get.
  void Set(std::string text);

 private:
  MetricsServer(int listen_fd, int32_t port);
  void Serve();
  void Answer(int fd);

  const int listen_fd_;
  const int32_t port_;
  std::mutex mutex_;
  std::string text_;  // guarded by mutex_.
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_METRICS_SERVER_H_
