// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// A randomized run of KVPageTable against a trivially correct model, shared
// by the CPU random tests (host and deferred devices) and the gpu suite:
// seeded SetRow / SetRows / Apply / CompactRows / SetIdentity calls, valid
// and invalid, checked against the model after each; the caller uploads and
// checks the device image.
//
// Thread safety: none; one test thread.
#ifndef KVBLOCK_TESTS_COMMIT_PAGE_TABLE_RANDOM_RUN_H_
#define KVBLOCK_TESTS_COMMIT_PAGE_TABLE_RANDOM_RUN_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "commit/page_table_checks.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock::testing {

struct Geometry {
  int32_t max_batch;
  int32_t max_pages_per_seq;
  int32_t num_pages;
};

inline constexpr Geometry kRandomGeometries[] = {
    {6, 5, 40},    // identity fits.
    {16, 3, 20},   // identity does not.
    {1, 1, 1},     // the smallest table.
    {33, 9, 500},  // longer rows.
    {80, 2, 300},  // many rows.
};

// The model: each row is its list of live K ids; `touched` marks the rows a
// call changed (or rewrote) since the last upload.
struct PageTableModel {
  explicit PageTableModel(Geometry g)
      : geometry(g),
        rows(g.max_batch),
        uploaded(g.max_batch),
        touched(g.max_batch, false) {}

  // The device image of `r`: [max_batch, 2, max_pages_per_seq].
  std::vector<int32_t> Image(const std::vector<std::vector<PageId>>& r) const {
    std::vector<int32_t> image;
    for (const std::vector<PageId>& row : r) {
      for (int half = 0; half < 2; ++half) {
        for (int32_t i = 0; i < geometry.max_pages_per_seq; ++i) {
          const bool live = i < static_cast<int32_t>(row.size());
          image.push_back(live ? row[i] + half * geometry.num_pages : kNoPage);
        }
      }
    }
    return image;
  }

  // K entries whose value differs between the last upload and now.
  int64_t DifferingEntries() const {
    int64_t differing = 0;
    for (size_t slot = 0; slot < rows.size(); ++slot) {
      for (size_t i = 0; i < static_cast<size_t>(geometry.max_pages_per_seq);
           ++i) {
        const PageId now = i < rows[slot].size() ? rows[slot][i] : kNoPage;
        const PageId then =
            i < uploaded[slot].size() ? uploaded[slot][i] : kNoPage;
        differing += now != then;
      }
    }
    return differing;
  }

  void Touch(SlotId slot) { touched[slot] = true; }

  Geometry geometry;
  std::vector<std::vector<PageId>> rows;
  std::vector<std::vector<PageId>> uploaded;
  std::vector<bool> touched;
  bool uploaded_once = false;
};

// Drives one table and its model with random calls.
class PageTableRandomRun {
 public:
  // `staging_bytes` as KVPageTableOptions (0: the default).
  PageTableRandomRun(uint32_t seed, Geometry geometry, Device& device,
                     int64_t staging_bytes = 0)
      : rng_(seed), model_(geometry) {
    absl::StatusOr<std::unique_ptr<KVPageTable>> table = KVPageTable::Create(
        geometry.max_batch, geometry.max_pages_per_seq, geometry.num_pages,
        device, {.staging_bytes = staging_bytes});
    REQUIRE_OK(table);
    table_ = *std::move(table);
  }

  KVPageTable& table() { return *table_; }
  PageTableModel& model() { return model_; }
  int Uniform(int lo, int hi) {  // in [lo, hi].
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }

  // One random call other than Upload, checked against the model.
  void Mutate() {
    const int kind = Uniform(0, 99);
    if (kind < 25) {
      SetRow();
    } else if (kind < 40) {
      SetRows();
    } else if (kind < 50) {
      GrowRows();
    } else if (kind < 62) {
      ApplyMoves();
    } else if (kind < 70) {
      CompactRows();
    } else if (kind < 72) {
      SetIdentity();
    } else {
      Invalid();
    }
    REQUIRE(Snapshot(*table_).rows == HostImage());
  }

