// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/page_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/reservation.h"
#include "kvblock/status_macros.h"

namespace kvblock {
namespace {

// Kernels index the mirror with 32-bit offsets.
constexpr int64_t kMaxEntries = std::numeric_limits<int32_t>::max();
// The default staging slot holds at most this much (see KVPageTableOptions).
constexpr int64_t kDefaultStagingCap = int64_t{1} << 20;

static_assert(sizeof(PageTablePatchRange) == KVPageTable::kRangeBytes);

absl::Status RequirePositive(absl::string_view name, int32_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("page table: ", name, " must be positive, got ", value));
}

// A patch in staging: the K ids from offset 0, then the ranges from the
// first kRangeBytes boundary after them.
int64_t RangesOffset(int64_t ids) {
  const int64_t bytes = ids * static_cast<int64_t>(sizeof(PageId));
  return (bytes + KVPageTable::kRangeBytes - 1) / KVPageTable::kRangeBytes *
         KVPageTable::kRangeBytes;
}
int64_t PatchBytes(int64_t ids, int64_t ranges) {
  return RangesOffset(ids) + ranges * KVPageTable::kRangeBytes;
}

}  // namespace

// The table's state and its parts.
class KVPageTable::Impl {
 public:
  // As KVPageTable::Create, whose checks `staging_bytes` passed.
  static absl::StatusOr<std::unique_ptr<Impl>> Create(int32_t max_batch,
                                                      int32_t max_pages_per_seq,
                                                      int32_t num_pages,
                                                      Device& device,
                                                      int64_t staging_bytes);
  Impl(int32_t max_batch, int32_t max_pages_per_seq, int32_t num_pages,
       Device& device, int64_t staging_bytes);
  ~Impl();

  // KVPageTable's calls, as documented there.
  absl::Status SetIdentity();
  absl::Status SetRow(SlotId slot, absl::Span<const PageId> k_page_ids);
  absl::Status SetRows(absl::Span<const KVPageTableRowUpdate> updates);
  absl::Status Apply(const KVPageTableEdit& edit);
  absl::Status CompactRows(absl::Span<const SlotId> old_to_new,
                           int32_t new_batch);
  absl::Status CheckInvariants() const;
  absl::StatusOr<bool> Upload(Stream stream);
  absl::StatusOr<absl::Span<const PageId>> HostRow(SlotId slot) const;
  DeviceTensor kernel_view() const;
  bool is_identity() const { return is_identity_; }

  int32_t max_batch() const { return max_batch_; }
  int32_t max_pages_per_seq() const { return max_pages_per_seq_; }
  int32_t num_pages() const { return num_pages_; }
  int64_t staging_bytes() const { return staging_bytes_; }
  const KVPageTableUploadStats& upload_stats() const { return upload_stats_; }

 private:
  // A validation scratch entry: `owner` is valid while `stamp` equals the
  // stamp of the current call, so clearing the scratch costs nothing.
  struct Mark {
    uint64_t stamp = 0;
    int32_t owner = 0;
  };
  // Claims `mark` for `owner` in the call of `stamp`; false, with the
  // owner that claimed it first in `earlier`, when it already is.
  static bool Claim(Mark& mark, uint64_t stamp, int32_t owner,
                    int32_t& earlier) {
    if (mark.stamp == stamp) {
      earlier = mark.owner;
      return false;
    }
    mark = {stamp, owner};
    return true;
  }

  // Offset of row buffer `index` in rows_.
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

  // Checks `edit` whole under a fresh stamp, leaving the move marks for
  // ApplyChecked. InvalidArgument naming the first bad move or update.
  absl::Status Check(const KVPageTableEdit& edit);
  // Applies an edit that Check has just passed.
  void ApplyChecked(const KVPageTableEdit& edit);
  // Slot `slot`'s live ids once the moves Check marked are done.
  int32_t LengthAfterMoves(SlotId slot,
                           absl::Span<const KVPageTableRowMove> moves) const;
  // OK when `slot`, whose row has `length` live ids, may be written with
  // `k_page_ids[first, count)`, keeping its first `first` ids; otherwise
  // InvalidArgument naming the slot and the bad value.
  // `end`: KVPageTableRowUpdate's.
  absl::Status ValidateRow(SlotId slot, const PageId* k_page_ids, int64_t count,
                           int64_t first, int32_t length,
                           int64_t end = -1) const;
  // Writes a validated row from its `first` id on (to `end`, see
  // KVPageTableRowUpdate).
  void WriteRow(SlotId slot, const PageId* k_page_ids, int32_t count,
                int32_t first, int32_t end = -1);
  // Empties the row buffer `buffer`.
  void ClearBuffer(int32_t buffer);
  // Notes that `slot`'s row changed in entries [first, end) (kRowEnd: to
  // its end).
  static constexpr int32_t kRowEnd = std::numeric_limits<int32_t>::max();
  void MarkWritten(SlotId slot, int32_t first, int32_t end = kRowEnd) {
    if (changed_[slot] == 0) {
      changed_[slot] = 1;
      changed_rows_.push_back(slot);
      written_from_[slot] = first;
      written_to_[slot] = end;
    } else {
      written_from_[slot] = std::min(written_from_[slot], first);
      written_to_[slot] = std::max(written_to_[slot], end);
    }
  }
  // Forgets the changes, once they are on the device.
  void ForgetChanges();

