// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The kernels of kvblock/kernels.h on the host device (their CPU references),
// checked against each other, against hand-computed values and against a
// naive double-precision attention; every error path leaves memory unchanged.
#include "device/kernels_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvblock/config.h"
#include "kvblock/device.h"
#include "kvblock/kernels.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock {
namespace {

using internal::Bf16ToFloat;
using internal::FloatToBf16;
using internal::FloatToHalf;
using internal::HalfToFloat;
using internal::LoadElement;
using internal::StoreElement;

using Bytes = std::vector<unsigned char>;

// A pool and a page table on the host device.
class HostPagedKv {
 public:
  // `rows[s]` = the K pages of slot s.
  HostPagedKv(const PagedKvConfig& config,
              const std::vector<std::vector<PageId>>& rows)
      : config_(config), device_(Device::Host()) {
    REQUIRE_OK(config.Validate());
    auto buffer = device_->Allocate(
        static_cast<size_t>(config.LayerPoolBytes() * config.num_layers));
    REQUIRE_OK(buffer);
    pool_buffer_ = std::move(*buffer);
    auto table = KVPageTable::Create(config.max_batch, config.max_pages_per_seq,
                                     config.num_pages, *device_);
    REQUIRE_OK(table);
    table_ = std::move(*table);
    for (size_t slot = 0; slot < rows.size(); ++slot) {
      REQUIRE_OK(table_->SetRow(static_cast<SlotId>(slot), rows[slot]));
    }
    REQUIRE_OK(table_->Upload(nullptr));
  }

  Device& device() { return *device_; }
  const PagedKvConfig& config() const { return config_; }
  KvPool pool() const { return {config_, pool_buffer_.data()}; }
  DeviceTensor table() const { return table_->kernel_view(); }
  KvBatch batch(const std::vector<int32_t>& seq_lens) const {
    return {table(), seq_lens.data(), static_cast<int32_t>(seq_lens.size())};
  }
  PageId KPage(SlotId slot, int64_t logical_page) const {
    return (*table_->HostRow(slot))[logical_page];
  }

  unsigned char* bytes() const {
    return static_cast<unsigned char*>(pool_buffer_.data());
  }
  size_t size() const { return pool_buffer_.size_bytes(); }
  Bytes Snapshot() const { return Bytes(bytes(), bytes() + size()); }
  // Byte offset of row `in_page` of pool page `page` of layer `layer`.
  int64_t RowOffset(int32_t layer, PageId page, int64_t in_page) const {
    const int64_t row =
        (int64_t{layer} * 2 * config_.num_pages + page) * config_.page_size +
        in_page;
    return row * config_.num_kv_heads * config_.head_dim *
           DTypeSize(config_.dtype);
  }

  void FillRandomBytes(uint32_t seed) {
    std::mt19937 rng(seed);
    for (size_t i = 0; i < size(); ++i) bytes()[i] = rng() & 0xff;
  }
  // Every element uniform in [-1, 1].
  void FillRandomValues(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    const int64_t elements =
        static_cast<int64_t>(size()) / DTypeSize(config_.dtype);
    for (int64_t i = 0; i < elements; ++i) {
      StoreElement(bytes(), i, config_.dtype, uniform(rng));
    }
  }

