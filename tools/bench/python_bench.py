#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock from Python: what a scheduler pays per call.

  PYTHONPATH=build-release/lib/python python3 tools/bench/python_bench.py

Rows (medians of --repetitions runs; the vLLM adapter's figures are
tools/bench/vllm_bench.py's):
  batched step (Python)        BatchCommit.commit + KVPageTable.upload at
                               batch 64, 256 and 1024 (page-table width 128):
                               every sequence appends one token from numpy
                               arrays, ~1% finish and as many prompts join
                               (hashed on arrival), as BM_CommitDecodeStep
                               upload:1 arrival:1 does; per step and per
                               sequence, and a line fitted through the three
                               (sequences about 6 pages long, as in the C++
                               benchmark, whose rows show the step's cost
                               does not depend on their length):
                               ns per sequence (to set against kvblock-bench's
                               BM_CommitDecodeStep upload:1 width:128) plus a
                               fixed cost per call
  binding's part               of each timed commit, the time outside
                               BatchCommit::Commit's own clock (phase timing
                               on, for the whole batched step): converting
                               the arguments and the joins, building the
                               result, the GIL; per batch and fitted
  batched step (Python, cold)  the same, with a byte written in every cache
                               line of 4 MiB between steps (outside the
                               time), as BM_CommitDecodeStep cold:1 does: the
                               step as it runs in serving, after the
                               scheduler's and the model launch's work
The request objects' own updates (appending the sampled token) are outside
the timed calls.
"""
import argparse
import statistics
import sys
import time

import numpy as np

import kvblock


# Written between steps in the cold rows, as BM_CommitDecodeStep cold:1
# does: a byte in every cache line of 4 MiB.
COLD_LINES = np.zeros(4 << 20, dtype=np.uint8)


def bench_batched_step(steps, repetitions, batch=256, cold=False):
    config = kvblock.PagedKvConfig()
    config.page_size = 16
    config.max_pages_per_seq = 128
    config.max_batch = batch
    config.num_pages = 16 * batch
    manager = kvblock.BlockManager(config)
    device = kvblock.Device.host()
    table = kvblock.KVPageTable(batch, 128, config.num_pages, device)
    commit = kvblock.BatchCommit(manager, table)
    table.upload()
    rng = np.random.default_rng(batch)
    prefix = rng.integers(0, 32000, 64, dtype=np.int32)
    next_id = [0]

    def new_join():
        suffix = rng.integers(0, 32000, 1 + next_id[0] % 32, dtype=np.int32)
        prompt = np.concatenate([prefix, suffix])
        # Hashed on arrival, outside the timed step (as arrival:1 in C++).
        join = kvblock.Join(next_id[0], prompt,
                            prompt_hashes=manager.hash_prompt(prompt))
        next_id[0] += 1
        return join

    commit.commit(joins=[new_join() for _ in range(batch)])
    table.upload()
    tokens = rng.integers(0, 32000, batch, dtype=np.int32)
    credit = [0]

    def draft():
        credit[0] += batch
        leaving = credit[0] // 100
        credit[0] %= 100
        slots = commit.slots
        counts = np.ones(batch, dtype=np.int32)
        picks = rng.choice(batch, leaving, replace=False)
        counts[picks] = 0
        finished = np.array(slots[picks], dtype=np.int64)
        joins = [new_join() for _ in range(leaving)]
        return finished, joins, counts, tokens[:batch - leaving]

    for _ in range(200):  # into the steady state.
        f, j, c, t = draft()
        commit.commit(finished=f, joins=j, append_counts=c, append_tokens=t)
        table.upload()

    # Commit's own clock (BatchCommit.time_phases) splits each timed call
    # into the C++ step and what the binding adds around it.
    commit.time_phases = True

    def run():
        elapsed = 0
        binding = 0
        for _ in range(steps):
            f, j, c, t = draft()
            if cold:
                COLD_LINES[::64] += 1
            inside = commit.phase_times.total_ns
            start = time.perf_counter_ns()
            commit.commit(finished=f, joins=j, append_counts=c,
                          append_tokens=t)
            committed = time.perf_counter_ns()
            table.upload()
            end = time.perf_counter_ns()
            elapsed += end - start
            binding += committed - start - (commit.phase_times.total_ns -
                                            inside)
        return elapsed / steps, binding / steps

    runs = [run() for _ in range(repetitions)]
    return (statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args(argv)
    batches = (64, 256, 1024)
    step_rows = []
    for cold in (False, True):
        name = "batched step (Python" + (", cold)" if cold else ")")
        stepped = [bench_batched_step(args.steps, args.repetitions, b, cold)
                   for b in batches]
        steps = [s for s, _ in stepped]
        bindings = [b for _, b in stepped]
        slope, fixed = np.polyfit(batches, steps, 1)
        binding_slope, binding_fixed = np.polyfit(batches, bindings, 1)
        step_rows += [
            (f"{name}, batch {b}",
             f"{t / 1e3:.2f} us per step, {t / b:.1f} ns per sequence")
            for b, t in zip(batches, steps)
        ] + [(f"{name}, fitted",
              f"{slope:.1f} ns per sequence + {fixed / 1e3:.2f} us per call")
             ] + [(f"{name}, binding's part, batch {b}", f"{t / 1e3:.2f} us")
                  for b, t in zip(batches, bindings)
                  ] + [(f"{name}, binding's part, fitted",
                        f"{binding_slope:.2f} ns per sequence + "
                        f"{binding_fixed / 1e3:.2f} us per call")]
    rows = step_rows
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main(sys.argv[1:])
