#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
#
# kvblock-sim as a user runs it: exit codes and messages for input the tool
# must refuse without crashing. Usage: sim_cli_test.py PATH_TO_KVBLOCK_SIM.
import os
import subprocess
import sys
import tempfile

SIM = sys.argv[1]
failures = []


def run(args, want_code, want_text=""):
    proc = subprocess.run([SIM] + args, capture_output=True, text=True,
                          timeout=120)
    text = proc.stdout + proc.stderr
    ok = proc.returncode == want_code and want_text in text
    print(f"{'ok  ' if ok else 'FAIL'} exit {proc.returncode} (want "
          f"{want_code}): kvblock-sim {' '.join(a[:60] for a in args)}")
    if not ok:
        failures.append(args)
        print(text[-2000:])


with tempfile.TemporaryDirectory() as tmp:
    # A geometry Validate() accepts but no machine can hold: bad input.
    run(["--page_size=2147483647"], 2, "block manager: reserving")
    run(["--max_batch=1000000000"], 2, "block manager: reserving")
    # A trace line nesting 100,000 arrays: an error naming the line.
    deep = os.path.join(tmp, "deep.jsonl")
    with open(deep, "w") as f:
        f.write('{"id": "x", "max_tokens": 2, "prompt": ' + "[" * 100000 +
                "]" * 100000 + "}\n")
    run(["--trace=" + deep], 2, "line 1: prompt")
    # An empty trace (blank lines only) is bad input, not a run of nothing.
    empty = os.path.join(tmp, "empty.jsonl")
    with open(empty, "w") as f:
        f.write("\n\n")
    run(["--trace=" + empty], 2, "holds no requests")
    # The built-in workload runs.
    run([], 0, "requests ")

sys.exit(1 if failures else 0)