 private:
  PagedKvConfig config_;
  std::unique_ptr<Device> device_;
  DeviceBuffer pool_buffer_;
  std::unique_ptr<KVPageTable> table_;
};

PagedKvConfig MakeConfig(DType dtype, int32_t num_pages, int32_t max_batch,
                         int32_t max_pages_per_seq, int32_t page_size,
                         int32_t num_layers, int32_t num_kv_heads,
                         int32_t head_dim) {
  PagedKvConfig config;
  config.num_pages = num_pages;
  config.max_batch = max_batch;
  config.max_pages_per_seq = max_pages_per_seq;
  config.page_size = page_size;
  config.num_layers = num_layers;
  config.num_kv_heads = num_kv_heads;
  config.head_dim = head_dim;
  config.dtype = dtype;
  return config;
}

TEST_CASE("f16 conversions round to nearest even and are exact back") {
  REQUIRE(FloatToHalf(1.0f) == 0x3c00);
  REQUIRE(FloatToHalf(-2.0f) == 0xc000);
  REQUIRE(FloatToHalf(0.0f) == 0x0000);
  REQUIRE(FloatToHalf(-0.0f) == 0x8000);
  REQUIRE(FloatToHalf(65504.0f) == 0x7bff);
  REQUIRE(FloatToHalf(65519.0f) == 0x7bff);
  REQUIRE(FloatToHalf(65520.0f) == 0x7c00);  // Ties to even: infinity.
  REQUIRE(FloatToHalf(1.0f / 3.0f) == 0x3555);
  REQUIRE(FloatToHalf(1.0f + 0x1p-11f) == 0x3c00);      // Tie -> even.
  REQUIRE(FloatToHalf(1.0f + 3 * 0x1p-11f) == 0x3c02);  // Tie -> even.
  REQUIRE(FloatToHalf(0x1p-24f) == 0x0001);             // Smallest subnormal.
  REQUIRE(FloatToHalf(0x1p-25f) == 0x0000);             // Tie -> even (0).
  REQUIRE(FloatToHalf(3 * 0x1p-25f) == 0x0002);         // Tie -> even (2).
  REQUIRE(FloatToHalf(0x1p-14f) == 0x0400);             // Smallest normal.
  REQUIRE(FloatToHalf(std::numeric_limits<float>::infinity()) == 0x7c00);
  REQUIRE(std::isnan(
      HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(HalfToFloat(0x3555) == 0.333251953125f);
  REQUIRE(HalfToFloat(0x8001) == -0x1p-24f);
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto half = static_cast<uint16_t>(bits);
    if ((bits & 0x7fff) > 0x7c00) continue;  // NaN payloads.
    INFO("half bits " << bits);
    REQUIRE(FloatToHalf(HalfToFloat(half)) == half);
  }
}

TEST_CASE("bf16 conversions round to nearest even and are exact back") {
  REQUIRE(FloatToBf16(1.0f) == 0x3f80);
  REQUIRE(FloatToBf16(-3.0f) == 0xc040);
  REQUIRE(FloatToBf16(1.0f + 0x1p-8f) == 0x3f80);      // Tie -> even.
  REQUIRE(FloatToBf16(1.0f + 3 * 0x1p-8f) == 0x3f82);  // Tie -> even.
  REQUIRE(FloatToBf16(1.0f + 0x1p-9f) == 0x3f80);
  REQUIRE(Bf16ToFloat(0x3fc0) == 1.5f);
  REQUIRE(std::isnan(
      Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto bf16 = static_cast<uint16_t>(bits);
    if ((bits & 0x7fff) > 0x7f80) continue;  // NaN payloads.
    INFO("bf16 bits " << bits);
    REQUIRE(FloatToBf16(Bf16ToFloat(bf16)) == bf16);
  }
}

TEST_CASE("copy moves exactly the K and V pages of every layer") {
  HostPagedKv kv(MakeConfig(DType::kF16, 10, 2, 3, 3, 3, 2, 4), {});
  kv.FillRandomBytes(1);
  const Bytes before = kv.Snapshot();
  const std::vector<PageId> copies = {1, 6, 4, 2};
  REQUIRE_OK(CopyPages(kv.device(), kv.pool(), copies.data(), 2, nullptr));

  Bytes expected = before;
  const int64_t page_bytes = kv.config().PageBytes();
  for (int32_t layer = 0; layer < 3; ++layer) {
    for (size_t i = 0; i < copies.size(); i += 2) {
      for (PageId half : {0, 10}) {
        std::memcpy(&expected[kv.RowOffset(layer, copies[i + 1] + half, 0)],
                    &before[kv.RowOffset(layer, copies[i] + half, 0)],
                    page_bytes);
      }
    }
  }
  REQUIRE(kv.Snapshot() == expected);
}

TEST_CASE("copy of zero pairs does nothing") {
  HostPagedKv kv(MakeConfig(DType::kBf16, 4, 1, 1, 2, 1, 1, 8), {});
  kv.FillRandomBytes(2);
  const Bytes before = kv.Snapshot();
  REQUIRE_OK(CopyPages(kv.device(), kv.pool(), nullptr, 0, nullptr));
  REQUIRE(kv.Snapshot() == before);
}

TEST_CASE("bad copies are refused and change nothing") {
  HostPagedKv kv(MakeConfig(DType::kF32, 8, 1, 1, 2, 2, 1, 4), {});
  kv.FillRandomBytes(3);
  const Bytes before = kv.Snapshot();
  auto copy = [&](const std::vector<PageId>& pairs) {
    return CopyPages(kv.device(), kv.pool(), pairs.data(),
                     static_cast<int64_t>(pairs.size() / 2), nullptr);
  };
  SECTION("source out of range") {
    REQUIRE_STATUS_IS(copy({0, 1, 8, 2}), kInvalidArgument);
  }
  SECTION("negative destination") {
    REQUIRE_STATUS_IS(copy({0, -1}), kInvalidArgument);
  }
  SECTION("repeated destination") {
    REQUIRE_STATUS_IS(copy({0, 3, 1, 3}), kInvalidArgument);
  }
  SECTION("destination that is a source") {
    REQUIRE_STATUS_IS(copy({0, 3, 3, 4}), kInvalidArgument);
    REQUIRE_STATUS_IS(copy({5, 5}), kInvalidArgument);
  }
  SECTION("bad counts and pointers") {
    const std::vector<PageId> pairs = {0, 1};
    REQUIRE_STATUS_IS(
        CopyPages(kv.device(), kv.pool(), pairs.data(), -1, nullptr),
        kInvalidArgument);
    REQUIRE_STATUS_IS(
        CopyPages(kv.device(), kv.pool(), pairs.data(), 9, nullptr),
        kInvalidArgument);
    REQUIRE_STATUS_IS(CopyPages(kv.device(), kv.pool(), nullptr, 1, nullptr),
                      kInvalidArgument);
    REQUIRE_STATUS_IS(CopyPages(kv.device(), KvPool{kv.config(), nullptr},
                                pairs.data(), 1, nullptr),
                      kInvalidArgument);
  }
  SECTION("bad dtype") {
    KvPool pool = kv.pool();
    pool.config.dtype = static_cast<DType>(7);
    const std::vector<PageId> pairs = {0, 1};
    REQUIRE_STATUS_IS(CopyPages(kv.device(), pool, pairs.data(), 1, nullptr),
                      kInvalidArgument);
  }
  REQUIRE(kv.Snapshot() == before);
}

TEST_CASE("host copies store, then load, the K and V of every layer") {
  // 6 device pages, 3 layers; a host tier of 4 pages.
  HostPagedKv kv(MakeConfig(DType::kBf16, 6, 2, 3, 2, 3, 1, 4), {});
  kv.FillRandomBytes(11);
  const PagedKvConfig& config = kv.config();
  const int64_t page_bytes = config.PageBytes();
  REQUIRE(HostPageBytes(config) == 2 * 3 * page_bytes);
  Bytes host_bytes(4 * HostPageBytes(config));
  std::mt19937 rng(12);
  for (unsigned char& b : host_bytes) b = rng() & 0xff;
  const HostKvPool host{host_bytes.data(), 4};
  const Bytes device_before = kv.Snapshot();
  const Bytes host_before = host_bytes;
  using D = HostCopy::Direction;
  // Listed load first: stores still run first, so page 2 is loaded with
  // what the store of device page 5 wrote into host page 1.
  const std::vector<HostCopy> copies = {{2, 1, D::kHostToDevice},
                                        {5, 1, D::kDeviceToHost},
                                        {0, 3, D::kDeviceToHost},
                                        {4, 0, D::kHostToDevice}};
  REQUIRE_OK(RunHostCopies(kv.device(), kv.pool(), host, copies.data(),
                           static_cast<int64_t>(copies.size()), nullptr));
  Bytes device_expected = device_before;
  Bytes host_expected = host_before;
  const auto host_at = [&](HostPageId page, int32_t layer, int32_t half) {
    return ((int64_t{page} * 3 + layer) * 2 + half) * page_bytes;
  };
  for (int32_t layer = 0; layer < 3; ++layer) {
    for (int32_t half = 0; half < 2; ++half) {
      const PageId v = half * config.num_pages;
      std::memcpy(&host_expected[host_at(1, layer, half)],
                  &device_before[kv.RowOffset(layer, 5 + v, 0)], page_bytes);
      std::memcpy(&host_expected[host_at(3, layer, half)],
                  &device_before[kv.RowOffset(layer, 0 + v, 0)], page_bytes);
      std::memcpy(&device_expected[kv.RowOffset(layer, 2 + v, 0)],
                  &host_expected[host_at(1, layer, half)], page_bytes);
      std::memcpy(&device_expected[kv.RowOffset(layer, 4 + v, 0)],
                  &host_before[host_at(0, layer, half)], page_bytes);
    }
  }
  REQUIRE(kv.Snapshot() == device_expected);
  REQUIRE(host_bytes == host_expected);
}

TEST_CASE("bad host copies are refused and change nothing") {
  HostPagedKv kv(MakeConfig(DType::kF16, 4, 1, 2, 2, 2, 1, 4), {});
  kv.FillRandomBytes(13);
  Bytes host_bytes(3 * HostPageBytes(kv.config()), 7);
  const HostKvPool host{host_bytes.data(), 3};
  const Bytes device_before = kv.Snapshot();
  const Bytes host_before = host_bytes;
  using D = HostCopy::Direction;
  auto run = [&](const std::vector<HostCopy>& copies) {
    return RunHostCopies(kv.device(), kv.pool(), host, copies.data(),
                         static_cast<int64_t>(copies.size()), nullptr);
  };
  SECTION("pages out of range") {
    REQUIRE_STATUS_IS(run({{0, 0, D::kDeviceToHost}, {4, 1, D::kDeviceToHost}}),
                      kInvalidArgument);
    const auto host_page = run({{0, 3, D::kHostToDevice}});
    REQUIRE_STATUS_IS(host_page, kInvalidArgument);
    REQUIRE(std::string(host_page.message()).find("host page 3") !=
            std::string::npos);
    REQUIRE_STATUS_IS(run({{-1, 0, D::kHostToDevice}}), kInvalidArgument);
  }
  SECTION("a page written twice in one direction") {
    REQUIRE_STATUS_IS(run({{0, 2, D::kDeviceToHost}, {1, 2, D::kDeviceToHost}}),
                      kInvalidArgument);
    REQUIRE_STATUS_IS(run({{3, 0, D::kHostToDevice}, {3, 1, D::kHostToDevice}}),
                      kInvalidArgument);
  }
  SECTION("an unknown direction") {
    REQUIRE_STATUS_IS(run({{0, 0, static_cast<D>(2)}}), kInvalidArgument);
  }
  SECTION("bad pools, counts and pointers") {
    const std::vector<HostCopy> one = {{0, 0, D::kDeviceToHost}};
    REQUIRE_STATUS_IS(
        RunHostCopies(kv.device(), kv.pool(), host, one.data(), -1, nullptr),
        kInvalidArgument);
    REQUIRE_STATUS_IS(
        RunHostCopies(kv.device(), kv.pool(), host, nullptr, 1, nullptr),
        kInvalidArgument);
    REQUIRE_STATUS_IS(RunHostCopies(kv.device(), kv.pool(), {nullptr, 3},
                                    one.data(), 1, nullptr),
                      kInvalidArgument);
    REQUIRE_STATUS_IS(
        RunHostCopies(kv.device(), kv.pool(), {host_bytes.data(), 0},
                      one.data(), 1, nullptr),
        kInvalidArgument);
    REQUIRE_STATUS_IS(
        RunHostCopies(kv.device(), kv.pool(), {host_bytes.data() + 1, 3},
                      one.data(), 1, nullptr),
        kInvalidArgument);
    REQUIRE_OK(
        RunHostCopies(kv.device(), kv.pool(), host, nullptr, 0, nullptr));
  }
  REQUIRE(kv.Snapshot() == device_before);
  REQUIRE(host_bytes == host_before);
}

TEST_CASE("write then gather round-trips for every dtype") {
  const DType dtype = GENERATE(DType::kF16, DType::kBf16, DType::kF32);
  INFO("dtype " << DTypeName(dtype));
  // Odd page size and head_dim: rows of 15 elements, no 16-byte alignment.
  const std::vector<std::vector<PageId>> rows = {
      {3, 7, 1}, {}, {0, 15, 8, 2, 9}, {4}};
  HostPagedKv kv(MakeConfig(dtype, 16, 4, 5, 3, 2, 3, 5), rows);
  kv.FillRandomBytes(4);
  const std::vector<int32_t> seq_lens = {9, 0, 14, 2};
  const int64_t row_bytes = 3 * 5 * DTypeSize(dtype);

  // Every token of every slot, in a shuffled order, with padding between.
  std::vector<SlotId> slots;
  std::vector<int32_t> positions;
  for (SlotId slot = 0; slot < 4; ++slot) {
    for (int32_t t = 0; t < seq_lens[slot]; ++t) {
      slots.push_back(slot);
      positions.push_back(t);
    }
  }
  std::mt19937 rng(5);
  std::vector<size_t> order(slots.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<SlotId> token_slots;
  std::vector<int32_t> token_positions;
  for (size_t i : order) {
    token_slots.push_back(slots[i]);
    token_positions.push_back(positions[i]);
    if (i % 4 == 0) {  // Padding: skipped whatever its position.
      token_slots.push_back(kNoSlot);
      token_positions.push_back(-5);
    }
  }
  const auto num_tokens = static_cast<int64_t>(token_slots.size());
  Bytes key(num_tokens * row_bytes);
  Bytes value(num_tokens * row_bytes);
  for (auto& byte : key) byte = rng() & 0xff;
  for (auto& byte : value) byte = rng() & 0xff;

  const Bytes before = kv.Snapshot();
  const KvTokens tokens = {key.data(), value.data(), token_slots.data(),
                           token_positions.data(), num_tokens};
  REQUIRE_OK(WriteKv(kv.device(), kv.pool(), 1, kv.table(), tokens, nullptr));

  // Only layer 1's rows of the written tokens changed.
  Bytes expected = before;
  for (int64_t i = 0; i < num_tokens; ++i) {
    if (token_slots[i] == kNoSlot) continue;
    const PageId page = kv.KPage(token_slots[i], token_positions[i] / 3);
    const int64_t in_page = token_positions[i] % 3;
    std::memcpy(&expected[kv.RowOffset(1, page, in_page)], &key[i * row_bytes],
                row_bytes);
    std::memcpy(&expected[kv.RowOffset(1, page + 16, in_page)],
                &value[i * row_bytes], row_bytes);
  }
  REQUIRE(kv.Snapshot() == expected);

  const int32_t max_len = 15;
  Bytes key_out(4 * max_len * row_bytes, 0xaa);
  Bytes value_out(4 * max_len * row_bytes, 0xaa);
  REQUIRE_OK(GatherKv(kv.device(), kv.pool(), 1, kv.batch(seq_lens), max_len,
                      key_out.data(), value_out.data(), nullptr));
  for (int64_t i = 0; i < num_tokens; ++i) {
    if (token_slots[i] == kNoSlot) continue;
    const int64_t out_row = token_slots[i] * max_len + token_positions[i];
    REQUIRE(std::memcmp(&key_out[out_row * row_bytes], &key[i * row_bytes],
                        row_bytes) == 0);
    REQUIRE(std::memcmp(&value_out[out_row * row_bytes], &value[i * row_bytes],
                        row_bytes) == 0);
  }
  for (SlotId slot = 0; slot < 4; ++slot) {
    for (int32_t t = seq_lens[slot]; t < max_len; ++t) {
      const int64_t offset = (slot * max_len + t) * row_bytes;
      REQUIRE(std::all_of(&key_out[offset], &key_out[offset + row_bytes],
                          [](unsigned char b) { return b == 0; }));
      REQUIRE(std::all_of(&value_out[offset], &value_out[offset + row_bytes],
                          [](unsigned char b) { return b == 0; }));
    }
  }
}

TEST_CASE("bad writes are refused and change nothing") {
  HostPagedKv kv(MakeConfig(DType::kBf16, 8, 2, 3, 4, 2, 1, 8), {{2, 5}, {}});
  kv.FillRandomBytes(6);
  const Bytes before = kv.Snapshot();
  const Bytes key(16 * 2, 1);
  const Bytes value(16 * 2, 2);
  std::vector<SlotId> slots = {0, 0};
  std::vector<int32_t> positions = {0, 7};
  KvTokens tokens = {key.data(), value.data(), slots.data(), positions.data(),
                     2};
  int32_t layer = 0;
  DeviceTensor table = kv.table();
  SECTION("slot out of range") { slots[1] = 2; }
  SECTION("negative slot other than padding") { slots[1] = -2; }
  SECTION("negative position") { positions[1] = -1; }
  SECTION("position past the row") { positions[1] = 12; }
  SECTION("position on an unused page") { positions[1] = 8; }
  SECTION("slot without pages") { slots[0] = 1; }
  SECTION("layer out of range") { layer = 2; }
  SECTION("table of another shape") {
    table = DeviceTensor(table.data(), {2, 2, 4});
  }
  SECTION("null pointer") { tokens.positions = nullptr; }
  SECTION("negative count") { tokens.num_tokens = -1; }
  SECTION("key not element-aligned") { tokens.key = key.data() + 1; }
  // An int32 array read off its alignment is a fault on a GPU.
  std::vector<int32_t> shifted(3);
  SECTION("slots not 4-byte aligned") {
    tokens.slots = reinterpret_cast<const SlotId*>(
        reinterpret_cast<const char*>(shifted.data()) + 1);
  }
  SECTION("table not 4-byte aligned") {
    table = DeviceTensor(
        reinterpret_cast<int32_t*>(reinterpret_cast<char*>(table.data()) + 2),
        table.shape());
  }
  REQUIRE_STATUS_IS(
      WriteKv(kv.device(), kv.pool(), layer, table, tokens, nullptr),
      kInvalidArgument);
  REQUIRE(kv.Snapshot() == before);
}

TEST_CASE("bad gathers are refused and write nothing") {
  HostPagedKv kv(MakeConfig(DType::kF16, 8, 2, 3, 4, 1, 1, 8), {{2, 5}, {}});
  kv.FillRandomBytes(7);
  std::vector<int32_t> seq_lens = {8, 0};
  int32_t max_len = 10;
  KvBatch batch = kv.batch(seq_lens);
  Bytes key_out(2 * 12 * 16, 0x55);
  Bytes value_out(2 * 12 * 16, 0x55);
  const Bytes untouched = key_out;
  SECTION("length past the live pages") { seq_lens[0] = 9; }
  SECTION("length on a slot without pages") { seq_lens[1] = 1; }
  SECTION("negative length") { seq_lens[1] = -1; }
  SECTION("length past max_len") { max_len = 7; }
  SECTION("negative max_len") { max_len = -1; }
  SECTION("batch past max_batch") { batch.batch = 3; }
  SECTION("null seq_lens") { batch.seq_lens = nullptr; }
  uint8_t* value_ptr = value_out.data();
  SECTION("output not element-aligned") { value_ptr += 1; }
  REQUIRE_STATUS_IS(GatherKv(kv.device(), kv.pool(), 0, batch, max_len,
                             key_out.data(), value_ptr, nullptr),
                    kInvalidArgument);
  REQUIRE(key_out == untouched);
  REQUIRE(value_out == untouched);
}

// Attention of slot `slot`, query head `qh`, straight from the pages in
// double precision.
std::vector<double> NaiveAttention(const HostPagedKv& kv, const Bytes& query,
                                   int32_t num_q_heads, float scale,
                                   int32_t layer, SlotId slot, int32_t len,
                                   int32_t qh, int32_t window = 0) {
  const PagedKvConfig& c = kv.config();
  const int32_t d = c.head_dim;
  const int32_t kh = qh / (num_q_heads / c.num_kv_heads);
  const int64_t elem = DTypeSize(c.dtype);
  auto element = [&](PageId page, int32_t t, int32_t i) {
    const int64_t offset =
        kv.RowOffset(layer, page, t % c.page_size) + (kh * d + i) * elem;
    return double{LoadElement(kv.bytes() + offset, 0, c.dtype)};
  };
  // A sliding window reads the last `window` tokens.
  const int32_t first = window > 0 ? std::max(0, len - window) : 0;
  std::vector<double> logits(len, -INFINITY);
  for (int32_t t = first; t < len; ++t) {
    const PageId page = kv.KPage(slot, t / c.page_size);
    double dot = 0;
    for (int32_t i = 0; i < d; ++i) {
      dot += double{LoadElement(query.data(),
                                (int64_t{slot} * num_q_heads + qh) * d + i,
                                c.dtype)} *
             element(page, t, i);
    }
    logits[t] = dot * scale;
  }
  const double max_logit =
      len == 0 ? 0 : *std::max_element(logits.begin(), logits.end());
  std::vector<double> out(d, 0.0);
  double sum = 0;
  for (int32_t t = first; t < len; ++t) {
    const double p = std::exp(logits[t] - max_logit);
    sum += p;
    const PageId v_page = kv.KPage(slot, t / c.page_size) + c.num_pages;
    for (int32_t i = 0; i < d; ++i) out[i] += p * element(v_page, t, i);
  }
  for (double& x : out) x = len == 0 ? 0 : x / sum;
  return out;
}

TEST_CASE("paged decode equals dense attention on gathered KV") {
  const DType dtype = GENERATE(DType::kF16, DType::kBf16, DType::kF32);
  const int32_t group = GENERATE(1, 4, 8);
  INFO("dtype " << DTypeName(dtype) << ", group " << group);
  const std::vector<std::vector<PageId>> rows = {
      {}, {11}, {3, 30, 17, 8}, {0, 1, 2, 39, 38, 37}};
  HostPagedKv kv(MakeConfig(dtype, 40, 4, 6, 7, 2, 2, 64), rows);
  kv.FillRandomValues(8);
  const std::vector<int32_t> seq_lens = {0, 1, 23, 42};
  const int32_t num_q_heads = 2 * group;
  const int64_t elem = DTypeSize(dtype);
  const int64_t out_bytes = 4 * num_q_heads * 64 * elem;
  Bytes query(out_bytes);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (int64_t i = 0; i < 4 * num_q_heads * 64; ++i) {
    StoreElement(query.data(), i, dtype, uniform(rng));
  }
  const DecodeQuery decode = {query.data(), num_q_heads, 0.3f};
  const int64_t workspace =
      PagedDecodeWorkspaceBytes(kv.config(), 4, num_q_heads);
  REQUIRE(workspace == 0);  // 42 tokens: one partition.

  Bytes paged(out_bytes, 0xaa);
  REQUIRE_OK(PagedDecodeAttention(kv.device(), kv.pool(), 1, kv.batch(seq_lens),
                                  decode, nullptr, 0, paged.data(), nullptr));

  const int32_t max_len = 42;
  const int64_t kv_bytes = 4 * max_len * 2 * 64 * elem;
  Bytes key(kv_bytes);
  Bytes value(kv_bytes);
  REQUIRE_OK(GatherKv(kv.device(), kv.pool(), 1, kv.batch(seq_lens), max_len,
                      key.data(), value.data(), nullptr));
  Bytes dense(out_bytes, 0x55);
  internal::DenseDecodeAttention(
      {dtype, 4, max_len, 2, 64, key.data(), value.data(), seq_lens.data()},
      decode, dense.data());
  REQUIRE(paged == dense);

  const double tolerance =
      dtype == DType::kF32 ? 1e-5 : (dtype == DType::kF16 ? 2e-3 : 1e-2);
  for (SlotId slot = 0; slot < 4; ++slot) {
    for (int32_t qh = 0; qh < num_q_heads; ++qh) {
      const std::vector<double> expected = NaiveAttention(
          kv, query, num_q_heads, 0.3f, 1, slot, seq_lens[slot], qh);
      for (int32_t i = 0; i < 64; ++i) {
        const float got = LoadElement(
            paged.data(), (int64_t{slot} * num_q_heads + qh) * 64 + i, dtype);
        INFO("slot " << slot << " head " << qh << " dim " << i);
        REQUIRE(std::abs(got - expected[i]) <= tolerance);
      }
    }
  }
}

TEST_CASE("sliding-window decode reads the window only, never the null page") {
  const DType dtype = GENERATE(DType::kF16, DType::kBf16, DType::kF32);
  const int32_t window = GENERATE(1, 7, 16, 100);
  INFO("dtype " << DTypeName(dtype) << ", window " << window);
  // Page 0 is the null page: the pages wholly before each window point at
  // it, and it holds NaNs, which any read would spread to the output.
  constexpr PageId kNull = 0;
  const std::vector<int32_t> seq_lens = {0, 5, 23, 42};
  std::vector<std::vector<PageId>> rows = {
      {}, {11}, {3, 30, 17, 8}, {20, 1, 2, 39, 38, 37}};
  for (size_t slot = 0; slot < rows.size(); ++slot) {
    const int32_t first = std::max(0, seq_lens[slot] - window);
    for (int32_t page = 0; page < first / 7; ++page) rows[slot][page] = kNull;
  }
  HostPagedKv kv(MakeConfig(dtype, 40, 4, 6, 7, 2, 2, 64), rows);
  kv.FillRandomValues(12);
  const int64_t elem = DTypeSize(dtype);
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (PageId page : {kNull, kNull + 40}) {  // its K and V page.
      for (int64_t i = 0; i < 7 * 2 * 64; ++i) {
        StoreElement(kv.bytes() + kv.RowOffset(layer, page, 0), i, dtype,
                     std::numeric_limits<float>::quiet_NaN());
      }
    }
  }
  const int32_t num_q_heads = 8;
  Bytes query(4 * num_q_heads * 64 * elem);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (int64_t i = 0; i < 4 * num_q_heads * 64; ++i) {
    StoreElement(query.data(), i, dtype, uniform(rng));
  }
  DecodeQuery decode = {query.data(), num_q_heads, 0.3f};
  decode.sliding_window = window;
  Bytes out(query.size(), 0xaa);
  REQUIRE_OK(PagedDecodeAttention(kv.device(), kv.pool(), 1, kv.batch(seq_lens),
                                  decode, nullptr, 0, out.data(), nullptr));
  const double tolerance =
      dtype == DType::kF32 ? 1e-5 : (dtype == DType::kF16 ? 2e-3 : 1e-2);
  for (SlotId slot = 0; slot < 4; ++slot) {
    for (int32_t qh = 0; qh < num_q_heads; ++qh) {
      const std::vector<double> expected = NaiveAttention(
          kv, query, num_q_heads, 0.3f, 1, slot, seq_lens[slot], qh, window);
      for (int32_t i = 0; i < 64; ++i) {
        const float got = LoadElement(
            out.data(), (int64_t{slot} * num_q_heads + qh) * 64 + i, dtype);
        INFO("slot " << slot << " head " << qh << " dim " << i);
        REQUIRE(std::abs(got - expected[i]) <= tolerance);
      }
    }
  }
}

TEST_CASE("decode workspace covers the partitions of the longest row") {
  PagedKvConfig config =
      MakeConfig(DType::kBf16, 1 << 14, 64, 32, 16, 1, 8, 128);
  // 512 tokens: one partition, no workspace.
  REQUIRE(PagedDecodeWorkspaceBytes(config, 64, 32) == 0);
  config.max_pages_per_seq = 256;  // 4096 tokens.
  // Group 4: 8 partitions of 512; batch x heads x parts x (head_dim + 2)
  // floats.
  REQUIRE(PagedDecodeWorkspaceBytes(config, 64, 32) == 64 * 32 * 8 * 130 * 4);
  // Group 32: 16 partitions of 256.
  REQUIRE(PagedDecodeWorkspaceBytes(config, 64, 256) ==
          int64_t{64} * 256 * 16 * 130 * 4);
}

TEST_CASE("decode of a row longer than a partition needs the workspace") {
  // 40 pages of 16 tokens = 640 tokens: two partitions on a GPU.
  std::vector<PageId> row(40);
  for (int32_t i = 0; i < 40; ++i) row[i] = 79 - 2 * i;
  HostPagedKv kv(MakeConfig(DType::kBf16, 80, 1, 40, 16, 1, 1, 128), {row});
  kv.FillRandomValues(10);
  const std::vector<int32_t> seq_lens = {600};
  Bytes query(4 * 128 * 2);
  for (int64_t i = 0; i < 4 * 128; ++i) {
    StoreElement(query.data(), i, DType::kBf16, std::sin(0.1f * i));
  }
  const DecodeQuery decode = {query.data(), 4, 0.125f};
  const int64_t workspace_bytes = PagedDecodeWorkspaceBytes(kv.config(), 1, 4);
  REQUIRE(workspace_bytes == 4 * 2 * 130 * 4);
  std::vector<unsigned char> workspace(workspace_bytes);
  const KvBatch batch = kv.batch(seq_lens);
  Bytes out(4 * 128 * 2);
  REQUIRE_STATUS_IS(
      PagedDecodeAttention(kv.device(), kv.pool(), 0, batch, decode,
                           workspace.data(), workspace_bytes - 1, out.data(),
                           nullptr),
      kInvalidArgument);
  REQUIRE_OK(PagedDecodeAttention(kv.device(), kv.pool(), 0, batch, decode,
                                  workspace.data(), workspace_bytes, out.data(),
                                  nullptr));
  Bytes key(600 * 128 * 2);
  Bytes value(600 * 128 * 2);
  REQUIRE_OK(GatherKv(kv.device(), kv.pool(), 0, batch, 600, key.data(),
                      value.data(), nullptr));
  Bytes dense(out.size());
  internal::DenseDecodeAttention(
      {DType::kBf16, 1, 600, 1, 128, key.data(), value.data(), seq_lens.data()},
      decode, dense.data());
  REQUIRE(out == dense);
}

TEST_CASE("bad decodes are refused and write nothing") {
  HostPagedKv kv(MakeConfig(DType::kF16, 8, 2, 2, 4, 1, 2, 64), {{1, 2}, {3}});
  kv.FillRandomValues(11);
  std::vector<int32_t> seq_lens = {8, 3};
  KvBatch batch = kv.batch(seq_lens);
  const Bytes query(2 * 4 * 64 * 2, 0);
  DecodeQuery decode = {query.data(), 4, 0.125f};
  KvPool pool = kv.pool();
  Bytes out(2 * 4 * 64 * 2, 0x33);
  const Bytes untouched = out;
  SECTION("query heads not a multiple of KV heads") { decode.num_q_heads = 3; }
  SECTION("GQA group above 32") { decode.num_q_heads = 66; }
  SECTION("no query heads") { decode.num_q_heads = 0; }
  SECTION("non-finite scale") {
    decode.scale = std::numeric_limits<float>::infinity();
  }
  SECTION("negative sliding window") { decode.sliding_window = -1; }
  SECTION("null query") { decode.query = nullptr; }
  SECTION("query not 16-byte aligned") { decode.query = query.data() + 2; }
  SECTION("length past the live pages") { seq_lens[1] = 5; }
  SECTION("negative length") { seq_lens[0] = -3; }
  SECTION("unsupported head_dim") {
    pool.config.head_dim = 32;  // The pool is big enough for the shape.
  }
  SECTION("batch past max_batch") { batch.batch = 3; }
  SECTION("more KV heads than the grid takes") {
    pool.config.num_kv_heads = 70000;  // rejected before any read.
    decode.num_q_heads = 70000;
  }
  SECTION("pool not 16-byte aligned") {
    pool.data = static_cast<uint8_t*>(pool.data) + 2;
  }
  void* destination = out.data();
  SECTION("out not element-aligned") { destination = out.data() + 1; }
  std::vector<int32_t> shifted(3);
  SECTION("seq_lens not 4-byte aligned") {
    std::memcpy(reinterpret_cast<char*>(shifted.data()) + 1, seq_lens.data(),
                8);
    batch.seq_lens = reinterpret_cast<const int32_t*>(
        reinterpret_cast<const char*>(shifted.data()) + 1);
  }
  REQUIRE_STATUS_IS(PagedDecodeAttention(kv.device(), pool, 0, batch, decode,
                                         nullptr, 0, destination, nullptr),
                    kInvalidArgument);
  REQUIRE(out == untouched);
}

TEST_CASE("a decode whose workspace size overflows is refused") {
  // Validate() takes this geometry; batch x heads x 65,536 partitions x
  // (head_dim + 2) floats does not fit int64, and wrapped negative it
  // passed for a workspace of 0 bytes.
  PagedKvConfig config;
  config.num_pages = 1;
  config.max_batch = 1987;
  config.max_pages_per_seq = 65535;
  config.page_size = 32768;
  config.num_kv_heads = 65535;
  config.head_dim = 64;
  config.dtype = DType::kF32;
  REQUIRE_OK(config.Validate());
  const auto device = Device::Host();
  alignas(16) static float pool_data[4];
  const KvPool pool{config, pool_data};
  std::vector<int32_t> table(1);  // the check comes before any read.
  const std::vector<int32_t> seq_lens(1987, 0);
  const KvBatch batch{DeviceTensor(table.data(), {1987, 2, 65535}),
                      seq_lens.data(), 1987};
  alignas(16) static float query[4];
  const DecodeQuery decode = {query, 2097120, 0.125f};
  alignas(16) static float out[4] = {1.f, 2.f, 3.f, 4.f};
  const absl::Status status = PagedDecodeAttention(
      *device, pool, 0, batch, decode, nullptr, 0, out, nullptr);
  REQUIRE_STATUS_IS(status, kInvalidArgument);
  REQUIRE(status.message().find("overflows int64 bytes") !=
          absl::string_view::npos);
  // Refused before anything is written.
  REQUIRE(std::vector<float>(out, out + 4) ==
          std::vector<float>{1.f, 2.f, 3.f, 4.f});
}

TEST_CASE("ToCsr writes FlashInfer's indptr, indices and last page lengths") {
  HostPagedKv kv(MakeConfig(DType::kBf16, 10, 4, 3, 4, 1, 1, 8),
                 {{5, 2, 9}, {}, {7}, {1, 3}});
  std::vector<int32_t> seq_lens = {10, 0, 4, 5};
  std::vector<int32_t> indptr(5, -7);
  std::vector<int32_t> indices(12, -7);
  std::vector<int32_t> last_page_len(4, -7);
  CsrPageIndex csr = {indptr.data(), indices.data(), 12, last_page_len.data()};
  SECTION("exact arrays") {
    REQUIRE_OK(
        ToCsr(kv.device(), kv.config(), kv.batch(seq_lens), csr, nullptr));
    REQUIRE(indptr == std::vector<int32_t>{0, 3, 3, 4, 6});
    REQUIRE(std::vector<int32_t>(indices.begin(), indices.begin() + 6) ==
            std::vector<int32_t>{5, 2, 9, 7, 1, 3});
    REQUIRE(std::all_of(indices.begin() + 6, indices.end(),
                        [](int32_t x) { return x == -7; }));
    REQUIRE(last_page_len == std::vector<int32_t>{2, 0, 4, 1});
  }
  SECTION("errors write nothing") {
    SECTION("indices capacity below batch x max_pages_per_seq") {
      csr.kv_indices_capacity = 11;
    }
    SECTION("length past the live pages") { seq_lens[3] = 9; }
    SECTION("null indptr") { csr.kv_indptr = nullptr; }
    REQUIRE_STATUS_IS(
        ToCsr(kv.device(), kv.config(), kv.batch(seq_lens), csr, nullptr),
        kInvalidArgument);
    for (const auto* array : {&indptr, &indices, &last_page_len}) {
      REQUIRE(std::all_of(array->begin(), array->end(),
                          [](int32_t x) { return x == -7; }));
    }
  }
}

}  // namespace
}  // namespace kvblock
