// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KvEventPublisher on loopback, every wait bounded: the wire format of a
// batch in both encodings and both hash forms, decoded with msgpack as a
// router would; a host tier's CPU events with exactly the fields vLLM's
// OffloadingConnector sends; a subscriber that rebuilds the cached set of a
// random manager run from the events alone; replay from 0 and from the
// middle for a late subscriber; a full queue that drops and counts; a malformed
// replay request that gets no reply; a subscriber that never reads, which
// the bound in bytes on what ZeroMQ holds keeps from growing the process;
// the replay ring's bound in bytes; threads pinned to a cpu; and the
// errors of Create.
#include "kvblock/kv_event_publisher.h"

#include <sched.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/group_spec_test_util.h"
#include "kvblock/block_manager.h"
#include "test_util.h"

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>
#include <zmq.hpp>

namespace kvblock {
namespace {

using Options = KvEventPublisherOptions;
constexpr int32_t kPageSize = 4;
constexpr int kTimeoutMs = 5000;

BlockHash HashOfByte(uint8_t first, uint8_t last) {
  BlockHash hash;
  hash.bytes.fill(0);
  hash.bytes.front() = first;
  hash.bytes.back() = last;
  return hash;
}

std::vector<KvCacheEvent> SampleEvents() {
  KvCacheEvent stored;
  stored.kind = KvCacheEvent::Kind::kBlockStored;
  stored.block_hashes = {HashOfByte(1, 2), HashOfByte(3, 4)};
  stored.parent_block_hash = HashOfByte(5, 6);
  stored.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  stored.cache_salt = "tenant";
  stored.adapter_id = 9;
  KvCacheEvent removed;
  removed.kind = KvCacheEvent::Kind::kBlockRemoved;
  removed.block_hashes = {HashOfByte(7, 8)};
  KvCacheEvent cleared;
  cleared.kind = KvCacheEvent::Kind::kAllBlocksCleared;
  return {stored, removed, cleared};
}

// The fields vLLM's event structs default to None, which a map leaves out
// when nil (msgspec's omit_defaults) and a decoder reads as None.
bool DefaultsToNone(const std::string& key) {
  return key == "extra_keys" || key == "group_idx" ||
         key == "kv_cache_spec_kind" || key == "kv_cache_spec_sliding_window";
}

// A decoded map's value under `key`, as msgspec decodes it: nil for a
// field left out that defaults to None.
const msgpack::object& Field(const msgpack::object& map, std::string key) {
  static const msgpack::object kNil;
  REQUIRE(map.type == msgpack::type::MAP);
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    if (map.via.map.ptr[i].key.as<std::string>() == key) {
      return map.via.map.ptr[i].val;
    }
  }
  if (DefaultsToNone(key)) return kNil;
  FAIL("no field " << key);
  return map;
}

// The keys of a decoded map, "type" first.
std::vector<std::string> Keys(const msgpack::object& map) {
  REQUIRE(map.type == msgpack::type::MAP);
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    keys.push_back(map.via.map.ptr[i].key.as<std::string>());
  }
  return keys;
}

TEST_CASE("token ids are packed in msgpack's shortest forms, as msgpack-cxx") {
  // Each form's edges, non-negative and negative, and a page of uint 16s
  // only (packed on a path of its own).
  for (const std::vector<TokenId>& tokens :
       {std::vector<TokenId>{0, 127, 128, 255, 256, 65535, 65536, 2147483647},
        std::vector<TokenId>{256, 4660, 31999, 65535},
        std::vector<TokenId>{5, -1, -32, -33, -128, -129, -32768, -32769,
                             std::numeric_limits<TokenId>::min(), 300}}) {
    KvCacheEvent stored;
    stored.kind = KvCacheEvent::Kind::kBlockStored;
    stored.block_hashes = {HashOfByte(1, 2)};
    stored.token_ids = tokens;
    Options options;
    options.block_size = static_cast<int32_t>(tokens.size());
    options.encoding = Options::Encoding::kTaggedArray;
    const std::string payload = EncodeKvEventBatch(1.0, {stored}, options);
    // msgpack-cxx's own packing of the same array, found in the payload.
    msgpack::sbuffer expected;
    msgpack::pack(expected, tokens);
    REQUIRE(payload.find(std::string(expected.data(), expected.size())) !=
            std::string::npos);
    const msgpack::object_handle handle =
        msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& event =
        handle.get().via.array.ptr[1].via.array.ptr[0];
    REQUIRE(event.via.array.ptr[3].as<std::vector<TokenId>>() == tokens);
  }
}

TEST_CASE("a batch is encoded as vLLM's, maps or tagged arrays") {
  Options options;
  options.block_size = kPageSize;
  options.data_parallel_rank = 3;
  const std::vector<KvCacheEvent> events = SampleEvents();

  SECTION("maps with a type key, 64-bit hashes") {
    const std::string payload = EncodeKvEventBatch(12.5, events, options);
    const msgpack::object_handle handle =
        msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& batch = handle.get();
    REQUIRE(batch.via.array.size == 3);
    REQUIRE(batch.via.array.ptr[0].as<double>() == 12.5);
    REQUIRE(batch.via.array.ptr[2].as<int64_t>() == 3);
    const msgpack::object& list = batch.via.array.ptr[1];
    REQUIRE(list.via.array.size == 3);
    const msgpack::object& stored = list.via.array.ptr[0];
    REQUIRE(Field(stored, "type").as<std::string>() == "BlockStored");
    // The digest's low 64 bits, big-endian: only the last byte is set.
    REQUIRE(Field(stored, "block_hashes").as<std::vector<uint64_t>>() ==
            std::vector<uint64_t>{2, 4});
    REQUIRE(Field(stored, "parent_block_hash").as<uint64_t>() == 6);
    REQUIRE(Field(stored, "token_ids").as<std::vector<int32_t>>() ==
            events[0].token_ids);
    REQUIRE(Field(stored, "block_size").as<int32_t>() == kPageSize);
    REQUIRE(Field(stored, "lora_id").as<int64_t>() == 9);
    REQUIRE(Field(stored, "medium").as<std::string>() == "GPU");
    REQUIRE(Field(stored, "lora_name").is_nil());
    // One entry a page; the salt only at a sequence's page 0, which this
    // event (it has a parent) does not hold.
    const msgpack::object& extra = Field(stored, "extra_keys");
    REQUIRE(extra.type == msgpack::type::ARRAY);
    REQUIRE(extra.via.array.size == 2);
    REQUIRE(extra.via.array.ptr[0].is_nil());
    REQUIRE(extra.via.array.ptr[1].is_nil());
    REQUIRE(Field(stored, "group_idx").as<int32_t>() == 0);
    const msgpack::object& removed = list.via.array.ptr[1];
    REQUIRE(Field(removed, "type").as<std::string>() == "BlockRemoved");
    REQUIRE(Field(removed, "block_hashes").as<std::vector<uint64_t>>() ==
            std::vector<uint64_t>{8});
    REQUIRE(Field(list.via.array.ptr[2], "type").as<std::string>() ==
            "AllBlocksCleared");
  }

  SECTION("XXH3-128 digests: their own low 64 bits, 16-byte digests") {
    options.hash_algorithm = HashAlgorithm::kXxh3_128;
    std::vector<KvCacheEvent> xxh3 = events;
    // A 16-byte digest, zero-padded (as the manager holds it).
    for (BlockHash& hash : xxh3[0].block_hashes) {
      std::fill(hash.bytes.begin() + 16, hash.bytes.end(), 0);
      hash.bytes[15] = 0x42;
      hash.bytes[8] = 0x81;
    }
    const msgpack::object_handle ints =
        msgpack::unpack(EncodeKvEventBatch(1.0, xxh3, options).data(),
                        EncodeKvEventBatch(1.0, xxh3, options).size());
    const msgpack::object& stored =
        ints.get().via.array.ptr[1].via.array.ptr[0];
    REQUIRE(Field(stored, "block_hashes").as<std::vector<uint64_t>>() ==
            std::vector<uint64_t>(2, 0x8100000000000042));
    options.hash_form = Options::HashForm::kBytes;
    const std::string payload = EncodeKvEventBatch(1.0, xxh3, options);
    const msgpack::object_handle bytes =
        msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& first =
        Field(bytes.get().via.array.ptr[1].via.array.ptr[0], "block_hashes")
            .via.array.ptr[0];
    REQUIRE(std::string(first.via.bin.ptr, first.via.bin.size) ==
            std::string(xxh3[0].block_hashes[0].bytes.begin(),
                        xxh3[0].block_hashes[0].bytes.begin() + 16));
  }

  SECTION("tagged arrays, raw digests") {
    options.encoding = Options::Encoding::kTaggedArray;
    options.hash_form = Options::HashForm::kBytes;
    options.data_parallel_rank.reset();
    const std::string payload = EncodeKvEventBatch(1.0, events, options);
    const msgpack::object_handle handle =
        msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& batch = handle.get();
    REQUIRE(batch.via.array.ptr[2].is_nil());
    const msgpack::object& stored = batch.via.array.ptr[1].via.array.ptr[0];
    REQUIRE(stored.type == msgpack::type::ARRAY);
    REQUIRE(stored.via.array.ptr[0].as<std::string>() == "BlockStored");
    const msgpack::object& first = stored.via.array.ptr[1].via.array.ptr[0];
    REQUIRE(first.type == msgpack::type::BIN);
    REQUIRE(std::string(first.via.bin.ptr, first.via.bin.size) ==
            std::string(events[0].block_hashes[0].bytes.begin(),
                        events[0].block_hashes[0].bytes.end()));
    REQUIRE(stored.via.array.ptr[3].as<std::vector<int32_t>>() ==
            events[0].token_ids);
    const msgpack::object& cleared = batch.via.array.ptr[1].via.array.ptr[2];
    REQUIRE(cleared.via.array.size == 1);
  }
}

