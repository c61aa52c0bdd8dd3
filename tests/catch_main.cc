// Copyright 2026 The kvblock Authors.
//
// The single Catch2 main of the CPU test executables (v2 and v3 alike).
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
