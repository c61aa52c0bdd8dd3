// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KVPageTable: the batched page table of one model, with a host copy that is
// the source of truth and a device mirror that the attention kernels read.
//
// Host state: for every batch slot (row) `b` in [0, max_batch), the K page ids
// of the sequence in that slot, `max_pages_per_seq` entries. Invariants
// (checked by CheckInvariants): every entry is kNoPage or a live id in
// [0, num_pages); the live ids of a row form a prefix (none follows a kNoPage).
// All layers share this one table.
//
// Device mirror (`kernel_view()`): one contiguous, unpadded int32 tensor
// [max_batch, 2, max_pages_per_seq]; half 0 of row `b` holds its K ids, half 1
// the V ids `k + num_pages` (kNoPage stays kNoPage). It is allocated once by
// Create and never moves (safe to capture in CUDA graphs); it holds zeros
// until the first Upload.
//
// Change record: every call that changes a row notes, per slot, the first
// entry it wrote since the last upload (a moved-in or cleared row: entry 0),
// and the table remembers how many live ids each slot has on the device.
// Upload plans from that record alone (no compare against the device image):
// per changed row one patch range, the ids from the first written entry to
// the live end plus the count of entries to clear after them. It packs the
// ranges and their K ids into one patch in pinned staging, copies it with
// one host-to-device copy, and has the device apply it to both halves
// (Device::ApplyPageTablePatch: a small kernel on CUDA). Staging rotates over
// kStagingSlots slots, each with a device twin that the patch is copied into:
// a slot is rewritten only after the device event of its last patch has
// completed, and Upload blocks only when every slot is still in flight. A
// patch bigger than one slot is split into slot-sized patches (rows are
// independent), waiting for slots as needed.
//
// Memory: host max_batch x max_pages_per_seq int32 plus O(max_batch); device
// one table (2 x that) plus kStagingSlots patch buffers; pinned staging
// kStagingSlots patch buffers (KVPageTableOptions::staging_bytes each).
//
// Complexity: SetRow / SetRows are O(ids written + ids cleared) (a SetRows
// update writes from its `first` id); a move is O(1) plus the ids of a row
// it empties; Apply is the sum of its moves and updates; CompactRows is
// O(max_batch) to check its map plus its moves. Upload is O(rows changed
// since the last upload + the ids written in them, counting every live id of
// a moved row), and O(1) with nothing changed; a row that grew by one page
// costs O(1) from commit to upload. SetIdentity, CheckInvariants and the first
// Upload are O(table). No call but CheckInvariants allocates memory after
// Create.
//
// Errors: every call that returns an error leaves the table unchanged (host
// rows, is_identity, upload_stats and what the next Upload sends); only a
// device failure in the middle of Upload has effects (see Upload).
//
// Thread safety: thread-compatible. One thread (the scheduler's) owns a table
// and its Device; const methods may run concurrently with each other only.
#ifndef KVBLOCK_PAGE_TABLE_H_
#define KVBLOCK_PAGE_TABLE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/device.h"
#include "kvblock/types.h"

