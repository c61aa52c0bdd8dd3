// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Deterministic pseudo-random numbers for kvblock-sim: the built-in workloads,
// the generated tokens and the beam-search rule all derive from these, so a
// run is the same for a seed on every compiler, library and machine (unlike
// the <random> distributions, whose algorithms the standard leaves open).
//
// Mix is SplitMix64's finalizer (a bijection of uint64 with full avalanche);
// HashId is 64-bit FNV-1a; Rng is a SplitMix64 stream.
//
// Complexity: O(1) per number (HashId: O(length)).
// Thread safety: the functions are pure; an Rng is a plain value, one per
// thread.
#ifndef KVBLOCK_TOOLS_SIM_RANDOM_H_
#define KVBLOCK_TOOLS_SIM_RANDOM_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace kvblock::sim {

// SplitMix64's output function applied to `x`.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// 64-bit FNV-1a of `text`.
inline uint64_t HashId(absl::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  }
  return hash;
}

// A SplitMix64 stream.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    const uint64_t value = Mix(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return value;
  }

  // Uniform in [lo, hi]. REQUIRES: lo <= hi. (The modulo bias is below 2^-40
  // for the ranges the simulator draws.)
  int64_t Uniform(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(Next() % span);
  }

 private:
  uint64_t state_;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_RANDOM_H_
