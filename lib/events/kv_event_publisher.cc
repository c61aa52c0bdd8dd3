// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/kv_event_publisher.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cache/cache_event_log.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/status_macros.h"

// Debian's msgpack-cxx 4 uses Boost unless told not to; nothing here needs
// it.
#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>
#include <zmq.hpp>

namespace kvblock {
namespace {

int64_t ThreadCpuNanos() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

// A payload being packed. msgpack-cxx writes through write(), a few bytes
// at a time, and token ids, most of a payload's bytes, are written straight
// in (PackTokenValues): both into memory grown ahead (Room), without a call
// a write. Its own bytes rather than a std::string's, which zero-fills what
// it grows into.
class PayloadBuffer {
 public:
  void write(const char* data, size_t size) {
    std::memcpy(Room(size), data, size);
    size_ += size;
  }
  // At least `size` writable bytes after the end, which Commit then ends.
  char* Room(size_t size) {
    if (capacity_ - size_ < size) Grow(size);
    return data_.get() + size_;
  }
  void Commit(const char* end) {
    size_ = static_cast<size_t>(end - data_.get());
  }
  // Room for `size` bytes in all, written once so that its memory is mapped
  // now rather than by the first payload that fills it.
  void Reserve(size_t size) {
    if (size > capacity_) Grow(size - size_);
    if (capacity_ > 0) std::memset(data_.get(), 0, capacity_);
  }
  void clear() { size_ = 0; }
  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }

 private:
  void Grow(size_t more) {
    const size_t capacity = std::max(2 * capacity_, size_ + more);
    auto data = std::make_unique_for_overwrite<char[]>(capacity);
    if (size_ > 0) std::memcpy(data.get(), data_.get(), size_);
    data_ = std::move(data);
    capacity_ = capacity;
  }

  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// Payload buffers that ZeroMQ sends without copying them: a copy of a
// look's batch into fresh memory costs as much as encoding it. ZeroMQ
// hands each back through Release once it has written it to the
// subscribers' connections (on its I/O thread, or at once when nobody
// subscribes), and the next payload reuses it, grown already.
//
// The pool counts the bytes of what ZeroMQ holds (queued_bytes): each
// message's bytes are added when it is handed over and taken off when
// ZeroMQ frees it, which is when they leave the process's memory. ZeroMQ
// has no such count of its own, only a limit in messages.
class PayloadPool {
 public:
  struct Payload {
    PayloadPool* pool = nullptr;
    int64_t counted = 0;  // in queued_bytes while ZeroMQ holds it.
    PayloadBuffer bytes;
  };

  // A spare payload, emptied, or a new one.
  std::unique_ptr<Payload> Take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!spare_.empty()) {
        std::unique_ptr<Payload> payload = std::move(spare_.back());
        spare_.pop_back();
        payload->bytes.clear();
        return payload;
      }
    }
    return New();
  }
  // Adds a spare payload of `bytes`, written once so that its memory is
  // mapped now rather than by the first payload that fills it.
  void Reserve(size_t bytes) {
    std::unique_ptr<Payload> payload = New();
    payload->bytes.Reserve(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(std::move(payload));
  }
  // Takes back a payload that was not sent.
  void Give(std::unique_ptr<Payload> payload) { Keep(std::move(payload)); }
  // A message of `payload`'s bytes, which it owns until ZeroMQ releases it,
  // counting `bytes` (its buffer and its frames) in queued_bytes until
  // then; returns queued_bytes with them in `queued`.
  zmq::message_t Message(std::unique_ptr<Payload> payload, int64_t bytes,
                         int64_t& queued) {
    Payload* const raw = payload.release();
    raw->counted = bytes;
    queued = queued_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    return zmq::message_t(raw->bytes.data(), raw->bytes.size(), &Release, raw);
  }
  // A replay reply of a copy of `data`, counting `bytes` in
  // replay_queued_bytes until ZeroMQ releases it.
  zmq::message_t CopyMessage(absl::string_view data, int64_t bytes) {
    auto* copy = new Copy{.pool = this,
                          .counted = bytes,
                          .data = std::make_unique_for_overwrite<char[]>(
                              std::max<size_t>(data.size(), 1))};
    if (!data.empty()) std::memcpy(copy->data.get(), data.data(), data.size());
    replay_queued_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    return zmq::message_t(copy->data.get(), data.size(), &ReleaseCopy, copy);
  }
  // The bytes of the messages ZeroMQ has not released yet: on PUB, and the
  // replay replies (a requester that does not read holds only its own).
  int64_t queued_bytes() const {
    return queued_bytes_.load(std::memory_order_relaxed);
  }
  int64_t replay_queued_bytes() const {
    return replay_queued_bytes_.load(std::memory_order_relaxed);
  }

 private:
  struct Copy {
    PayloadPool* pool = nullptr;
    int64_t counted = 0;
    std::unique_ptr<char[]> data;
  };
  // Spare payloads kept for reuse, at most: those beyond, which a burst
  // queued toward a slow subscriber leaves behind, are freed.
  static constexpr size_t kMaxSpare = 16;

  std::unique_ptr<Payload> New() {
    auto payload = std::make_unique<Payload>();
    payload->pool = this;
    return payload;
  }
  void Keep(std::unique_ptr<Payload> payload) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (spare_.size() < kMaxSpare) spare_.push_back(std::move(payload));
    // Otherwise it is freed (rare: after a burst).
  }
  static void Release(void* /*data*/, void* hint) {
    std::unique_ptr<Payload> payload(static_cast<Payload*>(hint));
    PayloadPool* const pool = payload->pool;
    pool->queued_bytes_.fetch_sub(payload->counted, std::memory_order_relaxed);
    payload->counted = 0;
    pool->Keep(std::move(payload));
  }
  static void ReleaseCopy(void* /*data*/, void* hint) {
    std::unique_ptr<Copy> copy(static_cast<Copy*>(hint));
    copy->pool->replay_queued_bytes_.fetch_sub(copy->counted,
                                               std::memory_order_relaxed);
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<Payload>> spare_;
  std::atomic<int64_t> queued_bytes_{0};
  std::atomic<int64_t> replay_queued_bytes_{0};
};

