# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""A Python subscriber of kvblock-sim's KV events (pyzmq and msgpack, as a
router would read vLLM's): every batch of a run, in order, decoded in both
encodings; the prefix cache rebuilt from the events alone equals the pool's
at the end, as the simulator's JSON report gives it. And a host tier's
events as the bindings hand them out (medium "CPU")."""
import json
import os
import re
import subprocess

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

SIM = os.environ.get("KVBLOCK_SIM")


def fields(event, encoding):
    """An event as (type, fields by name) in either encoding."""
    if encoding == "map":
        # The fields vLLM defaults to None are left out while nil.
        defaulted = dict.fromkeys(["extra_keys", "group_idx",
                                   "kv_cache_spec_kind",
                                   "kv_cache_spec_sliding_window"])
        return event["type"], {**defaulted, **event}
    names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids",
                             "block_size", "lora_id", "medium", "lora_name",
                             "extra_keys", "group_idx", "kv_cache_spec_kind",
                             "kv_cache_spec_sliding_window"],
             "BlockRemoved": ["block_hashes", "medium", "group_idx"],
             "AllBlocksCleared": []}[event[0]]
    assert len(event) == len(names) + 1
    return event[0], dict(zip(names, event[1:]))


@pytest.mark.skipif(SIM is None, reason="KVBLOCK_SIM (kvblock-sim) not set")
@pytest.mark.parametrize("encoding,hash_algorithm", [
    ("map", "sha256"), ("array", "sha256"), ("map", "xxh3")])
def test_a_subscriber_rebuilds_the_cache_of_a_sim_run(tmp_path, encoding,
                                                      hash_algorithm):
    report = tmp_path / "report.json"
    # A port of "*" the simulator picks and names: one picked here could be
    # taken before it binds. It waits after binding for the connect.
    sim = subprocess.Popen(
        [SIM, "--kv_events=tcp://127.0.0.1:*", "--kv_events_wait_ms=1500",
         f"--kv_events_encoding={encoding}", f"--hash={hash_algorithm}",
         f"--json={report}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    said = sim.stderr.readline().decode()
    bound = re.match(r"kvblock-sim: kv events on (\S+)$", said.strip())
    assert bound, said
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(bound[1])
    cached = set()
    expected_seq = 0
    stored = removed = 0
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    while True:
        # Until the simulator has exited and nothing more comes.
        if not poller.poll(2000 if sim.poll() is None else 500):
            if sim.poll() is not None:
                break
            continue
        topic, seq, payload = sub.recv_multipart()
        assert topic == b""
        assert int.from_bytes(seq, "big") == expected_seq  # none missed.
        expected_seq += 1
        ts, events, rank = msgpack.unpackb(payload, raw=False)
        assert ts > 0 and rank is None
        for event in events:
            kind, f = fields(event, encoding)
            if kind == "AllBlocksCleared":
                cached.clear()
            elif kind == "BlockRemoved":
                for block in f["block_hashes"]:
                    cached.remove(block)
                    removed += 1
            else:
                assert kind == "BlockStored"
                assert len(f["token_ids"]) == f["block_size"] * len(
                    f["block_hashes"])
                assert f["medium"] == "GPU"
                for block in f["block_hashes"]:
                    assert block not in cached
                    cached.add(block)
                    stored += 1
    assert sim.wait(timeout=60) == 0, sim.stderr.read().decode()
    kv = json.loads(report.read_text())["kv_events"]
    assert kv["on"] and kv["batches_published"] == expected_seq > 0
    assert kv["batches_dropped"] == 0
    assert stored > 0 and removed > 0
    assert len(cached) == kv["cached_pages"]
    xor = 0
    for block in cached:
        xor ^= block
    assert xor == kv["cached_hash_xor"]


def test_host_tier_events_are_cpu_events_with_hashes_alone():
    """A manager with a 4-page host tier: prompt A cached and freed, then
    evicted into the host tier by prompt B, and C evicting two of B's, each
    store dropping one of A's: CPU BlockStored and BlockRemoved with the
    hashes the GPU events named the pages by and nothing else, and the load
    of A's first page back a GPU BlockStored with its chain and tokens."""
    import numpy as np
    import kvblock

    config = kvblock.PagedKvConfig()
    config.num_pages, config.max_batch, config.max_pages_per_seq = 8, 8, 8
    config.page_size = 4
    options = kvblock.BlockManagerOptions()
    options.enable_kv_events = True
    options.host_pages = 4
    manager = kvblock.BlockManager(config, options)
    prompt_a = np.arange(1, 18, dtype=np.int32)
    manager.admit(1, prompt_a, cache_salt="tenant", adapter_id=9)
    manager.free(1)
    # A's KV computed (by the step's forward pass) before it is stored.
    manager.take_host_copies()
    manager.admit(2, np.arange(1000, 1032, dtype=np.int32))
    manager.free(2)
    manager.take_host_copies()
    manager.admit(3, np.arange(2000, 2008, dtype=np.int32))
    events = manager.take_kv_events()
    assert {event.medium for event in events} == {"GPU", "CPU"}
    (gpu_a,) = [event for event in events if event.medium == "GPU" and
                event.kind == "BlockStored" and event.adapter_id == 9]
    cpu = [event for event in events if event.medium == "CPU"]
    for event in cpu:
        assert event.kind in ("BlockStored", "BlockRemoved")
        assert event.parent_block_hash is None and list(event.token_ids) == []
        assert event.cache_salt == "" and event.adapter_id == 0
        assert "CPU" in repr(event)
    stored = [h for e in cpu if e.kind == "BlockStored"
              for h in e.block_hashes]
    removed = [h for e in cpu if e.kind == "BlockRemoved"
               for h in e.block_hashes]
    # A's pages stored continuation first (the device's LRU order), then two
    # of B's, each dropping the oldest of A's.
    assert stored[:4] == gpu_a.block_hashes[::-1] and len(stored) == 6
    assert removed == stored[:2]
    # A's first page again: loaded from the host tier, which is a GPU store
    # with its chain (none: a first page) and its tokens.
    manager.free(3)
    manager.take_host_copies()
    plan = manager.admit(4, prompt_a[:5], cache_salt="tenant", adapter_id=9)
    assert plan.host_hit_pages == 1 and plan.hit_pages == 1
    (load,) = [e for e in manager.take_kv_events()
               if e.medium == "GPU" and e.kind == "BlockStored"]
    assert load.block_hashes == gpu_a.block_hashes[:1]
    assert load.parent_block_hash is None
    assert list(load.token_ids) == [1, 2, 3, 4] and load.adapter_id == 9
