// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KvEventPublisher: KV cache events (kvblock/kv_events.h) over ZeroMQ in
// vLLM's wire format (vllm/distributed/kv_events.py), so that a fleet
// router (NVIDIA Dynamo's KV router, llm-d's KV-cache indexer) learns what a
// replica caches. The scheduler thread hands its events (a step's, or
// those of the steps between two of the thread's looks: see idle()) to
// Publish, which never blocks: it queues the batch, or drops and counts it
// when the queue is full. A publisher thread encodes each batch (msgpack)
// and sends it on a PUB socket as three frames: the topic, an 8-byte
// big-endian sequence number (from 0, one a batch) and the payload
// `[ts, [events...], data_parallel_rank]`. It keeps the last batches for
// an optional ROUTER replay socket: a request `[identity, "", start_seq]`
// (big-endian, unsigned, of any length as vLLM reads it: empty is 0, 2^63
// and all ones are past every batch) is answered with
// `[identity, "", seq, payload]` for every kept batch from start_seq on,
// then `[identity, "", -1, ""]`, however many (no ZeroMQ limit drops
// them; max_queued_bytes may end a replay early, below); a request of other
// than three frames gets no reply.
//
// Memory is bounded in bytes, so that a subscriber that never reads cannot
// grow the process: what ZeroMQ holds of the publisher's messages (sent,
// not yet written to the connections) at most max_queued_bytes on PUB and
// as much for replay replies, counted as each message is handed to ZeroMQ
// and freed by it. A batch past it is numbered and kept for replay but not
// sent on PUB (batches_unsent): a subscriber sees a gap in the sequence
// numbers and may replay it. The bound is on all subscribers together:
// ZeroMQ frees a batch once it has written it to every connection, so a
// subscriber that stops reading holds what it has not taken, and once
// that reaches the bound the others get nothing more until it reads or
// leaves (ZeroMQ's own drop at send_hwm is by connection); the same holds
// for requesters and the replies. A replay past the bound ends early with
// the end marker (replays_cut): the requester asks again from the seq
// after the last it got; a request that finds not even the marker's room
// gets no reply (replays_cut too). A batch larger than the bound alone is
// never sent, on PUB or in a replay (the replay goes on past it). The
// replay ring keeps at most replay_buffer batches and max_replay_bytes,
// the newest; a batch larger than max_replay_bytes alone is not kept. A
// turn of the publisher thread serves at most 64 replay requests, so that
// requests cannot hold the batches back.
//
// Thread safety: Publish, idle and stats may be called from any thread; the
// sockets belong to the publisher thread.
#ifndef KVBLOCK_KV_EVENT_PUBLISHER_H_
#define KVBLOCK_KV_EVENT_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/kv_events.h"

