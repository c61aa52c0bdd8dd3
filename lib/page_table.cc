// Copyright 2026 The kvblock Authors.
#include "kvblock/page_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "status_macros.h"

namespace kvblock {
namespace {

// The pool's and the config's limit: num_pages < 2^30, so V ids
// (`num_pages + id`) stay well inside int32.
constexpr int64_t kMaxNumPages = int64_t{1} << 30;
// Kernels index the mirror with 32-bit offsets.
constexpr int64_t kMaxEntries = std::numeric_limits<int32_t>::max();

absl::Status RequirePositive(absl::string_view name, int32_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("page table: ", name, " must be positive, got ", value));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KVPageTable>> KVPageTable::Create(
    int32_t max_batch, int32_t max_pages_per_seq, int32_t num_pages,
    Device& device) {
  KVBLOCK_RETURN_IF_ERROR(RequirePositive("max_batch", max_batch));
  KVBLOCK_RETURN_IF_ERROR(
      RequirePositive("max_pages_per_seq", max_pages_per_seq));
  KVBLOCK_RETURN_IF_ERROR(RequirePositive("num_pages", num_pages));
  if (num_pages >= kMaxNumPages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page table: num_pages ", num_pages, " is not below ", kMaxNumPages,
        ", the pool's limit (V page ids are num_pages + id, int32)"));
  }
  const int64_t entries = int64_t{max_batch} * 2 * max_pages_per_seq;
  if (entries > kMaxEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page table: max_batch ", max_batch, " x 2 x max_pages_per_seq ",
        max_pages_per_seq, " = ", entries, " entries, more than ", kMaxEntries,
        " (32-bit indexing)"));
  }
  std::unique_ptr<KVPageTable> table(
      new KVPageTable(max_batch, max_pages_per_seq, num_pages, device));
  const size_t bytes = static_cast<size_t>(entries) * sizeof(int32_t);
  KVBLOCK_ASSIGN_OR_RETURN(table->mirror_, device.Allocate(bytes));
  for (int i = 0; i < kStagingSlots; ++i) {
    KVBLOCK_ASSIGN_OR_RETURN(table->staging_[i], device.AllocatePinned(bytes));
    KVBLOCK_ASSIGN_OR_RETURN(table->staging_done_[i], device.CreateEvent());
  }
  return table;
}

KVPageTable::KVPageTable(int32_t max_batch, int32_t max_pages_per_seq,
                         int32_t num_pages, Device& device)
    : max_batch_(max_batch),
      max_pages_per_seq_(max_pages_per_seq),
      num_pages_(num_pages),
      device_(device),
      rows_(static_cast<size_t>(RowOffset(max_batch)), kNoPage),
      lengths_(max_batch, 0),
      buffer_of_(max_batch),
      next_buffer_of_(max_batch),
      retired_slots_(max_batch),
      slot_numbers_(max_batch),
      uploaded_(rows_.size(), kNoPage),
      uploaded_lengths_(max_batch, 0),
      changed_(max_batch, 0),
      changed_from_(max_batch),
      marks_(max_batch) {
  std::iota(buffer_of_.begin(), buffer_of_.end(), 0);
  std::iota(slot_numbers_.begin(), slot_numbers_.end(), 0);
  changed_rows_.reserve(max_batch);
  dirty_rows_.reserve(max_batch);
  copy_runs_.reserve(max_batch);
  // Staging starts as garbage: the first write of a row fills all of it.
  for (std::vector<int32_t>& lengths : staged_lengths_) {
    lengths.assign(max_batch, max_pages_per_seq);
  }
}

KVPageTable::~KVPageTable() {
  for (const DeviceEvent& done : staging_done_) {
    // Nothing to report to from a destructor; a failed wait means a failed
    // device, whose copies read nothing more.
    if (done.valid()) device_.WaitEvent(done).IgnoreError();
  }
}

absl::Status KVPageTable::SetIdentity() {
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
    MarkChanged(slot);
  }
  is_identity_ = true;
  return absl::OkStatus();
}