using Packer = msgpack::packer<PayloadBuffer>;
using Options = KvEventPublisherOptions;

void PackHash(Packer& pk, PayloadBuffer& buffer, const BlockHash& hash,
              const Options& options) {
  // The digest, not its padding (an unknown algorithm, which Create
  // refuses: the whole hash).
  const int32_t digest = DigestSize(options.hash_algorithm);
  const uint32_t size = static_cast<uint32_t>(digest == 0 ? 32 : digest);
  if (options.hash_form == Options::HashForm::kBytes) {
    pk.pack_bin(size);
    pk.pack_bin_body(reinterpret_cast<const char*>(hash.bytes.data()), size);
    return;
  }
  // vLLM's integer form: the digest's last 8 bytes, big-endian.
  static_assert(std::endian::native == std::endian::little);
  const uint8_t* low = hash.bytes.data() + size - 8;
  uint64_t value;
  std::memcpy(&value, low, 8);
  value = __builtin_bswap64(value);
  if (value >> 56 == 0) {
    pk.pack_uint64(value);  // a shorter form.
    return;
  }
  // All but 1 in 256 hashes: uint 64, the value's bytes as the digest's.
  char* out = buffer.Room(9);
  out[0] = static_cast<char>(0xcf);
  std::memcpy(out + 1, low, 8);
  buffer.Commit(out + 9);
}

// Token ids of an array, each in the shortest form (as msgpack-cxx's
// pack_int32 writes it), without a call a token.
void PackTokenValues(PayloadBuffer& buffer, absl::Span<const TokenId> tokens) {
  char* out = buffer.Room(5 * tokens.size());  // the longest form: 5 bytes.
  // Most of a vocabulary's ids take the uint 16 form: a page of them is
  // checked at once (a vector loop) and written without a branch a token.
  uint32_t outside = 0;
  for (const TokenId token : tokens) {
    outside |= static_cast<uint32_t>(token) - 0x100 >= 0x10000 - 0x100;
  }
  if (outside == 0) {
    for (const TokenId token : tokens) {
      // 0xcd, then the id big-endian, in one store (the 4th byte is
      // overwritten by the next token's, or left past the end).
      const uint32_t bytes =
          0xcd | uint32_t{__builtin_bswap16(static_cast<uint16_t>(token))} << 8;
      std::memcpy(out, &bytes, 4);
      out += 3;
    }
    buffer.Commit(out);
    return;
  }
  const auto put = [&out](uint8_t tag, uint32_t value, int bytes) {
    *out++ = static_cast<char>(tag);
    for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) {
      *out++ = static_cast<char>(value >> shift);
    }
  };
  for (const TokenId token : tokens) {
    const auto value = static_cast<uint32_t>(token);
    if (token >= 0) {
      if (value < 0x80) {
        *out++ = static_cast<char>(value);  // positive fixint.
      } else if (value < 0x100) {
        put(0xcc, value, 1);  // uint 8.
      } else if (value < 0x10000) {
        put(0xcd, value, 2);  // uint 16, big-endian.
      } else {
        put(0xce, value, 4);  // uint 32.
      }
    } else if (token >= -32) {
      *out++ = static_cast<char>(value);  // negative fixint.
    } else if (token >= -128) {
      put(0xd0, value, 1);  // int 8, two's complement.
    } else if (token >= -32768) {
      put(0xd1, value, 2);  // int 16.
    } else {
      put(0xd2, value, 4);  // int 32.
    }
  }
  buffer.Commit(out);
}

void PackString(Packer& pk, std::string_view text) {
  pk.pack_str(static_cast<uint32_t>(text.size()));
  pk.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
}

// One field: its name first in the map encoding, its value either way.
void Key(Packer& pk, const Options& options, std::string_view name) {
  if (options.encoding == Options::Encoding::kMap) PackString(pk, name);
}

// vLLM's event structs give their last fields (extra_keys, group_idx and
// the spec's kind and window) a default of None, and msgspec's encoder
// (omit_defaults=True) leaves a field that holds its default out of a map;
// an array_like struct keeps every field. So a nil such field is written
// in the tagged arrays only.
bool WritesDefaultNils(const Options& options) {
  return options.encoding == Options::Encoding::kTaggedArray;
}

// An event's head: a map with its type under "type", or a tagged array
// with the type first; `fields` follow.
void BeginEvent(Packer& pk, const Options& options, std::string_view type,
                uint32_t fields) {
  if (options.encoding == Options::Encoding::kMap) {
    pk.pack_map(fields + 1);
    PackString(pk, "type");
  } else {
    pk.pack_array(fields + 1);
  }
  PackString(pk, type);
}

// The bytes of an event between its variable fields, which depend only on
// the options: packed once (PackConstants) and copied whole, instead of a
// dozen keys and constants packed an event.
// Each in a fixed-size array, which Append copies whole (a few vector
// moves, where a copy of its own size is a call).
struct PackedConstant {
  static constexpr size_t kCapacity = 64;  // the longest is 45 bytes.
  std::array<char, kCapacity> bytes{};
  size_t size = 0;
};
// A KV cache group's: its BlockStored head, block size, kv_cache_spec_kind
// and sliding window.
struct GroupConstants {
  // The head (a map's size counts the window's field or not) and
  // block_hashes' key.
  PackedConstant stored_head;
  PackedConstant lora;         // block_size and its value, lora_id's key.
  PackedConstant kind;         // kv_cache_spec_kind and its value.
  PackedConstant stored_tail;  // kv_cache_spec_sliding_window, if written.
};
struct PackedConstants {
  PackedConstant parent;      // parent_block_hash's key.
  PackedConstant tokens;      // token_ids' key.
  PackedConstant extra;       // medium, lora_name (nil).
  PackedConstant extra_keys;  // extra_keys' key.
  PackedConstant group;       // group_idx's key (its value is the event's).
  // By group (options.kv_cache_groups, at least one); a group past them
  // is full attention, `full`.
  std::vector<GroupConstants> groups;
  GroupConstants full;
  PackedConstant removed_head;
  PackedConstant removed_tail;  // medium, group_idx's key.
  // A host tier (CPU) event's heads and block_hashes' key.
  PackedConstant host_stored_head;
  PackedConstant host_removed_head;
  PackedConstant cleared;

