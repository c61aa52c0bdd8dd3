// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// RunCatchSession: the Catch2 session every test main runs. Catch2 v2's
// implementation is compiled once, in catch_session.cc, instead of once per
// main (it is the slowest file of the build), and the mains (catch_main.cc,
// sha256_ni_main.cc, gpu/gpu_main.cc) include no Catch2 header at all.
#ifndef KVBLOCK_TESTS_CATCH_SESSION_H_
#define KVBLOCK_TESTS_CATCH_SESSION_H_

namespace kvblock::testing {

// Runs the tests the command line selects; returns the exit code.
int RunCatchSession(int argc, char** argv);

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_CATCH_SESSION_H_