// Inlined into SetRow(s): a valid row costs its comparisons only, not a
// call returning a Status.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status KVPageTable::ValidateRow(
    SlotId slot, const PageId* k_page_ids, int64_t count, int64_t first) const {
  if (slot < 0 || slot >= max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " is outside [0, ", max_batch_, ")"));
  }
  if (count < 0 || count > max_pages_per_seq_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, ": ", count, " page ids, want [0, max_pages_per_seq ",
        max_pages_per_seq_, "]"));
  }
  if (count > 0 && k_page_ids == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, ": null k_page_ids with count ", count));
  }
  if (first < 0 || first > std::min<int64_t>(count, Length(slot))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, ": first ", first, " is outside [0, min(count ", count,
        ", live ids ", Length(slot), ")]"));
  }
  for (int64_t i = first; i < count; ++i) {
    if (k_page_ids[i] < 0 || k_page_ids[i] >= num_pages_) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", slot, ": page id ", k_page_ids[i], " at index ",
                       i, " is outside [0, num_pages ", num_pages_, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status KVPageTable::SetRow(SlotId slot,
                                 absl::Span<const PageId> k_page_ids) {
  const int64_t count = static_cast<int64_t>(k_page_ids.size());
  KVBLOCK_RETURN_IF_ERROR(ValidateRow(slot, k_page_ids.data(), count));
  WriteRow(slot, k_page_ids.data(), static_cast<int32_t>(count));
  is_identity_ = false;
  return absl::OkStatus();
}

absl::Status KVPageTable::SetRows(
    absl::Span<const KVPageTableRowUpdate> updates) {
  const uint64_t stamp = ++stamp_;
  for (size_t i = 0; i < updates.size(); ++i) {
    const KVPageTableRowUpdate& update = updates[i];
    if (absl::Status status = ValidateRow(update.slot, update.k_page_ids,
                                          update.count, update.first);
        !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("update ", i, ": ", status.message()));
    }
    Mark& mark = marks_[update.slot];
    if (mark.stamp == stamp) {
      return absl::InvalidArgumentError(
          absl::StrCat("update ", i, ": slot ", update.slot,
                       " is already set by update ", mark.owner));
    }
    // A slot appears at most once, so i < max_batch here.
    mark = {stamp, static_cast<int32_t>(i)};
  }
  for (const KVPageTableRowUpdate& update : updates) {
    WriteRow(update.slot, update.k_page_ids, update.count, update.first);
  }
  is_identity_ = false;
  return absl::OkStatus();
}

absl::Status KVPageTable::CompactRows(absl::Span<const SlotId> old_to_new,
                                      int32_t new_batch) {
  if (old_to_new.size() != static_cast<size_t>(max_batch_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compact rows: old_to_new has ", old_to_new.size(),
                     " entries, want max_batch ", max_batch_));
  }
  if (new_batch < 0 || new_batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("compact rows: new_batch ", new_batch, " is outside [0, ",
                     max_batch_, "]"));
  }
  if (CompactInOrder(old_to_new, new_batch)) {
    is_identity_ = false;
    return absl::OkStatus();
  }
  // Validate while drafting the new slot -> buffer map in scratch: the
  // survivors take their buffers to their new slots, the retired buffers
  // fill the slots from new_batch on. No page id moves.
  const uint64_t stamp = ++stamp_;
  int32_t mapped = 0;
  SlotId next_empty = new_batch;
  for (SlotId old_slot = 0; old_slot < max_batch_; ++old_slot) {
    const SlotId new_slot = old_to_new[old_slot];
    if (new_slot == kNoSlot) {
      // More retired slots than max_batch - new_batch means a survivor is
      // missing, reported below; stop drafting past the end.
      if (next_empty < max_batch_) {
        next_buffer_of_[next_empty++] = buffer_of_[old_slot];
      }
      continue;
    }
    if (new_slot < 0 || new_slot >= new_batch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compact rows: old slot ", old_slot, " maps to ", new_slot,
          ", outside [0, new_batch ", new_batch, ") and not -1"));
    }
    Mark& mark = marks_[new_slot];
    if (mark.stamp == stamp) {
      return absl::InvalidArgumentError(
          absl::StrCat("compact rows: new slot ", new_slot,
                       " receives old slots ", mark.owner, " and ", old_slot));
    }
    mark = {stamp, old_slot};
    next_buffer_of_[new_slot] = buffer_of_[old_slot];
    ++mapped;
  }
  if (mapped != new_batch) {
    SlotId missing = 0;
    while (marks_[missing].stamp == stamp) ++missing;
    return absl::InvalidArgumentError(absl::StrCat(
        "compact rows: new slot ", missing, " receives no old slot (", mapped,
        " old slots map to new_batch ", new_batch, ")"));
  }
  // A slot changes when it gets another buffer, or keeps a retired one.
  for (SlotId slot = 0; slot < new_batch; ++slot) {
    const int32_t next = next_buffer_of_[slot];
    if (next != buffer_of_[slot] && (lengths_[next] > 0 || Length(slot) > 0)) {
      MarkChanged(slot);
    }
  }
  for (SlotId slot = new_batch; slot < max_batch_; ++slot) {
    if (Length(slot) > 0) MarkChanged(slot);
  }
  buffer_of_.swap(next_buffer_of_);
  for (SlotId slot = new_batch; slot < max_batch_; ++slot) {
    int32_t& length = lengths_[buffer_of_[slot]];
    std::fill_n(Row(slot), length, kNoPage);
    length = 0;
  }
  is_identity_ = false;
  return absl::OkStatus();
}