  const GroupConstants& Of(int32_t group) const {
    return group >= 0 && static_cast<size_t>(group) < groups.size()
               ? groups[static_cast<size_t>(group)]
               : full;
  }
};

// vLLM's fields, in its order (the tagged arrays are positional).
PackedConstants PackConstants(const Options& options) {
  PackedConstants packed;
  const auto pack = [](PackedConstant& out, const auto& fill) {
    PayloadBuffer buffer;
    Packer pk(buffer);
    fill(pk);
    // Field names and constants only: never near the capacity. (A key of
    // the tagged arrays is none: no buffer, nothing to copy.)
    out.size = std::min(buffer.size(), PackedConstant::kCapacity);
    std::copy_n(buffer.data(), out.size, out.bytes.data());
  };
  // BlockStored's 11 fields, of which 4 have a default: a map has the 7
  // others and those of the 4 that are not nil.
  const bool all = WritesDefaultNils(options);
  const auto pack_head = [&](PackedConstant& out, std::string_view type,
                             uint32_t fields) {
    pack(out, [&](Packer& pk) {
      BeginEvent(pk, options, type, fields);
      Key(pk, options, "block_hashes");
    });
  };
  pack(packed.parent,
       [&](Packer& pk) { Key(pk, options, "parent_block_hash"); });
  pack(packed.tokens, [&](Packer& pk) { Key(pk, options, "token_ids"); });
  pack(packed.extra, [&](Packer& pk) {
    Key(pk, options, "medium");
    PackString(pk, "GPU");
    Key(pk, options, "lora_name");
    pk.pack_nil();
  });
  pack(packed.extra_keys, [&](Packer& pk) { Key(pk, options, "extra_keys"); });
  pack(packed.group, [&](Packer& pk) { Key(pk, options, "group_idx"); });
  const auto pack_group = [&](const KvCacheGroupSpec& spec) {
    GroupConstants constants;
    // A GPU event's extra_keys, group_idx and kind are never nil.
    const bool window = spec.kind == AttentionKind::kSlidingWindow;
    pack_head(constants.stored_head, "BlockStored",
              all ? 11 : 10 + (window ? 1 : 0));
    pack(constants.lora, [&](Packer& pk) {
      Key(pk, options, "block_size");
      pk.pack_int32(spec.page_size);
      Key(pk, options, "lora_id");
    });
    pack(constants.kind, [&](Packer& pk) {
      Key(pk, options, "kv_cache_spec_kind");
      const absl::string_view kind = AttentionKindName(spec.kind);
      PackString(pk, std::string_view(kind.data(), kind.size()));
    });
    // vLLM's get_kv_cache_spec_sliding_window: a sliding window's, else nil.
    pack(constants.stored_tail, [&](Packer& pk) {
      if (window) {
        Key(pk, options, "kv_cache_spec_sliding_window");
        pk.pack_int32(spec.sliding_window);
      } else if (all) {
        pk.pack_nil();
      }
    });
    return constants;
  };
  const KvCacheGroupSpec full{.kind = AttentionKind::kFull,
                              .page_size = options.block_size,
                              .sliding_window = 0,
                              .attention_chunk_size = 0,
                              .eagle = false};
  packed.full = pack_group(full);
  for (const KvCacheGroupSpec& spec : options.kv_cache_groups) {
    packed.groups.push_back(pack_group(spec));
  }
  if (packed.groups.empty()) packed.groups.push_back(packed.full);
  pack_head(packed.removed_head, "BlockRemoved", 3);
  // A CPU event's 4 defaulted fields are nil: BlockRemoved's group_idx too.
  pack_head(packed.host_stored_head, "BlockStored", all ? 11 : 7);
  pack_head(packed.host_removed_head, "BlockRemoved", all ? 3 : 2);
  pack(packed.removed_tail, [&](Packer& pk) {
    Key(pk, options, "medium");
    PackString(pk, "GPU");
    Key(pk, options, "group_idx");
  });
  pack(packed.cleared,
       [&](Packer& pk) { BeginEvent(pk, options, "AllBlocksCleared", 0); });
  return packed;
}

void Append(PayloadBuffer& buffer, const PackedConstant& constant) {
  char* out = buffer.Room(PackedConstant::kCapacity);
  std::memcpy(out, constant.bytes.data(), PackedConstant::kCapacity);
  buffer.Commit(out + constant.size);
}

// An event's fields as PackEvent reads them, from a KvCacheEvent.
class BuiltEvent {
 public:
  explicit BuiltEvent(const KvCacheEvent& event) : event_(event) {}
  KvCacheEvent::Kind kind() const { return event_.kind; }
  size_t num_pages() const { return event_.block_hashes.size(); }
  template <typename Visit>
  void ForEachHash(Visit&& visit) const {
    for (const BlockHash& hash : event_.block_hashes) visit(hash);
  }
  const BlockHash* parent() const {
    return event_.parent_block_hash.has_value() ? &*event_.parent_block_hash
                                                : nullptr;
  }
  size_t num_tokens() const { return event_.token_ids.size(); }
  template <typename Visit>
  void ForEachTokens(Visit&& visit) const {
    visit(absl::MakeConstSpan(event_.token_ids));
  }
  int64_t adapter_id() const { return event_.adapter_id; }
  absl::string_view cache_salt() const { return event_.cache_salt; }
  int32_t group() const { return event_.group_idx; }
  KvCacheEvent::Medium medium() const { return event_.medium; }

