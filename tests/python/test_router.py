# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""tools/router/kv_router.py: its index rebuilt from events alone, and
routing kvblock-sim replicas by their KV events (loopback, bounded)."""
import importlib.util
import json
import os
import pathlib
import subprocess

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
        assert late.key_of == live.key_of and late.holds == live.holds
    finally:
        replica.process.kill()
        replica.process.wait()
        replica.sub.close(linger=0)
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
            f"--trace {bad}: Expecting property name")
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
