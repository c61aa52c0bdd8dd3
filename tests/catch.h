// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The one way kvblock's tests include Catch2: v3 (catch_all.hpp) or v2's
// single header (Debian 12 ships 2.13), as tests/meson.build found it
// (KVBLOCK_CATCH2_V3). With KVBLOCK_CATCH2_RUNNER defined first, the Catch2
// session for a main of our own instead.
#ifndef KVBLOCK_TESTS_CATCH_H_
#define KVBLOCK_TESTS_CATCH_H_

#if KVBLOCK_CATCH2_V3
#ifdef KVBLOCK_CATCH2_RUNNER
#include <catch2/catch_session.hpp>
#else
#include <catch2/catch_all.hpp>
#endif
#else
#ifdef KVBLOCK_CATCH2_RUNNER
#define CATCH_CONFIG_RUNNER
#endif
#include <catch2/catch.hpp>
#endif

#endif  // KVBLOCK_TESTS_CATCH_H_