 private:
  const KvCacheEvent& event_;
};

// The same straight from records [begin, end) of a log, one event of its
// grouping (CacheEventLog::EventEnd): nothing is built or allocated.
class LoggedEvent {
 public:
  LoggedEvent(const internal::CacheEventLog& log, size_t begin, size_t end)
      : log_(log), begin_(begin), end_(end) {}
  KvCacheEvent::Kind kind() const { return log_.kind(begin_); }
  size_t num_pages() const { return end_ - begin_; }
  template <typename Visit>
  void ForEachHash(Visit&& visit) const {
    for (size_t i = begin_; i < end_; ++i) visit(log_.hash(i));
  }
  const BlockHash* parent() const { return log_.parent(begin_); }
  // Every page of an event has tokens, or it is one page without.
  size_t num_tokens() const { return log_.tokens(begin_).size() * num_pages(); }
  template <typename Visit>
  void ForEachTokens(Visit&& visit) const {
    for (size_t i = begin_; i < end_; ++i) visit(log_.tokens(i));
  }
  int64_t adapter_id() const { return log_.adapter_id(begin_); }
  absl::string_view cache_salt() const { return log_.cache_salt(begin_); }
  int32_t group() const { return log_.group(begin_); }
  KvCacheEvent::Medium medium() const { return log_.medium(begin_); }

 private:
  const internal::CacheEventLog& log_;
  size_t begin_;
  size_t end_;
};

template <typename Event>
void PackHashes(Packer& pk, PayloadBuffer& buffer, const Event& event,
                const Options& options) {
  pk.pack_array(static_cast<uint32_t>(event.num_pages()));
  event.ForEachHash(
      [&](const BlockHash& hash) { PackHash(pk, buffer, hash, options); });
}

// The fields after block_hashes of a host-tier (CPU) event, as vLLM's
// OffloadingConnector fills them: no chain, tokens, block size, adapter,
// extra keys or group.
void PackHostTail(Packer& pk, const Options& options, bool stored) {
  const auto nil = [&](std::string_view name) {
    Key(pk, options, name);
    pk.pack_nil();
  };
  if (stored) {
    nil("parent_block_hash");
    Key(pk, options, "token_ids");
    pk.pack_array(0);
    Key(pk, options, "block_size");
    pk.pack_int32(0);
    nil("lora_id");
  }
  Key(pk, options, "medium");
  PackString(pk, "CPU");
  if (stored) nil("lora_name");
  if (!WritesDefaultNils(options)) return;
  if (stored) pk.pack_nil();  // extra_keys.
  pk.pack_nil();              // group_idx.
  if (stored) {
    pk.pack_nil();  // kv_cache_spec_kind.
    pk.pack_nil();  // kv_cache_spec_sliding_window.
  }
}

// Event: BuiltEvent or LoggedEvent.
template <typename Event>
void PackEvent(Packer& pk, PayloadBuffer& buffer, const Event& event,
               const Options& options, const PackedConstants& packed) {
  const bool host = event.medium() == KvCacheEvent::Medium::kCpu;
  switch (event.kind()) {
    case KvCacheEvent::Kind::kBlockStored: {
      if (host) {
        Append(buffer, packed.host_stored_head);
        PackHashes(pk, buffer, event, options);
        PackHostTail(pk, options, /*stored=*/true);
        return;
      }
      const GroupConstants& group = packed.Of(event.group());
      Append(buffer, group.stored_head);
      PackHashes(pk, buffer, event, options);
      Append(buffer, packed.parent);
      if (const BlockHash* parent = event.parent()) {
        PackHash(pk, buffer, *parent, options);
      } else {
        pk.pack_nil();
      }
      Append(buffer, packed.tokens);
      pk.pack_array(static_cast<uint32_t>(event.num_tokens()));
      event.ForEachTokens([&](absl::Span<const TokenId> tokens) {
        PackTokenValues(buffer, tokens);
      });
      Append(buffer, group.lora);
      if (event.adapter_id() != 0) {
        pk.pack_int64(event.adapter_id());
      } else {
        pk.pack_nil();
      }
      Append(buffer, packed.extra);
      // vLLM's extra keys: a tuple or None a block, one entry per hash. A
      // block's tuple holds what its hash took beyond its tokens; of
      // kvblock's keys that is the cache salt, which vLLM gives the block
      // at token 0 alone (the first of an event without a parent and with
      // tokens).
      Append(buffer, packed.extra_keys);
      pk.pack_array(static_cast<uint32_t>(event.num_pages()));
      const absl::string_view salt = event.cache_salt();
      const bool salted =
          !salt.empty() && event.parent() == nullptr && event.num_tokens() > 0;
      if (salted) {
        pk.pack_array(1);
        PackString(pk, std::string_view(salt.data(), salt.size()));
      }
      for (size_t i = salted ? 1 : 0; i < event.num_pages(); ++i) {
        pk.pack_nil();
      }
      Append(buffer, packed.group);
      pk.pack_int32(event.group());
      Append(buffer, group.kind);
      Append(buffer, group.stored_tail);
      return;
    }
    case KvCacheEvent::Kind::kBlockRemoved:
      if (host) {
        Append(buffer, packed.host_removed_head);
        PackHashes(pk, buffer, event, options);
        PackHostTail(pk, options, /*stored=*/false);
        return;
      }
      Append(buffer, packed.removed_head);
      PackHashes(pk, buffer, event, options);
      Append(buffer, packed.removed_tail);
      pk.pack_int32(event.group());
      return;
    case KvCacheEvent::Kind::kAllBlocksCleared:
      Append(buffer, packed.cleared);
      return;
  }
}

std::array<uint8_t, 8> BigEndian(int64_t value) {
  std::array<uint8_t, 8> bytes;
  for (int i = 7; i >= 0; --i) {
    bytes[i] = static_cast<uint8_t>(value & 0xff);
    value = static_cast<int64_t>(static_cast<uint64_t>(value) >> 8);
  }
  return bytes;
}