  // Uploads on the default stream and checks what it sent against the model:
  // something whenever a row differs from the device, nothing when no row
  // was touched, every differing entry among the entries set, and no more
  // bytes than the touched rows' ids and one range each (plus one range of
  // alignment per copy). The device image is the caller's to check.
  void UploadAndCheck(Device& device) {
    const KVPageTableUploadStats before = table_->upload_stats();
    const UploadEffect effect = UploadAndCount(*table_, device);
    const KVPageTableUploadStats& after = table_->upload_stats();
    int64_t touched_rows = 0;
    int64_t touched_ids = 0;
    for (size_t slot = 0; slot < model_.rows.size(); ++slot) {
      if (!model_.uploaded_once || model_.touched[slot]) {
        ++touched_rows;
        touched_ids += static_cast<int64_t>(model_.rows[slot].size());
      }
    }
    const int64_t differing = model_.uploaded_once
                                  ? model_.DifferingEntries()
                                  : int64_t{model_.geometry.max_batch} *
                                        model_.geometry.max_pages_per_seq;
    if (differing > 0) REQUIRE(effect.enqueued);
    if (touched_rows == 0) REQUIRE(effect == UploadEffect{false, 0, 0});
    REQUIRE(after.entries - before.entries >= differing);
    REQUIRE(after.ranges - before.ranges <= touched_rows);
    REQUIRE(effect.bytes <=
            4 * touched_ids +
                KVPageTable::kRangeBytes * (touched_rows + effect.copies));
    model_.uploaded = model_.rows;
    model_.uploaded_once = true;
    std::fill(model_.touched.begin(), model_.touched.end(), false);
  }

 private:
  SlotId RandomSlot() { return Uniform(0, model_.geometry.max_batch - 1); }

  std::vector<PageId> RandomRow() {
    std::vector<PageId> row(Uniform(0, model_.geometry.max_pages_per_seq));
    for (PageId& id : row) id = Uniform(0, model_.geometry.num_pages - 1);
    return row;
  }

  std::vector<PageId> HostImage() const {
    std::vector<PageId> image;
    for (const std::vector<PageId>& row : model_.rows) {
      image.insert(image.end(), row.begin(), row.end());
      image.insert(image.end(), model_.geometry.max_pages_per_seq - row.size(),
                   kNoPage);
    }
    return image;
  }

  std::vector<SlotId> ShuffledSlots(int32_t n) {
    std::vector<SlotId> slots(model_.geometry.max_batch);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(n);
    return slots;
  }

  void SetRow() {
    const SlotId slot = RandomSlot();
    std::vector<PageId> row = RandomRow();
    REQUIRE_OK(table_->SetRow(slot, row));
    model_.rows[slot] = std::move(row);
    model_.Touch(slot);
  }

  // Valid updates of distinct slots, rows from `rows` (whose lengths after
  // `moves`, if any, decide each update's `first`), with their rows.
  std::vector<std::vector<PageId>> RandomUpdates(
      const std::vector<std::vector<PageId>>& rows,
      std::vector<KVPageTableRowUpdate>& updates) {
    const std::vector<SlotId> slots =
        ShuffledSlots(Uniform(0, model_.geometry.max_batch));
    std::vector<std::vector<PageId>> contents;
    for (const SlotId slot : slots) {
      const std::vector<PageId>& old = rows[slot];
      if (!old.empty() && Uniform(0, 3) == 0) {
        // New ids in the middle, [first, end), the rest of the row kept (a
        // window's released pages).
        const int32_t size = static_cast<int32_t>(old.size());
        const int32_t first = Uniform(0, size - 1);
        const int32_t end = Uniform(first, size);
        std::vector<PageId> row = old;
        const std::vector<PageId> fresh = RandomRow();
        for (int32_t i = first; i < end; ++i) {
          row[i] = fresh.empty() ? old[i] : fresh[(i - first) % fresh.size()];
        }
        contents.push_back(std::move(row));
        updates.push_back({.slot = slot,
                           .k_page_ids = contents.back().data(),
                           .count = size,
                           .first = first,
                           .end = end});
        continue;
      }
      // Keep a random prefix of the row, then new ids: `first` = the prefix.
      const int32_t keep = Uniform(0, static_cast<int>(old.size()));
      std::vector<PageId> row(old.begin(), old.begin() + keep);
      const std::vector<PageId> tail = RandomRow();
      for (const PageId id : tail) {
        if (static_cast<int32_t>(row.size()) ==
            model_.geometry.max_pages_per_seq) {
          break;
        }
        row.push_back(id);
      }
      contents.push_back(std::move(row));
      const bool from_prefix = Uniform(0, 1) == 0;
      updates.push_back(
          {slot, contents.back().empty() ? nullptr : contents.back().data(),
           static_cast<int32_t>(contents.back().size()),
           from_prefix ? keep : 0});
    }
    // `contents` owns what the updates point at: fix the pointers.
    for (size_t i = 0; i < updates.size(); ++i) {
      updates[i].k_page_ids =
          contents[i].empty() ? nullptr : contents[i].data();
    }
    return contents;
  }

