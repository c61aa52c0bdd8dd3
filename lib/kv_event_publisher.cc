// Copyright 2026 The kvblock Authors.
#include "kvblock/kv_event_publisher.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache_event_log.h"
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

// A payload being packed into `bytes`: msgpack-cxx writes through write(),
// and token ids, most of a payload's bytes, are written straight in
// (PackTokens).
class PayloadBuffer {
 public:
  explicit PayloadBuffer(std::string& bytes) : bytes_(bytes) {}
  void write(const char* data, size_t size) { bytes_.append(data, size); }
  std::string& bytes() { return bytes_; }

 private:
  std::string& bytes_;
};

// Payload buffers that ZeroMQ sends without copying them: a copy of a
// millisecond's batch into fresh memory costs as much as encoding it. ZeroMQ
// hands each back through Release once sent (on its I/O thread, or at once
// when nobody subscribes), and the next payload reuses it, grown already.
class PayloadPool {
 public:
  struct Payload {
    PayloadPool* pool = nullptr;
    std::string bytes;
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
    auto payload = std::make_unique<Payload>();
    payload->pool = this;
    return payload;
  }
  // Adds a spare payload of `bytes`, written once so that its memory is
  // mapped now rather than by the first payload that fills it.
  void Reserve(size_t bytes) {
    auto payload = std::make_unique<Payload>();
    payload->pool = this;
    payload->bytes.resize(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(std::move(payload));
  }
  // A message of `payload`'s bytes, which it owns until ZeroMQ releases it.
  static zmq::message_t Message(std::unique_ptr<Payload> payload) {
    Payload* const raw = payload.release();
    return zmq::message_t(raw->bytes.data(), raw->bytes.size(), &Release, raw);
  }

 private:
  static void Release(void* /*data*/, void* hint) {
    std::unique_ptr<Payload> payload(static_cast<Payload*>(hint));
    PayloadPool* const pool = payload->pool;
    std::lock_guard<std::mutex> lock(pool->mutex_);
    pool->spare_.push_back(std::move(payload));
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<Payload>> spare_;
};

using Packer = msgpack::packer<PayloadBuffer>;
using Options = KvEventPublisherOptions;

void PackHash(Packer& pk, const BlockHash& hash, const Options& options) {
  if (options.hash_form == Options::HashForm::kBytes) {
    pk.pack_bin(static_cast<uint32_t>(hash.bytes.size()));
    pk.pack_bin_body(reinterpret_cast<const char*>(hash.bytes.data()),
                     static_cast<uint32_t>(hash.bytes.size()));
    return;
  }
  // vLLM's integer form: the digest's last 8 bytes, big-endian.
  uint64_t value = 0;
  for (size_t i = hash.bytes.size() - 8; i < hash.bytes.size(); ++i) {
    value = value << 8 | hash.bytes[i];
  }
  pk.pack_uint64(value);
}

void PackHashes(Packer& pk, absl::Span<const BlockHash> hashes,
                const Options& options) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const BlockHash& hash : hashes) PackHash(pk, hash, options);
}

// An array of token ids, as msgpack-cxx's pack_int32 would write each (the
// shortest form), without a call a token.
void PackTokens(Packer& pk, PayloadBuffer& buffer,
                absl::Span<const TokenId> tokens) {
  pk.pack_array(static_cast<uint32_t>(tokens.size()));
  if (std::any_of(tokens.begin(), tokens.end(),
                  [](TokenId token) { return token < 0; })) {
    for (const TokenId token : tokens) pk.pack_int32(token);
    return;
  }
  std::string& bytes = buffer.bytes();
  const size_t start = bytes.size();
  bytes.resize(start + 5 * tokens.size());  // the longest form: 5 bytes.
  char* out = bytes.data() + start;
  for (const TokenId token : tokens) {
    const auto value = static_cast<uint32_t>(token);
    if (value < 0x80) {  // positive fixint.
      *out++ = static_cast<char>(value);
    } else if (value < 0x100) {  // uint 8.
      *out++ = static_cast<char>(0xcc);
      *out++ = static_cast<char>(value);
    } else if (value < 0x10000) {  // uint 16, big-endian.
      *out++ = static_cast<char>(0xcd);
      *out++ = static_cast<char>(value >> 8);
      *out++ = static_cast<char>(value);
    } else {  // uint 32, big-endian.
      *out++ = static_cast<char>(0xce);
      *out++ = static_cast<char>(value >> 24);
      *out++ = static_cast<char>(value >> 16);
      *out++ = static_cast<char>(value >> 8);
      *out++ = static_cast<char>(value);
    }
  }
  bytes.resize(static_cast<size_t>(out - bytes.data()));
}