bool KVPageTable::CompactInOrder(absl::Span<const SlotId> old_to_new,
                                 int32_t new_batch) {
  // Order-preserving: each survivor maps to the number of survivors before
  // it. That alone proves the map valid. Between two retired slots, that is
  // a run of consecutive numbers: found and compared a run at a time (the
  // library's vectorized find and memcmp), not slot by slot. The retired
  // slots are noted for the moves below.
  const SlotId* const map = old_to_new.data();
  int32_t retired = 0;
  for (SlotId begin = 0; begin < max_batch_;) {
    const SlotId end = static_cast<SlotId>(
        std::find(map + begin, map + max_batch_, kNoSlot) - map);
    if (!std::equal(map + begin, map + end,
                    slot_numbers_.data() + begin - retired)) {
      return false;
    }
    if (end == max_batch_) break;
    retired_slots_[retired++] = end;
    begin = end + 1;
  }
  if (max_batch_ - retired != new_batch) return false;

  // Survivors move down in place, a run between retired slots at a time;
  // the retired buffers are kept in scratch and fill the slots from
  // new_batch on. Every slot from the first retired one on may change: one
  // range mark instead of a mark per row (Upload compares each with the
  // device's copy anyway).
  if (retired == 0) return true;
  changed_from_ = std::min(changed_from_, retired_slots_[0]);
  SlotId next = retired_slots_[0];
  for (int32_t r = 0; r < retired; ++r) {
    next_buffer_of_[r] = buffer_of_[retired_slots_[r]];
    const SlotId begin = retired_slots_[r] + 1;
    const SlotId end = r + 1 < retired ? retired_slots_[r + 1] : max_batch_;
    std::copy(buffer_of_.begin() + begin, buffer_of_.begin() + end,
              buffer_of_.begin() + next);
    next += end - begin;
  }
  for (int32_t i = 0; i < retired; ++i) {
    const SlotId slot = new_batch + i;
    buffer_of_[slot] = next_buffer_of_[i];
    int32_t& length = lengths_[buffer_of_[slot]];
    std::fill_n(Row(slot), length, kNoPage);
    length = 0;
  }
  return true;
}

