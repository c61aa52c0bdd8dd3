// Copyright 2026 The kvblock Authors.
//
// Randomized runs of KVPageTable against a trivially correct model: seeded
// SetRow / SetRows / CompactRows / SetIdentity calls, valid and invalid, and
// Uploads whose copies, bytes and device mirror are checked each time.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "deferred_device.h"
#include "kvblock/page_table.h"
#include "page_table_checks.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::DeferredDevice;
using ::kvblock::testing::ReadMirror;
using ::kvblock::testing::Snapshot;
using ::kvblock::testing::TableSnapshot;

constexpr int kOps = 10000;

struct Geometry {
  int32_t max_batch;
  int32_t max_pages_per_seq;
  int32_t num_pages;
};

// The model: each row is its list of live K ids.
struct Model {
  explicit Model(Geometry g)
      : geometry(g), rows(g.max_batch), uploaded(g.max_batch) {}

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

  // The copies and rows the next Upload must enqueue: the runs of rows that
  // differ from the last upload, two runs at most kMaxBridgedRows rows
  // apart as one (with the rows between).
  std::pair<int64_t, int64_t> NextUpload() const {
    int64_t copies = 0;
    int64_t rows_copied = 0;
    int64_t last_dirty = -1;  // none yet.
    for (size_t slot = 0; slot < rows.size(); ++slot) {
      if (uploaded_once && rows[slot] == uploaded[slot]) continue;
      const auto dirty = static_cast<int64_t>(slot);
      const int64_t clean_between = dirty - last_dirty - 1;
      if (last_dirty < 0 || clean_between > KVPageTable::kMaxBridgedRows) {
        ++copies;
        ++rows_copied;
      } else {
        rows_copied += clean_between + 1;
      }
      last_dirty = dirty;
    }
    return {copies, rows_copied};
  }

  Geometry geometry;
  std::vector<std::vector<PageId>> rows;
  std::vector<std::vector<PageId>> uploaded;
  bool uploaded_once = false;
};

// Drives one table and its model with random calls; the upload check is the
// caller's (it depends on the device).
class RandomRun {
 public:
  RandomRun(uint32_t seed, Geometry geometry, Device& device)
      : rng_(seed), model_(geometry) {
    absl::StatusOr<std::unique_ptr<KVPageTable>> table =
        KVPageTable::Create(geometry.max_batch, geometry.max_pages_per_seq,
                            geometry.num_pages, device);
    REQUIRE_OK(table);
    table_ = *std::move(table);
  }

  KVPageTable& table() { return *table_; }
  Model& model() { return model_; }
  int Uniform(int lo, int hi) {  // in [lo, hi].
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }

  // One random call other than Upload, checked against the model.
  void Mutate() {
    const int kind = Uniform(0, 99);
    if (kind < 30) {
      SetRow();
    } else if (kind < 50) {
      SetRows();
    } else if (kind < 62) {
      CompactRows();
    } else if (kind < 70) {
      EditBack();
    } else if (kind < 72) {
      SetIdentity();
    } else {
      Invalid();
    }
    RequireHostMatchesModel();
  }

  void RequireHostMatchesModel() {
    REQUIRE(Snapshot(*table_).rows == HostImage());
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

  void SetRow() {
    const SlotId slot = RandomSlot();
    std::vector<PageId> row = RandomRow();
    REQUIRE_OK(table_->SetRow(slot, row));
    model_.rows[slot] = std::move(row);
  }

  // Valid updates of distinct slots, with their rows.
  std::vector<std::vector<PageId>> RandomUpdates(
      std::vector<KVPageTableRowUpdate>& updates) {
    std::vector<SlotId> slots(model_.geometry.max_batch);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(Uniform(0, model_.geometry.max_batch));
    std::vector<std::vector<PageId>> rows;
    for (size_t i = 0; i < slots.size(); ++i) rows.push_back(RandomRow());
    updates.clear();
    for (size_t i = 0; i < slots.size(); ++i) {
      updates.push_back({slots[i], rows[i].empty() ? nullptr : rows[i].data(),
                         static_cast<int32_t>(rows[i].size())});
    }
    return rows;
  }

  void SetRows() {
    std::vector<KVPageTableRowUpdate> updates;
    std::vector<std::vector<PageId>> rows = RandomUpdates(updates);
    REQUIRE_OK(table_->SetRows(updates));
    for (size_t i = 0; i < updates.size(); ++i) {
      model_.rows[updates[i].slot] = std::move(rows[i]);
    }
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
    model_.rows = std::move(rows);
  }

  // A row changed and changed back: no net change.
  void EditBack() {
    const SlotId slot = RandomSlot();
    const std::vector<PageId> original = model_.rows[slot];
    REQUIRE_OK(table_->SetRow(slot, RandomRow()));
    REQUIRE_OK(table_->SetRow(slot, original));
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
    }
  }