TEST_CASE("events carry their KV cache group's index and spec") {
  Options options;
  options.block_size = kPageSize;
  options.kv_cache_groups = {
      testing::GroupSpec(AttentionKind::kFull, kPageSize),
      testing::GroupSpec(AttentionKind::kSlidingWindow, kPageSize, 128),
      testing::GroupSpec(AttentionKind::kChunkedLocal, kPageSize, 64)};
  std::vector<KvCacheEvent> events = SampleEvents();
  events.resize(2);
  for (const int32_t group : {1, 2, 5}) {
    INFO("group " << group);
    events[0].group_idx = group;
    events[1].group_idx = group;
    const std::string payload = EncodeKvEventBatch(1.0, events, options);
    const msgpack::object_handle handle =
        msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& list = handle.get().via.array.ptr[1];
    const msgpack::object& stored = list.via.array.ptr[0];
    REQUIRE(Field(stored, "group_idx").as<int32_t>() == group);
    const msgpack::object& window =
        Field(stored, "kv_cache_spec_sliding_window");
    if (group == 1) {
      REQUIRE(Field(stored, "kv_cache_spec_kind").as<std::string>() ==
              "sliding_window");
      REQUIRE(window.as<int32_t>() == 128);
    } else {
      // vLLM's window is a sliding window's alone; a group past the
      // options' is full attention.
      REQUIRE(Field(stored, "kv_cache_spec_kind").as<std::string>() ==
              (group == 2 ? "chunked_local_attention" : "full_attention"));
      REQUIRE(window.is_nil());
    }
    REQUIRE(Field(list.via.array.ptr[1], "group_idx").as<int32_t>() == group);
  }
  // Each event's block_size is its group's page size, as vLLM sends each
  // group's; a group past the options' has block_size.
  options.block_size = 3 * kPageSize;
  options.kv_cache_groups = {
      testing::GroupSpec(AttentionKind::kFull, kPageSize),
      testing::GroupSpec(AttentionKind::kSlidingWindow, 2 * kPageSize, 128)};
  for (const auto& [group, block_size] :
       {std::pair{0, kPageSize}, {1, 2 * kPageSize}, {5, 3 * kPageSize}}) {
    INFO("group " << group);
    events[0].group_idx = group;
    const std::string payload = EncodeKvEventBatch(1.0, events, options);
    const msgpack::object_handle handle =
        msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& stored =
        handle.get().via.array.ptr[1].via.array.ptr[0];
    REQUIRE(Field(stored, "block_size").as<int32_t>() == block_size);
  }
  options.endpoint = "inproc://groups";
  REQUIRE_OK(KvEventPublisher::Create(options));
}

using testing::TokenRange;

// The publisher packs a recorded batch straight from its records: the same
// bytes as its built events, in every encoding, over random admissions (two
// salts, two adapters), appends, frees, evictions and resets.
TEST_CASE("a recorded batch packs as its built events do") {
  // One group, or two of pages of 4 and 8 tokens, whose records hold pages
  // of each group's size.
  const bool two_sizes = GENERATE(false, true);
  INFO("two page sizes " << two_sizes);
  PagedKvConfig config;
  config.num_pages = two_sizes ? 24 : 12;
  config.page_size = kPageSize;
  config.max_pages_per_seq = 8;
  config.max_batch = 8;
  BlockManagerOptions manager_options{.enable_kv_events = true};
  if (two_sizes) {
    manager_options.kv_cache_groups = {
        testing::GroupSpec(AttentionKind::kFull, kPageSize),
        testing::GroupSpec(AttentionKind::kFull, 2 * kPageSize)};
  }
  auto manager = BlockManager::Create(config, manager_options);
  REQUIRE_OK(manager);
  int64_t large_pages = 0;
  std::mt19937 rng(11);
  std::vector<SequenceId> live;
  KvEventBatch recorded;
  int64_t batches = 0;
  std::array<int64_t, 3> kinds{};
  int64_t salted = 0;
  int64_t adapted = 0;
  int64_t chained = 0;
  for (SequenceId id = 0; id < testing::RandomRunLength(600); ++id) {
    INFO("op " << id);
    const std::string salt = rng() % 2 == 0 ? "" : "tenant";
    const HashExtraKeys extra{.cache_salt = salt,
                              .adapter_id = static_cast<int64_t>(rng() % 2)};
    if (live.size() < 3 &&
        (*manager)
            ->Admit(id, TokenRange(300 * (rng() % 3), 1 + rng() % 14), extra)
            .ok()) {
      live.push_back(id);
    }
    if (!live.empty()) {
      (void)(*manager)->Append(live[rng() % live.size()],
                               TokenRange(200 + rng() % 90, 1 + rng() % 6));
    }
    if (!live.empty() && (live.size() >= 3 || rng() % 3 == 0)) {
      REQUIRE_OK((*manager)->Free(live.front()));
      live.erase(live.begin());
    }
    if (rng() % 50 == 0) REQUIRE_OK((*manager)->ResetPrefixCache());
    if (rng() % 3 != 0) continue;  // some batches span several ops.
    REQUIRE_OK((*manager)->TakeKvEvents(recorded));
    std::vector<KvCacheEvent> events;
    recorded.AppendTo(events);
    for (const auto encoding :
         {Options::Encoding::kMap, Options::Encoding::kTaggedArray}) {
      for (const auto hashes :
           {Options::HashForm::kInt64, Options::HashForm::kBytes}) {
        Options options;
        options.block_size = kPageSize;
        options.encoding = encoding;
        options.hash_form = hashes;
        options.data_parallel_rank = 3;
        options.kv_cache_groups = manager_options.kv_cache_groups;
        REQUIRE(EncodeKvEventBatch(2.5, recorded, options) ==
                EncodeKvEventBatch(2.5, events, options));
      }
    }
    batches += recorded.empty() ? 0 : 1;
    for (const KvCacheEvent& event : events) {
      ++kinds[static_cast<int>(event.kind)];
      salted += !event.cache_salt.empty();
      adapted += event.adapter_id != 0;
      chained += event.parent_block_hash.has_value();
      if (event.kind == KvCacheEvent::Kind::kBlockStored &&
          event.group_idx == 1) {
        REQUIRE(event.token_ids.size() ==
                2 * kPageSize * event.block_hashes.size());
        large_pages += static_cast<int64_t>(event.block_hashes.size());
      }
    }
  }
  REQUIRE((large_pages > 0) == two_sizes);
  REQUIRE(batches >= testing::RandomRunLength(100));
  // Every kind and field was packed.
  for (const int64_t count : kinds) REQUIRE(count > 0);
  REQUIRE((salted > 0 && adapted > 0 && chained > 0));
  REQUIRE(EncodeKvEventBatch(1.0, KvEventBatch(), Options()) ==
          EncodeKvEventBatch(1.0, std::vector<KvCacheEvent>(), Options()));
}

