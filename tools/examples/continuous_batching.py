#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""A continuous-batching loop on kvblock, in five minutes of reading.

  tools/examples/continuous_batching.py

(from any folder: it finds the package of the build beside it, build/lib/python,
when it is not installed or on PYTHONPATH; a python3 without numpy runs it
again with Debian's /usr/bin/python3.)

Each step the scheduler builds one plan for BatchCommit: finished sequences
leave, running ones decode one token or take the next chunk of their prompt,
a request that asked for two samples forks once its prompt is done, and
waiting requests join on their first chunk (the prefix cache serves the
pages of the system prompt they share). When the pool runs out the latest
request is preempted and recomputed later. After the run it prints the
prefix-cache hit rate.
"""
import argparse
import os
import random
import sys

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.append(os.path.join(TOOLS, "..", "build", "lib", "python"))
try:
    import numpy as np

    import kvblock
except ImportError as missing:
    if __name__ != "__main__":
        raise
    sys.path.insert(0, TOOLS)
    from debian_python import rerun_or_exit
    rerun_or_exit("continuous_batching", missing,
                  "numpy: apt-get install python3-numpy; kvblock: tools/run "
                  "sim builds it")

PAGE = 16


class Request:
    def __init__(self, prompt, max_tokens, samples):
        self.prompt = np.asarray(prompt, dtype=np.int32)
        self.max_tokens = max_tokens
        self.samples = samples
        self.seqs = []  # its running sequences; the first has the prompt.
        self.generated = 0


def make_requests(count, seed):
    rng = random.Random(seed)
    system = [rng.randrange(32000) for _ in range(4 * PAGE)]
    return [Request(system + [rng.randrange(32000)
                              for _ in range(rng.randrange(8, 300))],
                    max_tokens=rng.randrange(4, 40),
                    samples=2 if i % 5 == 0 else 1)
            for i in range(count)]


def run(count=40, seed=1, pages=512, max_batch=32, budget=256):
    config = kvblock.PagedKvConfig()
    config.num_pages, config.page_size = pages, PAGE
    config.max_batch, config.max_pages_per_seq = max_batch, 64
    manager = kvblock.BlockManager(config)
    table = kvblock.KVPageTable(max_batch, 64, pages, kvblock.Device.host())
    commit = kvblock.BatchCommit(manager, table)
    waiting, running = make_requests(count, seed), []
    next_id = done = preemptions = 0
    admit = True  # False for one step after a step that ran out of pages.
    while waiting or running:
        owner = {s: r for r in running for s in r.seqs}
        finished = [s for r in running if r.generated == r.max_tokens
                    for s in r.seqs]
        left = budget
        counts = np.zeros(commit.batch, dtype=np.int32)  # decode tokens.
        pages_for = np.zeros(commit.batch, dtype=np.int32)  # and chunks.
        chunks, forks, decoding = [], [], set()
        for slot, seq in enumerate(commit.slots):
            r = owner[int(seq)]
            if r.generated == r.max_tokens:
                continue
            rest = manager.prompt_tokens_left(seq)
            if rest > 0:  # the next chunk of its prompt.
                n = min(rest, left)
                if n > 0:
                    start = len(r.prompt) - rest
                    chunks.append(kvblock.PromptChunk(
                        int(seq), r.prompt[start:start + n]))
                    pages_for[slot] = n
                    left -= n
                continue
            counts[slot] = pages_for[slot] = 1  # decode.
            decoding.add(r)
            left -= 1
            if len(r.seqs) < r.samples:  # fork the second sample.
                forks.append((r, kvblock.Join(next_id, [7], fork_of=seq)))
                next_id += 1
        joins = [join for _, join in forks]
        # Admissions: room in the batch, the budget, and the pages.
        seats = max_batch - (commit.batch - len(finished)) - len(forks)
        free = manager.num_allocatable - commit.append_pages(pages_for)
        admitted = []
        while admit and waiting and left > 0 and seats >= waiting[0].samples:
            r = waiting[0]
            plan = manager.plan_admission(r.prompt, prefill_tokens=left)
            if plan.pages_consumed + plan.reserved_pages > free - len(forks):
                break
            waiting.pop(0)
            joins.append(kvblock.Join(next_id, r.prompt, prefill_tokens=left))
            r.seqs, r.generated = [next_id], 0
            admitted.append(r)
            next_id += 1
            left -= plan.computed_tokens
            seats -= r.samples
            free -= plan.pages_consumed + plan.reserved_pages
        try:
            step = commit.commit(
                finished=np.array(finished, dtype=np.int64), joins=joins,
                append_counts=counts,
                append_tokens=np.full(int(counts.sum()), 5, dtype=np.int32),
                prompt_chunks=chunks)
        except kvblock.ResourceExhaustedError:
            # Out of pages (forks and decodes took more than was left): this
            # step's admissions wait, and if that is not enough the latest
            # running request is preempted (recompute: it starts over).
            waiting[:0] = admitted
            if not admit and running:
                victim = running.pop()
                commit.commit(preempted=np.array(victim.seqs, dtype=np.int64))
                victim.seqs, victim.generated = [], 0
                waiting.insert(0, victim)
                preemptions += 1
            admit = False
            continue
        admit = True
        table.upload()  # what the kernels read (also as table.__dlpack__()).
        _ = step.copies  # copy-on-write copies to run before attention.
        for r, join in forks:
            r.seqs.append(join.id)
        for r in decoding:
            r.generated += 1
        for r in [r for r in running if r.seqs[0] in finished]:
            running.remove(r)
            done += 1
        running += admitted
    stats = manager.stats
    hit_rate = stats["prefix_hit_tokens"] / max(1, stats["prompt_tokens"])
    print(f"{done} requests, {stats['prompt_chunks']} prompt chunks, "
          f"{stats['forks']} forks, {preemptions} preemptions, "
          f"prefix-cache hit rate {100 * hit_rate:.1f}%")
    manager.check_invariants()
    return done, hit_rate, preemptions


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pages", type=int, default=512)
    args = parser.parse_args()
    run(args.requests, args.seed, args.pages)
