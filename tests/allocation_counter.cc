// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "allocation_counter.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace {

std::atomic<int64_t> g_allocations{0};

void* CountedAlloc(size_t size) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}

void* CountedAllocOrAbort(size_t size) {
  if (void* p = CountedAlloc(size)) return p;
  std::abort();
}

}  // namespace

void* operator new(size_t size) { return CountedAllocOrAbort(size); }
void* operator new[](size_t size) { return CountedAllocOrAbort(size); }
void* operator new(size_t size, const std::nothrow_t&) noexcept {
  return CountedAlloc(size);
}
void* operator new[](size_t size, const std::nothrow_t&) noexcept {
  return CountedAlloc(size);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace kvblock::testing {

int64_t HeapAllocations() {
  return g_allocations.load(std::memory_order_relaxed);
}

}  // namespace kvblock::testing