// Packs the payload of a batch of `count` events into `buffer` (emptied
// first), `pack_events` packing the events.
template <typename PackEvents>
void EncodeBatch(PayloadBuffer& buffer, double ts, size_t count,
                 const KvEventPublisherOptions& options,
                 PackEvents&& pack_events) {
  buffer.clear();
  Packer pk(buffer);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(count));
  pack_events(pk);
  if (options.data_parallel_rank.has_value()) {
    pk.pack_int64(*options.data_parallel_rank);
  } else {
    pk.pack_nil();
  }
}

// A batch of built events; returns how many.
size_t EncodeEvents(PayloadBuffer& buffer, double ts,
                    absl::Span<const KvCacheEvent> events,
                    const KvEventPublisherOptions& options,
                    const PackedConstants& packed) {
  EncodeBatch(buffer, ts, events.size(), options, [&](Packer& pk) {
    for (const KvCacheEvent& event : events) {
      PackEvent(pk, buffer, BuiltEvent(event), options, packed);
    }
  });
  return events.size();
}

// A batch of records [begin, end) of `log`, packed from them; returns how
// many events they make. `event_ends`: scratch, where each event's end is
// found once (the batch's head counts them).
size_t EncodeLogged(PayloadBuffer& buffer, double ts,
                    const internal::CacheEventLog& log, size_t begin,
                    size_t end, const KvEventPublisherOptions& options,
                    const PackedConstants& packed,
                    std::vector<size_t>& event_ends) {
  event_ends.clear();
  for (size_t i = begin; i < end; i = event_ends.back()) {
    event_ends.push_back(log.EventEnd(i, end));
  }
  EncodeBatch(buffer, ts, event_ends.size(), options, [&](Packer& pk) {
    size_t first = begin;
    for (const size_t last : event_ends) {
      PackEvent(pk, buffer, LoggedEvent(log, first, last), options, packed);
      first = last;
    }
  });
  return event_ends.size();
}

}  // namespace

std::string EncodeKvEventBatch(double ts, absl::Span<const KvCacheEvent> events,
                               const KvEventPublisherOptions& options) {
  PayloadBuffer buffer;
  EncodeEvents(buffer, ts, events, options, PackConstants(options));
  return std::string(buffer.data(), buffer.size());
}

std::string EncodeKvEventBatch(double ts, const KvEventBatch& batch,
                               const KvEventPublisherOptions& options) {
  if (batch.log_ == nullptr) {
    return EncodeKvEventBatch(ts, absl::Span<const KvCacheEvent>(), options);
  }
  PayloadBuffer buffer;
  std::vector<size_t> event_ends;
  EncodeLogged(buffer, ts, *batch.log_, 0,
               static_cast<size_t>(batch.log_->num_records()), options,
               PackConstants(options), event_ends);
  return std::string(buffer.data(), buffer.size());
}

namespace {

// A cpu set of `cpu` alone.
cpu_set_t CpuSet(int32_t cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return set;
}

// Whether a thread may run on `cpu` (-1: no pinning), asked of a thread of
// its own: ZeroMQ's I/O thread aborts when its affinity cannot be set.
absl::Status CheckCpu(int32_t cpu) {
  if (cpu == -1) return absl::OkStatus();
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    return absl::InvalidArgumentError(absl::StrCat("kv event publisher: cpu ",
                                                   cpu, " is outside [-1, ",
                                                   CPU_SETSIZE, ")"));
  }
  int error = 0;
  std::thread probe([&] {
    const cpu_set_t set = CpuSet(cpu);
    error = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  });
  probe.join();
  if (error != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv event publisher: cannot run on cpu ", cpu, " (",
                     std::strerror(error), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

// KvEventPublisherOptions::poll_interval's range.
constexpr absl::Duration kMinPollInterval = absl::Microseconds(10);
constexpr absl::Duration kMaxPollInterval = absl::Seconds(1);

// How long closing the PUB socket may wait for sent messages to leave.
constexpr int kCloseLingerMs = 1000;
// InvalidArgument for a TCP endpoint whose port is a number outside
// [0, 65535]: ZeroMQ would bind that number modulo 2^16, another port.
absl::Status CheckTcpPort(absl::string_view option,
                          absl::string_view endpoint) {
  if (!absl::StartsWith(endpoint, "tcp://")) return absl::OkStatus();
  const size_t colon = endpoint.rfind(':');
  int64_t port = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) ||
      (port >= 0 && port <= 65535)) {
    return absl::OkStatus();  // "*", or ZeroMQ's to refuse.
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "kv event publisher: cannot bind ", option, " ", endpoint, ": port ",
      endpoint.substr(colon + 1), " is outside [0, 65535]"));
}

// What Create reserves for reserved_changes at most.
constexpr size_t kMaxReservedBytes = size_t{64} << 20;

// Apart, the bytes two threads write do not share a cache line.
constexpr size_t kCacheLine = 64;

// What ZeroMQ holds for a frame besides its bytes (a zmq_msg_t in a pipe),
// and for a batch's three frames (its 8-byte seq too).
constexpr int64_t kFrameBytes = 64;
// Replay requests one turn of the publisher thread serves.
constexpr int kReplayRequestsPerTurn = 64;
constexpr int64_t kBatchFrameBytes = 3 * kFrameBytes + 8;

struct KvEventPublisher::State {
  // A queued batch: events built by the caller, or the records
  // [records_begin, records_end) of the queue's log.
  struct Queued {
    double ts = 0;
    std::vector<KvCacheEvent> events;
    size_t records_begin = 0;
    size_t records_end = 0;
  };

  explicit State(KvEventPublisherOptions o)
      : options(std::move(o)),
        packed(PackConstants(options)),
        context(NewContext(options)),
        pub(context, zmq::socket_type::pub) {}

  // ZeroMQ's I/O thread starts with the first socket, on options.cpu.
  static zmq::context_t NewContext(const KvEventPublisherOptions& options) {
    zmq::context_t context;
    if (options.cpu >= 0) {
      context.set(zmq::ctxopt::thread_affinity_cpu_add, options.cpu);
    }
    return context;
  }

