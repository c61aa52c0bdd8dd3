// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// A program outside the project that publishes KV cache events, built only
// through `pkg-config --cflags --libs kvblock-events` or CMake's
// kvblock::events (tests/package/link_test.py): so that libkvblock-events
// and what it needs (ZeroMQ) link. Binds a free loopback port, sends one
// batch, prints "events consumer ok" and the endpoint.
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "kvblock/kv_event_publisher.h"
#include "kvblock/kv_events.h"

int main() {
  kvblock::KvEventPublisherOptions options;
  options.endpoint = "tcp://127.0.0.1:*";
  auto publisher = kvblock::KvEventPublisher::Create(std::move(options));
  if (!publisher.ok()) {
    std::fprintf(stderr, "events consumer: %s\n",
                 publisher.status().ToString().c_str());
    return 1;
  }
  std::vector<kvblock::KvCacheEvent> events(1);
  events[0].kind = kvblock::KvCacheEvent::Kind::kAllBlocksCleared;
  if (!(*publisher)->Publish(std::move(events)) ||
      !(*publisher)->Flush(absl::Seconds(10)) ||
      (*publisher)->stats().batches_published != 1) {
    std::fprintf(stderr, "events consumer: the batch was not sent\n");
    return 1;
  }
  std::printf("events consumer ok (%s)\n", (*publisher)->endpoint().c_str());
  return 0;
}