  void SetRows() {
    std::vector<KVPageTableRowUpdate> updates;
    std::vector<std::vector<PageId>> rows = RandomUpdates(model_.rows, updates);
    REQUIRE_OK(table_->SetRows(updates));
    for (size_t i = 0; i < updates.size(); ++i) {
      model_.rows[updates[i].slot] = std::move(rows[i]);
      model_.Touch(updates[i].slot);
    }
  }

  // A decode step: a few rows grow by one page, written from that page on.
  void GrowRows() {
    std::vector<KVPageTableRowUpdate> updates;
    std::vector<std::vector<PageId>> rows;
    rows.reserve(model_.rows.size());
    for (const SlotId slot :
         ShuffledSlots(Uniform(0, model_.geometry.max_batch))) {
      std::vector<PageId> row = model_.rows[slot];
      if (static_cast<int32_t>(row.size()) ==
          model_.geometry.max_pages_per_seq) {
        continue;
      }
      row.push_back(Uniform(0, model_.geometry.num_pages - 1));
      rows.push_back(std::move(row));
      updates.push_back({slot, rows.back().data(),
                         static_cast<int32_t>(rows.back().size()),
                         static_cast<int32_t>(rows.back().size()) - 1});
    }
    REQUIRE_OK(table_->SetRows(updates));
    for (size_t i = 0; i < updates.size(); ++i) {
      model_.rows[updates[i].slot] = rows[i];
      model_.Touch(updates[i].slot);
    }
  }

  // Valid moves: distinct sources to distinct destinations (a serving
  // step's hole filling, swaps, chains and cycles alike).
  std::vector<KVPageTableRowMove> RandomMoves() {
    const int32_t n = Uniform(0, model_.geometry.max_batch);
    const std::vector<SlotId> sources = ShuffledSlots(n);
    const std::vector<SlotId> destinations = ShuffledSlots(n);
    std::vector<KVPageTableRowMove> moves;
    for (int32_t i = 0; i < n; ++i)
      moves.push_back({sources[i], destinations[i]});
    return moves;
  }

  // The rows after `moves`: destinations get their source's row, sources no
  // move fills are empty.
  std::vector<std::vector<PageId>> Moved(
      const std::vector<KVPageTableRowMove>& moves) const {
    std::vector<std::vector<PageId>> rows = model_.rows;
    for (const KVPageTableRowMove& move : moves) rows[move.from].clear();
    for (const KVPageTableRowMove& move : moves) {
      rows[move.to] = model_.rows[move.from];
    }
    return rows;
  }

