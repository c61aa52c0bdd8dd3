#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock.vllm.KVCacheManager against vLLM's own KVCacheManager, call for
call, on hybrid models' KV cache configs.

  PYTHONPATH=build/lib/python python3 tools/bench/vllm_check.py \\
      --vllm-src DIR [--seeds 20]

DIR holds vLLM's `vllm` package (vllm-project/vllm
28be48fa944d8c58aeffd1ab1b56e27828c6b268), loaded as vllm_bench.py loads it.
Each config runs a scheduler-shaped loop (FCFS admissions under a token
budget with full_sequence_must_fit, chunked prefill, recompute preemption,
shared prefixes, lookahead slots on some steps) on both managers with the
same requests, and stops at the first difference in what vLLM's scheduler
sees: every call's result (block ids per group, None), prefix hits and their
token counts, free blocks, common prefix blocks, new block ids and KV cache
events. Prints one line a config and exits 1 on a difference.
"""
import argparse
import os
import random
import sys

import vllm_bench
from kvblock import vllm as kvblock_vllm

# (name, groups as (kind, block size, window or chunk), hash block size,
# use_eagle).
CONFIGS = (
    ("full", [("full", 16, 0)], 16, False),
    ("gpt-oss", [("full", 16, 0), ("swa", 16, 128)], 16, False),
    ("gemma3", [("swa", 16, 96)] * 5 + [("full", 16, 0)], 16, False),
    ("llama4", [("chunk", 16, 64), ("full", 16, 0)], 16, False),
    ("swa-only", [("swa", 16, 64)], 16, False),
    ("mixed-sizes", [("full", 32, 0), ("swa", 16, 32)], 16, False),
    ("swa-tail", [("full", 32, 0), ("swa", 8, 8)], 8, False),
    ("eagle", [("full", 16, 0), ("swa", 16, 48)], 16, True),
    ("three-kinds", [("full", 16, 0), ("swa", 16, 64), ("chunk", 16, 128)],
     16, False),
)


def make_config(interface, groups, num_blocks):
    specs = []
    for kind, size, extent in groups:
        common = dict(block_size=size, num_kv_heads=1, head_size=1,
                      dtype=None)
        if kind == "full":
            spec = interface.FullAttentionSpec(**common)
        elif kind == "swa":
            spec = interface.SlidingWindowSpec(sliding_window=extent,
                                               **common)
        else:
            spec = interface.ChunkedLocalAttentionSpec(
                attention_chunk_size=extent, **common)
        specs.append(interface.KVCacheGroupSpec([f"layer{len(specs)}"],
                                                spec))
    return interface.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                   kv_cache_groups=specs)


def events_of(manager):
    out = []
    for event in manager.take_events():
        fields = dict(vars(event))
        fields["type"] = type(event).__name__
        out.append(fields)
    return out


def make_trace(rng, hash_block):
    shared = [rng.randrange(32000) for _ in range(rng.choice((64, 300, 700)))]
    trace = []
    for i in range(rng.randrange(40, 90)):
        prompt = (shared[:rng.randrange(len(shared) + 1)]
                  if rng.random() < 0.6 else [])
        prompt = prompt + [rng.randrange(32000)
                           for _ in range(rng.randrange(1, 600))]
        trace.append((i // 3, f"q{i}", prompt, rng.randrange(1, 120)))
    return trace


class Mismatch(Exception):
    pass


# What the runs exercised, over every seed of a config.
counts = {}


def count(what, n=1):
    counts[what] = counts.get(what, 0) + n


def check(seed, vllm_manager_class, interface, hasher_pair, name, groups,
          hash_block, eagle):
    rng = random.Random(seed)
    trace = make_trace(rng, hash_block)
    # A pool that holds a few prompts of every group: admissions wait,
    # running requests are preempted, cached blocks are evicted.
    num_blocks = rng.choice((48, 96, 256)) * len(groups)
    budget = rng.choice((64, 256, 1024))
    model_len = 4096
    config = make_config(interface, groups, num_blocks)
    managers = (
        kvblock_vllm.KVCacheManager(
            config, model_len, hash_block, max_num_batched_tokens=budget,
            use_eagle=eagle, enable_kv_cache_events=True),
        vllm_manager_class(
            config, model_len, hash_block, max_num_batched_tokens=budget,
            use_eagle=eagle, enable_kv_cache_events=True))
    subjects = [vllm_bench.Subject("x", None, h) for h in hasher_pair]
    step_log = []

    def same(what, a, b):
        if a != b:
            raise Mismatch(f"{name} seed {seed} step {len(step_log)}: {what}: "
                           f"kvblock {a!r} vLLM {b!r}")

    def ids(blocks):
        return None if blocks is None else blocks.get_block_ids()

    states = [dict(pending=list(trace), waiting=[], running=[])
              for _ in managers]
    step = 0
    while (any(s["pending"] or s["waiting"] or s["running"] for s in states)
           and step < 600):
        outcomes = []
        for kv, state, subject in zip(managers, states, subjects):
            seen = []
            outcomes.append(seen)
            pending, waiting, running = (state["pending"], state["waiting"],
                                         state["running"])
            while pending and pending[0][0] <= step:
                _, rid, prompt, max_tokens = pending.pop(0)
                waiting.append(subject.request(rid, prompt, max_tokens))
            left = budget
            scheduled = []
            lookahead = 3 if step % 5 == 0 else 0
            for r in list(running):
                if r not in running:
                    continue
                new = min(r.num_tokens - r.num_computed_tokens, left)
                if new <= 0:
                    continue
                while True:
                    got = kv.allocate_slots(r, new,
                                            num_lookahead_tokens=lookahead)
                    seen.append(("run", r.request_id, ids(got),
                                 kv.num_free_blocks if hasattr(
                                     kv, "num_free_blocks") else
                                 kv.block_pool.get_num_free_blocks()))
                    if got is not None:
                        break
                    victim, scheduled = vllm_bench.preempt_latest(
                        kv, running, waiting, scheduled)
                    if victim is r:
                        break
                if got is None:
                    continue
                scheduled.append((r, new))
                left -= new
            while waiting and left > 0:
                r = waiting[0]
                blocks_hit, hits = kv.get_computed_blocks(r)
                seen.append(("hit", r.request_id, ids(blocks_hit), hits))
                new = min(r.num_tokens - hits, left)
                got = kv.allocate_slots(r, new, hits, blocks_hit,
                                        full_sequence_must_fit=True)
                seen.append(("admit", r.request_id, ids(got)))
                if got is None:
                    break
                waiting.pop(0)
                r.num_computed_tokens = hits
                running.append(r)
                scheduled.append((r, new))
                left -= new
            if running:
                seen.append(("common", kv.get_num_common_prefix_blocks(
                    running[0].request_id)))
            for r, new in scheduled:
                r.num_computed_tokens += new
                if r.num_computed_tokens < r.num_tokens:
                    continue
                r.append(1 + (r.num_tokens * 7919) % 32000)
                if r.num_tokens - r.num_prompt_tokens >= r.max_tokens:
                    running.remove(r)
                    seen.append(("blocks", r.request_id,
                                 kv.get_block_ids(r.request_id)))
                    kv.free(r)
            seen.append(("new", kv.take_new_block_ids()))
            seen.append(("usage", round(kv.usage, 9)))
            seen.append(("events", events_of(kv)))
        for a, b in zip(*outcomes):
            same(a[0], a, b)
            if a[0] == "hit" and a[3] > 0:
                count("hits")
            elif a[0] == "run" and a[2] is None:
                count("preemptions")
            elif a[0] == "events":
                count("removed", sum(e["type"] == "BlockRemoved"
                                     for e in a[1]))
        same("calls", len(outcomes[0]), len(outcomes[1]))
        step_log.append(step)
        step += 1
    return step


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-src", required=True)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--digest-events", action="store_true",
                        help="events carry the digests' bytes "
                        "(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    vllm_class, utils, interface, hashing = vllm_bench.load_vllm(
        args.vllm_src)
    if args.digest_events:
        os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"
        sys.modules["vllm.envs"].VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False
    failed = False
    for name, groups, hash_block, eagle in CONFIGS:
        hashers = (kvblock_vllm.get_request_block_hasher(hash_block,
                                                         "sha256_cbor"),
                   utils.get_request_block_hasher(hash_block,
                                                  hashing.sha256_cbor))
        steps = 0
        counts.clear()
        try:
            for seed in range(args.seeds):
                steps += check(seed, vllm_class, interface, hashers, name,
                               groups, hash_block, eagle)
            print(f"{name}: {args.seeds} seeds, {steps} steps, equal "
                  f"({counts.get('hits', 0)} prefix hits, "
                  f"{counts.get('preemptions', 0)} preemptions, "
                  f"{counts.get('removed', 0)} blocks evicted)")
        except Mismatch as error:
            print(f"{name}: DIFFERS: {error}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
