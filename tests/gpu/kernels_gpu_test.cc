// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Every CUDA kernel of kvblock/kernels.h against its CPU reference (the same
// call on the host device) over a grid of shapes: all dtypes, odd page sizes
// and head sizes (unaligned rows), empty and full rows, GQA ratios 1 to 32,
// lengths 1 to 32k, and batches wider than one scan block.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "device/kernels_reference.h"
#include "kvblock/config.h"
#include "kvblock/device.h"
#include "kvblock/kernels.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock {
namespace {

using Bytes = std::vector<unsigned char>;

std::unique_ptr<Device> CudaDevice() {
  absl::StatusOr<std::unique_ptr<Device>> device = Device::Cuda(0);
  REQUIRE_OK(device);
  return *std::move(device);
}

// `bytes` (at least 1) of device memory holding a copy of `data`.
DeviceBuffer ToDevice(Device& device, const void* data, size_t bytes) {
  absl::StatusOr<DeviceBuffer> buffer =
      device.Allocate(std::max<size_t>(bytes, 1));
  REQUIRE_OK(buffer);
  REQUIRE_OK(device.CopyToDevice(data, buffer->data(), bytes, nullptr));
  return *std::move(buffer);
}

template <typename T>
DeviceBuffer ToDevice(Device& device, const std::vector<T>& data) {
  return ToDevice(device, data.data(), data.size() * sizeof(T));
}

Bytes ToHost(Device& device, const void* data, size_t bytes) {
  Bytes out(bytes);
  REQUIRE_OK(device.CopyToHost(data, out.data(), bytes, nullptr));
  REQUIRE_OK(device.Synchronize(nullptr));
  return out;
}

// The same paged KV (pool contents and table rows) on the host device and on
// the GPU, to run a kernel and its reference side by side.
class PagedKvPair {
 public:
  PagedKvPair(const PagedKvConfig& config,
              const std::vector<std::vector<PageId>>& rows, uint32_t seed)
      : config_(config), host_(Device::Host()), cuda_(CudaDevice()) {
    REQUIRE_OK(config.Validate());
    host_pool_.resize(config.LayerPoolBytes() * config.num_layers);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    const int64_t elements =
        static_cast<int64_t>(host_pool_.size()) / DTypeSize(config.dtype);
    for (int64_t i = 0; i < elements; ++i) {
      internal::StoreElement(host_pool_.data(), i, config.dtype, uniform(rng));
    }
    cuda_pool_ = ToDevice(*cuda_, host_pool_);
    host_table_ = MakeTable(*host_, rows);
    cuda_table_ = MakeTable(*cuda_, rows);
  }

  const PagedKvConfig& config() const { return config_; }
  Device& host() { return *host_; }
  Device& cuda() { return *cuda_; }
  KvPool host_pool() { return {config_, host_pool_.data()}; }
  KvPool cuda_pool() { return {config_, cuda_pool_.data()}; }
  DeviceTensor host_table() const { return host_table_->kernel_view(); }
  DeviceTensor cuda_table() const { return cuda_table_->kernel_view(); }
  const Bytes& host_pool_bytes() const { return host_pool_; }
  Bytes CudaPoolBytes() {
    return ToHost(*cuda_, cuda_pool_.data(), cuda_pool_.size_bytes());
  }

 private:
  std::unique_ptr<KVPageTable> MakeTable(
      Device& device, const std::vector<std::vector<PageId>>& rows) {
    auto table =
        KVPageTable::Create(config_.max_batch, config_.max_pages_per_seq,
                            config_.num_pages, device);
    REQUIRE_OK(table);
    for (size_t slot = 0; slot < rows.size(); ++slot) {
      REQUIRE_OK((*table)->SetRow(static_cast<SlotId>(slot), rows[slot]));
    }
    REQUIRE_OK((*table)->Upload(nullptr));
    REQUIRE_OK(device.Synchronize(nullptr));
    return *std::move(table);
  }