  void ApplyMoves() {
    const std::vector<KVPageTableRowMove> moves = RandomMoves();
    std::vector<std::vector<PageId>> rows = Moved(moves);
    std::vector<KVPageTableRowUpdate> updates;
    std::vector<std::vector<PageId>> contents;
    if (Uniform(0, 1) == 0) contents = RandomUpdates(rows, updates);
    REQUIRE_OK(table_->Apply({.moves = moves, .rows = updates}));
    for (const KVPageTableRowMove& move : moves) {
      if (move.from != move.to) {
        model_.Touch(move.from);
        model_.Touch(move.to);
      }
    }
    for (size_t i = 0; i < updates.size(); ++i) {
      rows[updates[i].slot] = std::move(contents[i]);
      model_.Touch(updates[i].slot);
    }
    model_.rows = std::move(rows);
  }

  // A valid old-to-new map: each slot survives with probability 2/3, in
  // order or shuffled.
  std::vector<SlotId> RandomCompaction(int32_t& new_batch) {
    std::vector<SlotId> survivors;
    for (SlotId slot = 0; slot < model_.geometry.max_batch; ++slot) {
      if (Uniform(0, 2) != 0) survivors.push_back(slot);
    }
    if (Uniform(0, 1) == 0) {
      std::shuffle(survivors.begin(), survivors.end(), rng_);
    }
    std::vector<SlotId> old_to_new(model_.geometry.max_batch, kNoSlot);
    for (size_t i = 0; i < survivors.size(); ++i) {
      old_to_new[survivors[i]] = static_cast<SlotId>(i);
    }
    new_batch = static_cast<int32_t>(survivors.size());
    return old_to_new;
  }

  void CompactRows() {
    int32_t new_batch = 0;
    const std::vector<SlotId> old_to_new = RandomCompaction(new_batch);
    REQUIRE_OK(table_->CompactRows(old_to_new, new_batch));
    std::vector<std::vector<PageId>> rows(model_.geometry.max_batch);
    for (size_t old_slot = 0; old_slot < old_to_new.size(); ++old_slot) {
      if (old_to_new[old_slot] != kNoSlot) {
        rows[old_to_new[old_slot]] = model_.rows[old_slot];
      }
    }
    // A survivor that changes slot touches both; a retired row is cleared.
    for (SlotId slot = 0; slot < model_.geometry.max_batch; ++slot) {
      if (old_to_new[slot] == slot) continue;
      model_.Touch(slot);
      if (old_to_new[slot] != kNoSlot) model_.Touch(old_to_new[slot]);
    }
    model_.rows = std::move(rows);
  }

  void SetIdentity() {
    const Geometry& g = model_.geometry;
    if (int64_t{g.max_batch} * g.max_pages_per_seq > g.num_pages) {
      const TableSnapshot before = Snapshot(*table_);
      REQUIRE_STATUS_IS(table_->SetIdentity(), kFailedPrecondition);
      REQUIRE(Snapshot(*table_) == before);
      return;
    }
    REQUIRE_OK(table_->SetIdentity());
    REQUIRE(table_->is_identity());
    for (SlotId slot = 0; slot < g.max_batch; ++slot) {
      model_.rows[slot].resize(g.max_pages_per_seq);
      std::iota(model_.rows[slot].begin(), model_.rows[slot].end(),
                slot * g.max_pages_per_seq);
      model_.Touch(slot);
    }
  }

