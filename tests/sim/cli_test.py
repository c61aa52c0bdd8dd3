#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
#
# kvblock-sim as a user runs it: exit codes and messages for input the tool
# must refuse without crashing, and its outputs as tools/sim/README.md
# documents them. Usage: cli_test.py PATH_TO_KVBLOCK_SIM PATH_TO_README.
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

SIM = sys.argv[1]
with open(sys.argv[2]) as f:
    README = f.read()
failures = []


def check_documented(what, names):
    """Each of `names` appears in the README as `name`."""
    for name in names:
        if f"`{name}`" not in README:
            failures.append([what, name])
            print(f"FAIL {what} {name!r} is not documented in the README")


def run(args, want_code, want_text="", stdin=None):
    proc = subprocess.run([SIM] + args, capture_output=True, text=True,
                          timeout=120, input=stdin)
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
    # Flags: --help exits 0 and lists them; a bad flag or value exits 2.
    run(["--help"], 0, "--max_tokens_per_step")
    run(["--help"], 0, "tools/sim/README.md")
    run(["--nope"], 2, "unknown flag --nope")
    run(["--pages=abc"], 2, "bad value 'abc' for --pages")
    run(["--prefix_caching=maybe"], 2, "--prefix_caching")
    run(["trace.jsonl"], 2, "unexpected argument 'trace.jsonl'")
    run(["--pages=0"], 2, "bad geometry")
    run(["--hash=md5"], 2, "--hash must be sha256 or xxh3")
    run(["--chunk_tokens=-1"], 2, "--chunk_tokens must be 0 or positive")
    run(["--spec_tokens=65"], 2, "--spec_tokens must be in [0, 64], got 65")
    run(["--spec_acceptance=1.5"], 2, "--spec_acceptance must be in [0, 1]")
    # A prompt over the budget: chunked by default, rejected without.
    long = os.path.join(tmp, "long.jsonl")
    with open(long, "w") as f:
        f.write(json.dumps({"id": "long", "max_tokens": 4,
                            "prompt": list(range(300))}) + "\n")
    run(["--trace=" + long, "--max_tokens_per_step=128"], 0,
        "1 completed, 0 rejected")
    run(["--trace=" + long, "--max_tokens_per_step=128",
         "--nochunked_prefill"], 0, "over_token_budget")
    run(["--spec_tokens=4", "--spec_acceptance=0.7"], 0, "accepted")
    # A built-in workload too long for the geometry names the flag it needs.
    run(["--workload=serving"], 2, "does not fit the flags: request "
        "'req-1615' (#0): prompt: 1950 tokens exceed the 1024 tokens of a "
        "sequence (max_pages_per_seq x page_size); it needs "
        "--max_pages_per_seq=144 or more at --page_size=16")
    run(["--device=tpu"], 2, "--device must be auto, host or cuda")
    # The host tier's costing: a bus that moves something, pages of up to
    # 1 GiB; a tier no memory holds is refused before it is built.
    for bad, said in (("1e-300", "1e-300"), ("inf", "inf"), ("0", "0"),
                      ("nan", "nan")):
        run(["--host_pages=8", "--host_bandwidth=" + bad], 2,
            "--host_bandwidth must be in [0.001, 1e+06] GB/s, got " + said)
    run(["--host_pages=8", "--host_page_bytes=4611686018427387904"], 2,
        "--host_page_bytes must be in [0, 1073741824], got "
        "4611686018427387904")
    run(["--host_pages=1000000000"], 2,
        "the host tier (host_pages 1000000000 x 8192 bytes a page) exceed")
    # One full-attention group, however spelled, takes a host tier.
    run(["--kv_cache_groups=fullx1", "--host_pages=8"], 0, "host tier")
    run(["--kv_events_replay=tcp://127.0.0.1:*"], 2,
        "--kv_events_replay needs a --kv_events endpoint")
    run(["--kv_events=bogus://x"], 2, "--kv_events: kv event publisher: "
        "cannot bind endpoint bogus://x")
    run(["--kv_events=tcp://127.0.0.1:*", "--kv_events_replay=bogus"], 2,
        "--kv_events_replay: kv event publisher: cannot bind "
        "replay_endpoint bogus")
    run(["--kv_events=tcp://127.0.0.1:*", "--kv_events_encoding=json"], 2,
        "--kv_events_encoding must be map or array, got 'json'")
    run(["--kv_events=tcp://127.0.0.1:*", "--kv_events_hashes=hex"], 2,
        "--kv_events_hashes must be int64 or bytes, got 'hex'")
    run(["--kv_events=tcp://127.0.0.1:*",
         f"--kv_events_cpu={min(os.sched_getaffinity(0))}"], 0, "kv events")
    run(["--kv_events=tcp://127.0.0.1:*", "--kv_events_poll_us=1000"], 0,
        "kv events")
    # Each publisher flag is checked, and named, whatever the endpoint.
    for endpoint in ("tcp://127.0.0.1:*", "discard", ""):
        for flag, message in (
                ("--kv_events_cpu=-2",
                 "--kv_events_cpu must be -1 or in [0, 1024), got -2"),
                ("--kv_events_cpu=9999", "in [0, 1024), got 9999"),
                ("--kv_events_poll_us=5",
                 "--kv_events_poll_us must be in [10, 1000000], got 5"),
                ("--kv_events_poll_us=2000000", "got 2000000"),
                ("--kv_events_wait_ms=-1",
                 "--kv_events_wait_ms must be in [0, 60000], got -1"),
                ("--kv_events_wait_ms=60001", "got 60001"),
                ("--kv_events_max_queued_bytes=-1",
                 "--kv_events_max_queued_bytes must be at least 0, got -1"),
                ("--kv_events_encoding=foo",
                 "--kv_events_encoding must be map or array, got 'foo'"),
                ("--kv_events_hashes=foo",
                 "--kv_events_hashes must be int64 or bytes, got 'foo'")):
            run([f"--kv_events={endpoint}", flag], 2, message)
    run(["--kv_events=discard"], 0, "kv events")
    # A "*" port is said once bound, on stderr and in the report.
    bound = subprocess.run(
        [SIM, "--kv_events=tcp://127.0.0.1:*", "--json=" +
         os.path.join(tmp, "bound.json")], capture_output=True, text=True,
        timeout=120)
    said = re.search(r"^kvblock-sim: kv events on (tcp://127\.0\.0\.1:\d+)$",
                     bound.stderr, re.M)
    with open(os.path.join(tmp, "bound.json")) as f:
        reported = json.load(f)["kv_events"]
    if (bound.returncode != 0 or not said or
            reported["endpoint"] != said.group(1) or
            reported["replay_endpoint"] != "" or
            "; on " + said.group(1) not in bound.stdout):
        failures.append(["bound endpoint"])
        print(f"FAIL the bound endpoint: {bound.stderr[-500:]} {reported}")
    # --serve: a router's feed on stdin, the run's state on stdout.
    run(["--serve", "--workload=beam"], 2,
        "--serve excludes --trace, --workload and --write_trace")
    served = json.dumps({"id": "a", "arrival": 1, "prompt": [1, 2, 3],
                         "max_tokens": 2})
    run(["--serve"], 0, '{"clock":2,"kv_event_batches":0,"running":1,',
        stdin=served + '\n{"run_until": 2}\n')
    run(["--serve"], 2, "serve input: line 2: run_until: 1 is not after the "
        "arrival of 'a' (step 1)", stdin=served + '\n{"run_until": 1}\n')
    run(["--serve"], 2, "serve input: line 1: bad JSON", stdin="{\n")
    # No step, no host time (the end's wait for the device counted 310 ns).
    empty = os.path.join(tmp, "empty.json")
    run(["--serve", f"--json={empty}"], 0, "", stdin="")
    with open(empty) as f:
        idle = json.load(f)
    if (idle["steps"], idle["host_ns_total"]) != (0, 0):
        failures.append(["--serve", "empty"])
        print(f"FAIL an empty --serve run: {idle['steps']} steps, "
              f"{idle['host_ns_total']} ns of host time")
    # A router that goes away: the next write fails, exit 1 with a message
    # (not death by SIGPIPE, status 141).
    feeder = subprocess.Popen([SIM, "--serve"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    feeder.stdin.write(served + '\n{"run_until": 2}\n')
    feeder.stdin.flush()
    feeder.stdout.readline()  # the first state line; then the reader leaves.
    feeder.stdout.close()
    feeder.stdin.write('{"run_until": 3}\n{"run_until": 4}\n')
    feeder.stdin.close()
    code = feeder.wait(timeout=60)
    message = feeder.stderr.read()
    ok = code == 1 and "serve output: write failed" in message
    print(f"{'ok  ' if ok else 'FAIL'} exit {code} (want 1): kvblock-sim "
          "--serve with its reader gone")
    if not ok:
        failures.append(["--serve, reader gone"])
        print(message[-2000:])
    # A finished request's id may be reused; a running one's may not.
    again = json.dumps({"id": "a", "arrival": 9, "prompt": [4, 5],
                        "max_tokens": 1})
    run(["--serve"], 0, "2 completed, 0 rejected (of 2)",
        stdin=served + '\n{"run_until": 9}\n' + again + "\n")
    run(["--serve"], 2, 'serve input: line 3: id: "a" is in use',
        stdin=served + '\n{"run_until": 2}\n' + again + "\n")

    # A replica's memory does not grow with the requests it has served: the
    # peak RSS of a run of 50,000 requests is within 2 MB of one of 10,000.
    # What a run kept of each finished request (its request, state, id and
    # distribution entries) was about 500 bytes, 20 MB over the 40,000 more
    # (17.5 MB against 38.0 MB); 2 MB is 50 bytes a request, room for the
    # allocator's own growth (0.2 MB seen). ASan's quarantine, which holds
    # freed memory (256 MB) to catch uses after free, is off for it.
    def served_peak_rss(requests):
        path = os.path.join(tmp, f"serve{requests}.jsonl")
        with open(path, "w") as f:
            for i in range(requests):
                f.write(json.dumps({
                    "id": f"r{i}", "arrival": i, "max_tokens": 2,
                    "prompt": [(i * 7 + k) % 50000 for k in range(16)]}))
                f.write("\n")
                if i % 100 == 99:
                    f.write(f'{{"run_until": {i + 1}}}\n')
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = ":".join(
            o for o in (env.get("ASAN_OPTIONS", ""), "quarantine_size_mb=0")
            if o)
        with open(path) as feed:
            proc = subprocess.Popen([SIM, "--serve", "--device=host"],
                                    stdin=feed, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=env)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            failures.append(["--serve", requests])
            print(f"FAIL --serve of {requests} requests exited "
                  f"{proc.returncode}")
        return usage.ru_maxrss  # KB.

    rss_10k = served_peak_rss(10000)
    rss_50k = served_peak_rss(50000)
    ok = rss_50k - rss_10k < 2048
    print(f"{'ok  ' if ok else 'FAIL'} --serve peak RSS {rss_10k} KB after "
          f"10,000 requests, {rss_50k} KB after 50,000 (want < 2048 KB more)")
    if not ok:
        failures.append(["--serve RSS"])

    # A directory is not a trace: bad input.
    run(["--trace=" + tmp], 2, "is a directory")
    run(["--trace=" + os.path.join(tmp, "missing.jsonl")], 2,
        "missing.jsonl': No such file or directory")
    # A path is bytes: one that is not UTF-8 is written in the JSON report
    # and the chart's title as U+FFFD, not a crash.
    odd = os.path.join(tmp.encode(), b"odd\xffname.jsonl")
    with open(odd, "w") as f:
        f.write(json.dumps({"id": "a", "prompt": [1, 2, 3],
                            "max_tokens": 3}) + "\n")
    odd_outputs = [os.path.join(tmp, "odd.json"), os.path.join(tmp, "odd.svg")]
    proc = subprocess.run([SIM.encode(), b"--trace=" + odd,
                           b"--json=" + odd_outputs[0].encode(),
                           b"--plot=" + odd_outputs[1].encode()],
                          capture_output=True, timeout=120)
    with open(odd_outputs[0], encoding="utf-8") as f:
        source = json.load(f)["source"] if proc.returncode == 0 else ""
    with open(odd_outputs[1], encoding="utf-8") as f:
        titled = "odd\ufffdname.jsonl" in f.read()
    ok = source.endswith("odd\ufffdname.jsonl") and titled
    print(f"{'ok  ' if ok else 'FAIL'} exit {proc.returncode}: a trace path "
          f"that is not UTF-8 (report source {source[-20:]!r})")
    if not ok:
        failures.append(["non-UTF-8 path"])
        print(proc.stderr.decode(errors="replace")[-2000:])
    # The report is the run's output: one standard output cannot take fails.
    with open("/dev/full", "w") as full:
        proc = subprocess.run([SIM, "--workload=unique"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    ok = proc.returncode == 1 and "cannot write the report" in proc.stderr
    print(f"{'ok  ' if ok else 'FAIL'} exit {proc.returncode} (want 1): "
          "the report to a full standard output")
    if not ok:
        failures.append(["/dev/full"])
    # A trace written to standard output is the trace alone.
    proc = subprocess.run([SIM, "--workload=unique",
                           "--write_trace=/dev/stdout"],
                          capture_output=True, text=True, timeout=120)
    piped = os.path.join(tmp, "piped.jsonl")
    with open(piped, "w") as f:
        f.write(proc.stdout)
    run(["--trace=" + piped], 0, "requests")
    run(["--write_trace=" + piped, "--json=" + piped + ".json"], 2,
        "--write_trace writes the trace without a run: --json would never "
        "be written")
    # Output paths are checked before the run, naming the OS's reason.
    for flag in ("json", "timeline", "plot", "write_trace"):
        run([f"--{flag}=/no/such/dir/out"], 2,
            "cannot create '/no/such/dir/out': No such file or directory")
    # The built-in workload runs and writes every output.
    outputs = {flag: os.path.join(tmp, "out." + flag)
               for flag in ("json", "timeline", "plot")}
    run([f"--{flag}={path}" for flag, path in outputs.items()], 0,
        "queue wait")
    for flag, path in outputs.items():
        if os.path.getsize(path) == 0:
            failures.append([flag])
            print(f"FAIL --{flag} wrote an empty file")
    # Every JSON field and timeline column is documented.
    with open(outputs["json"]) as f:
        report = json.load(f)
    check_documented("JSON field", report)
    for field in ("queue_steps", "ttft_steps", "steps_limited_by",
                  "host_ns_by_phase", "config"):
        check_documented(f"JSON field {field}.", report[field])
    with open(outputs["timeline"]) as f:
        check_documented("timeline column", next(csv.reader(f)))
    # Every flag --help lists is documented.
    help_text = subprocess.run([SIM, "--help"], capture_output=True,
                               text=True).stdout
    flags = [line.split()[0][2:] for line in help_text.splitlines()
             if line.startswith("  --")]
    if len(flags) < 10:
        failures.append(["--help"])
        print(f"FAIL --help lists {len(flags)} flags")
    for flag in flags:
        if f"`--{flag}" not in README:
            failures.append(["flag", flag])
            print(f"FAIL flag --{flag} is not documented in the README")

sys.exit(1 if failures else 0)
