#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kv_router: a prefix-aware router over kvblock-sim replicas, fed by their KV
events in vLLM's wire format (tools/router/README.md).

It starts N `kvblock-sim --serve` replicas, subscribes to each one's KV event
stream (ZeroMQ PUB, msgpack batches, either encoding, either hash form),
indexes what each caches as page chains, and routes every request of a trace
to the replica holding its longest cached prefix (ties: the least loaded), or
round-robin, and reports the prefix-cache hit rate the replicas measured.

The replicas step in lockstep with the router: before the requests arriving
at step A are routed, every replica has run the steps before A and the router
has applied every event batch those steps published (a gap in the sequence
numbers is filled from the replica's replay socket).
"""
import argparse
import collections
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

# The helpers beside tools/ (project_version, debian_python).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from project_version import project_version  # noqa: E402

try:
    import msgpack
    import zmq
except ImportError as missing:
    if __name__ != "__main__":
        raise
    from debian_python import rerun_or_exit
    rerun_or_exit("kv_router", missing,
                  "Debian: apt-get install python3-msgpack python3-zmq")

# The simulator of the build beside this checkout, wherever it is run from.
DEFAULT_SIM = os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "tools",
    "sim", "kvblock-sim"))

BLOCK_STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids",
                       "block_size", "lora_id", "medium", "lora_name",
                       "extra_keys", "group_idx", "kv_cache_spec_kind",
                       "kv_cache_spec_sliding_window"]
BLOCK_REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]
# The fields vLLM's structs default to None: a map leaves them out while nil.
DEFAULTS_TO_NONE = ["extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window"]
REPLAY_END = -1
# The keys of pages no longer cached that a host-tier store may still name.
DROPPED_KEYS = 1 << 16


def decode_event(event):
    """An event of either encoding (a map with "type", vLLM since mid-2026, or
    a tagged array, before) as (type, fields by name), a field a map left out
    as None."""
    if isinstance(event, dict):
        return event["type"], {**dict.fromkeys(DEFAULTS_TO_NONE), **event}
    kind = event[0]
    names = {"BlockStored": BLOCK_STORED_FIELDS,
             "BlockRemoved": BLOCK_REMOVED_FIELDS,
             "AllBlocksCleared": []}.get(kind)
    if names is None or len(event) != len(names) + 1:
        raise ValueError(f"malformed event {kind!r} of {len(event)} elements")
    return kind, dict(zip(names, event[1:]))


def decode_batch(payload):
    """A batch payload `[ts, [events...], data_parallel_rank]` as its events,
    each (type, fields)."""
    ts, events, _rank = msgpack.unpackb(payload, raw=False)
    del ts
    return [decode_event(e) for e in events]


def _digest(data):
    return hashlib.blake2b(data, digest_size=8).digest()


def root_key(cache_salt="", lora_id=None):
    """The key a chain starts from: requests with another salt or adapter
    share no page."""
    return _digest(b"kvblock-router\0" + cache_salt.encode() + b"\0" +
                   str(lora_id).encode())


def page_key(parent_key, tokens):
    """The router's own key of a page: its tokens after its parent's key, so
    that equal keys mean equal prefixes whatever hash the engine uses (as
    Dynamo's router keys its radix tree by hashes of the tokens)."""
    return _digest(parent_key + struct.pack(f"<{len(tokens)}i", *tokens))


def prompt_keys(tokens, block_size, cache_salt="", lora_id=None):
    """The keys of a prompt's whole pages, in order."""
    keys = []
    key = root_key(cache_salt, lora_id)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        key = page_key(key, tokens[start:start + block_size])
        keys.append(key)
    return keys


class PrefixIndex:
    """What each replica caches, from its events alone.

    Every cached page is an entry under (medium, group, engine hash): a page
    may be cached on the GPU and in the host tier at once, and a hybrid
    model's groups each cache their own page of one hash. An entry maps to
    the router's page key (its chain of tokens). A host-tier store names no
    parent and no tokens: its key is the one the page had on the GPU, which
    `known` keeps while any entry holds the hash, and `dropped` a while
    after (the engine removes a page from the GPU before the host tier's
    store of it is sent: in the same batch here, a later one in vLLM's
    offloading). Routing matches the
    full-attention groups' pages: on the GPU, then continued in the host
    tier, as the engine's lookup continues there."""

    def __init__(self, replicas):
        # (medium, group, hash) -> [key, whether a full-attention page].
        self.entries = [dict() for _ in range(replicas)]
        # hash -> [key, entries holding it].
        self.known = [dict() for _ in range(replicas)]
        # medium -> the keys of full-attention pages held, counted.
        self.holds = [{"GPU": collections.Counter(),
                       "CPU": collections.Counter()} for _ in range(replicas)]
        # hash -> key of the last DROPPED_KEYS hashes no entry holds.
        self.dropped = [collections.OrderedDict() for _ in range(replicas)]
        self.full_groups = [dict() for _ in range(replicas)]  # group -> bool.
        self.orphans = 0  # pages stored under a parent the index lacks.
        self.unknown_removals = 0

    @staticmethod
    def _medium(f):
        medium = f.get("medium") or "GPU"  # vLLM's GPU events before media.
        if medium not in ("GPU", "CPU"):
            raise ValueError(f"unknown medium {medium!r}")
        return medium

    def _add(self, replica, medium, group, block, key, full):
        entries, known = self.entries[replica], self.known[replica]
        if (medium, group, block) in entries:  # stored again: keep one.
            return
        entries[medium, group, block] = [key, full]
        known.setdefault(block, [key, 0])[1] += 1
        if full:
            self.holds[replica][medium][key] += 1

    def _remove(self, replica, medium, group, block):
        entry = self.entries[replica].pop((medium, group, block), None)
        if entry is None:
            self.unknown_removals += 1
            return
        key, full = entry
        known = self.known[replica]
        known[block][1] -= 1
        if known[block][1] == 0:
            del known[block]
            dropped = self.dropped[replica]
            dropped[block] = key
            dropped.move_to_end(block)
            if len(dropped) > DROPPED_KEYS:
                dropped.popitem(last=False)
        if full:
            holds = self.holds[replica][medium]
            holds[key] -= 1
            if holds[key] == 0:
                del holds[key]

    def apply(self, replica, kind, f):
        if kind == "AllBlocksCleared":  # both tiers (lib/events/README.md).
            self.entries[replica].clear()
            self.known[replica].clear()
            self.dropped[replica].clear()
            for holds in self.holds[replica].values():
                holds.clear()
        elif kind == "BlockRemoved":
            medium, group = self._medium(f), f.get("group_idx") or 0
            for block in f["block_hashes"]:
                self._remove(replica, medium, group, block)
        elif kind == "BlockStored":
            self._store(replica, f)
        else:
            raise ValueError(f"unknown event type {kind!r}")

    def _store(self, replica, f):
        medium, group = self._medium(f), f.get("group_idx") or 0
        # A group's kind comes with its stores; one without is vLLM's
        # single full-attention group.
        kind = f.get("kv_cache_spec_kind")
        full = self.full_groups[replica].setdefault(
            group, kind in (None, "full_attention"))
        known = self.known[replica]
        if medium == "CPU":  # no chain: the key the page had on the GPU.
            dropped = self.dropped[replica]
            for block in f["block_hashes"]:
                key = known[block][0] if block in known else \
                    dropped.get(block)
                if key is None:
                    self.orphans += 1
                    continue
                self._add(replica, medium, group, block, key, full)
            return
        size = f["block_size"]
        tokens = f["token_ids"]
        if len(tokens) != size * len(f["block_hashes"]):
            raise ValueError("BlockStored: token_ids do not fill its pages")
        parent = f["parent_block_hash"]
        if parent is None:
            # The first page's extra keys: (salt,), or None unsalted.
            first = (f.get("extra_keys") or [None])[0]
            key = root_key(first[0] if first else "", f.get("lora_id"))
        elif parent in known:
            key = known[parent][0]
        else:
            self.orphans += len(f["block_hashes"])
            return
        for i, block in enumerate(f["block_hashes"]):
            key = page_key(key, tokens[i * size:(i + 1) * size])
            self._add(replica, medium, group, block, key, full)

    def gpu_blocks(self, replica):
        """The engine hashes of the pages cached on the replica's GPU, one
        a group's page (what its pool reports)."""
        return [block for (medium, _, block) in self.entries[replica]
                if medium == "GPU"]

    def matched_pages(self, replica, keys):
        """How many of `keys` (a prompt's) the replica holds as a prefix:
        on the GPU, then continued in its host tier."""
        n = 0
        for medium in ("GPU", "CPU"):
            holds = self.holds[replica][medium]
            while n < len(keys) and keys[n] in holds:
                n += 1
        return n


class Replica:
    """A `kvblock-sim --serve` process, its KV event subscription and its
    replay socket."""

    def __init__(self, index, sim, context, workdir, sim_flags):
        self.index = index
        self.report_path = os.path.join(workdir, f"replica-{index}.json")
        # Ports of "*": each replica binds free ones and names them, where
        # ports picked here and bound there could be taken between the two.
        self.process = subprocess.Popen(
            [sim, "--serve", "--kv_events=tcp://127.0.0.1:*",
             "--kv_events_replay=tcp://127.0.0.1:*",
             f"--json={self.report_path}"] + sim_flags,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, bufsize=1)
        said = self.process.stderr.readline()
        bound = re.match(r"kvblock-sim: kv events on (\S+), replay on (\S+)$",
                         said.strip())
        if bound is None:
            self.process.kill()
            raise RuntimeError(f"replica {index} ended: {said.strip()} "
                               f"{self.process.stderr.read().strip()}")
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(bound[1])
        self.replay = context.socket(zmq.DEALER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.connect(bound[2])
        self.next_seq = 0        # the next batch sequence number to apply.
        self.replayed = 0        # batches taken from the replay socket.
        self.routed = 0          # requests sent.
        self.state = None        # its last state line (read_state).

    def send(self, line):
        self.process.stdin.write(json.dumps(line) + "\n")

    def read_state(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"replica {self.index} ended: "
                               f"{self.process.stderr.read().strip()}")
        return json.loads(line)

    def outstanding(self):
        return self.routed - self.state["completed"] - self.state["rejected"]

    def fetch_replay(self, index):
        """Applies the kept batches from next_seq on, from the replay
        socket."""
        self.replay.send_multipart([b"", self.next_seq.to_bytes(8, "big")])
        while True:
            if not self.replay.poll(5000):
                raise RuntimeError(f"replica {self.index}: replay timed out")
            _, seq, payload = self.replay.recv_multipart()
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == REPLAY_END:
                return
            if seq > self.next_seq:
                raise RuntimeError(
                    f"replica {self.index}: the replay starts at batch {seq}, "
                    f"past batch {self.next_seq}: the batches between are "
                    "gone, and with them what the index needs")
            if seq == self.next_seq:
                for kind, f in decode_batch(payload):
                    index.apply(self.index, kind, f)
                self.next_seq = seq + 1
                self.replayed += 1

    def receive(self, index):
        """Applies one batch from the subscription, replaying a gap first."""
        _topic, seq, payload = self.sub.recv_multipart()
        seq = int.from_bytes(seq, "big")
        if seq > self.next_seq:  # missed some (a late join): replay them.
            self.fetch_replay(index)
        if seq == self.next_seq:
            for kind, f in decode_batch(payload):
                index.apply(self.index, kind, f)
            self.next_seq += 1


def sync_events(replicas, index, timeout_s=10.0):
    """Waits until the index holds every batch the replicas' steps so far
    handed to their publishers; replays what does not come."""
    poller = zmq.Poller()
    for r in replicas:
        poller.register(r.sub, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    replay_after = time.monotonic() + 0.2
    while True:
        lagging = [r for r in replicas
                   if r.next_seq < r.state["kv_event_batches"]]
        if not lagging:
            return
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(
                "events never came: " + ", ".join(
                    f"replica {r.index} has {r.next_seq} of "
                    f"{r.state['kv_event_batches']} batches" for r in lagging))
        if now > replay_after:  # the latest batches may never come live.
            for r in lagging:
                r.fetch_replay(index)
            replay_after = now + 1.0
            continue
        ready = dict(poller.poll(50))
        for r in replicas:
            while r.sub in ready and r.sub.poll(0):
                r.receive(index)


def choose(policy, replicas, index, keys, turn):
    """The replica a request goes to, and the pages each holds of it."""
    matched = [index.matched_pages(r.index, keys) for r in replicas]
    if policy == "round_robin":
        return turn % len(replicas), matched
    best = max(matched)
    candidates = [r for r in replicas if matched[r.index] == best]
    return min(candidates, key=lambda r: (r.outstanding(), r.index)).index, \
        matched


def route(requests, policy, sim, replicas=4, block_size=16, sim_flags=(),
          decisions=None):
    """Serves `requests` (trace objects) on `replicas` kvblock-sim replicas
    under `policy` ("prefix" or "round_robin"); returns the summary."""
    order = sorted(range(len(requests)),
                   key=lambda i: (requests[i].get("arrival", 0), i))
    context = zmq.Context()
    index = PrefixIndex(replicas)
    predicted_hit_tokens = 0
    with tempfile.TemporaryDirectory(prefix="kv_router-") as workdir:
        pool = []
        try:
            for i in range(replicas):
                pool.append(Replica(i, sim, context, workdir, list(sim_flags)))
            for r in pool:
                r.state = r.read_state()  # at step 0: bound and ready.
            clock = 0
            for turn, i in enumerate(order):
                request = requests[i]
                arrival = request.get("arrival", 0)
                if arrival > clock:
                    for r in pool:
                        r.send({"run_until": arrival})
                    for r in pool:
                        r.state = r.read_state()
                    sync_events(pool, index)
                    clock = arrival
                keys = prompt_keys(request["prompt"], block_size,
                                   request.get("cache_salt", ""))
                target, matched = choose(policy, pool, index, keys, turn)
                # The cache serves whole pages, and recomputes the last one
                # when the whole prompt is cached.
                hit_pages = min(matched[target],
                                (len(request["prompt"]) - 1) // block_size)
                predicted_hit_tokens += hit_pages * block_size
                pool[target].send(request)
                pool[target].routed += 1
                if decisions is not None:
                    decisions.append({"policy": policy, "id": request["id"],
                                      "replica": target,
                                      "matched_pages": matched})
            for r in pool:
                r.process.stdin.close()
            reports = []
            for r in pool:
                r.process.stdout.read()  # the text report.
                if r.process.wait(timeout=600) != 0:
                    raise RuntimeError(f"replica {r.index} failed: "
                                       f"{r.process.stderr.read().strip()}")
                with open(r.report_path) as f:
                    reports.append(json.load(f))
            # What the runs' last steps published.
            for r in pool:
                r.state["kv_event_batches"] = \
                    reports[r.index]["kv_events"]["batches"]
            sync_events(pool, index)
        finally:
            for r in pool:
                if r.process.poll() is None:
                    r.process.kill()
                    r.process.wait()
                r.sub.close(linger=0)
                r.replay.close(linger=0)
            context.term()
    return summarize(policy, pool, index, reports, predicted_hit_tokens)


def summarize(policy, pool, index, reports, predicted_hit_tokens):
    prompt = sum(rep["prompt_tokens"] for rep in reports)
    hits = sum(rep["prefix_hit_tokens"] for rep in reports)
    completed = sum(rep["completed"] for rep in reports)

    def mean_of(field):
        n = sum(rep[field]["count"] for rep in reports)
        total = sum(rep[field]["mean"] * rep[field]["count"] for rep in reports)
        return total / n if n else 0.0

    replicas = []
    for r, rep in zip(pool, reports):
        blocks = index.gpu_blocks(r.index)
        xor = 0
        for block in blocks:
            xor ^= block if isinstance(block, int) else \
                int.from_bytes(block[-8:], "big")
        replicas.append({
            "requests": r.routed,
            "prompt_tokens": rep["prompt_tokens"],
            "prefix_hit_tokens": rep["prefix_hit_tokens"],
            "steps": rep["steps"],
            "evictions": rep["evictions"],
            "preemptions": rep["preemptions"],
            "event_batches": r.next_seq,
            "replayed_batches": r.replayed,
            "indexed_pages": len(blocks),
            "index_matches_cache":
                len(blocks) == rep["kv_events"]["cached_pages"]
                and xor == rep["kv_events"]["cached_hash_xor"],
        })
    return {
        "policy": policy,
        "requests": sum(r.routed for r in pool),
        "completed": completed,
        "prompt_tokens": prompt,
        "prefix_hit_tokens": hits,
        "hit_rate": hits / prompt if prompt else 0.0,
        "predicted_hit_tokens": predicted_hit_tokens,
        "queue_steps_mean": mean_of("queue_steps"),
        "ttft_steps_mean": mean_of("ttft_steps"),
        "orphan_pages": index.orphans,
        "unknown_removals": index.unknown_removals,
        "replicas": replicas,
    }


def read_trace(path):
    """The requests of a JSON Lines trace; ValueError naming the line of
    one whose fields the router reads are missing or of the wrong type (the
    replicas check the rest)."""
    requests = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except ValueError as error:
                raise ValueError(f"line {number}: {error}") from None
            problem = trace_problem(request)
            if problem:
                raise ValueError(f"line {number}: {problem}")
            requests.append(request)
    return requests


def trace_problem(request):
    def is_int(value):
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(request, dict):
        return f"a request is a JSON object, got {request!r:.60}"
    prompt = request.get("prompt")
    if not isinstance(prompt, list) or not all(map(is_int, prompt)):
        return f"\"prompt\" must be a list of token ids, got {prompt!r:.60}"
    arrival = request.get("arrival", 0)
    if not is_int(arrival) or arrival < 0:
        return f"\"arrival\" must be a step, an int >= 0, got {arrival!r:.60}"
    if not isinstance(request.get("cache_salt", ""), str):
        return "\"cache_salt\" must be a string"
    if "id" not in request:
        return "a request needs an \"id\""
    return None


def print_summary(s, out):
    print(f"{s['policy']:<12} hit rate {100 * s['hit_rate']:5.1f}% "
          f"({s['prefix_hit_tokens']} of {s['prompt_tokens']} prompt tokens; "
          f"router predicted {s['predicted_hit_tokens']}), "
          f"{s['completed']} of {s['requests']} completed, "
          f"queue {s['queue_steps_mean']:.1f} steps, "
          f"first token {s['ttft_steps_mean']:.1f} steps", file=out)
    for i, r in enumerate(s["replicas"]):
        print(f"  replica {i}: {r['requests']} requests, hit "
              f"{r['prefix_hit_tokens']} of {r['prompt_tokens']} tokens, "
              f"{r['steps']} steps, {r['evictions']} evictions, "
              f"{r['event_batches']} event batches ({r['replayed_batches']} "
              f"replayed), index {'matches' if r['index_matches_cache'] else 'DIFFERS FROM'}"
              f" the cache ({r['indexed_pages']} pages)", file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Flags after -- go to every replica (e.g. -- --pages=512).")
    parser.add_argument("--version", action="version",
                        version=f"kv_router {project_version()}")
    parser.add_argument("--sim", default=DEFAULT_SIM,
                        help="the kvblock-sim binary (default: the build "
                        "beside this script, %(default)s)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", help="JSON Lines trace to route")
    source.add_argument("--workload", default="multiturn",
                        help="kvblock-sim built-in workload to route when no "
                        "--trace is given (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1,
                        help="the workload's seed (default: %(default)s)")
    parser.add_argument("--replicas", type=int, default=4,
                        help="kvblock-sim replicas (default: %(default)s)")
    parser.add_argument("--policy", choices=["prefix", "round_robin", "both"],
                        default="both", help="routing (default: %(default)s)")
    parser.add_argument("--page_size", type=int, default=16,
                        help="the replicas' --page_size (default: %(default)s)")
    parser.add_argument("--json", help="also write the summaries here")
    parser.add_argument("--decisions",
                        help="write each routing decision here (JSON Lines)")
    args, sim_flags = parser.parse_known_args(argv)
    if sim_flags and sim_flags[0] == "--":
        sim_flags = sim_flags[1:]
    if args.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {args.replicas}")
    if args.page_size < 1:
        parser.error(f"--page_size must be at least 1, got {args.page_size}")
    sim_flags = [f"--page_size={args.page_size}"] + sim_flags
    if not os.access(args.sim, os.X_OK):
        parser.error(f"--sim {args.sim} is not an executable file (build it "
                     "with tools/run sim, or name it with --sim)")
    if args.trace:
        try:
            requests = read_trace(args.trace)
        except (OSError, ValueError) as error:
            parser.error(f"--trace {args.trace}: {error}")
    else:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.jsonl")
            written = subprocess.run(
                [args.sim, f"--workload={args.workload}",
                 f"--seed={args.seed}", f"--write_trace={path}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if written.returncode != 0:
                parser.error(f"--workload {args.workload}: "
                             f"{written.stderr.strip()}")
            requests = read_trace(path)
    policies = ["prefix", "round_robin"] if args.policy == "both" \
        else [args.policy]
    summaries, decisions = [], []
    for policy in policies:
        try:
            summary = route(requests, policy, args.sim, args.replicas,
                            args.page_size, sim_flags,
                            decisions if args.decisions else None)
        except (RuntimeError, OSError, ValueError) as error:
            print(f"kv_router: {error}", file=sys.stderr)
            return 1
        print_summary(summary, sys.stdout)
        summaries.append(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summaries, f, indent=2)
    if args.decisions:
        with open(args.decisions, "w") as f:
            for d in decisions:
                f.write(json.dumps(d) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