  // Upload's parts. PlanPatch lists the ranges of the changed rows (of every
  // row, when `whole`) in ranges_ and returns how many ids they carry.
  // StagePatch packs ranges_[begin, end) into staging slot `slot` (the ids,
  // checked when `check_ids`, then the ranges) and returns the ranges'
  // offset; EnqueuePatch copies that patch to the slot's device twin and
  // applies it. CheckPatchIds checks every id of ranges_.
  int64_t PlanPatch(bool whole);
  absl::StatusOr<int64_t> StagePatch(int slot, size_t begin, size_t end,
                                     bool check_ids);
  absl::Status EnqueuePatch(int slot, int64_t ranges_offset, int32_t num_ranges,
                            Stream stream);
  absl::Status CheckPatchIds() const;
  // Internal naming the bad id of `range` (one that CheckPatchIds or
  // StagePatch found).
  absl::Status BadIdError(const PageTablePatchRange& range) const;
  // The host ids a range sends.
  const PageId* RangeIds(const PageTablePatchRange& range) const {
    return Row(range.entry / max_pages_per_seq_) +
           range.entry % max_pages_per_seq_;
  }
  // A staging slot no patch reads any more; waits (and says so) when every
  // slot is in flight.
  absl::StatusOr<int> AcquireStaging(bool& waited);

  const int32_t max_batch_;
  const int32_t max_pages_per_seq_;
  const int32_t num_pages_;
  const int64_t staging_bytes_;
  Device& device_;

  // Host truth: max_batch row buffers of max_pages_per_seq K ids; buffer `r`
  // holds `lengths_[r]` live ids in [0, num_pages_), then kNoPage. Slot `b`
  // reads buffer `buffer_of_[b]` (a permutation of [0, max_batch)), so that
  // a row moves by its buffer number, not its page ids.
  std::vector<PageId> rows_;
  std::vector<int32_t> lengths_;
  std::vector<int32_t> buffer_of_;
  // Set only by SetIdentity; then rows_ is the identity layout.
  bool is_identity_ = false;

  // The change record since the last successful Upload, by slot: the slots
  // in changed_rows_, each once (changed_[b] != 0 exactly for them), changed
  // in entries [written_from_[b], written_to_[b]) (the others hold what the
  // device holds; kRowEnd: to the row's end). device_lengths_[b]: the live
  // ids the device holds in row b
  // (meaningful once uploaded_once_; every entry after them is kNoPage
  // there).
  std::vector<uint8_t> changed_;
  std::vector<SlotId> changed_rows_;
  std::vector<int32_t> written_from_;
  std::vector<int32_t> written_to_;
  std::vector<int32_t> device_lengths_;
  bool uploaded_once_ = false;

  // Scratch, sized at Create: Check's marks by slot (updates, move sources,
  // move destinations), the buffers moves carry and free, CompactRows' edit,
  // and Upload's ranges.
  std::vector<Mark> update_marks_;
  std::vector<Mark> source_marks_;
  std::vector<Mark> destination_marks_;
  uint64_t stamp_ = 0;
  std::vector<int32_t> moved_buffers_;
  std::vector<int32_t> freed_buffers_;
  std::vector<KVPageTableRowMove> compaction_moves_;
  std::vector<KVPageTableRowUpdate> compaction_clears_;
  std::vector<PageTablePatchRange> ranges_;

  DeviceBuffer mirror_;
  // staging_[i] is packed by StagePatch and copied to patches_[i], which the
  // device applies; staging_done_[i] completes when that patch has been
  // applied, so both may be rewritten.
  std::array<PinnedBuffer, kStagingSlots> staging_;
  std::array<DeviceBuffer, kStagingSlots> patches_;
  std::array<DeviceEvent, kStagingSlots> staging_done_;
  int next_staging_ = 0;

  KVPageTableUploadStats upload_stats_;
};

