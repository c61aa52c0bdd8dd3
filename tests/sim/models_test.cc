// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/models.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvblock::sim {
namespace {

TEST_CASE("model presets name their KV cache groups") {
  auto llama = ModelGroups("llama", "", 16);
  REQUIRE_OK(llama);
  REQUIRE(llama->empty());
  auto gpt_oss = ModelGroups("gpt-oss", "", 16);
  REQUIRE_OK(gpt_oss);
  REQUIRE(DescribeGroups(*gpt_oss) == "full,sliding:128");
  REQUIRE((*gpt_oss)[1].page_size == 16);
  auto gemma3 = ModelGroups("gemma3", "", 16);
  REQUIRE_OK(gemma3);
  REQUIRE(DescribeGroups(*gemma3) ==
          "sliding:1024,sliding:1024,sliding:1024,sliding:1024,sliding:1024,"
          "full");
  REQUIRE(HasWindowGroup(*gemma3));
  REQUIRE(DescribeGroups(AllFullAttention(*gemma3)) ==
          "full,full,full,full,full,full");
  auto llama4 = ModelGroups("llama4", "", 16);
  REQUIRE_OK(llama4);
  REQUIRE((*llama4)[0].attention_chunk_size == 8192);
  for (const ModelPreset& preset : ModelPresets()) {
    INFO(preset.name);
    REQUIRE_OK(ModelGroups(preset.name, "", 16));
    REQUIRE_OK(ModelGroups("", preset.groups, 16));
  }
}

TEST_CASE("the flag form takes any mix and names a bad entry") {
  auto mixed = ModelGroups("", "chunked:64x2,sliding:7,full", 8);
  REQUIRE_OK(mixed);
  REQUIRE(DescribeGroups(*mixed) == "chunked:64,chunked:64,sliding:7,full");
  REQUIRE(DescribeGroups({}) == "full");
  // One full-attention group, however spelled, is the default model.
  for (const std::string one : {"full", "fullx1"}) {
    auto groups = ModelGroups("", one, 8);
    REQUIRE_OK(groups);
    REQUIRE(groups->empty());
  }
  for (const std::string bad :
       {"half", "sliding", "sliding:0", "sliding:x", "full:3", "fullx0",
        "fullx65", "chunked:8x2,full:4", "sliding:5:6", ""}) {
    INFO(bad);
    const auto status = ModelGroups("", bad.empty() ? "," : bad, 8);
    REQUIRE_STATUS_IS(status, kInvalidArgument);
    REQUIRE(std::string(status.status().message()).find("--kv_cache_groups") !=
            std::string::npos);
  }
  // The message quotes the entry as written, with what is wrong in it.
  for (const auto& [bad, message] :
       {std::pair{"full,sliding:0x10", "'sliding:0x10' has no positive"},
        std::pair{"fullx2,x2", "'x2' is not a group"},
        std::pair{"sliding:1:2", "'sliding:1:2' has more than one ':'"},
        std::pair{"sliding: 5", "'sliding: 5' has no positive"},
        std::pair{"sliding:+5", "'sliding:+5' has no positive"},
        std::pair{"sliding:5x 2", "'sliding:5x 2' repeats a group"}}) {
    INFO(bad);
    const auto status = ModelGroups("", bad, 8);
    REQUIRE_STATUS_IS(status, kInvalidArgument);
    REQUIRE(std::string(status.status().message()).find(message) !=
            std::string::npos);
  }
  const auto unknown = ModelGroups("gpt-5", "", 16);
  REQUIRE_STATUS_IS(unknown, kInvalidArgument);
  REQUIRE(std::string(unknown.status().message()).find("'gpt-5'") !=
          std::string::npos);
  REQUIRE_STATUS_IS(ModelGroups("llama", "full", 16), kInvalidArgument);
}

}  // namespace
}  // namespace kvblock::sim