absl::Status KVPageTable::CheckInvariants() const {
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
    KVBLOCK_RETURN_IF_ERROR(CheckRow(slot));
    if (is_identity_ && Length(slot) != max_pages_per_seq_) {
      return absl::InternalError(
          absl::StrCat("page table row ", slot, ": identity row has ",
                       Length(slot), " pages, want ", max_pages_per_seq_));
    }
    for (int32_t i = 0; is_identity_ && i < max_pages_per_seq_; ++i) {
      const PageId id = Row(slot)[i];
      if (id != RowOffset(slot) + i) {
        return absl::InternalError(
            absl::StrCat("page table row ", slot, ": identity row holds page ",
                         id, " at index ", i, ", want ", RowOffset(slot) + i));
      }
    }
  }
  if (changed_from_ < 0 || changed_from_ > max_batch_) {
    return absl::InternalError(absl::StrCat(
        "page table: rows from ", changed_from_, " on marked changed"));
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

absl::StatusOr<bool> KVPageTable::Upload(Stream stream) {
  // Only live ids reach the device; staging writes kNoPage past them.
  if (!uploaded_once_) {
    for (SlotId slot = 0; slot < max_batch_; ++slot) {
      KVBLOCK_RETURN_IF_ERROR(CheckLiveIds(slot));
    }
  } else {
    for (SlotId slot : changed_rows_) {
      if (slot < changed_from_) KVBLOCK_RETURN_IF_ERROR(CheckLiveIds(slot));
    }
    for (SlotId slot = changed_from_; slot < max_batch_; ++slot) {
      KVBLOCK_RETURN_IF_ERROR(CheckLiveIds(slot));
    }
  }

  // Plan: the rows whose K ids differ from the device's, in slot order.
  const size_t row_k_bytes = sizeof(PageId) * max_pages_per_seq_;
  dirty_rows_.clear();
  if (!uploaded_once_) {
    for (SlotId slot = 0; slot < max_batch_; ++slot) {
      dirty_rows_.push_back(slot);
    }
  } else {
    // Rows are equal when their live prefixes are (kNoPage follows both).
    const auto differs = [&](SlotId slot) {
      const int32_t length = Length(slot);
      return length != uploaded_lengths_[slot] ||
             std::memcmp(Row(slot), uploaded_.data() + RowOffset(slot),
                         sizeof(PageId) * length) != 0;
    };
    // Slot order: a scan of the flags when many rows changed (a compaction
    // marks most of the batch), a sort of the list when few did.
    const size_t candidates =
        changed_rows_.size() + static_cast<size_t>(max_batch_ - changed_from_);
    if (candidates * 8 > static_cast<size_t>(max_batch_)) {
      for (SlotId slot = 0; slot < max_batch_; ++slot) {
        if ((changed_[slot] != 0 || slot >= changed_from_) && differs(slot)) {
          dirty_rows_.push_back(slot);
        }
      }
    } else {
      for (SlotId slot : changed_rows_) {
        if (slot < changed_from_ && differs(slot)) dirty_rows_.push_back(slot);
      }
      for (SlotId slot = changed_from_; slot < max_batch_; ++slot) {
        if (differs(slot)) dirty_rows_.push_back(slot);
      }
      std::sort(dirty_rows_.begin(), dirty_rows_.end());
    }
  }
  if (dirty_rows_.empty()) {
    ForgetChanges();
    ++upload_stats_.calls;
    return false;
  }

  // The copies: runs of dirty rows, merged across gaps of at most
  // kMaxBridgedRows rows.
  copy_runs_.clear();
  int64_t copied_rows = 0;
  for (SlotId slot : dirty_rows_) {
    if (copy_runs_.empty() || slot - copy_runs_.back().end > kMaxBridgedRows) {
      copy_runs_.push_back({slot, slot});
    }
    copied_rows += slot + 1 - copy_runs_.back().end;
    copy_runs_.back().end = slot + 1;
  }

  // Stage each copied row at its own offset: K half, then V half. Past the
  // live ids only what the slot's last row there left live needs clearing.
  bool waited = false;
  KVBLOCK_ASSIGN_OR_RETURN(const int staging_slot, AcquireStaging(waited));
  int32_t* const staging = static_cast<int32_t*>(staging_[staging_slot].data());
  std::vector<int32_t>& staged_lengths = staged_lengths_[staging_slot];
  for (const CopyRun& run : copy_runs_) {
    for (SlotId slot = run.first; slot < run.end; ++slot) {
      const PageId* k_ids = Row(slot);
      const int32_t length = Length(slot);
      int32_t* const k_out = staging + 2 * RowOffset(slot);
      int32_t* const v_out = k_out + max_pages_per_seq_;
      std::copy_n(k_ids, length, k_out);
      for (int32_t i = 0; i < length; ++i) v_out[i] = k_ids[i] + num_pages_;
      const int32_t staged = staged_lengths[slot];
      if (staged > length) {
        std::fill(k_out + length, k_out + staged, kNoPage);
        std::fill(v_out + length, v_out + staged, kNoPage);
      }
      staged_lengths[slot] = length;
    }
  }

  int32_t* const mirror = static_cast<int32_t*>(mirror_.data());
  const size_t row_bytes = 2 * row_k_bytes;
  int64_t copies = 0;
  absl::Status status;
  for (const CopyRun& run : copy_runs_) {
    const int64_t offset = 2 * RowOffset(run.first);
    status = device_.CopyToDevice(staging + offset, mirror + offset,
                                  (run.end - run.first) * row_bytes, stream);
    if (!status.ok()) break;
    ++copies;
  }
  // Guard the slot even after a failed copy: earlier copies may still read
  // it.
  if (copies > 0) {
    absl::Status recorded =
        device_.RecordEvent(staging_done_[staging_slot], stream);
    if (status.ok()) status = std::move(recorded);
  }
  if (!status.ok()) {
    // The mirror may now hold some of the new rows: no longer trust the last
    // uploaded image, so that the next Upload copies everything.
    uploaded_once_ = false;
    return status;
  }

  for (SlotId slot : dirty_rows_) {
    std::copy_n(Row(slot), Length(slot), uploaded_.data() + RowOffset(slot));
    uploaded_lengths_[slot] = Length(slot);
  }
  ForgetChanges();
  uploaded_once_ = true;
  next_staging_ = (staging_slot + 1) % kStagingSlots;
  ++upload_stats_.calls;
  upload_stats_.copies += copies;
  upload_stats_.bytes += copied_rows * static_cast<int64_t>(row_bytes);
  upload_stats_.rows += copied_rows;
  upload_stats_.host_waits += waited;
  return true;
}

absl::StatusOr<absl::Span<const PageId>> KVPageTable::HostRow(
    SlotId slot) const {
  if (slot < 0 || slot >= max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host row: slot ", slot, " is outside [0, ", max_batch_, ")"));
  }
  return absl::Span<const PageId>(Row(slot), max_pages_per_seq_);
}

DeviceTensor KVPageTable::kernel_view() const {
  return DeviceTensor(static_cast<int32_t*>(mirror_.data()),
                      {max_batch_, 2, max_pages_per_seq_});
}

void KVPageTable::WriteRow(SlotId slot, const PageId* k_page_ids, int32_t count,
                           int32_t first) {
  int32_t& length = lengths_[buffer_of_[slot]];
  const int32_t old_count = length;
  if (count == 0 && old_count == 0) return;  // stays empty: no change.
  PageId* const row = Row(slot);
  if (count == first + 1) {
    row[first] = k_page_ids[first];  // a decode row: no call into memmove.
  } else if (count > first) {
    std::copy(k_page_ids + first, k_page_ids + count, row + first);
  }
  if (old_count > count) std::fill(row + count, row + old_count, kNoPage);
  length = count;
  MarkChanged(slot);
}

absl::Status KVPageTable::CheckLiveIds(SlotId slot) const {
  const int32_t length = Length(slot);
  if (length < 0 || length > max_pages_per_seq_) {
    return absl::InternalError(
        absl::StrCat("page table row ", slot, ": length ", length,
                     " is outside [0, ", max_pages_per_seq_, "]"));
  }
  const PageId* row = Row(slot);
  for (int32_t i = 0; i < length; ++i) {
    if (row[i] < 0 || row[i] >= num_pages_) {
      return absl::InternalError(
          absl::StrCat("page table row ", slot, ": entry ", i, " is ", row[i],
                       ", want a page in [0, ", num_pages_, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status KVPageTable::CheckRow(SlotId slot) const {
  KVBLOCK_RETURN_IF_ERROR(CheckLiveIds(slot));
  const int32_t length = Length(slot);
  const PageId* row = Row(slot);
  for (int32_t i = length; i < max_pages_per_seq_; ++i) {
    if (row[i] != kNoPage) {
      return absl::InternalError(
          absl::StrCat("page table row ", slot, ": entry ", i, " is ", row[i],
                       ", want -1 after ", length, " live pages"));
    }
  }
  return absl::OkStatus();
}

void KVPageTable::ForgetChanges() {
  for (SlotId slot : changed_rows_) changed_[slot] = 0;
  changed_rows_.clear();
  changed_from_ = max_batch_;
}

absl::StatusOr<int> KVPageTable::AcquireStaging(bool& waited) {
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

}  // namespace kvblock