absl::StatusOr<std::unique_ptr<KVPageTable>> KVPageTable::Create(
    int32_t max_batch, int32_t max_pages_per_seq, int32_t num_pages,
    Device& device, const KVPageTableOptions& options) {
  KVBLOCK_RETURN_IF_ERROR(RequirePositive("max_batch", max_batch));
  KVBLOCK_RETURN_IF_ERROR(
      RequirePositive("max_pages_per_seq", max_pages_per_seq));
  KVBLOCK_RETURN_IF_ERROR(RequirePositive("num_pages", num_pages));
  if (num_pages > kMaxNumPages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page table: num_pages ", num_pages, " is above ", kMaxNumPages,
        ", the pool's limit (V page ids are num_pages + id, int32)"));
  }
  const int64_t entries = int64_t{max_batch} * 2 * max_pages_per_seq;
  if (entries > kMaxEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page table: max_batch ", max_batch, " x 2 x max_pages_per_seq ",
        max_pages_per_seq, " = ", entries, " entries, more than ", kMaxEntries,
        " (32-bit indexing)"));
  }
  const int64_t min_staging = MinStagingBytes(max_pages_per_seq);
  int64_t staging_bytes = options.staging_bytes;
  if (staging_bytes == 0) {
    // The worst patch of the whole table, capped: bigger patches split.
    const int64_t whole = PatchBytes(entries / 2, max_batch);
    staging_bytes = std::max(min_staging, std::min(whole, kDefaultStagingCap));
  } else if (staging_bytes < min_staging) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page table: staging_bytes ", staging_bytes, " is below ", min_staging,
        ", one row of max_pages_per_seq ", max_pages_per_seq, " ids"));
  }
  // The host rows and the pinned staging, checked before anything is
  // allocated (a staging_bytes no machine holds was a calloc of it).
  internal::Reservation reservation("page table");
  reservation.Add(entries / 2, sizeof(PageId));
  reservation.Add(kStagingSlots, staging_bytes);
  KVBLOCK_RETURN_IF_ERROR(reservation.Check());
  KVBLOCK_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl,
                           Impl::Create(max_batch, max_pages_per_seq, num_pages,
                                        device, staging_bytes));
  return std::unique_ptr<KVPageTable>(new KVPageTable(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<KVPageTable::Impl>> KVPageTable::Impl::Create(
    int32_t max_batch, int32_t max_pages_per_seq, int32_t num_pages,
    Device& device, int64_t staging_bytes) {
  std::unique_ptr<Impl> table;
  try {
    table = std::make_unique<Impl>(max_batch, max_pages_per_seq, num_pages,
                                   device, staging_bytes);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("page table: out of host memory for ", max_batch,
                     " rows of ", max_pages_per_seq, " pages"));
  }
  const int64_t entries = int64_t{max_batch} * 2 * max_pages_per_seq;
  KVBLOCK_ASSIGN_OR_RETURN(
      table->mirror_,
      device.Allocate(static_cast<size_t>(entries) * sizeof(int32_t)));
  for (int i = 0; i < kStagingSlots; ++i) {
    const size_t bytes = static_cast<size_t>(staging_bytes);
    KVBLOCK_ASSIGN_OR_RETURN(table->staging_[i], device.AllocatePinned(bytes));
    KVBLOCK_ASSIGN_OR_RETURN(table->patches_[i], device.Allocate(bytes));
    KVBLOCK_ASSIGN_OR_RETURN(table->staging_done_[i], device.CreateEvent());
  }
  return table;
}

KVPageTable::Impl::Impl(int32_t max_batch, int32_t max_pages_per_seq,
                        int32_t num_pages, Device& device,
                        int64_t staging_bytes)
    : max_batch_(max_batch),
      max_pages_per_seq_(max_pages_per_seq),
      num_pages_(num_pages),
      staging_bytes_(staging_bytes),
      device_(device),
      rows_(static_cast<size_t>(RowOffset(max_batch)), kNoPage),
      lengths_(max_batch, 0),
      buffer_of_(max_batch),
      changed_(max_batch, 0),
      written_from_(max_batch, 0),
      written_to_(max_batch, 0),
      device_lengths_(max_batch, 0),
      update_marks_(max_batch),
      source_marks_(max_batch),
      destination_marks_(max_batch),
      moved_buffers_(max_batch),
      freed_buffers_(max_batch),
      compaction_moves_(max_batch),
      compaction_clears_(max_batch) {
  std::iota(buffer_of_.begin(), buffer_of_.end(), 0);
  changed_rows_.reserve(max_batch);
  ranges_.reserve(max_batch);
}

KVPageTable::Impl::~Impl() {
  for (const DeviceEvent& done : staging_done_) {
    // Nothing to report to from a destructor; a failed wait means a failed
    // device, whose patches read nothing more.
    if (done.valid()) device_.WaitEvent(done).IgnoreError();
  }
}

absl::Status KVPageTable::Impl::SetIdentity() {
  const int64_t needed = int64_t{max_batch_} * max_pages_per_seq_;
  if (needed > num_pages_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "page table: the identity layout needs max_batch ", max_batch_,
        " x max_pages_per_seq ", max_pages_per_seq_, " = ", needed,
        " pages, the pool has num_pages ", num_pages_));
  }
  for (SlotId slot = 0; slot < max_batch_; ++slot) {
    PageId* row = Row(slot);
    for (int32_t i = 0; i < max_pages_per_seq_; ++i) {
      row[i] = static_cast<PageId>(RowOffset(slot) + i);
    }
    lengths_[buffer_of_[slot]] = max_pages_per_seq_;
    MarkWritten(slot, 0);
  }
  is_identity_ = true;
  return absl::OkStatus();
}