void PackString(Packer& pk, std::string_view text) {
  pk.pack_str(static_cast<uint32_t>(text.size()));
  pk.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
}

// One field: its name first in the map encoding, its value either way.
void Key(Packer& pk, const Options& options, std::string_view name) {
  if (options.encoding == Options::Encoding::kMap) PackString(pk, name);
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
struct PackedConstants {
  std::string stored_head;  // BlockStored's head and block_hashes' key.
  std::string parent;       // parent_block_hash's key.
  std::string tokens;       // token_ids' key.
  std::string lora;         // block_size and its value, lora_id's key.
  std::string extra;        // medium, lora_name (nil), extra_keys' key.
  std::string stored_tail;  // group_idx and the kv_cache_spec fields.
  std::string removed_head;
  std::string removed_tail;  // medium, group_idx.
  std::string cleared;
};

// vLLM's fields, in its order (the tagged arrays are positional).
PackedConstants PackConstants(const Options& options) {
  PackedConstants packed;
  const auto pack = [](std::string& out, const auto& fill) {
    PayloadBuffer buffer(out);
    Packer pk(buffer);
    fill(pk);
  };
  pack(packed.stored_head, [&](Packer& pk) {
    BeginEvent(pk, options, "BlockStored", 11);
    Key(pk, options, "block_hashes");
  });
  pack(packed.parent,
       [&](Packer& pk) { Key(pk, options, "parent_block_hash"); });
  pack(packed.tokens, [&](Packer& pk) { Key(pk, options, "token_ids"); });
  pack(packed.lora, [&](Packer& pk) {
    Key(pk, options, "block_size");
    pk.pack_int32(options.block_size);
    Key(pk, options, "lora_id");
  });
  pack(packed.extra, [&](Packer& pk) {
    Key(pk, options, "medium");
    PackString(pk, "GPU");
    Key(pk, options, "lora_name");
    pk.pack_nil();
    Key(pk, options, "extra_keys");
  });
  pack(packed.stored_tail, [&](Packer& pk) {
    Key(pk, options, "group_idx");
    pk.pack_int32(0);
    Key(pk, options, "kv_cache_spec_kind");
    PackString(pk, "full_attention");
    Key(pk, options, "kv_cache_spec_sliding_window");
    pk.pack_nil();
  });
  pack(packed.removed_head, [&](Packer& pk) {
    BeginEvent(pk, options, "BlockRemoved", 3);
    Key(pk, options, "block_hashes");
  });
  pack(packed.removed_tail, [&](Packer& pk) {
    Key(pk, options, "medium");
    PackString(pk, "GPU");
    Key(pk, options, "group_idx");
    pk.pack_int32(0);
  });
  pack(packed.cleared,
       [&](Packer& pk) { BeginEvent(pk, options, "AllBlocksCleared", 0); });
  return packed;
}

void Append(PayloadBuffer& buffer, const std::string& bytes) {
  buffer.write(bytes.data(), bytes.size());
}

void PackEvent(Packer& pk, PayloadBuffer& buffer, const KvCacheEvent& event,
               const Options& options, const PackedConstants& packed) {
  switch (event.kind) {
    case KvCacheEvent::Kind::kBlockStored:
      Append(buffer, packed.stored_head);
      PackHashes(pk, event.block_hashes, options);
      Append(buffer, packed.parent);
      if (event.parent_block_hash.has_value()) {
        PackHash(pk, *event.parent_block_hash, options);
      } else {
        pk.pack_nil();
      }
      Append(buffer, packed.tokens);
      PackTokens(pk, buffer, event.token_ids);
      Append(buffer, packed.lora);
      if (event.adapter_id != 0) {
        pk.pack_int64(event.adapter_id);
      } else {
        pk.pack_nil();
      }
      Append(buffer, packed.extra);
      // vLLM's extra keys: one tuple a block; the cache salt is kvblock's.
      if (event.cache_salt.empty()) {
        pk.pack_nil();
      } else {
        pk.pack_array(static_cast<uint32_t>(event.block_hashes.size()));
        for (size_t i = 0; i < event.block_hashes.size(); ++i) {
          pk.pack_array(1);
          PackString(pk, event.cache_salt);
        }
      }
      Append(buffer, packed.stored_tail);
      return;
    case KvCacheEvent::Kind::kBlockRemoved:
      Append(buffer, packed.removed_head);
      PackHashes(pk, event.block_hashes, options);
      Append(buffer, packed.removed_tail);
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

// Packs the payload of a batch into `buffer` (emptied first).
void EncodeInto(PayloadBuffer& buffer, double ts,
                absl::Span<const KvCacheEvent> events,
                const KvEventPublisherOptions& options,
                const PackedConstants& packed) {
  buffer.bytes().clear();
  Packer pk(buffer);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvCacheEvent& event : events) {
    PackEvent(pk, buffer, event, options, packed);
  }
  if (options.data_parallel_rank.has_value()) {
    pk.pack_int64(*options.data_parallel_rank);
  } else {
    pk.pack_nil();
  }
}

}  // namespace

std::string EncodeKvEventBatch(double ts, absl::Span<const KvCacheEvent> events,
                               const KvEventPublisherOptions& options) {
  std::string bytes;
  PayloadBuffer buffer(bytes);
  EncodeInto(buffer, ts, events, options, PackConstants(options));
  return bytes;
}

// How long closing the PUB socket may wait for sent messages to leave.
constexpr int kCloseLingerMs = 1000;

// Apart, the bytes two threads write do not share a cache line.
constexpr size_t kCacheLine = 64;

struct KvEventPublisher::State {
  // A queued batch: events built by the caller, or the records
  // [records_begin, records_end) of the queue's log.
  struct Queued {
    double ts = 0;
    std::vector<KvCacheEvent> events;
    size_t records_begin = 0;
    size_t records_end = 0;
    int32_t page_size = 0;
  };

  explicit State(KvEventPublisherOptions o)
      : options(std::move(o)),
        packed(PackConstants(options)),
        pub(context, zmq::socket_type::pub) {}

  // The publisher thread: sends what is queued, answers replay requests,
  // until stopped with the queue empty.
  void Run();
  void Send(double ts, absl::Span<const KvCacheEvent> events);
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
  std::condition_variable wake;     // stop.
  std::condition_variable drained;  // the queue emptied and was sent.
  // Guarded by mutex: the queue, its batches' records, and whether the
  // thread holds batches taken from it. The thread takes the queue by
  // swapping it with its own emptied `taken` and `taken_log`, so that both
  // keep their grown buffers and neither side allocates in steady state.
  std::vector<Queued> queue;
  internal::CacheEventLog queue_log;
  bool stop = false;
  bool sending = false;
  KvEventPublisherStats stats;
  // Whether the queue is empty, written under mutex and read without it
  // (idle(), every step of a scheduler that asks).
  std::atomic<bool> queue_empty{true};

  // The publisher thread's own.
  alignas(kCacheLine) std::vector<Queued> taken;
  internal::CacheEventLog taken_log;
  // A batch's events, built from its log (stale ones after them keep
  // their buffers for the next).
  std::vector<KvCacheEvent> built;
  int64_t next_seq = 0;
  std::deque<std::pair<int64_t, std::string>> kept;  // for replay.
  std::thread thread;
};

void KvEventPublisher::State::Run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      // Publish does not wake the thread (a wake-up is a system call on
      // the scheduler's thread, every step): it looks every millisecond,
      // which bounds the events' delay, and serves replay requests then.
      wake.wait_for(lock, std::chrono::milliseconds(1), [&] { return stop; });
      std::swap(queue, taken);
      std::swap(queue_log, taken_log);
      queue_empty.store(true, std::memory_order_relaxed);
      sending = !taken.empty();
      if (taken.empty() && stop) return;
    }
    int64_t sent_events = 0;
    for (const Queued& batch : taken) {
      if (batch.events.empty()) {
        // Into the events built before, keeping their buffers.
        const size_t count =
            taken_log.BuildEvents(batch.page_size, batch.records_begin,
                                  batch.records_end, built, /*used=*/0);
        Send(batch.ts, absl::MakeConstSpan(built.data(), count));
        sent_events += static_cast<int64_t>(count);
      } else {
        Send(batch.ts, batch.events);
        sent_events += static_cast<int64_t>(batch.events.size());
      }
    }
    const int64_t batches_sent = static_cast<int64_t>(taken.size());
    taken.clear();
    taken_log.Clear();
    // A system call: not under the lock Publish takes.
    const int64_t cpu_ns = ThreadCpuNanos();
    {
      std::lock_guard<std::mutex> lock(mutex);
      stats.thread_cpu_ns = cpu_ns;
      stats.batches_published += batches_sent;
      stats.events_published += sent_events;
      sending = false;
      if (queue.empty()) drained.notify_all();
    }
    if (router) ServeReplay();
  }
}