namespace kvblock {

// One row of a SetRows call: slot `slot` gets the K pages
// `k_page_ids[0, count)` and every entry past `count` is cleared. Entries
// before `first` keep the ids the row holds (the caller vouches that they are
// `k_page_ids[0, first)`, which is not read): only `[first, count)` is
// validated and written, so a row that grew by one page costs O(1).
// Non-owning: `k_page_ids` must stay valid during the call; it may be null
// only when `count` is 0 (which clears the slot).
struct KVPageTableRowUpdate {
  SlotId slot = kNoSlot;
  const PageId* k_page_ids = nullptr;
  int32_t count = 0;
  int32_t first = 0;  // in [0, min(count, the row's live ids)].
  // -1: write to `count`. Else in [first, count], with `count` the row's
  // live ids: entries from `end` on keep the ids the row holds too, so that
  // only [first, end) is validated, written and uploaded (a window's
  // released pages, in the middle of a row).
  int32_t end = -1;
};

// One row move of an Apply call: slot `to` receives the row slot `from` held
// before the call.
struct KVPageTableRowMove {
  SlotId from = kNoSlot;
  SlotId to = kNoSlot;
};

// Row changes applied as one commit (LevelDB's WriteBatch, for rows): the
// moves first, all at once, then the updates, each against the row its slot
// holds after the moves. Non-owning views.
struct KVPageTableEdit {
  absl::Span<const KVPageTableRowMove> moves = {};
  absl::Span<const KVPageTableRowUpdate> rows = {};
};

struct KVPageTableOptions {
  // Bytes of each pinned staging slot, and of its device twin, that Upload
  // packs a patch into; 0 picks the whole table's worst-case patch, capped at
  // 1 MiB (and at least one full row). At least
  // KVPageTable::MinStagingBytes(max_pages_per_seq).
  int64_t staging_bytes = 0;
};

// What KVPageTable::Upload has done since Create.
struct KVPageTableUploadStats {
  int64_t calls = 0;       // Upload calls that returned OK.
  int64_t copies = 0;      // host-to-device patch copies they enqueued.
  int64_t bytes = 0;       // bytes of those copies (ranges and ids).
  int64_t ranges = 0;      // patch ranges sent: one per row patched.
  int64_t entries = 0;     // K entries those ranges set: ids and clears
                           // (the V half mirrors each).
  int64_t host_waits = 0;  // staging slots that Upload had to wait for.

  friend bool operator==(const KVPageTableUploadStats&,
                         const KVPageTableUploadStats&) = default;
};

class KVPageTable {
 public:
  // Pinned staging slots Upload rotates over.
  static constexpr int kStagingSlots = 3;
  // Bytes of one patch range on the wire (PageTablePatchRange).
  static constexpr int64_t kRangeBytes = 16;

  // The least staging that holds one full row's range: its header, its ids
  // and the alignment between them.
  static constexpr int64_t MinStagingBytes(int32_t max_pages_per_seq) {
    return 2 * kRangeBytes + int64_t{max_pages_per_seq} * sizeof(PageId);
  }

  // A table of `max_batch` rows of `max_pages_per_seq` K pages each, over a
  // pool of `num_pages` K pages, every entry kNoPage, mirrored on `device`
  // (which must outlive the table).
  // InvalidArgument: a non-positive argument; `num_pages` above
  // INT32_MAX / 2 (V ids are `num_pages + id`, int32; PagedKvConfig's limit);
  // a table of more than INT32_MAX entries (`max_batch * 2 *
  // max_pages_per_seq`; kernels index it with 32-bit offsets); staging_bytes
  // negative or below MinStagingBytes. ResourceExhausted: the host rows, the
  // device mirror or the staging could not be allocated, or need more than
  // the machine's memory (checked first). Internal: the device failed
  // otherwise.
  static absl::StatusOr<std::unique_ptr<KVPageTable>> Create(
      int32_t max_batch, int32_t max_pages_per_seq, int32_t num_pages,
      Device& device, const KVPageTableOptions& options = {});

  KVPageTable(const KVPageTable&) = delete;
  KVPageTable& operator=(const KVPageTable&) = delete;
  // Waits for the patches still reading its staging, then frees it.
  ~KVPageTable();

  // Gives slot `b` the K pages [b * max_pages_per_seq, (b + 1) *
  // max_pages_per_seq), every row full, and sets is_identity().
  // FailedPrecondition when the pool is too small for that layout
  // (max_batch * max_pages_per_seq > num_pages). On error, nothing changes.
  absl::Status SetIdentity();

  // Slot `slot` gets the K pages `k_page_ids`; entries past them are cleared.
  // Clears is_identity(). InvalidArgument: `slot` outside [0, max_batch), more
  // than max_pages_per_seq ids, or an id outside [0, num_pages) (kNoPage
  // included: pass the live prefix only). On error, nothing changes.
  absl::Status SetRow(SlotId slot, absl::Span<const PageId> k_page_ids);