TEST_CASE("extra_keys has an entry a page, the salt at a sequence's page 0") {
  // vLLM's generate_block_hash_extra_keys: a tuple of what a block's hash
  // took beyond its tokens, else None; the cache salt only in the block at
  // token 0. Both encodings carry the same list.
  KvCacheEvent stored = SampleEvents()[0];
  KvCacheEvent root = stored;
  root.parent_block_hash.reset();
  KvCacheEvent unsalted_root = root;
  unsalted_root.cache_salt.clear();
  KvCacheEvent registered = root;  // registered directly: no tokens.
  registered.token_ids.clear();
  const std::vector<KvCacheEvent> events = {stored, root, unsalted_root,
                                            registered};
  // Per event, its entries: the salt, or nil (an empty string here).
  const std::vector<std::vector<std::string>> expected = {
      {"", ""}, {"tenant", ""}, {"", ""}, {"", ""}};
  for (const Options::Encoding encoding :
       {Options::Encoding::kMap, Options::Encoding::kTaggedArray}) {
    Options options;
    options.block_size = kPageSize;
    options.encoding = encoding;
    const std::string payload = EncodeKvEventBatch(1.0, events, options);
    const msgpack::object_handle handle =
        msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& list = handle.get().via.array.ptr[1];
    for (size_t i = 0; i < events.size(); ++i) {
      INFO("event " << i
                    << (encoding == Options::Encoding::kMap ? " map"
                                                            : " array"));
      const msgpack::object& event = list.via.array.ptr[i];
      const msgpack::object& extra = encoding == Options::Encoding::kMap
                                         ? Field(event, "extra_keys")
                                         : event.via.array.ptr[8];
      REQUIRE(extra.type == msgpack::type::ARRAY);
      std::vector<std::string> entries;
      for (uint32_t e = 0; e < extra.via.array.size; ++e) {
        const msgpack::object& entry = extra.via.array.ptr[e];
        if (entry.is_nil()) {
          entries.push_back("");
          continue;
        }
        REQUIRE(entry.via.array.size == 1);
        entries.push_back(entry.via.array.ptr[0].as<std::string>());
      }
      REQUIRE(entries == expected[i]);
    }
  }
}

TEST_CASE("maps leave out the nil fields vLLM defaults to None, as msgspec") {
  // vLLM's structs (since PR #42892 events are maps) default extra_keys,
  // group_idx and the spec's kind and window to None, and msgspec's
  // omit_defaults leaves such a field out while it holds None; the tagged
  // arrays (array_like) keep every field.
  Options options;
  options.block_size = kPageSize;
  options.kv_cache_groups = {
      testing::GroupSpec(AttentionKind::kFull, kPageSize),
      testing::GroupSpec(AttentionKind::kSlidingWindow, kPageSize, 128)};
  const std::vector<KvCacheEvent> sample = SampleEvents();
  KvCacheEvent unsalted = sample[0];
  unsalted.cache_salt.clear();
  KvCacheEvent windowed = sample[0];
  windowed.group_idx = 1;
  KvCacheEvent host_stored = sample[0];
  host_stored.medium = KvCacheEvent::Medium::kCpu;
  KvCacheEvent host_removed = sample[1];
  host_removed.medium = KvCacheEvent::Medium::kCpu;
  const std::vector<KvCacheEvent> events = {
      sample[0],   unsalted,     windowed, sample[1],
      host_stored, host_removed, sample[2]};
  const std::vector<std::string> head = {
      "type",    "block_hashes", "parent_block_hash", "token_ids", "block_size",
      "lora_id", "medium",       "lora_name"};
  const auto with = [&](std::vector<std::string> keys,
                        std::initializer_list<std::string> more) {
    keys.insert(keys.end(), more);
    return keys;
  };
  const std::vector<std::vector<std::string>> expected = {
      with(head, {"extra_keys", "group_idx", "kv_cache_spec_kind"}),
      with(head, {"extra_keys", "group_idx", "kv_cache_spec_kind"}),
      with(head, {"extra_keys", "group_idx", "kv_cache_spec_kind",
                  "kv_cache_spec_sliding_window"}),
      {"type", "block_hashes", "medium", "group_idx"},
      head,
      {"type", "block_hashes", "medium"},
      {"type"}};
  const std::string payload = EncodeKvEventBatch(1.0, events, options);
  const msgpack::object_handle handle =
      msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& list = handle.get().via.array.ptr[1];
  REQUIRE(list.via.array.size == events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    INFO("event " << i);
    REQUIRE(Keys(list.via.array.ptr[i]) == expected[i]);
  }
  REQUIRE(Field(list.via.array.ptr[4], "extra_keys").is_nil());
  REQUIRE(Field(list.via.array.ptr[2], "kv_cache_spec_sliding_window")
              .as<int32_t>() == 128);

  options.encoding = Options::Encoding::kTaggedArray;
  const std::string arrays = EncodeKvEventBatch(1.0, events, options);
  const msgpack::object_handle array_handle =
      msgpack::unpack(arrays.data(), arrays.size());
  const msgpack::object& array_list = array_handle.get().via.array.ptr[1];
  const std::vector<uint32_t> sizes = {12, 12, 12, 4, 12, 4, 1};
  for (size_t i = 0; i < events.size(); ++i) {
    INFO("event " << i);
    REQUIRE(array_list.via.array.ptr[i].via.array.size == sizes[i]);
  }
}

// An event's type and its fields in order, as (name, value), from either
// encoding (a tagged array's names are the ones of the wire format's tables).
struct DecodedEvent {
  std::string type;
  std::vector<std::pair<std::string, const msgpack::object*>> fields;
  const msgpack::object& operator[](const std::string& name) const {
    static const msgpack::object kNil;
    for (const auto& [key, value] : fields) {
      if (key == name) return *value;
    }
    if (DefaultsToNone(name)) return kNil;
    FAIL("no field " << name);
    return *fields.front().second;
  }
};
DecodedEvent Decode(const msgpack::object& event, Options::Encoding encoding) {
  DecodedEvent decoded;
  if (encoding == Options::Encoding::kMap) {
    REQUIRE(event.type == msgpack::type::MAP);
    REQUIRE(event.via.map.size >= 1);
    REQUIRE(event.via.map.ptr[0].key.as<std::string>() == "type");
    decoded.type = event.via.map.ptr[0].val.as<std::string>();
    for (uint32_t i = 1; i < event.via.map.size; ++i) {
      decoded.fields.emplace_back(event.via.map.ptr[i].key.as<std::string>(),
                                  &event.via.map.ptr[i].val);
    }
    return decoded;
  }
  REQUIRE(event.type == msgpack::type::ARRAY);
  decoded.type = event.via.array.ptr[0].as<std::string>();
  static const std::vector<std::string> kStored = {
      "block_hashes",
      "parent_block_hash",
      "token_ids",
      "block_size",
      "lora_id",
      "medium",
      "lora_name",
      "extra_keys",
      "group_idx",
      "kv_cache_spec_kind",
      "kv_cache_spec_sliding_window"};
  static const std::vector<std::string> kRemoved = {"block_hashes", "medium",
                                                    "group_idx"};
  const std::vector<std::string>& names =
      decoded.type == "BlockStored" ? kStored : kRemoved;
  REQUIRE(event.via.array.size == names.size() + 1);
  for (size_t i = 0; i < names.size(); ++i) {
    decoded.fields.emplace_back(names[i], &event.via.array.ptr[i + 1]);
  }
  return decoded;
}