  // The publisher thread: sends what is queued, answers replay requests,
  // until stopped with the queue empty.
  void Run();
  // Numbers a packed payload as the next batch, keeps a copy for replay,
  // and sends it unless max_queued_bytes would be passed; whether it sent.
  bool Send(std::unique_ptr<PayloadPool::Payload> payload);
  // Queues a batch stamped now, `fill` filling it under the lock; false
  // (counted) when the queue is full.
  template <typename Fill>
  bool Queue(Fill&& fill);
  void ServeReplay();

  const KvEventPublisherOptions options;
  const PackedConstants packed;
  // Before the context: ZeroMQ releases the last payloads as it closes.
  PayloadPool payloads;
  zmq::context_t context;
  zmq::socket_t pub;
  std::optional<zmq::socket_t> router;
  std::string endpoint;
  std::string replay_endpoint;

  // The scheduler's side and the thread's each on cache lines of their
  // own: Publish writes the queue's ends every step while the thread works
  // through what it took, and sharing a line would bounce it between cores.
  alignas(kCacheLine) mutable std::mutex mutex;
  std::condition_variable wake;     // stop, or flush.
  std::condition_variable drained;  // the queue emptied and was sent.
  // Guarded by mutex: the queue, its batches' records, and whether the
  // thread holds batches taken from it. The thread takes the queue by
  // swapping it with its own emptied `taken` and `taken_log`, so that both
  // keep their grown buffers and neither side allocates in steady state.
  std::vector<Queued> queue;
  internal::CacheEventLog queue_log;
  bool stop = false;
  bool flush = false;  // Flush waits: look now.
  bool sending = false;
  KvEventPublisherStats stats;
  // Whether the queue is empty, written under mutex and read without it
  // (idle(), every step of a scheduler that asks).
  std::atomic<bool> queue_empty{true};

  // The publisher thread's own.
  alignas(kCacheLine) std::vector<Queued> taken;
  internal::CacheEventLog taken_log;
  std::vector<size_t> event_ends;  // EncodeLogged's scratch.
  int64_t next_seq = 0;
  std::deque<std::pair<int64_t, std::string>> kept;  // for replay.
  int64_t kept_bytes = 0;         // kept's strings' capacities.
  int64_t peak_queued_bytes = 0;  // PUB's and replies' bytes at most.
  int64_t replays_cut = 0;        // replies ended at max_queued_bytes.
  std::thread thread;
};

void KvEventPublisher::State::Run() {
  const absl::Duration busy = options.poll_interval;
  const absl::Duration idle_at_most = std::max(busy, absl::Milliseconds(1));
  absl::Duration interval = busy;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      // Publish does not wake the thread (a wake-up is a system call on
      // the scheduler's thread, every step): it looks every interval, which
      // bounds the events' delay, and serves replay requests then.
      wake.wait_for(lock, absl::ToChronoNanoseconds(interval),
                    [&] { return stop || flush; });
      flush = false;
      std::swap(queue, taken);
      std::swap(queue_log, taken_log);
      queue_empty.store(true, std::memory_order_relaxed);
      sending = !taken.empty();
      if (taken.empty() && stop) return;
      interval = taken.empty() ? std::min(2 * interval, idle_at_most) : busy;
    }
    int64_t sent_events = 0;
    int64_t batches_sent = 0;
    for (const Queued& batch : taken) {
      std::unique_ptr<PayloadPool::Payload> payload = payloads.Take();
      PayloadBuffer& buffer = payload->bytes;
      const size_t count =
          batch.events.empty()
              ? EncodeLogged(buffer, batch.ts, taken_log, batch.records_begin,
                             batch.records_end, options, packed, event_ends)
              : EncodeEvents(buffer, batch.ts, batch.events, options, packed);
      if (Send(std::move(payload))) {
        sent_events += static_cast<int64_t>(count);
        ++batches_sent;
      }
    }
    const int64_t batches_unsent =
        static_cast<int64_t>(taken.size()) - batches_sent;
    taken.clear();
    taken_log.Clear();
    // A system call: not under the lock Publish takes.
    const int64_t cpu_ns = ThreadCpuNanos();
    {
      std::lock_guard<std::mutex> lock(mutex);
      stats.thread_cpu_ns = cpu_ns;
      stats.batches_published += batches_sent;
      stats.events_published += sent_events;
      stats.batches_unsent += batches_unsent;
      stats.peak_queued_bytes = peak_queued_bytes;
      stats.replays_cut = replays_cut;
      sending = false;
      if (queue.empty()) drained.notify_all();
    }
    if (router) ServeReplay();
  }
}