void KvEventPublisher::State::Send(double ts,
                                   absl::Span<const KvCacheEvent> events) {
  const int64_t seq = next_seq++;
  std::unique_ptr<PayloadPool::Payload> payload = payloads.Take();
  PayloadBuffer buffer(payload->bytes);
  EncodeInto(buffer, ts, events, options, packed);
  if (router && options.replay_buffer > 0) {
    // A copy, into the oldest kept one's buffer once the buffer is full.
    std::string copy;
    if (kept.size() == static_cast<size_t>(options.replay_buffer)) {
      copy = std::move(kept.front().second);
      kept.pop_front();
    }
    copy.assign(payload->bytes);
    kept.emplace_back(seq, std::move(copy));
  }
  const std::array<uint8_t, 8> seq_bytes = BigEndian(seq);
  // PUB never blocks: at the high-water mark ZeroMQ drops the message.
  pub.send(zmq::buffer(options.topic), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
  pub.send(PayloadPool::Message(std::move(payload)), zmq::send_flags::none);
}

void KvEventPublisher::State::ServeReplay() {
  while (true) {
    std::vector<zmq::message_t> frames;
    while (true) {
      zmq::message_t frame;
      if (!router->recv(frame, zmq::recv_flags::dontwait)) break;
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) break;
    }
    if (frames.empty()) return;
    const bool well_formed =
        frames.size() == 3 && frames[1].size() == 0 && frames[2].size() == 8;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++(well_formed ? stats.replay_requests : stats.malformed_requests);
    }
    if (!well_formed) continue;
    int64_t start = 0;
    const auto* bytes = static_cast<const uint8_t*>(frames[2].data());
    for (int i = 0; i < 8; ++i) start = start << 8 | bytes[i];
    const zmq::message_t& identity = frames[0];
    const auto reply = [&](int64_t seq, const std::string& payload) {
      const std::array<uint8_t, 8> seq_bytes = BigEndian(seq);
      router->send(zmq::buffer(identity.data(), identity.size()),
                   zmq::send_flags::sndmore);
      router->send(zmq::message_t(), zmq::send_flags::sndmore);
      router->send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
      router->send(zmq::buffer(payload), zmq::send_flags::none);
    };
    for (const auto& [seq, payload] : kept) {
      if (seq >= start) reply(seq, payload);
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
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv event publisher: block_size ", options.block_size,
                     " is less than 1"));
  }
  auto state = std::make_unique<State>(std::move(options));
  {
    const auto changes = static_cast<size_t>(state->options.reserved_changes);
    const auto page_size = static_cast<size_t>(state->options.block_size);
    state->queue_log.Reserve(changes, page_size);
    state->taken_log.Reserve(changes, page_size);
    // A change's bytes at most: its hash, tokens of 5 bytes, and its share
    // of an event's field names.
    state->payloads.Reserve(changes * (5 * page_size + 64));
    const size_t batches =
        std::min(changes, static_cast<size_t>(state->options.queue_capacity));
    state->queue.reserve(batches);
    state->taken.reserve(batches);
  }
  const auto bind = [](zmq::socket_t& socket, const std::string& endpoint,
                       std::string& bound) -> absl::Status {
    try {
      socket.bind(endpoint);
      bound = socket.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& error) {
      return absl::UnavailableError(absl::StrCat(
          "kv event publisher: cannot bind ", endpoint, ": ", error.what()));
    }
    return absl::OkStatus();
  };
  state->pub.set(zmq::sockopt::sndhwm, state->options.send_hwm);
  // On close, what the thread sent still goes out to connected
  // subscribers, for at most this long (0 would drop the last batches of a
  // process that exits right after its final Flush).
  state->pub.set(zmq::sockopt::linger, kCloseLingerMs);
  KVBLOCK_RETURN_IF_ERROR(
      bind(state->pub, state->options.endpoint, state->endpoint));
  if (!state->options.replay_endpoint.empty()) {
    state->router.emplace(state->context, zmq::socket_type::router);
    state->router->set(zmq::sockopt::linger, 0);
    KVBLOCK_RETURN_IF_ERROR(bind(*state->router, state->options.replay_endpoint,
                                 state->replay_endpoint));
  }
  State* const raw = state.get();
  raw->thread = std::thread([raw] { raw->Run(); });
  // Named, to tell it apart in top and perf (at most 15 characters).
  pthread_setname_np(raw->thread.native_handle(), "kvblock-events");
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
    queued.page_size = batch.page_size_;
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
  return state_->stats;
}

bool KvEventPublisher::Flush(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  return state_->drained.wait_for(
      lock, absl::ToChronoNanoseconds(timeout),
      [&] { return state_->queue.empty() && !state_->sending; });
}

}  // namespace kvblock
