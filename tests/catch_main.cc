// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The main of the CPU test executables.
#include "catch_session.h"

int main(int argc, char** argv) {
  return kvblock::testing::RunCatchSession(argc, argv);
}