bool KvEventPublisher::State::Send(
    std::unique_ptr<PayloadPool::Payload> payload) {
  const int64_t seq = next_seq++;
  const size_t size = payload->bytes.size();
  // A batch larger than max_replay_bytes alone is not kept (nor does it
  // push the kept ones out).
  if (router && options.replay_buffer > 0 &&
      (options.max_replay_bytes == 0 ||
       static_cast<int64_t>(size) <= options.max_replay_bytes)) {
    // A copy, into the oldest kept one's buffer once the buffer is full
    // (unless that buffer is much larger than this copy needs).
    std::string copy;
    if (kept.size() == static_cast<size_t>(options.replay_buffer)) {
      kept_bytes -= static_cast<int64_t>(kept.front().second.capacity());
      copy = std::move(kept.front().second);
      kept.pop_front();
      if (copy.capacity() > 2 * size + 4096) copy = std::string();
    }
    copy.assign(payload->bytes.data(), size);
    kept_bytes += static_cast<int64_t>(copy.capacity());
    kept.emplace_back(seq, std::move(copy));
    while (options.max_replay_bytes > 0 &&
           kept_bytes > options.max_replay_bytes && kept.size() > 1) {
      kept_bytes -= static_cast<int64_t>(kept.front().second.capacity());
      kept.pop_front();
    }
  }
  // What ZeroMQ holds for the batch until it has written it: the payload
  // and the three frames. (Its buffer may be larger, reserved once; a
  // capacity would hold back a first batch smaller than the bound.)
  const int64_t bytes =
      static_cast<int64_t>(size + options.topic.size()) + kBatchFrameBytes;
  if (options.max_queued_bytes > 0 &&
      payloads.queued_bytes() + bytes > options.max_queued_bytes) {
    // Numbered and kept, not sent: a subscriber sees the gap, as after a
    // drop at the high-water mark, and may replay it.
    payloads.Give(std::move(payload));
    return false;
  }
  const std::array<uint8_t, 8> seq_bytes = BigEndian(seq);
  int64_t queued = 0;
  zmq::message_t message = payloads.Message(std::move(payload), bytes, queued);
  peak_queued_bytes =
      std::max(peak_queued_bytes, queued + payloads.replay_queued_bytes());
  // PUB never blocks: at the high-water mark ZeroMQ drops the message.
  pub.send(zmq::buffer(options.topic), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
  pub.send(std::move(message), zmq::send_flags::none);
  return true;
}

void KvEventPublisher::State::ServeReplay() {
  // A turn serves at most kReplayRequestsPerTurn requests, then the thread
  // goes back to the queue: a stream of requests cannot stop publishing.
  for (int served = 0; served < kReplayRequestsPerTurn; ++served) {
    std::vector<zmq::message_t> frames;
    while (true) {
      zmq::message_t frame;
      if (!router->recv(frame, zmq::recv_flags::dontwait)) break;
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) break;
    }
    if (frames.empty()) return;
    // vLLM's: [identity, anything, start], start an unsigned big-endian
    // number of any length (empty: 0; past every seq: the end marker only).
    const bool well_formed = frames.size() == 3;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++(well_formed ? stats.replay_requests : stats.malformed_requests);
    }
    if (!well_formed) continue;
    uint64_t start = 0;
    const auto* bytes = static_cast<const uint8_t*>(frames[2].data());
    for (size_t i = 0; i < frames[2].size(); ++i) {
      start = start >> 56 != 0 ? UINT64_MAX : start << 8 | bytes[i];
    }
    const zmq::message_t& identity = frames[0];
    // Each reply, the end marker's too, counted in the replies' bytes
    // queued toward ZeroMQ: a requester that does not read stops the
    // replies at max_queued_bytes, not the batches on PUB.
    const auto reply_bytes = [&](absl::string_view payload) {
      return static_cast<int64_t>(payload.size()) +
             static_cast<int64_t>(identity.size()) + kBatchFrameBytes +
             kFrameBytes;
    };
    const auto reply = [&](int64_t seq, absl::string_view payload) {
      const std::array<uint8_t, 8> seq_bytes = BigEndian(seq);
      router->send(zmq::buffer(identity.data(), identity.size()),
                   zmq::send_flags::sndmore);
      router->send(zmq::message_t(), zmq::send_flags::sndmore);
      router->send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
      router->send(payloads.CopyMessage(payload, reply_bytes(payload)),
                   zmq::send_flags::none);
      peak_queued_bytes =
          std::max(peak_queued_bytes,
                   payloads.queued_bytes() + payloads.replay_queued_bytes());
    };
    const auto over_bound = [&](int64_t bytes) {
      return options.max_queued_bytes > 0 &&
             payloads.replay_queued_bytes() + bytes > options.max_queued_bytes;
    };
    // Not even the end marker fits: the request gets no reply (a requester
    // that never reads cannot grow the process by asking).
    if (over_bound(reply_bytes(""))) {
      ++replays_cut;
      continue;
    }
    for (const auto& [seq, payload] : kept) {
      if (static_cast<uint64_t>(seq) < start) continue;
      const int64_t bytes = reply_bytes(payload);
      // A batch larger than the bound alone is never sent, here as on PUB:
      // the replay goes on past it.
      if (options.max_queued_bytes > 0 && bytes > options.max_queued_bytes) {
        continue;
      }
      if (over_bound(bytes + reply_bytes(""))) {
        // Ended early, by the end marker: the requester asks again from
        // the seq after the last it got.
        ++replays_cut;
        break;
      }
      reply(seq, payload);
    }
    reply(-1, "");
  }
}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    KvEventPublisherOptions options) {
  if (options.endpoint.empty()) {
    return absl::InvalidArgumentError(
        "kv event publisher: the endpoint is empty");
  }
  for (const auto& [name, bytes] :
       {std::pair{"max_queued_bytes", options.max_queued_bytes},
        std::pair{"max_replay_bytes", options.max_replay_bytes}}) {
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv event publisher: ", name, " ", bytes, " is less than 0"));
    }
  }
  if (options.queue_capacity < 1 || options.replay_buffer < 0 ||
      options.send_hwm < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv event publisher: queue_capacity ", options.queue_capacity,
        " (at least 1), replay_buffer ", options.replay_buffer,
        " and send_hwm ", options.send_hwm, " (at least 0)"));
  }
  constexpr int32_t kMaxReservedChanges = 1 << 22;
  if (options.reserved_changes < 0 ||
      options.reserved_changes > kMaxReservedChanges) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv event publisher: reserved_changes ", options.reserved_changes,
        " is outside [0, ", kMaxReservedChanges, "]"));
  }
  if (options.poll_interval < kMinPollInterval ||
      options.poll_interval > kMaxPollInterval) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv event publisher: poll_interval ",
                     absl::FormatDuration(options.poll_interval),
                     " is outside [", absl::FormatDuration(kMinPollInterval),
                     ", ", absl::FormatDuration(kMaxPollInterval), "]"));
  }
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv event publisher: block_size ", options.block_size,
                     " is less than 1"));
  }
  if (!options.kv_cache_groups.empty()) {
    KVBLOCK_RETURN_IF_ERROR(ValidateKvCacheGroups(options.kv_cache_groups));
  }
  if (DigestSize(options.hash_algorithm) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv event publisher: hash_algorithm ",
                     static_cast<int>(options.hash_algorithm), " is unknown"));
  }
  KVBLOCK_RETURN_IF_ERROR(CheckCpu(options.cpu));
  auto state = std::make_unique<State>(std::move(options));
  {
    // A change's tokens at most: the largest group's page.
    int32_t largest = state->options.block_size;
    for (const KvCacheGroupSpec& group : state->options.kv_cache_groups) {
      largest = std::max(largest, group.page_size);
    }
    const auto page_size = static_cast<size_t>(largest);
    // A change's bytes reserved, its tokens in both logs (4 bytes each) and
    // the payload (5), within kMaxReservedBytes: large pages reserve fewer
    // changes.
    const size_t changes = std::min(
        static_cast<size_t>(state->options.reserved_changes),
        std::max<size_t>(1, kMaxReservedBytes / (13 * page_size + 200)));
    state->queue_log.Reserve(changes, page_size);
    state->taken_log.Reserve(changes, page_size);
    // A change's bytes at most: its hash, tokens of 5 bytes, and its share
    // of an event's field names.
    state->payloads.Reserve(changes * (5 * page_size + 64));
    const size_t batches =
        std::min(changes, static_cast<size_t>(state->options.queue_capacity));
    state->event_ends.reserve(changes);
    state->queue.reserve(batches);
    state->taken.reserve(batches);
  }
  // A failure names the option, endpoint or replay_endpoint.
  const auto bind = [](zmq::socket_t& socket, absl::string_view option,
                       const std::string& endpoint,
                       std::string& bound) -> absl::Status {
    KVBLOCK_RETURN_IF_ERROR(CheckTcpPort(option, endpoint));
    try {
      socket.bind(endpoint);
      bound = socket.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& error) {
      return absl::UnavailableError(
          absl::StrCat("kv event publisher: cannot bind ", option, " ",
                       endpoint, ": ", error.what()));
    }
    return absl::OkStatus();
  };
  state->pub.set(zmq::sockopt::sndhwm, state->options.send_hwm);
  // On close, what the thread sent still goes out to connected
  // subscribers, for at most this long (0 would drop the last batches of a
  // process that exits right after its final Flush).
  state->pub.set(zmq::sockopt::linger, kCloseLingerMs);
  KVBLOCK_RETURN_IF_ERROR(
      bind(state->pub, "endpoint", state->options.endpoint, state->endpoint));
  if (!state->options.replay_endpoint.empty()) {
    state->router.emplace(state->context, zmq::socket_type::router);
    state->router->set(zmq::sockopt::linger, 0);
    // No limit on the replies queued for a peer: ZeroMQ's default (1,000
    // messages) drops, without a word, the kept batches past it.
    state->router->set(zmq::sockopt::sndhwm, 0);
    KVBLOCK_RETURN_IF_ERROR(bind(*state->router, "replay_endpoint",
                                 state->options.replay_endpoint,
                                 state->replay_endpoint));
  }
  State* const raw = state.get();
  raw->thread = std::thread([raw] { raw->Run(); });
  // Named, to tell it apart in top and perf (at most 15 characters).
  pthread_setname_np(raw->thread.native_handle(), "kvblock-events");
  if (raw->options.cpu >= 0) {
    // Allowed: CheckCpu asked.
    const cpu_set_t set = CpuSet(raw->options.cpu);
    pthread_setaffinity_np(raw->thread.native_handle(), sizeof(set), &set);
  }
  return std::unique_ptr<KvEventPublisher>(
      new KvEventPublisher(std::move(state)));
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<State> state)
    : state_(std::move(state)) {}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_one();
  state_->thread.join();
}

