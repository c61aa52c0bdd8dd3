// Copyright 2026 The kvblock Authors.
//
// Main of the gpu suite: runs the Catch2 tests only when a CUDA device is
// usable, and otherwise exits 77, which Meson reports as SKIP (never as a
// pass).
#include <cstdio>

#include "kvblock/device.h"

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char** argv) {
  constexpr int kSkipped = 77;
  if (auto device = kvblock::Device::Cuda(0); !device.ok()) {
    std::printf("gpu suite skipped: %s\n",
                device.status().ToString().c_str());
    return kSkipped;
  }
  return Catch::Session().run(argc, argv);
}