// A hash as the options send it: the digest's last 8 bytes as a big-endian
// uint64, or the 32-byte SHA-256 digest as bin.
bool HashIs(const msgpack::object& sent, const BlockHash& hash,
            Options::HashForm form) {
  if (form == Options::HashForm::kBytes) {
    return sent.type == msgpack::type::BIN &&
           std::string(sent.via.bin.ptr, sent.via.bin.size) ==
               std::string(hash.bytes.begin(), hash.bytes.end());
  }
  uint64_t low = 0;
  for (size_t i = hash.bytes.size() - 8; i < hash.bytes.size(); ++i) {
    low = low << 8 | hash.bytes[i];
  }
  return sent.type == msgpack::type::POSITIVE_INTEGER &&
         sent.as<uint64_t>() == low;
}

// A manager with a host tier of 4 pages records: prompt A (salted, with an
// adapter) cached and freed; prompt B evicting A's four pages into the host
// tier (which fills it); prompt C evicting two of B's, each store dropping
// one of A's from the host tier. The CPU events are packed as vLLM's
// OffloadingConnector sends them (hashes, no chain, tokens, block size,
// adapter, extra keys or group), in both encodings and hash forms.
TEST_CASE("host tier events are packed as vLLM's CPU events, in either form") {
  PagedKvConfig config;
  config.num_pages = 8;
  config.page_size = kPageSize;
  config.max_pages_per_seq = 8;
  config.max_batch = 8;
  auto manager =
      BlockManager::Create(config, {.enable_kv_events = true, .host_pages = 4});
  REQUIRE_OK(manager);
  BlockManager& bm = **manager;
  std::vector<HostCopy> copies;
  REQUIRE_OK(bm.Admit(1, TokenRange(1, 17),
                      {.cache_salt = "tenant", .adapter_id = 9}));
  REQUIRE_OK(bm.Free(1));
  REQUIRE_OK(bm.TakeHostCopies(copies));
  REQUIRE_OK(bm.Admit(2, TokenRange(1000, 32)));
  REQUIRE_OK(bm.Free(2));
  REQUIRE_OK(bm.TakeHostCopies(copies));
  REQUIRE_OK(bm.Admit(3, TokenRange(2000, 8)));
  REQUIRE_OK(bm.TakeHostCopies(copies));
  REQUIRE(copies.size() == 6);  // stores: A's 4, then 2 of B's.
  REQUIRE(bm.stats().host_evictions == 2);

  KvEventBatch recorded;
  REQUIRE_OK(bm.TakeKvEvents(recorded));
  std::vector<KvCacheEvent> events;
  recorded.AppendTo(events);
  // The hashes the GPU events named A's and B's pages by.
  std::vector<BlockHash> gpu_a;
  std::vector<BlockHash> cpu_stored;
  std::vector<BlockHash> cpu_removed;
  for (const KvCacheEvent& event : events) {
    const bool stored = event.kind == KvCacheEvent::Kind::kBlockStored;
    if (event.medium == KvCacheEvent::Medium::kGpu) {
      if (stored && event.adapter_id == 9) gpu_a = event.block_hashes;
      continue;
    }
    std::vector<BlockHash>& into = stored ? cpu_stored : cpu_removed;
    into.insert(into.end(), event.block_hashes.begin(),
                event.block_hashes.end());
  }
  REQUIRE(gpu_a.size() == 4);
  REQUIRE(cpu_stored.size() == 6);
  // A's pages went to the host tier continuation first (the LRU order of
  // the device), and the host tier dropped them in the order it stored
  // them.
  REQUIRE(std::vector<BlockHash>(cpu_stored.begin(), cpu_stored.begin() + 4) ==
          std::vector<BlockHash>(gpu_a.rbegin(), gpu_a.rend()));
  REQUIRE(cpu_removed ==
          std::vector<BlockHash>(cpu_stored.begin(), cpu_stored.begin() + 2));

  for (const auto encoding :
       {Options::Encoding::kMap, Options::Encoding::kTaggedArray}) {
    for (const auto form :
         {Options::HashForm::kInt64, Options::HashForm::kBytes}) {
      INFO("tagged arrays " << (encoding == Options::Encoding::kTaggedArray)
                            << ", bytes "
                            << (form == Options::HashForm::kBytes));
      Options options;
      options.block_size = kPageSize;
      options.encoding = encoding;
      options.hash_form = form;
      const std::string payload = EncodeKvEventBatch(2.5, recorded, options);
      // The records pack as the events built from them.
      REQUIRE(payload == EncodeKvEventBatch(2.5, events, options));
      const msgpack::object_handle handle =
          msgpack::unpack(payload.data(), payload.size());
      const msgpack::object& list = handle.get().via.array.ptr[1];
      REQUIRE(list.via.array.size == events.size());
      size_t next_stored = 0;
      size_t next_removed = 0;
      for (uint32_t i = 0; i < list.via.array.size; ++i) {
        const DecodedEvent event = Decode(list.via.array.ptr[i], encoding);
        if (event["medium"].as<std::string>() == "GPU") {
          // A GPU event keeps its group (an int) and its own fields.
          REQUIRE(event["group_idx"].as<int32_t>() == 0);
          if (event.type == "BlockStored") {
            REQUIRE(event["block_size"].as<int32_t>() == kPageSize);
          }
          continue;
        }
        REQUIRE(event["medium"].as<std::string>() == "CPU");
        std::vector<std::string> names;
        for (const auto& field : event.fields) names.push_back(field.first);
        const msgpack::object& hashes = event["block_hashes"];
        REQUIRE(hashes.type == msgpack::type::ARRAY);
        std::vector<BlockHash>& expected =
            event.type == "BlockStored" ? cpu_stored : cpu_removed;
        size_t& next = event.type == "BlockStored" ? next_stored : next_removed;
        for (uint32_t h = 0; h < hashes.via.array.size; ++h) {
          REQUIRE(next < expected.size());
          REQUIRE(HashIs(hashes.via.array.ptr[h], expected[next++], form));
        }
        // A map leaves out the nil fields that default to None.
        const bool all = encoding == Options::Encoding::kTaggedArray;
        if (event.type == "BlockRemoved") {
          REQUIRE(names ==
                  (all ? std::vector<std::string>{"block_hashes", "medium",
                                                  "group_idx"}
                       : std::vector<std::string>{"block_hashes", "medium"}));
          REQUIRE(event["group_idx"].is_nil());
          continue;
        }
        REQUIRE(event.type == "BlockStored");
        std::vector<std::string> stored_names = {
            "block_hashes", "parent_block_hash", "token_ids",
            "block_size",   "lora_id",           "medium",
            "lora_name"};
        if (all) {
          stored_names.insert(stored_names.end(),
                              {"extra_keys", "group_idx", "kv_cache_spec_kind",
                               "kv_cache_spec_sliding_window"});
        }
        REQUIRE(names == stored_names);
        REQUIRE(event["parent_block_hash"].is_nil());
        REQUIRE(event["token_ids"].type == msgpack::type::ARRAY);
        REQUIRE(event["token_ids"].via.array.size == 0);
        REQUIRE(event["block_size"].type == msgpack::type::POSITIVE_INTEGER);
        REQUIRE(event["block_size"].as<int32_t>() == 0);
        // A's pages carry a salt and an adapter on the GPU; not on the CPU.
        for (const char* nil :
             {"lora_id", "lora_name", "extra_keys", "group_idx",
              "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}) {
          INFO(nil);
          REQUIRE(event[nil].is_nil());
        }
      }
      REQUIRE(next_stored == cpu_stored.size());
      REQUIRE(next_removed == cpu_removed.size());
    }
  }
}

// One message from `socket`, waiting at most kTimeoutMs; empty on timeout.
std::vector<zmq::message_t> Receive(zmq::socket_t& socket,
                                    int timeout_ms = kTimeoutMs) {
  std::vector<zmq::message_t> frames;
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) == 0) {
    return frames;
  }
  do {
    zmq::message_t frame;
    REQUIRE(socket.recv(frame, zmq::recv_flags::none));
    frames.push_back(std::move(frame));
  } while (frames.back().more());
  return frames;
}