// Inlined into SetRow(s) and Apply: a valid row costs its comparisons only,
// not a call returning a Status.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status KVPageTable::Impl::ValidateRow(
    SlotId slot, const PageId* k_page_ids, int64_t count, int64_t first,
    int32_t length, int64_t end) const {
  if (count < 0 || count > max_pages_per_seq_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, ": ", count, " page ids, want [0, max_pages_per_seq ",
        max_pages_per_seq_, "]"));
  }
  if (count > 0 && k_page_ids == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, ": null k_page_ids with count ", count));
  }
  if (first < 0 || first > std::min<int64_t>(count, length)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, ": first ", first, " is outside [0, min(count ", count,
        ", live ids ", length, ")]"));
  }
  if (end != -1 &&
      (end < first || end > count || (end != count && count != length))) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, ": end ", end, " of a row of ", count,
                     " ids, want -1, or in [first ", first,
                     ", count] with count the ", length, " live ids"));
  }
  const int64_t last = end >= 0 ? end : count;
  for (int64_t i = first; i < last; ++i) {
    if (k_page_ids[i] < 0 || k_page_ids[i] >= num_pages_) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", slot, ": page id ", k_page_ids[i], " at index ",
                       i, " is outside [0, num_pages ", num_pages_, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status KVPageTable::Impl::SetRow(SlotId slot,
                                       absl::Span<const PageId> k_page_ids) {
  if (slot < 0 || slot >= max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page table: slot ", slot, " is outside [0, ", max_batch_, ")"));
  }
  const int64_t count = static_cast<int64_t>(k_page_ids.size());
  if (absl::Status status =
          ValidateRow(slot, k_page_ids.data(), count, 0, Length(slot));
      !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page table: ", status.message()));
  }
  WriteRow(slot, k_page_ids.data(), static_cast<int32_t>(count), 0);
  is_identity_ = false;
  return absl::OkStatus();
}

absl::Status KVPageTable::Impl::SetRows(
    absl::Span<const KVPageTableRowUpdate> updates) {
  return Apply({.rows = updates});
}

absl::Status KVPageTable::Impl::Apply(const KVPageTableEdit& edit) {
  KVBLOCK_RETURN_IF_ERROR(Check(edit));
  ApplyChecked(edit);
  is_identity_ = false;
  return absl::OkStatus();
}

absl::Status KVPageTable::Impl::Check(const KVPageTableEdit& edit) {
  const uint64_t stamp = ++stamp_;
  for (size_t i = 0; i < edit.moves.size(); ++i) {
    const KVPageTableRowMove& move = edit.moves[i];
    for (const SlotId slot : {move.from, move.to}) {
      if (slot < 0 || slot >= max_batch_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "page table: move ", i, ": slot ", slot, " (from ", move.from,
            " to ", move.to, ") is outside [0, ", max_batch_, ")"));
      }
    }
    // At most one move per slot each way, so i < max_batch.
    const int32_t owner = static_cast<int32_t>(i);
    int32_t earlier = 0;
    if (!Claim(source_marks_[move.from], stamp, owner, earlier)) {
      return absl::InvalidArgumentError(
          absl::StrCat("page table: move ", i, ": slot ", move.from,
                       " is already moved by move ", earlier));
    }
    if (!Claim(destination_marks_[move.to], stamp, owner, earlier)) {
      return absl::InvalidArgumentError(
          absl::StrCat("page table: move ", i, ": slot ", move.to,
                       " already receives move ", earlier));
    }
  }
  for (size_t i = 0; i < edit.rows.size(); ++i) {
    const KVPageTableRowUpdate& update = edit.rows[i];
    if (update.slot < 0 || update.slot >= max_batch_) {
      return absl::InvalidArgumentError(
          absl::StrCat("page table: update ", i, ": slot ", update.slot,
                       " is outside [0, ", max_batch_, ")"));
    }
    if (absl::Status status = ValidateRow(
            update.slot, update.k_page_ids, update.count, update.first,
            LengthAfterMoves(update.slot, edit.moves), update.end);
        !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("page table: update ", i, ": ", status.message()));
    }
    // A slot appears at most once, so i < max_batch.
    int32_t earlier = 0;
    if (!Claim(update_marks_[update.slot], stamp, static_cast<int32_t>(i),
               earlier)) {
      return absl::InvalidArgumentError(
          absl::StrCat("page table: update ", i, ": slot ", update.slot,
                       " is already set by update ", earlier));
    }
  }
  return absl::OkStatus();
}

int32_t KVPageTable::Impl::LengthAfterMoves(
    SlotId slot, absl::Span<const KVPageTableRowMove> moves) const {
  if (moves.empty()) return Length(slot);
  const Mark& destination = destination_marks_[slot];
  if (destination.stamp == stamp_) {
    return Length(moves[destination.owner].from);
  }
  return source_marks_[slot].stamp == stamp_ ? 0 : Length(slot);
}

