// Copyright 2026 The kvblock Authors.
//
// The one way kvblock's tests include Catch2: v3 (catch_all.hpp) when it is
// there, else v2's single header (Debian 12 ships 2.13).
#ifndef KVBLOCK_TESTS_CATCH_H_
#define KVBLOCK_TESTS_CATCH_H_

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

#endif  // KVBLOCK_TESTS_CATCH_H_
