// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "cache/sha256_page_step.h"

// OpenSSL 3 deprecates the low-level SHA256_* calls in favour of EVP, but its
// EVP_DigestInit_ex2 allocates on every init: one malloc per page hashed, and
// EVP has no call for the bare compression function that a page step runs
// (SHA256_Transform). The low-level calls run the same audited
// implementation on a stack context and allocate nothing, which the hot path
// (Append) requires.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if KVBLOCK_SHA256_NI_ARCH
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvblock::internal {
namespace {

constexpr size_t kBlockBytes = 64;
constexpr size_t kTokensPerBlock = kBlockBytes / sizeof(TokenId);

// Big-endian words, as whole-word loads and stores (a byte loop vectorizes
// into shuffles that cost as much as a third of a compression).
uint32_t ToBigEndian(uint32_t v) {
  if constexpr (std::endian::native == std::endian::little) {
    return __builtin_bswap32(v);
  }
  return v;
}
uint32_t LoadBe32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return ToBigEndian(v);
}
void StoreBe32(uint8_t* p, uint32_t v) {
  v = ToBigEndian(v);
  std::memcpy(p, &v, sizeof(v));
}

// The little-endian bytes of at most a block's `tokens`, zero-filled to a
// whole block: a page's last block when it holds fewer than 16 tokens (or
// any block on a big-endian host).
struct TailBlock {
  explicit TailBlock(absl::Span<const TokenId> tokens) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto token = static_cast<uint32_t>(tokens[i]);
      for (size_t byte = 0; byte < sizeof(token); ++byte) {
        bytes[sizeof(token) * i + byte] =
            static_cast<uint8_t>(token >> (8 * byte));
      }
    }
  }
  alignas(16) uint8_t bytes[kBlockBytes] = {};
};

}  // namespace

BlockHash Sha256PageStepOpenSsl(const BlockHash& parent,
                                absl::Span<const TokenId> tokens) {
  SHA256_CTX ctx;
  for (int i = 0; i < 8; ++i) ctx.h[i] = LoadBe32(parent.bytes.data() + 4 * i);
  size_t done = 0;
  if constexpr (std::endian::native == std::endian::little) {
    // Whole blocks straight from the tokens: no copy.
    for (; tokens.size() - done >= kTokensPerBlock; done += kTokensPerBlock) {
      SHA256_Transform(
          &ctx, reinterpret_cast<const unsigned char*>(tokens.data() + done));
    }
  }
  for (; done < tokens.size(); done += kTokensPerBlock) {
    const TailBlock block(tokens.subspan(done, kTokensPerBlock));
    SHA256_Transform(&ctx, block.bytes);
  }
  BlockHash hash;
  for (int i = 0; i < 8; ++i) StoreBe32(hash.bytes.data() + 4 * i, ctx.h[i]);
  return hash;
}

#if KVBLOCK_SHA256_NI_ARCH

namespace {

#define KVBLOCK_SHA_NI_TARGET __attribute__((target("sha,sse4.1")))

// FIPS 180-4, 4.2.2: the round constants, four to a 4-round group.
alignas(16) constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// Registers are named high lane first, as in Intel's description of the SHA
// extensions: `dcba` holds a in lane 0. The rounds keep the state as
// (a, b, e, f) and (c, d, g, h).
struct State {
  __m128i abef;
  __m128i cdgh;
};

// Swaps the bytes of each 32-bit lane: big-endian words to and from memory.
KVBLOCK_SHA_NI_TARGET inline __m128i ByteSwap32(__m128i v) {
  return _mm_shuffle_epi8(
      v, _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL));
}

