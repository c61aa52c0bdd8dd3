// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "catch_session.h"

#define KVBLOCK_CATCH2_RUNNER
#include "catch.h"

namespace kvblock::testing {

int RunCatchSession(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}

}  // namespace kvblock::testing