  // A call that must fail with InvalidArgument and change nothing.
  void Invalid() {
    const Geometry& g = model_.geometry;
    const TableSnapshot before = Snapshot(*table_);
    std::vector<PageId> row = RandomRow();
    std::vector<KVPageTableRowUpdate> updates;
    const std::vector<std::vector<PageId>> storage = RandomUpdates(updates);
    std::vector<PageId> too_long(g.max_pages_per_seq + 1, 0);
    int32_t new_batch = 0;
    std::vector<SlotId> old_to_new = RandomCompaction(new_batch);
    absl::Status status;
    switch (Uniform(0, 7)) {
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
      default:  // a map of the wrong length.
        old_to_new.push_back(kNoSlot);
        if (Uniform(0, 1)) old_to_new.resize(Uniform(0, g.max_batch - 1));
        status = table_->CompactRows(old_to_new, new_batch);
        break;
    }
    INFO(status.ToString());
    REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Snapshot(*table_) == before);
  }

  std::mt19937 rng_;
  Model model_;
  std::unique_ptr<KVPageTable> table_;
};

const Geometry kGeometries[] = {
    {6, 5, 40},    // identity fits.
    {16, 3, 20},   // identity does not.
    {1, 1, 1},     // the smallest table.
    {33, 9, 500},  // longer runs.
    {80, 2, 300},  // runs far enough apart to be copied apart.
};

TEST_CASE("random calls match a model; every upload is exact", "[random]") {
  const uint32_t seed = GENERATE(1u, 2u, 3u);
  const Geometry geometry =
      GENERATE(from_range(std::begin(kGeometries), std::end(kGeometries)));
  INFO("seed " << seed << ", geometry " << geometry.max_batch << " x "
               << geometry.max_pages_per_seq << " over " << geometry.num_pages
               << " pages");
  std::unique_ptr<Device> device = Device::Host();
  RandomRun run(seed, geometry, *device);
  const int64_t row_bytes =
      2 * int64_t{geometry.max_pages_per_seq} * sizeof(int32_t);
  for (int op = 0; op < kOps; ++op) {
    INFO("op " << op);
    if (run.Uniform(0, 99) >= 30) {
      run.Mutate();
      continue;
    }
    Model& model = run.model();
    const auto [copies, rows] = model.NextUpload();
    const testing::UploadEffect effect =
        testing::UploadAndCount(run.table(), *device);
    REQUIRE(effect ==
            testing::UploadEffect{copies > 0, copies, rows * row_bytes});
    model.uploaded = model.rows;
    model.uploaded_once = true;
    REQUIRE(ReadMirror(run.table(), *device) == model.Image(model.rows));
  }
  REQUIRE_OK(run.table().CheckInvariants());
}

TEST_CASE("random calls with copies in flight: each upload lands intact",
          "[random]") {
  const uint32_t seed = GENERATE(11u, 12u, 13u);
  const Geometry geometry =
      GENERATE(from_range(std::begin(kGeometries), std::end(kGeometries)));
  INFO("seed " << seed << ", geometry " << geometry.max_batch << " x "
               << geometry.max_pages_per_seq << " over " << geometry.num_pages
               << " pages");
  DeferredDevice device;
  RandomRun run(seed, geometry, device);
  const DeviceTensor view = run.table().kernel_view();
  auto device_image = [&] {  // the deferred device's memory, as it is now.
    std::vector<int32_t> image(static_cast<size_t>(view.num_elements()));
    std::memcpy(image.data(), view.data(), view.size_bytes());
    return image;
  };
  std::deque<std::vector<int32_t>> in_flight;  // images of pending uploads.
  int64_t waits = 0;
  for (int op = 0; op < kOps; ++op) {
    INFO("op " << op);
    const int kind = run.Uniform(0, 99);
    if (kind < 55) {
      run.Mutate();
      continue;
    }
    if (kind < 70) {  // the device finishes the oldest upload.
      REQUIRE(device.RunToNextEvent() == !in_flight.empty());
      if (in_flight.empty()) continue;
      REQUIRE(device_image() == in_flight.front());
      in_flight.pop_front();
      continue;
    }
    Model& model = run.model();
    const auto [copies, rows] = model.NextUpload();
    const absl::StatusOr<bool> enqueued = run.table().Upload(nullptr);
    REQUIRE_OK(enqueued);
    REQUIRE(*enqueued == (copies > 0));
    if (copies > 0 &&
        in_flight.size() == static_cast<size_t>(KVPageTable::kStagingSlots)) {
      // Every slot was busy: the upload waited for the oldest, only.
      ++waits;
      REQUIRE(device_image() == in_flight.front());
      in_flight.pop_front();
    }
    REQUIRE(run.table().upload_stats().host_waits == waits);
    if (copies > 0) in_flight.push_back(model.Image(model.rows));
    model.uploaded = model.rows;
    model.uploaded_once = true;
  }
  while (device.RunToNextEvent()) {
    REQUIRE(device_image() == in_flight.front());
    in_flight.pop_front();
  }
  REQUIRE(in_flight.empty());
  REQUIRE(ReadMirror(run.table(), device) ==
          run.model().Image(run.model().uploaded));
}

}  // namespace
}  // namespace kvblock
