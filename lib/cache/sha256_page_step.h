// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The SHA-256 page step of the prefix-cache hash chain (internal; see
// block_hash.h for the chain): the SHA-256 compression function, started
// from the parent hash's eight big-endian words, over the page tokens'
// little-endian bytes in 64-byte blocks, the last one zero-filled. A page of
// 16 tokens is one block.
//
// Two implementations compute it: OpenSSL's SHA256_Transform, everywhere,
// and the x86 SHA extensions, inline, where the CPU has them. The second
// keeps the chaining value in registers and makes no library call: 38 ns a
// page instead of 52 (BM_HashPage, 2.6 GHz Xeon), which a decode step pays
// for every page that fills. Sha256PageStep picks one, once per process.
//
// Thread safety: all three are pure functions, safe to call concurrently.
#ifndef KVBLOCK_LIB_CACHE_SHA256_PAGE_STEP_H_
#define KVBLOCK_LIB_CACHE_SHA256_PAGE_STEP_H_

#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/types.h"

#if defined(__x86_64__) || defined(__i386__)
#define KVBLOCK_SHA256_NI_ARCH 1
#else
#define KVBLOCK_SHA256_NI_ARCH 0
#endif

namespace kvblock::internal {

// The page step on the SHA extensions when CpuHasSha256Ni(), else on
// OpenSSL. O(tokens).
BlockHash Sha256PageStep(const BlockHash& parent,
                         absl::Span<const TokenId> tokens);

// The page step on OpenSSL's compression function. O(tokens).
BlockHash Sha256PageStepOpenSsl(const BlockHash& parent,
                                absl::Span<const TokenId> tokens);

// Whether this CPU has the SHA extensions and SSE4.1, which
// Sha256PageStepNi needs (false on other architectures).
bool CpuHasSha256Ni();

#if KVBLOCK_SHA256_NI_ARCH
// The page step on the SHA extensions. REQUIRES: CpuHasSha256Ni().
// O(tokens).
BlockHash Sha256PageStepNi(const BlockHash& parent,
                           absl::Span<const TokenId> tokens);
#endif

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_CACHE_SHA256_PAGE_STEP_H_