  PagedKvConfig config_;
  std::unique_ptr<Device> host_;
  std::unique_ptr<Device> cuda_;
  Bytes host_pool_;
  DeviceBuffer cuda_pool_;
  std::unique_ptr<KVPageTable> host_table_;
  std::unique_ptr<KVPageTable> cuda_table_;
};

struct Shape {
  DType dtype;
  int32_t page_size;
  int32_t num_kv_heads;
  int32_t head_dim;
};

PagedKvConfig MakeConfig(const Shape& shape, int32_t num_pages,
                         int32_t max_batch, int32_t max_pages_per_seq,
                         int32_t num_layers) {
  PagedKvConfig config;
  config.num_pages = num_pages;
  config.max_batch = max_batch;
  config.max_pages_per_seq = max_pages_per_seq;
  config.page_size = shape.page_size;
  config.num_layers = num_layers;
  config.num_kv_heads = shape.num_kv_heads;
  config.head_dim = shape.head_dim;
  config.dtype = shape.dtype;
  return config;
}

// Random rows over distinct pages: the lengths given, each row holding just
// the pages its length needs (a length of max tokens fills the row).
std::vector<std::vector<PageId>> RandomRows(const PagedKvConfig& config,
                                            const std::vector<int32_t>& lens,
                                            std::mt19937& rng) {
  std::vector<PageId> pages(config.num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<std::vector<PageId>> rows;
  size_t next = 0;
  for (int32_t len : lens) {
    const int32_t count = (len + config.page_size - 1) / config.page_size;
    REQUIRE(next + count <= pages.size());
    rows.emplace_back(pages.begin() + next, pages.begin() + next + count);
    next += count;
  }
  return rows;
}

// Largest element difference of two arrays of `dtype`.
double MaxDifference(const Bytes& a, const Bytes& b, DType dtype) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  const int64_t n = static_cast<int64_t>(a.size()) / DTypeSize(dtype);
  for (int64_t i = 0; i < n; ++i) {
    const double x = internal::LoadElement(a.data(), i, dtype);
    const double y = internal::LoadElement(b.data(), i, dtype);
    worst = std::max(worst, std::isnan(x - y) ? INFINITY : std::abs(x - y));
  }
  return worst;
}

TEST_CASE("gpu page copy equals the reference", "[gpu]") {
  const Shape shape =
      GENERATE(Shape{DType::kBf16, 16, 8, 128}, Shape{DType::kF16, 3, 1, 13},
               Shape{DType::kF32, 17, 2, 5}, Shape{DType::kF16, 1, 3, 4});
  const int32_t num_copies = GENERATE(0, 1, 37);
  INFO("page_size " << shape.page_size << " head_dim " << shape.head_dim
                    << " copies " << num_copies);
  const PagedKvConfig config = MakeConfig(shape, 96, 1, 1, 3);
  PagedKvPair kv(config, {}, 1);
  std::mt19937 rng(2);
  std::vector<PageId> pages(config.num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  // Sources from the front, distinct destinations from the back.
  std::vector<PageId> copies;
  for (int32_t i = 0; i < num_copies; ++i) {
    copies.push_back(pages[i]);
    copies.push_back(pages[config.num_pages - 1 - i]);
  }
  const DeviceBuffer cuda_copies = ToDevice(kv.cuda(), copies);
  REQUIRE_OK(
      CopyPages(kv.host(), kv.host_pool(), copies.data(), num_copies, nullptr));
  REQUIRE_OK(CopyPages(kv.cuda(), kv.cuda_pool(),
                       static_cast<const PageId*>(cuda_copies.data()),
                       num_copies, nullptr));
  REQUIRE(kv.CudaPoolBytes() == kv.host_pool_bytes());
}

TEST_CASE("gpu host copies equal the reference", "[gpu]") {
  const Shape shape =
      GENERATE(Shape{DType::kBf16, 16, 8, 128}, Shape{DType::kF16, 3, 1, 13},
               Shape{DType::kF32, 17, 2, 5});
  const int32_t num_copies = GENERATE(0, 1, 40);
  INFO("page_size " << shape.page_size << " head_dim " << shape.head_dim
                    << " copies " << num_copies);
  const PagedKvConfig config = MakeConfig(shape, 96, 1, 1, 3);
  PagedKvPair kv(config, {}, 4);
  constexpr int32_t kHostPages = 64;
  const size_t host_bytes = kHostPages * HostPageBytes(config);
  // The same host tier contents on the host device and in pinned memory.
  Bytes host_tier(host_bytes);
  std::mt19937 rng(5);
  for (unsigned char& b : host_tier) b = rng() & 0xff;
  absl::StatusOr<PinnedBuffer> pinned = kv.cuda().AllocatePinned(host_bytes);
  REQUIRE_OK(pinned);
  std::memcpy(pinned->data(), host_tier.data(), host_bytes);
  // Alternating stores and loads over distinct pages of each direction.
  std::vector<PageId> device_pages(config.num_pages);
  std::iota(device_pages.begin(), device_pages.end(), 0);
  std::shuffle(device_pages.begin(), device_pages.end(), rng);
  std::vector<HostPageId> host_pages(kHostPages);
  std::iota(host_pages.begin(), host_pages.end(), 0);
  std::shuffle(host_pages.begin(), host_pages.end(), rng);
  std::vector<HostCopy> copies;
  for (int32_t i = 0; i < num_copies; ++i) {
    copies.push_back({device_pages[i], host_pages[i],
                      i % 2 == 0 ? HostCopy::Direction::kDeviceToHost
                                 : HostCopy::Direction::kHostToDevice});
  }
  const DeviceBuffer cuda_copies = ToDevice(kv.cuda(), copies);
  REQUIRE_OK(RunHostCopies(kv.host(), kv.host_pool(),
                           {host_tier.data(), kHostPages}, copies.data(),
                           num_copies, nullptr));
  REQUIRE_OK(RunHostCopies(
      kv.cuda(), kv.cuda_pool(), {pinned->data(), kHostPages},
      static_cast<const HostCopy*>(cuda_copies.data()), num_copies, nullptr));
  REQUIRE_OK(kv.cuda().Synchronize(nullptr));
  REQUIRE(kv.CudaPoolBytes() == kv.host_pool_bytes());
  const auto* tier = static_cast<const unsigned char*>(pinned->data());
  REQUIRE(Bytes(tier, tier + host_bytes) == host_tier);
}

TEST_CASE("gpu write and gather equal the reference", "[gpu]") {
  const Shape shape =
      GENERATE(Shape{DType::kBf16, 16, 8, 128}, Shape{DType::kF16, 5, 2, 64},
               Shape{DType::kF32, 3, 3, 7}, Shape{DType::kBf16, 17, 1, 9});
  INFO("dtype " << DTypeName(shape.dtype) << " page_size " << shape.page_size
                << " head_dim " << shape.head_dim);
  std::mt19937 rng(3);
  const int32_t max_pages = 8;
  const int32_t max_tokens = max_pages * shape.page_size;
  // An empty row, a full row, and partial ones.
  const std::vector<int32_t> lens = {0,
                                     max_tokens,
                                     1,
                                     max_tokens - 1,
                                     shape.page_size,
                                     2 * shape.page_size + 1};
  const PagedKvConfig config =
      MakeConfig(shape, 64, static_cast<int32_t>(lens.size()), max_pages, 2);
  PagedKvPair kv(config, RandomRows(config, lens, rng), 4);

  std::vector<SlotId> slots;
  std::vector<int32_t> positions;
  for (SlotId slot = 0; slot < static_cast<SlotId>(lens.size()); ++slot) {
    for (int32_t t = 0; t < lens[slot]; ++t) {
      slots.push_back(slot);
      positions.push_back(t);
      if (t % 5 == 0) {  // Padding tokens mixed in.
        slots.push_back(kNoSlot);
        positions.push_back(0);
      }
    }
  }
  const auto num_tokens = static_cast<int64_t>(slots.size());
  const int64_t row_bytes =
      int64_t{shape.num_kv_heads} * shape.head_dim * DTypeSize(shape.dtype);
  Bytes key(num_tokens * row_bytes);
  Bytes value(num_tokens * row_bytes);
  for (auto& b : key) b = rng() & 0xff;
  for (auto& b : value) b = rng() & 0xff;
  const DeviceBuffer cuda_key = ToDevice(kv.cuda(), key);
  const DeviceBuffer cuda_value = ToDevice(kv.cuda(), value);
  const DeviceBuffer cuda_slots = ToDevice(kv.cuda(), slots);
  const DeviceBuffer cuda_positions = ToDevice(kv.cuda(), positions);
  REQUIRE_OK(WriteKv(
      kv.host(), kv.host_pool(), 1, kv.host_table(),
      {key.data(), value.data(), slots.data(), positions.data(), num_tokens},
      nullptr));
  REQUIRE_OK(
      WriteKv(kv.cuda(), kv.cuda_pool(), 1, kv.cuda_table(),
              {cuda_key.data(), cuda_value.data(),
               static_cast<const SlotId*>(cuda_slots.data()),
               static_cast<const int32_t*>(cuda_positions.data()), num_tokens},
              nullptr));
  REQUIRE(kv.CudaPoolBytes() == kv.host_pool_bytes());

  const int32_t max_len = max_tokens + 3;
  const auto batch = static_cast<int32_t>(lens.size());
  const size_t out_bytes = static_cast<size_t>(batch * max_len * row_bytes);
  Bytes host_key(out_bytes);
  Bytes host_value(out_bytes);
  const DeviceBuffer cuda_lens = ToDevice(kv.cuda(), lens);
  absl::StatusOr<DeviceBuffer> cuda_key_out = kv.cuda().Allocate(out_bytes);
  absl::StatusOr<DeviceBuffer> cuda_value_out = kv.cuda().Allocate(out_bytes);
  REQUIRE_OK(cuda_key_out);
  REQUIRE_OK(cuda_value_out);
  for (int32_t layer : {0, 1}) {
    REQUIRE_OK(GatherKv(kv.host(), kv.host_pool(), layer,
                        {kv.host_table(), lens.data(), batch}, max_len,
                        host_key.data(), host_value.data(), nullptr));
    REQUIRE_OK(GatherKv(
        kv.cuda(), kv.cuda_pool(), layer,
        {kv.cuda_table(), static_cast<const int32_t*>(cuda_lens.data()), batch},
        max_len, cuda_key_out->data(), cuda_value_out->data(), nullptr));
    REQUIRE(ToHost(kv.cuda(), cuda_key_out->data(), out_bytes) == host_key);
    REQUIRE(ToHost(kv.cuda(), cuda_value_out->data(), out_bytes) == host_value);
  }
}

struct DecodeCase {
  Shape shape;
  int32_t group;
  std::vector<int32_t> lens;
  int32_t sliding_window = 0;  // > 0: the pages before it hold random KV.
};

TEST_CASE("gpu paged decode attention equals the reference", "[gpu]") {
  const DecodeCase c = GENERATE(
      DecodeCase{{DType::kBf16, 16, 2, 128}, 1, {1, 7, 300, 4096}},
      DecodeCase{{DType::kF16, 17, 1, 64}, 4, {0, 513, 1000, 17}},
      DecodeCase{{DType::kF32, 3, 2, 256}, 8, {1, 2, 33, 0}},
      DecodeCase{{DType::kBf16, 16, 4, 96}, 8, {32768, 5}},
      DecodeCase{{DType::kBf16, 5, 1, 80}, 32, {600, 1, 1024}},
      DecodeCase{{DType::kF16, 16, 8, 128},
                 4,
                 {2048, 1, 511, 512, 1536, 77, 2000, 1024}},
      DecodeCase{{DType::kF32, 16, 2, 128}, 1, {640, 1}},
      // Tensor cores keeping 8 rows (groups 8, 2, and 3 with padding
      // heads); CUDA cores with 2 query heads per thread and three
      // padding heads, 4 in four subgroups (a lane of 64 threads),
      // 4 with four padding heads (a lane of one warp).
      DecodeCase{{DType::kBf16, 16, 2, 128}, 8, {4096, 1, 17, 513}},
      DecodeCase{{DType::kF16, 16, 1, 128}, 2, {100, 1025}},
      DecodeCase{{DType::kBf16, 7, 3, 64}, 3, {1, 700, 64}},
      DecodeCase{{DType::kF32, 16, 1, 80}, 5, {300, 2}},
      DecodeCase{{DType::kBf16, 16, 2, 256}, 16, {1500, 3}},
      DecodeCase{{DType::kF32, 16, 1, 96}, 12, {999}},
      // Tensor cores keeping 16 rows: a group over 8, a head_dim
      // that 32-dim slices do not split.
      DecodeCase{{DType::kBf16, 16, 2, 128}, 12, {2500, 16}},
      DecodeCase{{DType::kF16, 5, 1, 80}, 4, {1100, 9}},
      // Sliding windows: gpt-oss's 128 on tensor cores, over
      // partitions and within one; a window past a partition
      // edge; CUDA cores.
      DecodeCase{{DType::kBf16, 16, 2, 128}, 8, {4096, 100, 129, 1}, 128},
      DecodeCase{{DType::kF16, 16, 1, 128}, 4, {1100, 2048, 999}, 1000},
      DecodeCase{{DType::kF32, 7, 2, 64}, 1, {300, 2, 7, 8}, 7},
      DecodeCase{{DType::kBf16, 16, 2, 256}, 16, {1500, 3}, 513});
  const Shape& shape = c.shape;
  INFO("dtype " << DTypeName(shape.dtype) << " head_dim " << shape.head_dim
                << " page_size " << shape.page_size << " group " << c.group
                << " sliding_window " << c.sliding_window);
  std::mt19937 rng(5);
  const int32_t longest = *std::max_element(c.lens.begin(), c.lens.end());
  const int32_t max_pages = (longest + shape.page_size - 1) / shape.page_size;
  int32_t total_pages = 0;
  for (int32_t len : c.lens)
    total_pages += (len + shape.page_size - 1) / shape.page_size;
  const auto batch = static_cast<int32_t>(c.lens.size());
  const PagedKvConfig config =
      MakeConfig(shape, std::max(total_pages, 1) + 3, batch, max_pages, 2);
  PagedKvPair kv(config, RandomRows(config, c.lens, rng), 6);

  const int32_t num_q_heads = shape.num_kv_heads * c.group;
  const int64_t elements = int64_t{batch} * num_q_heads * shape.head_dim;
  const size_t out_bytes =
      static_cast<size_t>(elements * DTypeSize(shape.dtype));
  Bytes query(out_bytes);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (int64_t i = 0; i < elements; ++i) {
    internal::StoreElement(query.data(), i, shape.dtype, uniform(rng));
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(shape.head_dim));
  const int64_t workspace_bytes =
      PagedDecodeWorkspaceBytes(config, batch, num_q_heads);

  Bytes host_out(out_bytes);
  Bytes host_workspace(workspace_bytes);
  REQUIRE_OK(PagedDecodeAttention(
      kv.host(), kv.host_pool(), 1, {kv.host_table(), c.lens.data(), batch},
      {query.data(), num_q_heads, scale, c.sliding_window},
      host_workspace.data(), workspace_bytes, host_out.data(), nullptr));

  const DeviceBuffer cuda_query = ToDevice(kv.cuda(), query);
  const DeviceBuffer cuda_lens = ToDevice(kv.cuda(), c.lens);
  absl::StatusOr<DeviceBuffer> workspace =
      kv.cuda().Allocate(std::max<int64_t>(workspace_bytes, 1));
  absl::StatusOr<DeviceBuffer> cuda_out = kv.cuda().Allocate(out_bytes);
  REQUIRE_OK(workspace);
  REQUIRE_OK(cuda_out);
  REQUIRE_OK(PagedDecodeAttention(
      kv.cuda(), kv.cuda_pool(), 1,
      {kv.cuda_table(), static_cast<const int32_t*>(cuda_lens.data()), batch},
      {cuda_query.data(), num_q_heads, scale, c.sliding_window},
      workspace->data(), workspace_bytes, cuda_out->data(), nullptr));
  const Bytes gpu_out = ToHost(kv.cuda(), cuda_out->data(), out_bytes);
  const double tolerance = shape.dtype == DType::kF32   ? 1e-5
                           : shape.dtype == DType::kF16 ? 2e-3
                                                        : 1.6e-2;
  REQUIRE(MaxDifference(gpu_out, host_out, shape.dtype) <= tolerance);
}

TEST_CASE("gpu ToCsr equals the reference", "[gpu]") {
  const int32_t batch = GENERATE(1, 5, 3000);
  const int32_t page_size = GENERATE(1, 16, 7);
  INFO("batch " << batch << " page_size " << page_size);
  std::mt19937 rng(7);
  const int32_t max_pages = 6;
  std::uniform_int_distribution<int32_t> length(0, max_pages * page_size);
  std::vector<int32_t> lens(batch);
  for (int32_t& len : lens) len = length(rng);
  lens[0] = max_pages * page_size;  // A full row.
  if (batch > 1) lens[1] = 0;       // An empty row.
  const PagedKvConfig config = MakeConfig(
      {DType::kBf16, page_size, 1, 8}, batch * max_pages, batch, max_pages, 1);
  PagedKvPair kv(config, RandomRows(config, lens, rng), 8);
  const int64_t capacity = int64_t{batch} * max_pages;
  std::vector<int32_t> indptr(batch + 1, -1);
  std::vector<int32_t> indices(capacity, -1);
  std::vector<int32_t> last(batch, -1);
  REQUIRE_OK(ToCsr(kv.host(), config, {kv.host_table(), lens.data(), batch},
                   {indptr.data(), indices.data(), capacity, last.data()},
                   nullptr));
  const DeviceBuffer cuda_lens = ToDevice(kv.cuda(), lens);
  const std::vector<int32_t> unset_indices(capacity, -1);
  const std::vector<int32_t> unset_last(batch, -1);
  const std::vector<int32_t> unset_indptr(batch + 1, -1);
  const DeviceBuffer cuda_indptr = ToDevice(kv.cuda(), unset_indptr);
  const DeviceBuffer cuda_indices = ToDevice(kv.cuda(), unset_indices);
  const DeviceBuffer cuda_last = ToDevice(kv.cuda(), unset_last);
  REQUIRE_OK(ToCsr(
      kv.cuda(), config,
      {kv.cuda_table(), static_cast<const int32_t*>(cuda_lens.data()), batch},
      {static_cast<int32_t*>(cuda_indptr.data()),
       static_cast<int32_t*>(cuda_indices.data()), capacity,
       static_cast<int32_t*>(cuda_last.data())},
      nullptr));
  auto to_ints = [](const Bytes& bytes) {
    std::vector<int32_t> ints(bytes.size() / sizeof(int32_t));
    std::memcpy(ints.data(), bytes.data(), bytes.size());
    return ints;
  };
  REQUIRE(to_ints(ToHost(kv.cuda(), cuda_indptr.data(),
                         cuda_indptr.size_bytes())) == indptr);
  REQUIRE(to_ints(ToHost(kv.cuda(), cuda_indices.data(),
                         cuda_indices.size_bytes())) == indices);
  REQUIRE(to_ints(ToHost(kv.cuda(), cuda_last.data(),
                         cuda_last.size_bytes())) == last);
}

}  // namespace
}  // namespace kvblock
