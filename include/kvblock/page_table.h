// Copyright 2026 The kvblock Authors.
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
// until the first Upload. Upload enqueues host-to-device copies of the rows
// that differ from the last uploaded image, one copy per run of such rows
// (runs at most kMaxBridgedRows rows apart count as one), from pinned staging
// that rotates over kStagingSlots slots: a slot is rewritten only after the
// device event of its last copy has completed, and Upload blocks only when
// every slot is still in flight.
//
// Memory: host 2 x max_batch x max_pages_per_seq int32 (truth, last uploaded
// image) plus O(max_batch); device one table (2 x that); pinned staging
// kStagingSlots tables.
//
// Complexity: SetRow / SetRows are O(pages written + pages cleared) (a
// SetRows update writes from its `first` page);
// CompactRows is O(max_batch + pages of retired rows): rows keep their host
// storage and change slots by index; Upload is O(live ids of the rows
// changed since the last upload, which include every row from an in-order
// compaction's first retired slot on, and of the unchanged rows bridged
// between their runs) host work plus, per run, one copy of whole rows (the
// first Upload: the whole table), and O(1) with nothing changed. SetIdentity
// and CheckInvariants are O(table). No call but CheckInvariants allocates
// memory after Create.
//
// Errors: every call that returns an error leaves the table unchanged (host
// rows, is_identity, upload_stats and what the next Upload copies); only a
// device failure in the middle of Upload has effects (see Upload).
//
// Thread safety: thread-compatible. One thread (the scheduler's) owns a table
// and its Device; const methods may run concurrently with each other only.
#ifndef KVBLOCK_PAGE_TABLE_H_
#define KVBLOCK_PAGE_TABLE_H_

#include <array>
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
};

// What KVPageTable::Upload has done since Create.
struct KVPageTableUploadStats {
  int64_t calls = 0;       // Upload calls that returned OK.
  int64_t copies = 0;      // host-to-device copies they enqueued.
  int64_t bytes = 0;       // bytes of those copies.
  int64_t rows = 0;        // rows those copies carried.
  int64_t host_waits = 0;  // calls that blocked: every staging slot in flight.

  friend bool operator==(const KVPageTableUploadStats&,
                         const KVPageTableUploadStats&) = default;
};

class KVPageTable {
 public:
  // Pinned staging slots Upload rotates over.
  static constexpr int kStagingSlots = 3;
  // Upload copies two runs of changed rows at most this many unchanged rows
  // apart as one (restaging the rows between, which the device holds
  // already): on a GPU a copy costs microseconds of host time to enqueue, a
  // staged row tens of nanoseconds.
  static constexpr int32_t kMaxBridgedRows = 16;

  // A table of `max_batch` rows of `max_pages_per_seq` K pages each, over a
  // pool of `num_pages` K pages, every entry kNoPage, mirrored on `device`
  // (which must outlive the table).
  // InvalidArgument: a non-positive argument; `num_pages` at or above 2^30
  // (BlockPool's and PagedKvConfig's limit, for int32 V ids); a table of more
  // than INT32_MAX entries (`max_batch * 2 * max_pages_per_seq`; kernels index
  // it with 32-bit offsets). ResourceExhausted / Internal: the device could not
  // allocate the mirror, the staging or its events.
  static absl::StatusOr<std::unique_ptr<KVPageTable>> Create(
      int32_t max_batch, int32_t max_pages_per_seq, int32_t num_pages,
      Device& device);

  KVPageTable(const KVPageTable&) = delete;
  KVPageTable& operator=(const KVPageTable&) = delete;
  // Waits for the copies still reading its staging, then frees it.
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
  // is broken, naming the row; OK otherwise. O(table).
  absl::Status CheckInvariants() const;

  // Enqueues on `stream` the host-to-device copies that bring the device
  // mirror up to date, and returns whether it enqueued any. First checks the
  // invariants of every row that may differ from the device (all rows on the
  // first call; afterwards the rows changed since the last upload: the others
  // passed that check when they were uploaded). The first call copies the
  // whole table; later calls compare each changed row with the last uploaded
  // image (a row edited and edited back is clean) and enqueue one copy per
  // maximal run of differing rows. With nothing to copy it does no device
  // operation and never waits. The host rows may change as soon as it
  // returns; the caller orders kernels after it on `stream`.
  // Internal: a broken invariant, or a device failure (ResourceExhausted or
  // Unavailable where the device says so). On error the host rows and
  // upload_stats are unchanged; after a failed copy the mirror may hold part
  // of the new rows, and the next Upload copies the whole table.
  absl::StatusOr<bool> Upload(Stream stream);

  // The host K row of `slot`, max_pages_per_seq entries: its live ids, then
  // kNoPage. The view follows the slot's row until the next CompactRows
  // (which gives slots other row storage); call again after one.
  // InvalidArgument: `slot` outside [0, max_batch).
  absl::StatusOr<absl::Span<const PageId>> HostRow(SlotId slot) const;

  // The device mirror, int32 [max_batch, 2, max_pages_per_seq]; the same
  // address for the table's lifetime. Kernels read it after Upload on their
  // stream.
  DeviceTensor kernel_view() const;

  // True only while the rows were last set by SetIdentity(): any later
  // successful SetRow, SetRows or CompactRows clears it, even one that
  // changes nothing or happens to describe the identity.
  bool is_identity() const { return is_identity_; }