int64_t SeqOf(const zmq::message_t& frame) {
  REQUIRE(frame.size() == 8);
  int64_t seq = 0;
  const auto* bytes = static_cast<const uint8_t*>(frame.data());
  for (int i = 0; i < 8; ++i) seq = seq << 8 | bytes[i];
  return seq;
}

zmq::message_t SeqFrame(int64_t seq) {
  std::array<uint8_t, 8> bytes;
  for (int i = 7; i >= 0; --i, seq >>= 8) bytes[i] = seq & 0xff;
  return zmq::message_t(bytes.data(), bytes.size());
}

// Applies one payload's events to `cached` (raw digests as strings).
void Apply(const zmq::message_t& payload, std::set<std::string>& cached) {
  const msgpack::object_handle handle =
      msgpack::unpack(static_cast<const char*>(payload.data()), payload.size());
  const msgpack::object& list = handle.get().via.array.ptr[1];
  for (uint32_t i = 0; i < list.via.array.size; ++i) {
    const msgpack::object& event = list.via.array.ptr[i];
    const std::string type = Field(event, "type").as<std::string>();
    if (type == "AllBlocksCleared") {
      cached.clear();
      continue;
    }
    const msgpack::object& hashes = Field(event, "block_hashes");
    for (uint32_t h = 0; h < hashes.via.array.size; ++h) {
      const msgpack::object& hash = hashes.via.array.ptr[h];
      const std::string key(hash.via.bin.ptr, hash.via.bin.size);
      if (type == "BlockStored") {
        REQUIRE(cached.insert(key).second);
      } else {
        REQUIRE(cached.erase(key) == 1);
      }
    }
  }
}

TEST_CASE("a subscriber rebuilds the cache; a late one replays it") {
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.replay_endpoint = "tcp://127.0.0.1:*";
  options.topic = "kv";
  options.block_size = kPageSize;
  options.hash_form = Options::HashForm::kBytes;
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);

  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv");
  sub.connect((*publisher)->endpoint());
  // PUB drops what it sends before the subscription arrives: wait for it
  // with probes, each a reset (harmless: the run below starts empty).
  int64_t first_seq = -1;
  for (int probe = 0; probe < 100 && first_seq < 0; ++probe) {
    KvCacheEvent cleared;
    cleared.kind = KvCacheEvent::Kind::kAllBlocksCleared;
    REQUIRE((*publisher)->Publish({cleared}));
    const std::vector<zmq::message_t> frames = Receive(sub, 50);
    if (!frames.empty()) first_seq = SeqOf(frames[1]);
  }
  REQUIRE(first_seq >= 0);

  PagedKvConfig config;
  config.num_pages = 16;
  config.page_size = kPageSize;
  config.max_pages_per_seq = 8;
  config.max_batch = 8;
  BlockManagerOptions manager_options;
  manager_options.enable_kv_events = true;
  auto manager = BlockManager::Create(config, manager_options);
  REQUIRE_OK(manager);
  std::mt19937 rng(7);
  std::vector<SequenceId> live;
  KvEventBatch recorded;
  int64_t batches = 0;
  for (SequenceId id = 0; id < testing::RandomRunLength(400); ++id) {
    if (live.size() < 4 &&
        (*manager)
            ->Admit(id, TokenRange(100 * (rng() % 3), 1 + rng() % 12))
            .ok()) {
      live.push_back(id);
    }
    if (!live.empty()) {
      (void)(*manager)->Append(live[rng() % live.size()],
                               TokenRange(rng() % 9, 3));
    }
    if (!live.empty() && (live.size() >= 4 || rng() % 3 == 0)) {
      REQUIRE_OK((*manager)->Free(live.front()));
      live.erase(live.begin());
    }
    // As a scheduler does: one batch, taken into after every step (copied
    // behind the queued batches, mostly) or when the publisher is idle
    // (exchanged), the events pending in the manager meanwhile.
    const bool last = id + 1 == testing::RandomRunLength(400);
    if (!last && rng() % 2 == 0 && !(*publisher)->idle()) continue;
    REQUIRE_OK((*manager)->TakeKvEvents(recorded));
    REQUIRE((*manager)->pending_kv_changes() == 0);
    if (!recorded.empty()) {
      REQUIRE((*publisher)->Publish(recorded));
      REQUIRE(recorded.empty());
      ++batches;
    }
  }
  REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  REQUIRE((*publisher)->idle());
  REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  std::set<std::string> pool_cached;
  for (const auto& [page, hash] : (*manager)->pool().Snapshot().cached) {
    pool_cached.insert(std::string(hash.bytes.begin(), hash.bytes.end()));
  }
  REQUIRE(!pool_cached.empty());

  // Live: every batch after the probe, in order, rebuilds the cache.
  std::set<std::string> cached;
  int64_t expected = first_seq + 1;
  const int64_t last = (*publisher)->stats().batches_published - 1;
  while (expected <= last) {
    const std::vector<zmq::message_t> frames = Receive(sub);
    REQUIRE(frames.size() == 3);
    REQUIRE(frames[0].to_string() == "kv");
    if (SeqOf(frames[1]) < expected) continue;  // a probe's.
    REQUIRE(SeqOf(frames[1]) == expected);
    Apply(frames[2], cached);
    ++expected;
  }
  REQUIRE(cached == pool_cached);

  // A late subscriber replays: from the first batch of the run, the same
  // cache; from the middle, the batches from there on.
  zmq::socket_t replay(context, zmq::socket_type::dealer);
  replay.connect((*publisher)->replay_endpoint());
  // The sequence numbers replayed from `start`; with `rebuilt`, their
  // events applied to it.
  const auto request = [&](int64_t start, std::set<std::string>* rebuilt) {
    replay.send(zmq::message_t(), zmq::send_flags::sndmore);
    replay.send(SeqFrame(start), zmq::send_flags::none);
    std::vector<int64_t> seqs;
    while (true) {
      const std::vector<zmq::message_t> frames = Receive(replay);
      REQUIRE(frames.size() == 3);  // DEALER: "", seq, payload.
      const int64_t seq = SeqOf(frames[1]);
      if (seq == -1) {
        REQUIRE(frames[2].size() == 0);
        return seqs;
      }
      seqs.push_back(seq);
      if (rebuilt != nullptr) Apply(frames[2], *rebuilt);
    }
  };
  std::set<std::string> rebuilt;
  const std::vector<int64_t> all = request(first_seq + 1, &rebuilt);
  REQUIRE(static_cast<int64_t>(all.size()) == batches);
  REQUIRE(all.front() == first_seq + 1);
  REQUIRE(rebuilt == pool_cached);
  const int64_t middle = first_seq + 1 + batches / 2;
  const std::vector<int64_t> tail = request(middle, nullptr);
  REQUIRE(tail.front() == middle);
  REQUIRE(tail.back() == last);
  REQUIRE(static_cast<int64_t>(tail.size()) == last - middle + 1);
  REQUIRE((*publisher)->stats().replay_requests == 2);
}