void KVPageTable::Impl::ApplyChecked(const KVPageTableEdit& edit) {
  if (!edit.moves.empty()) {
    // Every destination takes its source's buffer; the buffers of
    // destinations that are no source are freed, and go, emptied, to the
    // sources that are no destination (there are as many of each).
    const uint64_t stamp = stamp_;
    size_t freed = 0;
    for (size_t i = 0; i < edit.moves.size(); ++i) {
      const KVPageTableRowMove& move = edit.moves[i];
      moved_buffers_[i] = buffer_of_[move.from];
      if (source_marks_[move.to].stamp != stamp) {
        freed_buffers_[freed++] = buffer_of_[move.to];
      }
    }
    for (size_t i = 0; i < edit.moves.size(); ++i) {
      const KVPageTableRowMove& move = edit.moves[i];
      if (move.from == move.to) continue;
      buffer_of_[move.to] = moved_buffers_[i];
      MarkWritten(move.to, 0);
    }
    for (const KVPageTableRowMove& move : edit.moves) {
      if (destination_marks_[move.from].stamp == stamp) continue;
      const int32_t buffer = freed_buffers_[--freed];
      ClearBuffer(buffer);
      buffer_of_[move.from] = buffer;
      MarkWritten(move.from, 0);
    }
  }
  for (const KVPageTableRowUpdate& update : edit.rows) {
    WriteRow(update.slot, update.k_page_ids, update.count, update.first,
             update.end);
  }
}

absl::Status KVPageTable::Impl::CompactRows(absl::Span<const SlotId> old_to_new,
                                            int32_t new_batch) {
  if (old_to_new.size() != static_cast<size_t>(max_batch_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page table: compact rows: old_to_new has ", old_to_new.size(),
        " entries, want max_batch ", max_batch_));
  }
  if (new_batch < 0 || new_batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("page table: compact rows: new_batch ", new_batch,
                     " is outside [0, ", max_batch_, "]"));
  }
  // The map as an edit: a move per survivor that changes slot, a clear per
  // retired row that no survivor lands on (a survivor's old slot that no
  // one lands on is emptied by its move).
  const uint64_t stamp = ++stamp_;
  int32_t mapped = 0;
  size_t moves = 0;
  for (SlotId old_slot = 0; old_slot < max_batch_; ++old_slot) {
    const SlotId new_slot = old_to_new[old_slot];
    if (new_slot == kNoSlot) continue;
    if (new_slot < 0 || new_slot >= new_batch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page table: compact rows: old slot ", old_slot, " maps to ",
          new_slot, ", outside [0, new_batch ", new_batch, ") and not -1"));
    }
    int32_t earlier = 0;
    if (!Claim(update_marks_[new_slot], stamp, old_slot, earlier)) {
      return absl::InvalidArgumentError(
          absl::StrCat("page table: compact rows: new slot ", new_slot,
                       " receives old slots ", earlier, " and ", old_slot));
    }
    ++mapped;
    if (new_slot != old_slot) compaction_moves_[moves++] = {old_slot, new_slot};
  }
  if (mapped != new_batch) {
    SlotId missing = 0;
    while (update_marks_[missing].stamp == stamp) ++missing;
    return absl::InvalidArgumentError(
        absl::StrCat("page table: compact rows: new slot ", missing,
                     " receives no old slot (", mapped,
                     " old slots map to new_batch ", new_batch, ")"));
  }
  size_t clears = 0;
  for (SlotId slot = 0; slot < max_batch_; ++slot) {
    if (old_to_new[slot] == kNoSlot && update_marks_[slot].stamp != stamp &&
        Length(slot) > 0) {
      compaction_clears_[clears++] = {.slot = slot};
    }
  }
  const KVPageTableEdit edit{
      .moves = absl::MakeConstSpan(compaction_moves_).first(moves),
      .rows = absl::MakeConstSpan(compaction_clears_).first(clears),
  };
  // A valid map makes a valid edit: a failure here is a bug of this file.
  if (absl::Status status = Check(edit); !status.ok()) {
    return absl::InternalError(
        absl::StrCat("page table: compact rows: ", status.message()));
  }
  ApplyChecked(edit);
  is_identity_ = false;
  return absl::OkStatus();
}