  // Applies every update as one commit, after validating them all: each as
  // SetRow does (its ids from `first` on), `first` in [0, min(count, the
  // row's live ids)], and no slot twice. Slots not named keep their rows.
  // Clears is_identity(). InvalidArgument names the first bad update by
  // index. On error, nothing changes.
  absl::Status SetRows(absl::Span<const KVPageTableRowUpdate> updates);

  // Applies `edit` as one commit, after validating it whole: the moves at
  // once (a slot is the source of at most one move and the destination of
  // at most one; a source that no move fills is left empty, so moving row a
  // to b and b to a swaps them), then the updates as SetRows does, each
  // checked against its slot's row after the moves. Only page ids move,
  // never KV data. Clears is_identity(). InvalidArgument names the first bad
  // move or update by index. On error, nothing changes.
  absl::Status Apply(const KVPageTableEdit& edit);

  // Moves rows: `old_to_new` has one entry per old slot (max_batch entries);
  // entry `s` is the new slot of old slot `s`, or kNoSlot to retire it. Every
  // new slot in [0, new_batch) receives exactly one old row; rows from
  // `new_batch` on are cleared afterwards (so are retired rows no survivor
  // lands on). Only page ids move, never KV data. Clears is_identity().
  // InvalidArgument: `old_to_new` not max_batch entries long, `new_batch`
  // outside [0, max_batch], an entry outside [0, new_batch) other than
  // kNoSlot, a new slot named twice or not at all. On error, nothing changes.
  absl::Status CompactRows(absl::Span<const SlotId> old_to_new,
                           int32_t new_batch);

  // Internal when an invariant of the host rows (see the top of this file)
  // or of the change record is broken, naming the row; OK otherwise.
  // O(table).
  absl::Status CheckInvariants() const;

  // Enqueues on `stream` the patch that brings the device mirror up to date,
  // and returns whether it enqueued any. The first call (and the first after
  // a failed one) sets every entry of the table; later calls send, for each
  // row changed since the last upload, its ids from the first entry written
  // (checking each is in [0, num_pages) as it is staged: the other ids were
  // checked when they were sent) and the clears after them. With nothing
  // changed it does no device operation and never waits. The host rows may
  // change as soon as it returns; the caller orders kernels after it on
  // `stream`.
  // Internal: a staged id out of range, or a device failure
  // (ResourceExhausted or Unavailable where the device says so). On error
  // the host rows and upload_stats are unchanged; after a failed device call
  // the mirror may hold part of the new rows, and the next Upload sets the
  // whole table.
  absl::StatusOr<bool> Upload(Stream stream);

  // The host K row of `slot`, max_pages_per_seq entries: its live ids, then
  // kNoPage. The view follows the slot's row until the next call that moves
  // rows (Apply with moves, CompactRows), which gives slots other row
  // storage; call again after one. InvalidArgument: `slot` outside
  // [0, max_batch).
  absl::StatusOr<absl::Span<const PageId>> HostRow(SlotId slot) const;

  // The device mirror, int32 [max_batch, 2, max_pages_per_seq]; the same
  // address for the table's lifetime. Kernels read it after Upload on their
  // stream.
  DeviceTensor kernel_view() const;

  // True only while the rows were last set by SetIdentity(): any later
  // successful SetRow, SetRows, Apply or CompactRows clears it, even one that
  // changes nothing or happens to describe the identity.
  bool is_identity() const;

  int32_t max_batch() const;
  int32_t max_pages_per_seq() const;
  int32_t num_pages() const;
  int64_t staging_bytes() const;
  const KVPageTableUploadStats& upload_stats() const;

 private:
  // The one BatchCommit a table serves at a time marks it.
  friend class BatchCommit;

  // Its rows, change record, scratch and device buffers, and Upload's
  // parts (lib/commit/page_table.cc).
  class Impl;
  explicit KVPageTable(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  // A BatchCommit writes its rows. Atomic: BatchCommit::Create and the
  // destructor of another commit over the table may run on two threads (two
  // managers, the bindings' locks taken per manager).
  std::atomic<bool> in_commit_ = false;
};

}  // namespace kvblock

#endif  // KVBLOCK_PAGE_TABLE_H_
