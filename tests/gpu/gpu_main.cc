// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Main of the gpu suite: runs the Catch2 tests only when a CUDA device is
// usable, and otherwise exits 77, which Meson reports as SKIP (never as a
// pass).
#include <cstdio>

#include "catch_session.h"
#include "kvblock/device.h"

int main(int argc, char** argv) {
  constexpr int kSkipped = 77;
  if (auto device = kvblock::Device::Cuda(0); !device.ok()) {
    std::printf("gpu suite skipped: %s\n", device.status().ToString().c_str());
    return kSkipped;
  }
  return kvblock::testing::RunCatchSession(argc, argv);
}