TEST_CASE("a full queue drops batches and counts them, never waiting") {
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.queue_capacity = 1;
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);
  std::vector<KvCacheEvent> events = SampleEvents();
  constexpr int kBatches = 20000;
  int accepted = 0;
  for (int i = 0; i < kBatches; ++i) accepted += (*publisher)->Publish(events);
  REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  const KvEventPublisherStats stats = (*publisher)->stats();
  REQUIRE(stats.batches_published == accepted);
  REQUIRE(stats.batches_published + stats.batches_dropped == kBatches);
  REQUIRE(stats.batches_dropped > 0);
}

// ZeroMQ's ROUTER drops, without a word, what is queued for a peer past its
// send limit (1,000 messages by default): a replay of more kept batches lost
// most of them.
TEST_CASE("a replay returns every kept batch, however many") {
  constexpr int kBatches = 6500;
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.replay_endpoint = "tcp://127.0.0.1:*";
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);
  const std::vector<KvCacheEvent> events = SampleEvents();
  for (int i = 0; i < kBatches; ++i) {
    if (i % 512 == 0) REQUIRE((*publisher)->Flush(absl::Seconds(5)));
    REQUIRE((*publisher)->Publish(events));
  }
  REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  REQUIRE((*publisher)->stats().batches_published == kBatches);
  zmq::context_t context;
  zmq::socket_t replay(context, zmq::socket_type::dealer);
  replay.connect((*publisher)->replay_endpoint());
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(SeqFrame(0), zmq::send_flags::none);
  for (int64_t seq = 0; seq <= kBatches; ++seq) {
    const std::vector<zmq::message_t> frames = Receive(replay);
    REQUIRE(frames.size() == 3);
    REQUIRE(SeqOf(frames[1]) == (seq == kBatches ? -1 : seq));
  }
}

// A batch of about 28 KB on the wire: 2,000 pages of 4 tokens.
std::vector<KvCacheEvent> LargeEvents() {
  KvCacheEvent stored;
  stored.kind = KvCacheEvent::Kind::kBlockStored;
  for (int i = 0; i < 2000; ++i) {
    stored.block_hashes.push_back(HashOfByte(static_cast<uint8_t>(i), 0xff));
  }
  for (int i = 0; i < 4 * 2000; ++i) stored.token_ids.push_back(300 + i);
  return {stored};
}

// Before max_queued_bytes, a subscriber that never read let ZeroMQ queue
// every batch (up to send_hwm, 100,000 messages): over 1 GB in 90 s.
TEST_CASE("a subscriber that never reads bounds what is queued, in bytes") {
  constexpr int64_t kBound = int64_t{1} << 20;
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.replay_endpoint = "tcp://127.0.0.1:*";
  options.block_size = kPageSize;
  options.reserved_changes = 0;
  options.max_queued_bytes = kBound;
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);
  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  // Little room past the publisher: its kernel buffers and queue.
  sub.set(zmq::sockopt::rcvhwm, 3);
  sub.set(zmq::sockopt::rcvbuf, 64 << 10);
  sub.set(zmq::sockopt::subscribe, "");
  sub.connect((*publisher)->endpoint());
  int64_t probe_seq = -1;  // the last probe's: the subscription is live.
  for (int probe = 0; probe < 100 && probe_seq < 0; ++probe) {
    REQUIRE((*publisher)->Publish(SampleEvents()));
    const std::vector<zmq::message_t> frames = Receive(sub, 50);
    if (!frames.empty()) probe_seq = SeqOf(frames[1]);
  }
  REQUIRE(probe_seq >= 0);
  // Probes sent after the one read: the subscriber reads them below.
  REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  const int64_t first = probe_seq + 1;

  // It stops reading; 28 MB of batches are published, far more than the
  // loopback connection's buffers hold.
  const std::vector<KvCacheEvent> large = LargeEvents();
  constexpr int kBatches = 1000;
  for (int i = 0; i < kBatches; ++i) {
    if (i % 50 == 0) REQUIRE((*publisher)->Flush(absl::Seconds(10)));
    REQUIRE((*publisher)->Publish(large));
  }
  REQUIRE((*publisher)->Flush(absl::Seconds(10)));
  KvEventPublisherStats stats = (*publisher)->stats();
  REQUIRE(stats.batches_dropped == 0);
  REQUIRE(stats.batches_unsent > 0);
  REQUIRE(stats.peak_queued_bytes > 0);
  REQUIRE(stats.peak_queued_bytes <= kBound);
  REQUIRE(stats.queued_bytes <= kBound);
  const int64_t numbered = stats.batches_published + stats.batches_unsent;

  // Now it reads: every batch sent, in order, the gaps exactly the unsent.
  std::vector<int64_t> seqs;
  while (true) {
    const std::vector<zmq::message_t> frames = Receive(sub, 1000);
    if (frames.empty()) break;
    REQUIRE(frames.size() == 3);
    const int64_t seq = SeqOf(frames[1]);
    REQUIRE((seqs.empty() || seq > seqs.back()));
    seqs.push_back(seq);
  }
  REQUIRE(!seqs.empty());
  REQUIRE(seqs.front() >= first);
  REQUIRE(seqs.back() < numbered);
  std::vector<int64_t> gaps;
  for (int64_t seq = first, i = 0; seq < numbered; ++seq) {
    if (i < static_cast<int64_t>(seqs.size()) && seqs[i] == seq) {
      ++i;
    } else {
      gaps.push_back(seq);
    }
  }
  REQUIRE(static_cast<int64_t>(gaps.size()) == stats.batches_unsent);
  REQUIRE(static_cast<int64_t>(seqs.size()) == stats.batches_published - first);

  // Read, ZeroMQ freed everything: the next batch is sent, numbered next.
  for (int i = 0; i < 500 && (*publisher)->stats().queued_bytes > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE((*publisher)->stats().queued_bytes == 0);
  REQUIRE((*publisher)->Publish(large));
  std::vector<zmq::message_t> frames = Receive(sub);
  REQUIRE(frames.size() == 3);
  REQUIRE(SeqOf(frames[1]) == numbered);

  // An unsent batch was kept: a replay from the first gap returns it and
  // those after, in order, until the bound ends it with the end marker.
  zmq::socket_t replay(context, zmq::socket_type::dealer);
  replay.set(zmq::sockopt::rcvhwm, 3);
  replay.set(zmq::sockopt::rcvbuf, 64 << 10);
  replay.connect((*publisher)->replay_endpoint());
  // Until the requester reads, the replies it has not taken stay queued.
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(SeqFrame(gaps.front()), zmq::send_flags::none);
  // The thread answers at a look and counts the cut at the next: a batch
  // and a Flush make one, until it shows.
  for (int i = 0; i < 500 && stats.replays_cut == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE((*publisher)->Publish(SampleEvents()));
    REQUIRE((*publisher)->Flush(absl::Seconds(5)));
    stats = (*publisher)->stats();
  }
  REQUIRE(stats.replays_cut == 1);
  // PUB's bound and the replies' apart.
  REQUIRE(stats.peak_queued_bytes <= 2 * kBound);
  // The requester holds its replies: the batches on PUB still go out.
  REQUIRE((*publisher)->Publish(large));
  REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  REQUIRE((*publisher)->stats().batches_unsent == stats.batches_unsent);
  int64_t expected = gaps.front();
  while (true) {
    frames = Receive(replay);
    REQUIRE(frames.size() == 3);
    const int64_t seq = SeqOf(frames[1]);
    if (seq == -1) break;
    REQUIRE(seq == expected);
    ++expected;
  }
  REQUIRE(expected > gaps.front());
  REQUIRE(expected < numbered);  // cut before the newest.
}

