// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// A program outside the project, built only through `pkg-config --cflags
// --libs kvblock` (tests/package/link_test.py): one scheduler step through
// the public API on the host device, its page table uploaded and read back.
// On a CUDA build it also asks for GPU 0, so the CUDA device and the static
// CUDA runtime must link; having no GPU is fine. Prints "consumer ok".
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"

namespace {

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  kvblock::PagedKvConfig config;
  config.num_pages = 64;
  config.max_batch = 4;
  config.max_pages_per_seq = 8;
  auto manager = kvblock::BlockManager::Create(config);
  if (!manager.ok()) return Fail("BlockManager::Create", manager.status());
  std::unique_ptr<kvblock::Device> host = kvblock::Device::Host();
  auto table = kvblock::KVPageTable::Create(
      config.max_batch, config.max_pages_per_seq, config.num_pages, *host);
  if (!table.ok()) return Fail("KVPageTable::Create", table.status());
  auto commit = kvblock::BatchCommit::Create(**manager, **table);
  if (!commit.ok()) return Fail("BatchCommit::Create", commit.status());

  // A 40-token prompt: three pages of 16 tokens.
  std::vector<kvblock::TokenId> prompt(40);
  for (int32_t i = 0; i < 40; ++i) prompt[i] = i;
  const kvblock::JoinRequest join{.id = 7, .tokens = prompt};
  auto step = (*commit)->Commit({.joins = {&join, 1}});
  if (!step.ok()) return Fail("Commit", step.status());
  if (auto uploaded = (*table)->Upload(nullptr); !uploaded.ok()) {
    return Fail("Upload", uploaded.status());
  }
  const kvblock::DeviceTensor view = (*table)->kernel_view();
  std::vector<int32_t> device_table(view.num_elements());
  if (absl::Status copied = host->CopyToHost(view.data(), device_table.data(),
                                             view.size_bytes(), nullptr);
      !copied.ok()) {
    return Fail("CopyToHost", copied);
  }
  if (absl::Status synced = host->Synchronize(nullptr); !synced.ok()) {
    return Fail("Synchronize", synced);
  }
  int32_t pages = 0;
  while (pages < config.max_pages_per_seq && device_table[pages] >= 0) ++pages;
  if (step->batch != 1 || pages != 3 ||
      device_table[config.max_pages_per_seq] !=
          device_table[0] + config.num_pages) {
    std::fprintf(stderr, "consumer: batch %d, %d pages in row 0\n", step->batch,
                 pages);
    return 1;
  }
  auto cuda = kvblock::Device::Cuda(0);
  std::printf("consumer ok (cuda: %s)\n",
              cuda.ok() ? std::string((*cuda)->name()).c_str()
                        : cuda.status().ToString().c_str());
  return 0;
}