namespace kvblock {

struct KvEventPublisherOptions {
  // The PUB socket's bind endpoint ("tcp://127.0.0.1:5557"; a port of "*"
  // picks a free one, see endpoint()).
  std::string endpoint;
  // The ROUTER replay socket's bind endpoint; empty: no replay.
  std::string replay_endpoint;
  // The first frame of every message; may be empty.
  std::string topic;
  // The PUB socket's send high-water mark, in messages (ZeroMQ's drop,
  // beside max_queued_bytes).
  int32_t send_hwm = 100000;
  // The bytes ZeroMQ may hold of the messages the publisher has sent on
  // PUB and it has not yet written out (each batch's payload plus 200
  // bytes of frames), and, apart, of its replay replies, at least 0; 0: no
  // bound. A batch past it is numbered and kept for replay, not sent
  // (batches_unsent); a replay past it ends early (replays_cut). One bound
  // for all subscribers, and one for all requesters (see above).
  int64_t max_queued_bytes = int64_t{64} << 20;
  // Batches Publish may queue for the publisher thread (at least 1).
  int32_t queue_capacity = 1024;
  // Cache changes (pages stored or removed) the queue holds before its
  // buffers grow, in [0, 2^22]: allocated and written once at Create (about
  // 200 bytes a change, twice: the queue's buffers and the thread's, and
  // 150 for a payload, at pages of 16 tokens; 13 bytes a token of larger
  // pages, and at most 64 MiB in all: fewer changes then), so that the
  // first steps do not pay for growing and mapping them; a busy replica
  // changes a few thousand pages a millisecond.
  int32_t reserved_changes = 4096;
  // Batches kept for replay (0: none); kept only with a replay_endpoint.
  int32_t replay_buffer = 10000;
  // The kept batches' bytes at most (their copies' capacities), the oldest
  // dropped first, at least 0; 0: replay_buffer's count alone.
  int64_t max_replay_bytes = int64_t{256} << 20;
  // The batch's third element; none: nil.
  std::optional<int64_t> data_parallel_rank;
  // How often the publisher thread looks for queued batches, in [10 us,
  // 1 s]: every poll_interval while it finds some; after a look that finds
  // none, twice as long as the one before, up to max(poll_interval, 1 ms),
  // so that an idle replica wakes it a thousand times a second at most. The
  // interval bounds the events' delay, and a short one keeps what the
  // scheduler writes between two looks (its records, ~200 bytes a change)
  // small enough to stay in its core's cache.
  absl::Duration poll_interval = absl::Microseconds(250);
  // The CPU the publisher thread and ZeroMQ's I/O thread run on, -1: any.
  // A scheduler thread kept off it (pinned elsewhere) no longer shares its
  // core with them when the kernel places them beside it.
  int32_t cpu = -1;
  // Tokens a page: BlockStored's block_size for a model of one group (and
  // for an event of a group past kv_cache_groups).
  int32_t block_size = 16;
  // The model's KV cache groups (BlockManagerOptions::kv_cache_groups), for
  // each event's block_size (its group's page_size, as vLLM sends each
  // group's), kv_cache_spec_kind and kv_cache_spec_sliding_window by its
  // group_idx; empty: one full-attention group. An event of a group past
  // the list is sent as a full-attention group of block_size.
  std::vector<KvCacheGroupSpec> kv_cache_groups = {};
  // vLLM's encodings: maps with a "type" key (the default, vLLM since
  // mid-2026: a nil field that vLLM defaults to None is left out, as
  // msgspec's omit_defaults does) or tagged arrays ["BlockStored", field,
  // ...] with every field (before).
  enum class Encoding : uint8_t { kMap, kTaggedArray };
  Encoding encoding = Encoding::kMap;
  // Block hashes as vLLM's 64-bit integers (the digest's low 64 bits, read
  // big-endian) or as the raw digests.
  enum class HashForm : uint8_t { kInt64, kBytes };
  HashForm hash_form = HashForm::kInt64;
  // The manager's hash algorithm (BlockManagerOptions::hash_algorithm): its
  // digest is the first DigestSize bytes of each hash, the rest padding.
  HashAlgorithm hash_algorithm = HashAlgorithm::kSha256;
};

struct KvEventPublisherStats {
  int64_t batches_published = 0;  // sent on PUB, with their events.
  int64_t events_published = 0;
  // Not numbered: Publish's queue was full (a subscriber sees no gap).
  int64_t batches_dropped = 0;
  // Numbered and kept for replay but not sent: ZeroMQ held
  // max_queued_bytes (a subscriber sees the gap in the seqs).
  int64_t batches_unsent = 0;
  // The bytes ZeroMQ holds of the publisher's messages now, and at most
  // (as of the thread's last look), as max_queued_bytes counts them: PUB's
  // and the replies' together.
  int64_t queued_bytes = 0;
  int64_t peak_queued_bytes = 0;
  int64_t replays_cut = 0;  // replays ended early at max_queued_bytes.
  int64_t replay_requests = 0;
  int64_t malformed_requests = 0;  // not three frames: given no reply.
  // CPU time of the publisher thread (encoding, sending, replays), off the
  // scheduler's thread.
  int64_t thread_cpu_ns = 0;
};

// The payload of one batch, as the publisher sends it: msgpack of
// [ts, [events...], data_parallel_rank].
std::string EncodeKvEventBatch(double ts, absl::Span<const KvCacheEvent> events,
                               const KvEventPublisherOptions& options);
// The same for a batch the manager recorded, packed straight from its
// records (as the publisher thread does) without building its events.
std::string EncodeKvEventBatch(double ts, const KvEventBatch& batch,
                               const KvEventPublisherOptions& options);

class KvEventPublisher {
 public:
  // Binds the sockets and starts the publisher thread. InvalidArgument for
  // an empty endpoint, queue_capacity < 1, a negative max_queued_bytes or
  // max_replay_bytes, another option out of range or a
  // cpu the threads may not run on; Unavailable when a socket cannot bind
  // (the message names the endpoint and ZeroMQ's reason).
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Create(
      KvEventPublisherOptions options);

  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;
  // Sends what is queued, then stops the thread and closes the sockets,
  // waiting up to a second for what was sent to reach connected
  // subscribers.
  ~KvEventPublisher();

  // Queues one batch (stamped now) for the publisher thread, without
  // waiting and without waking it (it looks every poll_interval); false when
  // the queue is full: the batch is dropped and counted. An empty batch is
  // not sent.
  bool Publish(std::vector<KvCacheEvent> events);
  // The same for a batch the manager recorded (BlockManager::TakeKvEvents),
  // leaving it empty with buffers to take into again: when every batch
  // handed over before has been taken (idle()), its buffers are exchanged
  // with the queue's emptied ones, copying nothing; otherwise its records
  // are copied behind the queued batches. The publisher thread packs them
  // from the records.
  bool Publish(KvEventBatch& batch);
  // Whether the thread has taken every batch handed over, which it does
  // at each look (poll_interval): one atomic load. A scheduler whose steps
  // take microseconds hands its events over only then, leaving them in the
  // manager's log meanwhile (a step that rolls back still truncates them
  // there), so that one batch a look is sent, each taken without a copy; it
  // should still hand over when many changes are pending (the thread may
  // fall behind) and before it reports to a router.
  bool idle() const;

  // The endpoints as bound (with the port a "*" picked).
  const std::string& endpoint() const;
  const std::string& replay_endpoint() const;
  KvEventPublisherStats stats() const;
  // Wakes the thread and waits until every queued batch is sent, at most
  // `timeout`; false on timeout.
  bool Flush(absl::Duration timeout);

 private:
  struct State;
  explicit KvEventPublisher(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvblock

#endif  // KVBLOCK_KV_EVENT_PUBLISHER_H_