absl::Status KVPageTable::Impl::CheckInvariants() const {
  std::vector<uint8_t> seen(max_batch_, 0);
  for (SlotId slot = 0; slot < max_batch_; ++slot) {
    const int32_t buffer = buffer_of_[slot];
    if (buffer < 0 || buffer >= max_batch_ || seen[buffer]++ != 0) {
      return absl::InternalError(
          absl::StrCat("page table: slot ", slot, " has buffer ", buffer,
                       ", not a fresh one in [0, ", max_batch_, ")"));
    }
  }
  for (SlotId slot = 0; slot < max_batch_; ++slot) {
    const int32_t length = Length(slot);
    if (length < 0 || length > max_pages_per_seq_) {
      return absl::InternalError(
          absl::StrCat("page table: row ", slot, ": length ", length,
                       " is outside [0, ", max_pages_per_seq_, "]"));
    }
    const PageId* row = Row(slot);
    for (int32_t i = 0; i < max_pages_per_seq_; ++i) {
      const bool live = i < length;
      if (live ? row[i] < 0 || row[i] >= num_pages_ : row[i] != kNoPage) {
        return absl::InternalError(absl::StrCat(
            "page table: row ", slot, ": entry ", i, " is ", row[i],
            live ? absl::StrCat(", want a page in [0, ", num_pages_, ")")
                 : absl::StrCat(", want -1 after ", length, " live pages")));
      }
      if (is_identity_ && row[i] != RowOffset(slot) + i) {
        return absl::InternalError(absl::StrCat(
            "page table: row ", slot, ": identity row holds page ", row[i],
            " at index ", i, ", want ", RowOffset(slot) + i));
      }
    }
    if (device_lengths_[slot] < 0 ||
        device_lengths_[slot] > max_pages_per_seq_) {
      return absl::InternalError(absl::StrCat(
          "page table: row ", slot, ": device length ", device_lengths_[slot],
          " is outside [0, ", max_pages_per_seq_, "]"));
    }
    if (changed_[slot] == 0 && uploaded_once_ &&
        device_lengths_[slot] != length) {
      return absl::InternalError(absl::StrCat(
          "page table: row ", slot, ": unchanged since the upload, yet ",
          length, " live ids here and ", device_lengths_[slot],
          " on the device"));
    }
    if (changed_[slot] != 0 && written_to_[slot] < written_from_[slot]) {
      return absl::InternalError(
          absl::StrCat("page table: row ", slot, ": written in entries [",
                       written_from_[slot], ", ", written_to_[slot], ")"));
    }
    if (changed_[slot] != 0 && (written_from_[slot] < 0 ||
                                written_from_[slot] > device_lengths_[slot])) {
      return absl::InternalError(
          absl::StrCat("page table: row ", slot, ": written from entry ",
                       written_from_[slot], ", past the device's ",
                       device_lengths_[slot], " live ids"));
    }
  }
  size_t flagged = 0;
  for (uint8_t changed : changed_) flagged += changed != 0;
  if (flagged != changed_rows_.size()) {
    return absl::InternalError(absl::StrCat("page table: ", flagged,
                                            " rows flagged changed, ",
                                            changed_rows_.size(), " listed"));
  }
  for (SlotId slot : changed_rows_) {
    if (changed_[slot] == 0) {
      return absl::InternalError(absl::StrCat(
          "page table: row ", slot, " is listed changed but not flagged"));
    }
  }
  return absl::OkStatus();
}

int64_t KVPageTable::Impl::PlanPatch(bool whole) {
  ranges_.clear();
  int64_t ids = 0;
  // Row `slot` changed from entry `from` on, and the device holds
  // `device_length` live ids there: send the ids from `from` to the live
  // end, and clear what the device holds past it.
  const auto plan_row = [&](SlotId slot, int32_t from, int32_t to,
                            int32_t device_length) {
    const int32_t length = Length(slot);
    const int32_t begin = std::min(from, length);
    // Entries in the middle only while the length is the device's.
    const int32_t end =
        to < length && device_length == length ? std::max(to, begin) : length;
    const int32_t count = end - begin;
    const int32_t clear =
        end < length ? 0 : std::max(length, device_length) - length;
    if (count == 0 && clear == 0) return;
    ranges_.push_back({
        .entry = static_cast<int32_t>(RowOffset(slot) + begin),
        .count = count,
        .clear = clear,
        .ids_offset = static_cast<int32_t>(ids),
    });
    ids += count;
  };
  if (whole) {
    // The mirror may hold anything (zeros at first): set every entry.
    for (SlotId slot = 0; slot < max_batch_; ++slot) {
      plan_row(slot, 0, kRowEnd, max_pages_per_seq_);
    }
  } else {
    for (const SlotId slot : changed_rows_) {
      plan_row(slot, written_from_[slot], written_to_[slot],
               device_lengths_[slot]);
    }
  }
  return ids;
}

absl::Status KVPageTable::Impl::BadIdError(
    const PageTablePatchRange& range) const {
  const SlotId slot = range.entry / max_pages_per_seq_;
  const int32_t first = range.entry % max_pages_per_seq_;
  const PageId* row = Row(slot);
  for (int32_t i = first; i < first + range.count; ++i) {
    if (row[i] < 0 || row[i] >= num_pages_) {
      return absl::InternalError(
          absl::StrCat("page table: row ", slot, ": entry ", i, " is ", row[i],
                       ", want a page in [0, ", num_pages_, ")"));
    }
  }
  return absl::InternalError(
      absl::StrCat("page table: row ", slot, ": a bad id vanished"));
}