bool KvEventPublisher::Publish(std::vector<KvCacheEvent> events) {
  if (events.empty()) return true;
  return state_->Queue(
      [&](State::Queued& batch) { batch.events = std::move(events); });
}

bool KvEventPublisher::Publish(KvEventBatch& batch) {
  if (batch.empty()) return true;
  const bool queued = state_->Queue([&](State::Queued& queued) {
    internal::CacheEventLog& log = state_->queue_log;
    if (log.empty()) {
      // No queued batch holds records: exchange the buffers.
      log.Swap(*batch.log_);
      queued.records_end = static_cast<size_t>(log.num_records());
      return;
    }
    queued.records_begin = static_cast<size_t>(log.num_records());
    batch.log_->AppendTo(log);
    queued.records_end = static_cast<size_t>(log.num_records());
  });
  batch.Clear();
  return queued;
}

bool KvEventPublisher::idle() const {
  return state_->queue_empty.load(std::memory_order_relaxed);
}

template <typename Fill>
bool KvEventPublisher::State::Queue(Fill&& fill) {
  // The system clock's vDSO read, cheaper than absl::Now on this path.
  const double ts = std::chrono::duration<double>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  std::lock_guard<std::mutex> lock(mutex);
  if (queue.size() >= static_cast<size_t>(options.queue_capacity)) {
    ++stats.batches_dropped;
    return false;
  }
  Queued& batch = queue.emplace_back();
  batch.ts = ts;
  fill(batch);
  queue_empty.store(false, std::memory_order_relaxed);
  return true;
}

const std::string& KvEventPublisher::endpoint() const {
  return state_->endpoint;
}

const std::string& KvEventPublisher::replay_endpoint() const {
  return state_->replay_endpoint;
}

KvEventPublisherStats KvEventPublisher::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  KvEventPublisherStats stats = state_->stats;
  stats.queued_bytes =
      state_->payloads.queued_bytes() + state_->payloads.replay_queued_bytes();
  return stats;
}

bool KvEventPublisher::Flush(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->flush = true;
  state_->wake.notify_one();
  return state_->drained.wait_for(
      lock, absl::ToChronoNanoseconds(timeout),
      [&] { return state_->queue.empty() && !state_->sending; });
}

}  // namespace kvblock