TEST_CASE("the replay ring is bounded in bytes, keeping the newest") {
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.replay_endpoint = "tcp://127.0.0.1:*";
  options.block_size = kPageSize;
  options.reserved_changes = 0;
  options.max_replay_bytes = 100 << 10;  // three of the 28 KB batches.
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);
  const std::vector<KvCacheEvent> large = LargeEvents();
  for (int i = 0; i < 20; ++i) REQUIRE((*publisher)->Publish(large));
  REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  REQUIRE((*publisher)->stats().batches_published == 20);
  zmq::context_t context;
  zmq::socket_t replay(context, zmq::socket_type::dealer);
  replay.connect((*publisher)->replay_endpoint());
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(SeqFrame(0), zmq::send_flags::none);
  std::vector<int64_t> seqs;
  while (true) {
    const std::vector<zmq::message_t> frames = Receive(replay);
    REQUIRE(frames.size() == 3);
    if (SeqOf(frames[1]) == -1) break;
    seqs.push_back(SeqOf(frames[1]));
  }
  REQUIRE(seqs.size() >= 2);
  REQUIRE(seqs.size() <= 4);
  REQUIRE(seqs.back() == 19);
  for (size_t i = 1; i < seqs.size(); ++i) REQUIRE(seqs[i] == seqs[i - 1] + 1);
}

// A batch of about 170 KB: six LargeEvents in one.
std::vector<KvCacheEvent> HugeEvents() {
  std::vector<KvCacheEvent> huge;
  for (int i = 0; i < 6; ++i) huge.push_back(LargeEvents()[0]);
  return huge;
}

// The seqs one replay from `start` returns, up to its end marker.
std::vector<int64_t> ReplaySeqs(zmq::socket_t& replay, int64_t start) {
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(SeqFrame(start), zmq::send_flags::none);
  std::vector<int64_t> seqs;
  while (true) {
    const std::vector<zmq::message_t> frames = Receive(replay);
    REQUIRE(frames.size() == 3);
    if (SeqOf(frames[1]) == -1) return seqs;
    seqs.push_back(SeqOf(frames[1]));
  }
}

TEST_CASE("a batch larger than a bound alone is passed over, not a wall") {
  // Kept only if it fits max_replay_bytes alone, and then never the reason
  // the older ones go (it emptied the ring); replayed only if it fits
  // max_queued_bytes alone, and otherwise passed over (every replay from
  // it ended at it: the requester's retries never got past).
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.replay_endpoint = "tcp://127.0.0.1:*";
  options.block_size = kPageSize;
  options.reserved_changes = 0;
  for (const bool replay_bound : {true, false}) {
    INFO((replay_bound ? "max_replay_bytes" : "max_queued_bytes"));
    options.max_replay_bytes = replay_bound ? 100 << 10 : 0;
    options.max_queued_bytes = replay_bound ? 0 : 100 << 10;
    auto publisher = KvEventPublisher::Create(options);
    REQUIRE_OK(publisher);
    for (int i = 0; i < 5; ++i) REQUIRE((*publisher)->Publish(SampleEvents()));
    REQUIRE((*publisher)->Publish(HugeEvents()));  // seq 5.
    for (int i = 0; i < 5; ++i) REQUIRE((*publisher)->Publish(SampleEvents()));
    REQUIRE((*publisher)->Flush(absl::Seconds(5)));
    zmq::context_t context;
    zmq::socket_t replay(context, zmq::socket_type::dealer);
    replay.connect((*publisher)->replay_endpoint());
    REQUIRE(ReplaySeqs(replay, 0) ==
            std::vector<int64_t>{0, 1, 2, 3, 4, 6, 7, 8, 9, 10});
    REQUIRE(ReplaySeqs(replay, 5) == std::vector<int64_t>{6, 7, 8, 9, 10});
  }
}

TEST_CASE("replay requests neither stop the batches nor grow the process") {
  constexpr int64_t kBound = 64 << 10;
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  // A Unix socket: its kernel buffers take far less than loopback TCP's
  // before ZeroMQ holds the markers.
  const std::string socket_path = (std::filesystem::temp_directory_path() /
                                   absl::StrCat("kvblock-replay-", getpid()))
                                      .string();
  options.replay_endpoint = "ipc://" + socket_path;
  options.block_size = kPageSize;
  options.max_queued_bytes = kBound;
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);
  zmq::context_t context;
  // A requester that asks without end, past every seq (the end marker
  // alone), and never reads. Before, a turn served requests until none was
  // left, so that the batches were not sent (Flush timed out), and the end
  // markers, not counted, piled up in ZeroMQ without bound.
  std::atomic<bool> asking = true;
  std::thread flood([&] {
    zmq::socket_t requester(context, zmq::socket_type::dealer);
    requester.set(zmq::sockopt::rcvhwm, 1);
    requester.set(zmq::sockopt::rcvbuf, 4 << 10);
    requester.set(zmq::sockopt::sndhwm, 0);
    requester.connect((*publisher)->replay_endpoint());
    while (asking.load()) {
      requester.send(zmq::message_t(), zmq::send_flags::sndmore);
      requester.send(SeqFrame(INT64_MAX), zmq::send_flags::none);
    }
    requester.set(zmq::sockopt::linger, 0);
  });
  for (int i = 0; i < 200; ++i) {
    REQUIRE((*publisher)->Publish(SampleEvents()));
    REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  }
  KvEventPublisherStats stats = (*publisher)->stats();
  for (int i = 0; i < 6000 && stats.replays_cut == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE((*publisher)->Flush(absl::Seconds(5)));
    stats = (*publisher)->stats();
  }
  asking = false;
  flood.join();
  REQUIRE(stats.batches_published == 200);
  REQUIRE(stats.replay_requests > 0);
  // The markers count: past the bound, a request gets no reply.
  REQUIRE(stats.replays_cut > 0);
  REQUIRE(stats.peak_queued_bytes <= 2 * kBound);
  publisher->reset();
  std::filesystem::remove(socket_path);
}

TEST_CASE("Flush wakes the thread; its looks at any interval send all") {
  for (const absl::Duration interval :
       {absl::Microseconds(10), absl::Seconds(1)}) {
    Options options;
    options.endpoint = "tcp://127.0.0.1:*";
    options.poll_interval = interval;
    auto publisher = KvEventPublisher::Create(options);
    REQUIRE_OK(publisher);
    const std::vector<KvCacheEvent> events = SampleEvents();
    REQUIRE((*publisher)->Publish(events));
    REQUIRE((*publisher)->Flush(absl::Seconds(5)));
    // The thread sent a batch, so it waits a whole interval now: done
    // within half of a one-second one, Flush woke it.
    for (int i = 0; i < 3; ++i) REQUIRE((*publisher)->Publish(events));
    REQUIRE((*publisher)->Flush(absl::Milliseconds(500)));
    const KvEventPublisherStats stats = (*publisher)->stats();
    REQUIRE(stats.batches_published == 4);
    REQUIRE(stats.events_published == 4 * static_cast<int64_t>(events.size()));
  }
}

