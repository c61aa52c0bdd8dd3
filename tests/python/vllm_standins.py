# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""vLLM-shaped stand-ins for the adapter's tests, written from vLLM's public
classes (vllm-project/vllm 28be48fa944d8c58aeffd1ab1b56e27828c6b268):
KVCacheConfig, KVCacheGroupSpec, FullAttentionSpec, SlidingWindowSpec,
ChunkedLocalAttentionSpec, MambaSpec, LoRARequest, PlaceholderRange, MultiModalFeatureSpec and Request with its
block hasher, with the fields kvblock.vllm reads. No vLLM code.

Also `reference_hash`: vLLM's hash_block_tokens with its CBOR hash functions,
from cbor2 and hashlib / xxhash as vLLM's own functions compute it."""
import hashlib
from dataclasses import dataclass, field
from typing import Optional

import cbor2

try:
    import xxhash
except ImportError:  # pragma: no cover - Debian's python3-xxhash is installed.
    xxhash = None


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int = 1
    head_size: int = 1


@dataclass(frozen=True)
class SlidingWindowSpec:
    block_size: int
    sliding_window: int
    num_kv_heads: int = 1
    head_size: int = 1


@dataclass(frozen=True)
class ChunkedLocalAttentionSpec:
    block_size: int
    attention_chunk_size: int
    num_kv_heads: int = 1
    head_size: int = 1


@dataclass(frozen=True)
class MambaSpec:
    block_size: int


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: object
    is_eagle_group: bool = False


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


def make_kv_cache_config(block_size: int, num_blocks: int) -> KVCacheConfig:
    return KVCacheConfig(num_blocks, [], [
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size))])


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name


@dataclass
class PlaceholderRange:
    offset: int
    length: int


@dataclass
class MultiModalFeatureSpec:
    mm_position: PlaceholderRange
    identifier: str
    modality: str = "image"


class Request:
    """vLLM's Request as the manager reads it: block_hashes computed by its
    block hasher at creation and as output tokens are appended."""

    def __init__(self, request_id, prompt_token_ids, block_hasher=None,
                 mm_features=None, lora_request=None, cache_salt=None,
                 skip_reading_prefix_cache=False, max_tokens=16):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self._all_token_ids = list(prompt_token_ids)
        self.all_token_ids = self._all_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.mm_features = mm_features or []
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.prompt_embeds = None
        self.num_preemptions = 0
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.spec_token_ids = []
        self.max_tokens = max_tokens
        self.block_hashes = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    def append_output_token_ids(self, token_ids) -> None:
        if isinstance(token_ids, int):
            self._all_token_ids.append(token_ids)
        else:
            self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))


def reference_digest(function: str, value) -> bytes:
    data = cbor2.dumps(value, canonical=True)
    if function == "sha256_cbor":
        return hashlib.sha256(data).digest()
    return xxhash.xxh3_128_digest(data)


def reference_hash(function: str, parent: bytes, tokens, extra_keys) -> bytes:
    """hash_block_tokens(function, parent, tokens, extra_keys)."""
    return reference_digest(function, (parent, tuple(tokens), extra_keys))
