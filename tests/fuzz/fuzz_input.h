// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// FuzzInput: reads a fuzzer's bytes as the choices of a test program (small
// integers, booleans, byte strings), in the manner of LLVM's
// FuzzedDataProvider but compiler-independent, so that the fuzz targets also
// build with GCC, where tests/fuzz/replay_main.cc replays their corpora as
// ordinary tests. Past the end every read returns its lowest value.
//
// FUZZ_CHECK(condition, message): a finding. Prints and aborts, which
// libFuzzer records as a crash (and the replay test as a failure).
//
// Thread safety: one FuzzInput per thread.
#ifndef KVBLOCK_TESTS_FUZZ_FUZZ_INPUT_H_
#define KVBLOCK_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(condition, message)                                     \
  do {                                                                     \
    if (!(condition)) {                                                    \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, \
                   __LINE__, #condition, std::string(message).c_str());    \
      std::abort();                                                        \
    }                                                                      \
  } while (false)

namespace kvblock::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return offset_ >= size_; }

  // An integer in [lo, hi] (REQUIRES lo <= hi), from as few bytes as the
  // range needs.
  int64_t Int(int64_t lo, int64_t hi) {
    const uint64_t range =
        static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
    uint64_t value = 0;
    for (uint64_t left = range; left != 0 && offset_ < size_; left >>= 8) {
      value = (value << 8) | data_[offset_++];
    }
    return static_cast<int64_t>(
        static_cast<uint64_t>(lo) +
        (range == UINT64_MAX ? value : value % (range + 1)));
  }
  bool Bool() { return Int(0, 1) != 0; }
  // Up to `max` bytes.
  std::string Bytes(size_t max) {
    const size_t n = static_cast<size_t>(Int(0, static_cast<int64_t>(max)));
    std::string out;
    for (size_t i = 0; i < n && offset_ < size_; ++i) {
      out.push_back(static_cast<char>(data_[offset_++]));
    }
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

}  // namespace kvblock::fuzz

#endif  // KVBLOCK_TESTS_FUZZ_FUZZ_INPUT_H_