TEST_CASE(
    "a malformed replay request gets no reply, and no crash; "
    "start numbers are read as vLLM reads them") {
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.replay_endpoint = "tcp://127.0.0.1:*";
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);
  REQUIRE((*publisher)->Publish(SampleEvents()));
  REQUIRE((*publisher)->Flush(absl::Seconds(5)));
  zmq::context_t context;
  zmq::socket_t replay(context, zmq::socket_type::dealer);
  replay.connect((*publisher)->replay_endpoint());
  replay.send(zmq::str_buffer("x"), zmq::send_flags::none);  // one frame.
  REQUIRE(Receive(replay, 300).empty());
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);  // four frames.
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(SeqFrame(0), zmq::send_flags::none);
  REQUIRE(Receive(replay, 300).empty());
  REQUIRE((*publisher)->stats().malformed_requests == 2);
  // Unsigned, any length: past every batch, only the end marker.
  const std::array<uint8_t, 8> high = {0x80, 0, 0, 0, 0, 0, 0, 0};
  const std::array<uint8_t, 8> ones = {0xff, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0xff};
  const std::array<uint8_t, 4> four = {0, 0, 1, 0};
  for (zmq::const_buffer start : {zmq::buffer(high), zmq::buffer(ones),
                                  zmq::buffer(four), zmq::str_buffer("abc")}) {
    replay.send(zmq::message_t(), zmq::send_flags::sndmore);
    replay.send(start, zmq::send_flags::none);
    const std::vector<zmq::message_t> end = Receive(replay);
    REQUIRE(end.size() == 3);
    REQUIRE(SeqOf(end[1]) == -1);
  }
  // An empty start is 0: every kept batch.
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(zmq::message_t(), zmq::send_flags::none);
  REQUIRE(SeqOf(Receive(replay)[1]) == 0);
  REQUIRE(SeqOf(Receive(replay)[1]) == -1);
  // It still answers a good one.
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(SeqFrame(0), zmq::send_flags::none);
  std::vector<zmq::message_t> frames = Receive(replay);
  REQUIRE(frames.size() == 3);
  REQUIRE(SeqOf(frames[1]) == 0);
  frames = Receive(replay);
  REQUIRE(SeqOf(frames[1]) == -1);
}

// The threads of this process named `name`, by the CPUs they may run on
// (their status's Cpus_allowed_list).
std::vector<std::string> AllowedCpusOfThreads(const std::string& name) {
  std::vector<std::string> allowed;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string thread_name;
    std::getline(comm, thread_name);
    if (thread_name != name) continue;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      constexpr std::string_view kKey = "Cpus_allowed_list:";
      if (line.starts_with(kKey)) {
        allowed.push_back(std::string(absl::StripAsciiWhitespace(
            absl::string_view(line).substr(kKey.size()))));
      }
    }
  }
  return allowed;
}

TEST_CASE("Create names what it cannot use") {
  Options options;
  REQUIRE_STATUS_IS(KvEventPublisher::Create(options), kInvalidArgument);
  options.endpoint = "tcp://127.0.0.1:*";
  options.queue_capacity = 0;
  auto bad = KvEventPublisher::Create(options);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(bad.status().message()).find("queue_capacity 0") !=
          std::string::npos);
  options.queue_capacity = 4;
  for (const int32_t changes : {-1, (1 << 22) + 1}) {
    options.reserved_changes = changes;
    bad = KvEventPublisher::Create(options);
    REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(bad.status().message())
                .find(absl::StrCat("reserved_changes ", changes,
                                   " is outside [0, 4194304]")) !=
            std::string::npos);
  }
  options.reserved_changes = 64;
  for (const absl::Duration interval :
       {absl::Microseconds(9), absl::Seconds(1) + absl::Nanoseconds(1)}) {
    options.poll_interval = interval;
    bad = KvEventPublisher::Create(options);
    REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(
        std::string(bad.status().message())
            .find(absl::StrCat("poll_interval ", absl::FormatDuration(interval),
                               " is outside [10us, 1s]")) != std::string::npos);
  }
  options.poll_interval = absl::Microseconds(250);
  for (const bool queued : {true, false}) {
    (queued ? options.max_queued_bytes : options.max_replay_bytes) = -1;
    bad = KvEventPublisher::Create(options);
    REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(
        std::string(bad.status().message())
            .find(absl::StrCat(queued ? "max_queued_bytes" : "max_replay_bytes",
                               " -1 is less than 0")) != std::string::npos);
    (queued ? options.max_queued_bytes : options.max_replay_bytes) = 0;
  }
  options.block_size = 0;
  bad = KvEventPublisher::Create(options);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(bad.status().message()).find("block_size 0") !=
          std::string::npos);
  options.block_size = kPageSize;
  for (const int32_t cpu : {-2, CPU_SETSIZE}) {
    options.cpu = cpu;
    bad = KvEventPublisher::Create(options);
    REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(bad.status().message())
                .find(absl::StrCat("cpu ", cpu, " is outside [-1, ")) !=
            std::string::npos);
  }
  options.cpu = CPU_SETSIZE - 1;  // no machine here has it.
  bad = KvEventPublisher::Create(options);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(bad.status().message())
              .find(absl::StrCat("cannot run on cpu ", CPU_SETSIZE - 1)) !=
          std::string::npos);
  // Refused before anything started: no publisher thread is left behind.
  REQUIRE(AllowedCpusOfThreads("kvblock-events").empty());
  options.cpu = -1;
  auto first = KvEventPublisher::Create(options);
  REQUIRE_OK(first);
  options.endpoint = (*first)->endpoint();  // taken.
  auto taken = KvEventPublisher::Create(options);
  REQUIRE(taken.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(std::string(taken.status().message()).find(options.endpoint) !=
          std::string::npos);
  options.endpoint = "nonsense://here";
  REQUIRE_STATUS_IS(KvEventPublisher::Create(options), kUnavailable);
  // ZeroMQ would bind a port past 65535 modulo 2^16: another port.
  for (const bool replay : {false, true}) {
    for (const char* port : {"65536", "99999", "-5"}) {
      options.endpoint = replay ? "tcp://127.0.0.1:*" : "";
      options.replay_endpoint = "";
      (replay ? options.replay_endpoint : options.endpoint) =
          absl::StrCat("tcp://127.0.0.1:", port);
      bad = KvEventPublisher::Create(options);
      REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(
          std::string(bad.status().message())
              .find(absl::StrCat("port ", port, " is outside [0, 65535]")) !=
          std::string::npos);
    }
  }
}

TEST_CASE("a batch under the bound is sent, whatever the buffers reserved") {
  // Pages of 4,096 tokens reserve 64 MiB of buffers up front, one payload
  // buffer far past a bound of 1 MiB; a batch of one page is sent.
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.block_size = 4096;
  options.max_queued_bytes = int64_t{1} << 20;
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);
  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.connect((*publisher)->endpoint());
  bool received = false;
  for (int probe = 0; probe < 100 && !received; ++probe) {
    REQUIRE((*publisher)->Publish(SampleEvents()));
    received = !Receive(sub, 50).empty();
  }
  REQUIRE(received);
  REQUIRE((*publisher)->stats().batches_unsent == 0);
}

TEST_CASE("the publisher's threads run on the cpu asked for") {
  cpu_set_t own;
  REQUIRE(sched_getaffinity(0, sizeof(own), &own) == 0);
  int32_t cpu = 0;
  while (!CPU_ISSET(cpu, &own)) ++cpu;
  Options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.block_size = kPageSize;
  options.cpu = cpu;
  auto publisher = KvEventPublisher::Create(options);
  REQUIRE_OK(publisher);
  const std::string expected = absl::StrCat(cpu);
  REQUIRE(AllowedCpusOfThreads("kvblock-events") ==
          std::vector<std::string>{expected});
  // ZeroMQ's I/O thread sets its own as it starts.
  std::vector<std::string> io;
  for (int tries = 0; tries < 1000 && io != std::vector{expected}; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    io = AllowedCpusOfThreads("ZMQbg/IO/0");
  }
  REQUIRE(io == std::vector<std::string>{expected});
  KvCacheEvent removed;
  removed.kind = KvCacheEvent::Kind::kBlockRemoved;
  removed.block_hashes = {HashOfByte(1, 2)};
  REQUIRE((*publisher)->Publish(std::vector<KvCacheEvent>{removed}));
  REQUIRE((*publisher)->Flush(absl::Seconds(10)));
  REQUIRE((*publisher)->stats().batches_published == 1);
}

}  // namespace
}  // namespace kvblock
