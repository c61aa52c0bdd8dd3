// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The test programs' precompiled header (tests/meson.build's cpp_pch):
// Catch2 and the headers most test files include, parsed once a program
// rather than once a file (a fifth of the test programs' compile time).
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "catch.h"
#include "test_util.h"
