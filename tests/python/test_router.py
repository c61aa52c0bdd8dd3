# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""tools/router/kv_router.py: its index rebuilt from events alone, and
routing kvblock-sim replicas by their KV events (loopback, bounded)."""
import importlib.util
import json
import os
import pathlib
import subprocess
import threading

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

SIM = os.environ.get("KVBLOCK_SIM")
ROUTER = pathlib.Path(__file__).resolve().parents[2] / "tools" / "router" / \
    "kv_router.py"
spec = importlib.util.spec_from_file_location("kv_router", ROUTER)
kv_router = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kv_router)

needs_sim = pytest.mark.skipif(SIM is None,
                               reason="KVBLOCK_SIM (kvblock-sim) not set")


def stored(hashes, parent, tokens, salt=None, block_size=2):
    return ("BlockStored", {
        "block_hashes": hashes, "parent_block_hash": parent,
        "token_ids": tokens, "block_size": block_size, "lora_id": None,
        # As kvblock (and vLLM) send them: an entry a page, the salt at a
        # sequence's page 0 alone.
        "extra_keys": [[salt] if salt and parent is None and i == 0 else None
                       for i in range(len(hashes))]})


def test_the_index_follows_stored_removed_and_cleared_pages():
    index = kv_router.PrefixIndex(2)
    keys = kv_router.prompt_keys([1, 2, 3, 4, 5, 6, 7], 2)
    assert len(keys) == 3  # whole pages only.
    # Replica 0 stores the chain in two events; replica 1 its first page,
    # under other engine hashes (the router keys pages by their tokens).
    index.apply(0, *stored([10, 11], None, [1, 2, 3, 4]))
    index.apply(0, *stored([12], 11, [5, 6]))
    index.apply(1, *stored([99], None, [1, 2]))
    assert index.matched_pages(0, keys) == 3
    assert index.matched_pages(1, keys) == 1
    # A prefix is what counts: without the middle page, one page matches.
    index.apply(0, "BlockRemoved", {"block_hashes": [11]})
    assert index.matched_pages(0, keys) == 1
    index.apply(0, "AllBlocksCleared", {})
    assert index.matched_pages(0, keys) == 0
    assert index.matched_pages(1, keys) == 1
    # A page under a parent the index never saw cannot be placed.
    index.apply(1, *stored([7], 1234, [3, 4]))
    assert index.orphans == 1
    index.apply(1, "BlockRemoved", {"block_hashes": [5555]})
    assert index.unknown_removals == 1


def test_host_tier_pages_continue_a_prefix_and_keep_their_key():
    index = kv_router.PrefixIndex(1)
    keys = kv_router.prompt_keys([1, 2, 3, 4, 5, 6], 2)
    index.apply(0, *stored([10, 11, 12], None, [1, 2, 3, 4, 5, 6]))
    # The engine evicts pages 11 and 12 from the GPU and stores them in
    # its host tier, whose events name no parent and no tokens.
    index.apply(0, "BlockRemoved", {"block_hashes": [11, 12],
                                    "medium": "GPU"})
    index.apply(0, "BlockStored", {
        "block_hashes": [11, 12], "parent_block_hash": None,
        "token_ids": [], "block_size": 0, "lora_id": None, "medium": "CPU"})
    assert index.orphans == 0
    # The GPU's page 10, then the host tier's 11 and 12.
    assert index.matched_pages(0, keys) == 3
    assert index.gpu_blocks(0) == [10]
    # Page 11 comes back to the GPU; the host tier then drops its copy:
    # the GPU's still counts.
    index.apply(0, *stored([11], 10, [3, 4]))
    index.apply(0, "BlockRemoved", {"block_hashes": [11], "medium": "CPU"})
    assert index.matched_pages(0, keys) == 3
    index.apply(0, "BlockRemoved", {"block_hashes": [12], "medium": "CPU"})
    assert index.matched_pages(0, keys) == 2
    assert sorted(index.gpu_blocks(0)) == [10, 11]
    # A reset clears both tiers.
    index.apply(0, "AllBlocksCleared", {})
    assert index.matched_pages(0, keys) == 0 and index.gpu_blocks(0) == []
    with pytest.raises(ValueError, match="unknown medium 'DISK'"):
        index.apply(0, "BlockRemoved", {"block_hashes": [1], "medium": "DISK"})


def test_each_group_holds_its_own_pages_and_full_ones_route():
    index = kv_router.PrefixIndex(1)
    keys = kv_router.prompt_keys([1, 2, 3, 4], 2)

    def grouped(group, kind):
        kind_, f = stored([10, 11], None, [1, 2, 3, 4])
        return kind_, {**f, "medium": "GPU", "group_idx": group,
                       "kv_cache_spec_kind": kind}

    index.apply(0, *grouped(0, "full_attention"))
    index.apply(0, *grouped(1, "sliding_window"))
    assert len(index.gpu_blocks(0)) == 4  # a page of each group.
    # The window group frees its first page: the full group still has it.
    index.apply(0, "BlockRemoved", {"block_hashes": [10], "medium": "GPU",
                                    "group_idx": 1})
    assert index.matched_pages(0, keys) == 2
    index.apply(0, "BlockRemoved", {"block_hashes": [10], "medium": "GPU",
                                    "group_idx": 0})
    assert index.matched_pages(0, keys) == 0
    assert index.unknown_removals == 0


def test_salts_keep_chains_apart_and_tagged_arrays_decode():
    index = kv_router.PrefixIndex(1)
    kind, f = kv_router.decode_event(
        ["BlockStored", [1], None, [1, 2], 2, None, "GPU", None, [["t-a"]], 0,
         "full_attention", None])
    index.apply(0, kind, f)
    tokens = [1, 2, 3]
    assert index.matched_pages(0, kv_router.prompt_keys(tokens, 2, "t-a")) == 1
    assert index.matched_pages(0, kv_router.prompt_keys(tokens, 2)) == 0
    assert index.matched_pages(0, kv_router.prompt_keys(tokens, 2, "t-b")) == 0
    with pytest.raises(ValueError, match="malformed event 'BlockStored'"):
        kv_router.decode_event(["BlockStored", [1]])
    with pytest.raises(ValueError, match="unknown event type"):
        index.apply(0, "BlockMoved", {})


def multiturn_trace(tmp_path):
    path = tmp_path / "multiturn.jsonl"
    subprocess.run([SIM, "--workload=multiturn", f"--write_trace={path}"],
                   check=True, stdout=subprocess.DEVNULL)
    return kv_router.read_trace(path)


@needs_sim
def test_prefix_routing_beats_round_robin_on_a_multiturn_trace(tmp_path):
    requests = multiturn_trace(tmp_path)
    decisions = []
    prefix = kv_router.route(requests, "prefix", SIM, 4,
                             sim_flags=["--device=host"], decisions=decisions)
    rr = kv_router.route(requests, "round_robin", SIM, 4,
                         sim_flags=["--device=host"])
    for s in (prefix, rr):
        assert s["completed"] == s["requests"] == len(requests)
        assert s["orphan_pages"] == 0 and s["unknown_removals"] == 0
        # Every replica's index, from its events alone, is its cache.
        assert all(r["index_matches_cache"] for r in s["replicas"])
        # In lockstep, with nothing queued, what the router saw cached is
        # what the replica hit.
        assert s["predicted_hit_tokens"] == s["prefix_hit_tokens"]
    assert prefix["hit_rate"] > rr["hit_rate"] + 0.2
    # Each request went to a replica holding its longest cached prefix.
    assert len(decisions) == len(requests)
    for d in decisions:
        assert d["matched_pages"][d["replica"]] == max(d["matched_pages"])
    # Later turns found their conversation's pages.
    assert sum(1 for d in decisions if max(d["matched_pages"]) > 0) > \
        len(requests) / 2
    # Nobody was starved: every replica served requests.
    assert all(r["requests"] > 0 for r in prefix["replicas"])


@needs_sim
def test_the_index_works_on_raw_digests_and_tagged_arrays(tmp_path):
    requests = multiturn_trace(tmp_path)[:60]
    s = kv_router.route(requests, "prefix", SIM, 2, sim_flags=[
        "--device=host", "--kv_events_hashes=bytes",
        "--kv_events_encoding=array"])
    assert s["completed"] == len(requests)
    assert all(r["index_matches_cache"] and r["indexed_pages"] > 0
               for r in s["replicas"])


@needs_sim
def test_a_late_index_is_rebuilt_from_the_replay_socket(tmp_path):
    requests = multiturn_trace(tmp_path)[:40]
    context = zmq.Context()
    replica = kv_router.Replica(0, SIM, context, str(tmp_path),
                                ["--device=host"])
    try:
        replica.state = replica.read_state()
        live = kv_router.PrefixIndex(1)
        for request in requests:
            replica.send(request)
        replica.send({"run_until": max(r["arrival"] for r in requests) + 1})
        replica.state = replica.read_state()
        kv_router.sync_events([replica], live)
        assert replica.next_seq == replica.state["kv_event_batches"] > 0
        late = kv_router.PrefixIndex(1)
        replica.next_seq = 0
        replica.fetch_replay(late)
        assert late.entries == live.entries and late.holds == live.holds
    finally:
        replica.process.kill()
        replica.process.wait()
        replica.sub.close(linger=0)
        replica.replay.close(linger=0)
        context.term()


def test_a_replay_that_lost_the_missing_batches_is_an_error():
    # A replay socket that keeps batches 5 and 6 only: batches 0 to 4, which
    # the index lacks, are gone.
    context = zmq.Context()
    server = context.socket(zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")

    def serve():
        if not server.poll(5000):
            return
        requester, _, _ = server.recv_multipart()
        empty = msgpack.packb([0.0, [], None])
        for seq in (5, 6):
            server.send_multipart([requester, b"", seq.to_bytes(8, "big"),
                                   empty])
        end = kv_router.REPLAY_END.to_bytes(8, "big", signed=True)
        server.send_multipart([requester, b"", end, b""])

    replica = kv_router.Replica.__new__(kv_router.Replica)
    replica.index, replica.next_seq, replica.replayed = 0, 0, 0
    replica.replay = context.socket(zmq.DEALER)
    replica.replay.connect(f"tcp://127.0.0.1:{port}")
    server_thread = threading.Thread(target=serve)
    server_thread.start()
    try:
        with pytest.raises(RuntimeError,
                           match="replica 0: the replay starts at batch 5, "
                           "past batch 0"):
            replica.fetch_replay(kv_router.PrefixIndex(1))
        assert replica.next_seq == 0 and replica.replayed == 0
    finally:
        server_thread.join()
        server.close(linger=0)
        replica.replay.close(linger=0)
        context.term()


@needs_sim
def test_the_cli_reports_bad_flags_and_failing_replicas(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        kv_router.main(["--sim", SIM, "--replicas", "0"])
    assert exit_info.value.code == 2
    assert "--replicas must be at least 1, got 0" in capsys.readouterr().err
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"id": "a", "prompt": [1], "max_tokens": 1}))
    assert kv_router.main(["--sim", SIM, "--trace", str(trace), "--",
                           "--pages=0"]) == 1
    assert "bad geometry" in capsys.readouterr().err
    out = tmp_path / "summary.json"
    assert kv_router.main(["--sim", SIM, "--trace", str(trace), "--replicas",
                           "2", "--json", str(out), "--",
                           "--device=host"]) == 0
    summaries = json.loads(out.read_text())
    assert [s["policy"] for s in summaries] == ["prefix", "round_robin"]
    assert "prefix" in capsys.readouterr().out


def test_bad_inputs_are_messages_with_exit_code_2(tmp_path, capsys):
    def refused(argv, message):
        with pytest.raises(SystemExit) as exit_info:
            kv_router.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert "Traceback" not in err

    refused(["--sim", str(tmp_path / "no-sim")],
            f"--sim {tmp_path / 'no-sim'} is not an executable file")
    refused(["--sim", "/bin/true", "--trace", str(tmp_path / "none.jsonl")],
            f"--trace {tmp_path / 'none.jsonl'}: [Errno 2] No such file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    refused(["--sim", "/bin/true", "--trace", str(bad)],
            f"--trace {bad}: line 1: Expecting property name")
    # The fields the router reads, checked before any replica starts.
    for line, message in [
            ('{"id": "a", "prompt": [1]}\n[1, 2]',
             "line 2: a request is a JSON object"),
            ('{"id": "a", "max_tokens": 4}',
             'line 1: "prompt" must be a list of token ids, got None'),
            ('{"id": "a", "prompt": [1, true]}',
             'line 1: "prompt" must be a list of token ids, got [1, True]'),
            ('{"id": "a", "prompt": [1], "arrival": "5"}',
             'line 1: "arrival" must be a step, an int >= 0, got \'5\''),
            ('{"id": "a", "prompt": [1], "arrival": -1}',
             'line 1: "arrival" must be a step, an int >= 0, got -1'),
            ('{"id": "a", "prompt": [1], "cache_salt": 3}',
             'line 1: "cache_salt" must be a string'),
            ('{"prompt": [1]}', 'line 1: a request needs an "id"')]:
        bad.write_text(line + "\n")
        refused(["--sim", "/bin/true", "--trace", str(bad)],
                f"--trace {bad}: {message}")
    if SIM is not None:
        refused(["--sim", SIM, "--workload", "nope"],
                "--workload nope: kvblock-sim: unknown workload 'nope'")


def test_the_script_runs_from_any_folder(tmp_path):
    # Its default --sim is the build beside it, not one below the caller's
    # folder.
    shown = subprocess.run([str(ROUTER), "--help"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    beside = ROUTER.parents[2] / "build" / "tools" / "sim" / "kvblock-sim"
    # argparse wraps a long path at its spaces and hyphens ("kvblock-" /
    # "sim" when the checkout's folder is long, as mktemp's): compare
    # without the whitespace it wrapped with.
    assert "".join(str(beside).split()) in "".join(shown.stdout.split())
    version = subprocess.run([str(ROUTER), "--version"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    expected = os.environ["KVBLOCK_EXPECTED_VERSION"]
    assert version.stdout == f"kv_router {expected}\n"
