// Copyright 2026 The kvblock Authors.
//
// The single Catch2 main of the CPU test executables (v2 and v3 alike).
#define KVBLOCK_CATCH2_RUNNER
#include "catch.h"

int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