  // A call that must fail with InvalidArgument and change nothing.
  void Invalid() {
    const Geometry& g = model_.geometry;
    const TableSnapshot before = Snapshot(*table_);
    std::vector<PageId> row = RandomRow();
    std::vector<KVPageTableRowUpdate> updates;
    const std::vector<std::vector<PageId>> storage =
        RandomUpdates(model_.rows, updates);
    std::vector<PageId> too_long(g.max_pages_per_seq + 1, 0);
    int32_t new_batch = 0;
    std::vector<SlotId> old_to_new = RandomCompaction(new_batch);
    std::vector<KVPageTableRowMove> moves = RandomMoves();
    absl::Status status;
    switch (Uniform(0, 9)) {
      case 0:  // a slot outside [0, max_batch).
        status = table_->SetRow(
            Uniform(0, 1) ? -1 - Uniform(0, 5) : g.max_batch + Uniform(0, 5),
            row);
        break;
      case 1:  // a page outside [0, num_pages), -1 included.
        if (row.empty()) row.push_back(0);
        row[Uniform(0, static_cast<int>(row.size()) - 1)] =
            Uniform(0, 1) ? kNoPage : g.num_pages + Uniform(0, 5);
        status = table_->SetRow(RandomSlot(), row);
        break;
      case 2:  // too many pages.
        status = table_->SetRow(RandomSlot(), too_long);
        break;
      case 3:  // valid updates and one slot twice.
        updates.push_back({RandomSlot(), nullptr, 0});
        updates.push_back(updates.back());
        std::shuffle(updates.begin(), updates.end(), rng_);
        status = table_->SetRows(updates);
        break;
      case 4:  // valid updates and one bad one, anywhere.
        updates.push_back(
            {RandomSlot(), too_long.data(), g.max_pages_per_seq + 1});
        std::shuffle(updates.begin(), updates.end(), rng_);
        status = table_->SetRows(updates);
        break;
      case 5:  // a new slot outside [0, new_batch), or a bad new_batch.
        switch (Uniform(0, 2)) {
          case 0:
            old_to_new[RandomSlot()] = new_batch;
            break;
          case 1:
            old_to_new[RandomSlot()] = -2 - Uniform(0, 5);
            break;
          default:
            new_batch = Uniform(0, 1) ? -1 : g.max_batch + 1;
            break;
        }
        status = table_->CompactRows(old_to_new, new_batch);
        break;
      case 6: {  // a new slot twice, or one missing.
        const auto taken = std::find_if(old_to_new.begin(), old_to_new.end(),
                                        [](SlotId s) { return s != kNoSlot; });
        if (taken == old_to_new.end() || g.max_batch == 1) {
          status = table_->CompactRows(old_to_new, new_batch + 1);
          break;
        }
        SlotId other = RandomSlot();
        if (other == taken - old_to_new.begin()) {
          other = (other + 1) % g.max_batch;
        }
        old_to_new[other] = *taken;
        status = table_->CompactRows(old_to_new, new_batch);
        break;
      }
      case 7:  // a move naming a slot outside the table.
        moves.push_back({RandomSlot(), Uniform(0, 1) ? -1 : g.max_batch});
        if (Uniform(0, 1)) std::swap(moves.back().from, moves.back().to);
        std::shuffle(moves.begin(), moves.end(), rng_);
        status = table_->Apply({.moves = moves});
        break;
      case 8:  // a slot moved from twice, or into twice.
        if (moves.empty()) moves.push_back({RandomSlot(), RandomSlot()});
        moves.push_back(moves[Uniform(0, static_cast<int>(moves.size()) - 1)]);
        if (Uniform(0, 1)) {
          moves.back().to = RandomSlot();
        } else {
          moves.back().from = RandomSlot();
        }
        std::shuffle(moves.begin(), moves.end(), rng_);
        status = table_->Apply({.moves = moves});
        break;
      default: {  // an update whose `first` passes its row after the moves.
        const std::vector<std::vector<PageId>> moved = Moved(moves);
        const SlotId slot = RandomSlot();
        const int32_t length = static_cast<int32_t>(moved[slot].size());
        std::vector<PageId> ids(g.max_pages_per_seq, 0);
        const int32_t count = g.max_pages_per_seq;
        const KVPageTableRowUpdate update{slot, ids.data(), count, length + 1};
        if (length + 1 > count) {
          // No first past the row fits: a map of the wrong length instead.
          old_to_new.push_back(kNoSlot);
          status = table_->CompactRows(old_to_new, new_batch);
          break;
        }
        status = table_->Apply({.moves = moves, .rows = {&update, 1}});
        break;
      }
    }
    INFO(status.ToString());
    REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Snapshot(*table_) == before);
  }

  std::mt19937 rng_;
  PageTableModel model_;
  std::unique_ptr<KVPageTable> table_;
};

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_COMMIT_PAGE_TABLE_RANDOM_RUN_H_