absl::Status KVPageTable::Impl::CheckPatchIds() const {
  for (const PageTablePatchRange& range : ranges_) {
    const PageId* const ids = RangeIds(range);
    uint32_t bad = 0;
    for (int32_t i = 0; i < range.count; ++i) {
      bad |= static_cast<uint32_t>(ids[i]) >= static_cast<uint32_t>(num_pages_);
    }
    if (bad != 0) return BadIdError(range);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KVPageTable::Impl::StagePatch(int slot, size_t begin,
                                                      size_t end,
                                                      bool check_ids) {
  char* const staging = static_cast<char*>(staging_[slot].data());
  PageId* const ids_out = reinterpret_cast<PageId*>(staging);
  const int32_t base = ranges_[begin].ids_offset;
  // The ids, checked as they are copied (a branch-free or over each range).
  for (size_t r = begin; r < end; ++r) {
    const PageTablePatchRange& range = ranges_[r];
    const PageId* const ids = RangeIds(range);
    PageId* const out = ids_out + (range.ids_offset - base);
    uint32_t bad = 0;
    for (int32_t i = 0; i < range.count; ++i) {
      bad |= static_cast<uint32_t>(ids[i]) >= static_cast<uint32_t>(num_pages_);
      out[i] = ids[i];
    }
    if (check_ids && bad != 0) return BadIdError(range);
  }
  const PageTablePatchRange& last = ranges_[end - 1];
  const int64_t ranges_offset =
      RangesOffset(last.ids_offset + last.count - base);
  auto* const ranges_out =
      reinterpret_cast<PageTablePatchRange*>(staging + ranges_offset);
  for (size_t r = begin; r < end; ++r) {
    PageTablePatchRange range = ranges_[r];
    range.ids_offset -= base;
    ranges_out[r - begin] = range;
  }
  return ranges_offset;
}

absl::Status KVPageTable::Impl::EnqueuePatch(int slot, int64_t ranges_offset,
                                             int32_t num_ranges,
                                             Stream stream) {
  const int64_t bytes = ranges_offset + int64_t{num_ranges} * kRangeBytes;
  char* const patch = static_cast<char*>(patches_[slot].data());
  absl::Status status = device_.CopyToDevice(
      staging_[slot].data(), patch, static_cast<size_t>(bytes), stream);
  if (!status.ok()) return status;
  status = device_.ApplyPageTablePatch(
      {
          .table = static_cast<int32_t*>(mirror_.data()),
          .max_batch = max_batch_,
          .max_pages_per_seq = max_pages_per_seq_,
          .num_pages = num_pages_,
          .ids = reinterpret_cast<const int32_t*>(patch),
          .ranges = reinterpret_cast<const PageTablePatchRange*>(patch +
                                                                 ranges_offset),
          .num_ranges = num_ranges,
      },
      stream);
  // Guard the slot even after a failed launch: the copy may still read it.
  absl::Status recorded = device_.RecordEvent(staging_done_[slot], stream);
  return status.ok() ? recorded : status;
}

absl::StatusOr<bool> KVPageTable::Impl::Upload(Stream stream) {
  const bool whole = !uploaded_once_;
  const int64_t ids = PlanPatch(whole);
  if (ranges_.empty()) {
    ForgetChanges();
    ++upload_stats_.calls;
    return false;
  }
  // One patch, its ids checked as they are staged; or several, after every
  // id is checked, so that a bad id never leaves half a table sent.
  const bool split =
      PatchBytes(ids, static_cast<int64_t>(ranges_.size())) > staging_bytes_;
  if (split) KVBLOCK_RETURN_IF_ERROR(CheckPatchIds());
  KVPageTableUploadStats sent;
  for (size_t begin = 0; begin < ranges_.size();) {
    // The most ranges from `begin` on that fit one staging slot (one whole
    // row always does).
    const int32_t base = ranges_[begin].ids_offset;
    size_t end = begin + 1;
    while (end < ranges_.size() &&
           PatchBytes(ranges_[end].ids_offset + ranges_[end].count - base,
                      static_cast<int64_t>(end + 1 - begin)) <=
               staging_bytes_) {
      ++end;
    }
    const int32_t num_ranges = static_cast<int32_t>(end - begin);
    // Nothing reaches the device before the first EnqueuePatch; once one
    // has run, a failure leaves the mirror holding part of the rows.
    bool waited = false;
    absl::StatusOr<int> slot = AcquireStaging(waited);
    absl::StatusOr<int64_t> ranges_offset =
        slot.ok() ? StagePatch(*slot, begin, end, /*check_ids=*/!split)
                  : absl::StatusOr<int64_t>(slot.status());
    absl::Status status = ranges_offset.status();
    if (status.ok()) {
      status = EnqueuePatch(*slot, *ranges_offset, num_ranges, stream);
      ++sent.copies;
    }
    if (!status.ok()) {
      if (sent.copies > 0) uploaded_once_ = false;
      return status;
    }
    next_staging_ = (*slot + 1) % kStagingSlots;
    sent.bytes += *ranges_offset + int64_t{num_ranges} * kRangeBytes;
    sent.host_waits += waited;
    begin = end;
  }

  for (const PageTablePatchRange& range : ranges_) {
    sent.entries += range.count + range.clear;
  }
  if (whole) {
    for (SlotId slot = 0; slot < max_batch_; ++slot) {
      device_lengths_[slot] = Length(slot);
    }
  } else {
    for (const SlotId slot : changed_rows_) {
      device_lengths_[slot] = Length(slot);
    }
  }
  ForgetChanges();
  uploaded_once_ = true;
  ++upload_stats_.calls;
  upload_stats_.copies += sent.copies;
  upload_stats_.bytes += sent.bytes;
  upload_stats_.ranges += static_cast<int64_t>(ranges_.size());
  upload_stats_.entries += sent.entries;
  upload_stats_.host_waits += sent.host_waits;
  return true;
}

absl::StatusOr<absl::Span<const PageId>> KVPageTable::Impl::HostRow(
    SlotId slot) const {
  if (slot < 0 || slot >= max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page table: slot ", slot, " is outside [0, ", max_batch_, ")"));
  }
  return absl::Span<const PageId>(Row(slot), max_pages_per_seq_);
}

DeviceTensor KVPageTable::Impl::kernel_view() const {
  return DeviceTensor(static_cast<int32_t*>(mirror_.data()),
                      {max_batch_, 2, max_pages_per_seq_});
}

void KVPageTable::Impl::WriteRow(SlotId slot, const PageId* k_page_ids,
                                 int32_t count, int32_t first, int32_t end) {
  int32_t& length = lengths_[buffer_of_[slot]];
  const int32_t old_count = length;
  if (count == 0 && old_count == 0) return;  // stays empty: no change.
  PageId* const row = Row(slot);
  if (end >= 0 && end != count) {  // entries in the middle; the length stays.
    std::copy(k_page_ids + first, k_page_ids + end, row + first);
    MarkWritten(slot, first, end);
    return;
  }
  if (count == first + 1) {
    row[first] = k_page_ids[first];  // a decode row: no call into memmove.
  } else if (count > first) {
    std::copy(k_page_ids + first, k_page_ids + count, row + first);
  }
  if (old_count > count) std::fill(row + count, row + old_count, kNoPage);
  length = count;
  MarkWritten(slot, first);
}

void KVPageTable::Impl::ClearBuffer(int32_t buffer) {
  int32_t& length = lengths_[buffer];
  std::fill_n(rows_.data() + RowOffset(buffer), length, kNoPage);
  length = 0;
}

void KVPageTable::Impl::ForgetChanges() {
  for (SlotId slot : changed_rows_) changed_[slot] = 0;
  changed_rows_.clear();
}

absl::StatusOr<int> KVPageTable::Impl::AcquireStaging(bool& waited) {
  for (int i = 0; i < kStagingSlots; ++i) {
    const int slot = (next_staging_ + i) % kStagingSlots;
    KVBLOCK_ASSIGN_OR_RETURN(const bool done,
                             device_.EventDone(staging_done_[slot]));
    if (done) {
      waited = false;
      return slot;
    }
  }
  // Every slot is in flight: wait for the next in turn (the oldest, when the
  // uploads share one stream).
  KVBLOCK_RETURN_IF_ERROR(device_.WaitEvent(staging_done_[next_staging_]));
  waited = true;
  return next_staging_;
}

KVPageTable::KVPageTable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KVPageTable::~KVPageTable() = default;

absl::Status KVPageTable::SetIdentity() { return impl_->SetIdentity(); }

absl::Status KVPageTable::SetRow(SlotId slot,
                                 absl::Span<const PageId> k_page_ids) {
  return impl_->SetRow(slot, k_page_ids);
}

absl::Status KVPageTable::SetRows(
    absl::Span<const KVPageTableRowUpdate> updates) {
  return impl_->SetRows(updates);
}

absl::Status KVPageTable::Apply(const KVPageTableEdit& edit) {
  return impl_->Apply(edit);
}

absl::Status KVPageTable::CompactRows(absl::Span<const SlotId> old_to_new,
                                      int32_t new_batch) {
  return impl_->CompactRows(old_to_new, new_batch);
}

absl::Status KVPageTable::CheckInvariants() const {
  return impl_->CheckInvariants();
}

absl::StatusOr<bool> KVPageTable::Upload(Stream stream) {
  return impl_->Upload(stream);
}

absl::StatusOr<absl::Span<const PageId>> KVPageTable::HostRow(
    SlotId slot) const {
  return impl_->HostRow(slot);
}

DeviceTensor KVPageTable::kernel_view() const { return impl_->kernel_view(); }

bool KVPageTable::is_identity() const { return impl_->is_identity(); }

int32_t KVPageTable::max_batch() const { return impl_->max_batch(); }

int32_t KVPageTable::max_pages_per_seq() const {
  return impl_->max_pages_per_seq();
}

int32_t KVPageTable::num_pages() const { return impl_->num_pages(); }

int64_t KVPageTable::staging_bytes() const { return impl_->staging_bytes(); }

const KVPageTableUploadStats& KVPageTable::upload_stats() const {
  return impl_->upload_stats();
}

}  // namespace kvblock
