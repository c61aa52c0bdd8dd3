// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// A second, obviously correct implementation of the block hash format of
// kvblock/block_hash.h, for the tests and the hash fuzzer: the messages
// written field by field from the header's tables, SHA-256 digests from
// OpenSSL's one-shot EVP_Digest, XXH3-128 from xxHash's one-shot call, and
// the SHA-256 page step from a plain transcription of FIPS 180-4's
// compression function (no OpenSSL, no SHA extensions). Results are lowercase
// hex of the 32 BlockHash bytes.
//
// Thread safety: plain functions (the round constants are a function-local
// static, initialized once).
#ifndef KVBLOCK_TESTS_CACHE_BLOCK_HASH_REFERENCE_H_
#define KVBLOCK_TESTS_CACHE_BLOCK_HASH_REFERENCE_H_

#include <openssl/evp.h>
#include <xxhash.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "kvblock/block_hash.h"

namespace kvblock::testing {

// The documented messages, written field by field from the header's tables.
inline std::string AppendLe(std::string out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
  return out;
}
inline std::string RootMessage(HashAlgorithm algorithm, int32_t page_size,
                               const HashExtraKeys& extra) {
  std::string m = "kvblock-block-v3";
  m.push_back(static_cast<char>(algorithm));
  m = AppendLe(std::move(m), static_cast<uint32_t>(page_size), 4);
  m = AppendLe(std::move(m), extra.cache_salt.size(), 8);
  m.append(extra.cache_salt.data(), extra.cache_salt.size());
  return AppendLe(std::move(m), static_cast<uint64_t>(extra.adapter_id), 8);
}
inline std::string PageBytes(const std::vector<TokenId>& tokens) {
  std::string m;
  for (TokenId t : tokens) {
    m = AppendLe(std::move(m), static_cast<uint32_t>(t), 4);
  }
  return m;
}

// FIPS 180-4, 4.2.2: SHA-256's round constants, derived as defined (the
// first 32 bits of the fractional parts of the cube roots of the first 64
// primes) rather than copied: floor(cbrt(p) * 2^32) is the largest x with
// x^3 <= p * 2^96, found by bisection in 128-bit integers.
inline std::array<uint32_t, 64> RoundConstants() {
  std::array<uint32_t, 64> constants;
  uint32_t prime = 1;
  for (uint32_t& constant : constants) {
    const auto is_prime = [](uint32_t n) {
      for (uint32_t d = 2; d * d <= n; ++d) {
        if (n % d == 0) return false;
      }
      return true;
    };
    do {
      ++prime;
    } while (!is_prime(prime));
    const unsigned __int128 target = static_cast<unsigned __int128>(prime)
                                     << 96;
    uint64_t low = 0, high = uint64_t{1} << 36;  // cbrt(311) < 8.
    while (high - low > 1) {
      const uint64_t mid = low + (high - low) / 2;
      const unsigned __int128 cube =
          static_cast<unsigned __int128>(mid) * mid * mid;
      (cube <= target ? low : high) = mid;
    }
    constant = static_cast<uint32_t>(low);  // the fractional bits.
  }
  return constants;
}

// FIPS 180-4's SHA-256 compression function, transcribed plainly (no
// OpenSSL), for the page steps.
using Sha256State = std::array<uint32_t, 8>;
inline Sha256State Compress(Sha256State h, const uint8_t* block) {
  static const std::array<uint32_t, 64> kK = RoundConstants();
  const auto rotr = [](uint32_t x, int n) {
    return (x >> n) | (x << (32 - n));
  };
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) {
    w[t] = uint32_t{block[4 * t]} << 24 | uint32_t{block[4 * t + 1]} << 16 |
           uint32_t{block[4 * t + 2]} << 8 | uint32_t{block[4 * t + 3]};
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 =
        rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 =
        rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  Sha256State v = h;
  for (int t = 0; t < 64; ++t) {
    const uint32_t s1 = rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25);
    const uint32_t ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
    const uint32_t t1 = v[7] + s1 + ch + kK[t] + w[t];
    const uint32_t s0 = rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22);
    const uint32_t maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
    v = {t1 + s0 + maj, v[0], v[1], v[2], v[3] + t1, v[4], v[5], v[6]};
  }
  for (int i = 0; i < 8; ++i) h[i] += v[i];
  return h;
}
inline std::string StateHex(const Sha256State& h) {
  std::string bytes;
  for (const uint32_t word : h) {
    for (int b = 3; b >= 0; --b)
      bytes.push_back(static_cast<char>(word >> (8 * b)));
  }
  return absl::BytesToHexString(bytes);
}
// The documented SHA-256 page step: the compression function from the
// parent's words over zero-filled 64-byte blocks of the page bytes.
inline std::string Sha256PageHex(const BlockHash& parent,
                                 const std::string& page) {
  Sha256State h;
  for (int i = 0; i < 8; ++i) {
    h[i] = uint32_t{parent.bytes[4 * i]} << 24 |
           uint32_t{parent.bytes[4 * i + 1]} << 16 |
           uint32_t{parent.bytes[4 * i + 2]} << 8 | parent.bytes[4 * i + 3];
  }
  for (size_t offset = 0; offset < page.size(); offset += 64) {
    uint8_t block[64] = {};
    page.copy(reinterpret_cast<char*>(block), 64, offset);
    h = Compress(h, block);
  }
  return StateHex(h);
}

// The digests of the documented formats, from OpenSSL, xxHash and Compress.
inline std::string Sha256Hex(const std::string& message) {
  unsigned char digest[32];
  if (EVP_Digest(message.data(), message.size(), digest, nullptr, EVP_sha256(),
                 nullptr) != 1) {
    std::abort();  // OpenSSL out of memory: nothing to compare against.
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), 32));
}
inline std::string Xxh3Hex(const std::string& message) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical,
                           XXH3_128bits(message.data(), message.size()));
  return absl::BytesToHexString(absl::string_view(
             reinterpret_cast<const char*>(canonical.digest), 16)) +
         std::string(32, '0');
}
inline std::string RootHex(HashAlgorithm algorithm, int32_t page_size,
                           const HashExtraKeys& extra) {
  const std::string message = RootMessage(algorithm, page_size, extra);
  return algorithm == HashAlgorithm::kSha256 ? Sha256Hex(message)
                                             : Xxh3Hex(message);
}
inline std::string PageHex(HashAlgorithm algorithm, const BlockHash& parent,
                           const std::vector<TokenId>& tokens) {
  const std::string page = PageBytes(tokens);
  if (algorithm == HashAlgorithm::kSha256) return Sha256PageHex(parent, page);
  return Xxh3Hex(
      std::string(reinterpret_cast<const char*>(parent.bytes.data()), 32) +
      page);
}

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_CACHE_BLOCK_HASH_REFERENCE_H_