KVBLOCK_SHA_NI_TARGET inline __m128i Load(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// One compression of the 64-byte block at `block` into `state`.
KVBLOCK_SHA_NI_TARGET inline void Compress(const uint8_t* block, State& state) {
  const State in = state;
  // The message schedule, four words a register, the last four groups'.
  __m128i w[4];
  for (int i = 0; i < 4; ++i) w[i] = ByteSwap32(Load(block + 16 * i));
  for (int group = 0; group < 16; ++group) {
    __m128i& words = w[group % 4];  // holds group - 4's words until replaced.
    if (group >= 4) {
      // W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16] (FIPS 180-4,
      // 6.2.2), four at once: msg1 adds s0 of group - 3's words to group -
      // 4's, the add brings in W[t-7] from groups - 2 and - 1, and msg2 adds
      // s1 of the newest words as it makes them.
      const __m128i partial = _mm_add_epi32(
          _mm_sha256msg1_epu32(words, w[(group + 1) % 4]),
          _mm_alignr_epi8(w[(group + 3) % 4], w[(group + 2) % 4], 4));
      words = _mm_sha256msg2_epu32(partial, w[(group + 3) % 4]);
    }
    const __m128i message = _mm_add_epi32(
        words, _mm_load_si128(
                   reinterpret_cast<const __m128i*>(kRoundConstants) + group));
    // Two rounds on the low two words, then two on the high two.
    state.cdgh = _mm_sha256rnds2_epu32(state.cdgh, state.abef, message);
    state.abef = _mm_sha256rnds2_epu32(state.abef, state.cdgh,
                                       _mm_shuffle_epi32(message, 0x0E));
  }
  state.abef = _mm_add_epi32(state.abef, in.abef);
  state.cdgh = _mm_add_epi32(state.cdgh, in.cdgh);
}

}  // namespace

bool CpuHasSha256Ni() {
  // CPUID, not __builtin_cpu_supports: clang 14 knows no "sha" feature.
  // SSE4.1 is leaf 1 ECX bit 19; the SHA extensions leaf 7 EBX bit 29.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 19)) == 0) {
    return false;
  }
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 &&
         (ebx & (1u << 29)) != 0;
}

KVBLOCK_SHA_NI_TARGET BlockHash
Sha256PageStepNi(const BlockHash& parent, absl::Span<const TokenId> tokens) {
  const __m128i dcba = ByteSwap32(Load(parent.bytes.data()));
  const __m128i hgfe = ByteSwap32(Load(parent.bytes.data() + 16));
  const __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  State state = {.abef = _mm_alignr_epi8(cdab, efgh, 8),
                 .cdgh = _mm_blend_epi16(efgh, cdab, 0xF0)};
  // x86 is little-endian: whole blocks straight from the tokens.
  const auto* const bytes = reinterpret_cast<const uint8_t*>(tokens.data());
  size_t done = 0;
  for (; tokens.size() - done >= kTokensPerBlock; done += kTokensPerBlock) {
    Compress(bytes + sizeof(TokenId) * done, state);
  }
  if (done < tokens.size())
    Compress(TailBlock(tokens.subspan(done)).bytes, state);
  const __m128i feba = _mm_shuffle_epi32(state.abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(state.cdgh, 0xB1);
  BlockHash hash;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(hash.bytes.data()),
                   ByteSwap32(_mm_blend_epi16(feba, dchg, 0xF0)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(hash.bytes.data() + 16),
                   ByteSwap32(_mm_alignr_epi8(dchg, feba, 8)));
  return hash;
}

BlockHash Sha256PageStep(const BlockHash& parent,
                         absl::Span<const TokenId> tokens) {
  static const bool kHasNi = CpuHasSha256Ni();
  return kHasNi ? Sha256PageStepNi(parent, tokens)
                : Sha256PageStepOpenSsl(parent, tokens);
}

#else  // !KVBLOCK_SHA256_NI_ARCH

bool CpuHasSha256Ni() { return false; }

BlockHash Sha256PageStep(const BlockHash& parent,
                         absl::Span<const TokenId> tokens) {
  return Sha256PageStepOpenSsl(parent, tokens);
}

#endif  // KVBLOCK_SHA256_NI_ARCH

}  // namespace kvblock::internal