  int32_t max_batch() const { return max_batch_; }
  int32_t max_pages_per_seq() const { return max_pages_per_seq_; }
  int32_t num_pages() const { return num_pages_; }
  const KVPageTableUploadStats& upload_stats() const { return upload_stats_; }

 private:
  // A validation scratch entry: `owner` is valid while `stamp` equals the
  // stamp of the current call, so clearing the scratch costs nothing.
  struct Mark {
    uint64_t stamp = 0;
    int32_t owner = 0;
  };

  KVPageTable(int32_t max_batch, int32_t max_pages_per_seq, int32_t num_pages,
              Device& device);

  // Offset of row `slot`'s first entry in the host arrays.
  // Offset of row `index` in a [max_batch, max_pages_per_seq] array.
  int64_t RowOffset(int32_t index) const {
    return int64_t{index} * max_pages_per_seq_;
  }
  // The host K row of `slot` and its live length, through its buffer.
  PageId* Row(SlotId slot) {
    return rows_.data() + RowOffset(buffer_of_[slot]);
  }
  const PageId* Row(SlotId slot) const {
    return rows_.data() + RowOffset(buffer_of_[slot]);
  }
  int32_t Length(SlotId slot) const { return lengths_[buffer_of_[slot]]; }
  // CompactRows for an order-preserving map (what a serving step makes),
  // checked and applied a run of survivors at a time, moving buffer numbers
  // only; false, changing nothing, for any other map.
  bool CompactInOrder(absl::Span<const SlotId> old_to_new, int32_t new_batch);
  // OK when `slot` may be written with `k_page_ids[first, count)`, keeping
  // its first `first` ids; otherwise InvalidArgument naming the slot and the
  // bad value.
  absl::Status ValidateRow(SlotId slot, const PageId* k_page_ids, int64_t count,
                           int64_t first = 0) const;
  // Writes a validated row from its `first` id on (marking it changed unless
  // it stays empty).
  void WriteRow(SlotId slot, const PageId* k_page_ids, int32_t count,
                int32_t first = 0);
  // The invariants of one row; Internal naming it when broken.
  // CheckRow: the whole row (live ids in range, kNoPage after them);
  // CheckLiveIds: the live ids only.
  absl::Status CheckRow(SlotId slot) const;
  absl::Status CheckLiveIds(SlotId slot) const;
  // Adds `slot` to the rows changed since the last upload.
  void MarkChanged(SlotId slot) {
    if (changed_[slot] != 0) return;
    changed_[slot] = 1;
    changed_rows_.push_back(slot);
  }
  // Empties the rows changed since the last upload.
  void ForgetChanges();
  // A staging slot no copy reads any more; waits (and says so) when every
  // slot is in flight.
  absl::StatusOr<int> AcquireStaging(bool& waited);

  const int32_t max_batch_;
  const int32_t max_pages_per_seq_;
  const int32_t num_pages_;
  Device& device_;

  // Host truth: max_batch row buffers of max_pages_per_seq K ids; buffer `r`
  // holds `lengths_[r]` live ids in [0, num_pages_), then kNoPage. Slot `b`
  // reads buffer `buffer_of_[b]` (a permutation of [0, max_batch)), so that
  // CompactRows moves buffer numbers instead of page ids.
  std::vector<PageId> rows_;
  std::vector<int32_t> lengths_;
  std::vector<int32_t> buffer_of_;
  std::vector<int32_t> next_buffer_of_;  // CompactRows scratch.
  std::vector<SlotId> retired_slots_;    // CompactInOrder scratch.
  std::vector<SlotId> slot_numbers_;     // 0, 1, ..., max_batch - 1.
  // Set only by SetIdentity; then rows_ is the identity layout.
  bool is_identity_ = false;

  // The K ids of the device mirror as of the last successful Upload
  // (meaningful once `uploaded_once_`).
  // Only the first uploaded_lengths_[b] ids of row b are meaningful.
  std::vector<PageId> uploaded_;
  std::vector<int32_t> uploaded_lengths_;
  bool uploaded_once_ = false;
  // Rows changed since the last successful Upload: those in
  // `changed_rows_`, each once (`changed_[b] != 0` exactly for them), and
  // every row from `changed_from_` on (what in-order compactions moved or
  // cleared; max_batch_ when none did).
  std::vector<uint8_t> changed_;
  std::vector<SlotId> changed_rows_;
  SlotId changed_from_;

  // Scratch, sized at Create: the rows an Upload copies, the slot ranges
  // [first, end) it copies them in, and duplicate detection for SetRows /
  // CompactRows.
  struct CopyRun {
    SlotId first = 0;
    SlotId end = 0;
  };
  std::vector<SlotId> dirty_rows_;
  std::vector<CopyRun> copy_runs_;
  std::vector<Mark> marks_;
  uint64_t stamp_ = 0;

  DeviceBuffer mirror_;
  // staging_[i] is laid out as the mirror; staging_done_[i] completes when
  // the last copy from it has.
  std::array<PinnedBuffer, kStagingSlots> staging_;
  // By staging slot and row: entries from this index on are kNoPage there
  // (max_pages_per_seq until the row is first written).
  std::array<std::vector<int32_t>, kStagingSlots> staged_lengths_;
  std::array<DeviceEvent, kStagingSlots> staging_done_;
  int next_staging_ = 0;

  KVPageTableUploadStats upload_stats_;
};

}  // namespace kvblock

#endif  // KVBLOCK_PAGE_TABLE_H_
