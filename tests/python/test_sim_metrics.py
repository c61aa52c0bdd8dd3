# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock-sim --serve --metrics_port: the library's metrics scraped over
HTTP on loopback as Prometheus scrapes them, refreshed at each horizon."""
import json
import os
import re
import subprocess
import urllib.error
import urllib.request

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

SIM = os.environ.get("KVBLOCK_SIM")
pytestmark = pytest.mark.skipif(SIM is None,
                                reason="KVBLOCK_SIM (kvblock-sim) not set")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith(
            "text/plain; version=0.0.4")
        text = answer.read().decode()
    families = list(text_string_to_metric_families(text))
    # Each counter's samples typed as one (its TYPE line names NAME_total).
    for family in families:
        for sample in family.samples:
            if sample.name.endswith("_total"):
                assert family.type == "counter", sample.name
    return {s.name: s for f in families for s in f.samples}


def test_a_scrape_follows_the_served_steps():
    sim = subprocess.Popen(
        [SIM, "--serve", "--metrics_port=0", "--device=host",
         "--kv_events=tcp://127.0.0.1:*"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        port = None
        while port is None:
            line = sim.stderr.readline()
            assert line, "kvblock-sim ended before it said its metrics port"
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics",
                              line)
            port = found and int(found.group(1))
        assert json.loads(sim.stdout.readline())["clock"] == 0
        before = scrape(port)
        assert before["vllm:prefix_cache_queries_total"].value == 0
        assert before["vllm:kv_cache_usage_perc"].labels == {
            "model_name": "kvblock-sim", "engine": "0"}

        # Two 40-token prompts sharing their first two 16-token pages.
        for rid, tail in (("a", 100), ("b", 200)):
            request = {"id": rid, "arrival": 0, "max_tokens": 2,
                       "prompt": list(range(32)) + list(range(tail, tail + 8))}
            sim.stdin.write(json.dumps(request) + "\n")
        sim.stdin.write(json.dumps({"run_until": 20}) + "\n")
        sim.stdin.flush()
        assert json.loads(sim.stdout.readline())["completed"] == 2
        after = scrape(port)
        assert after["vllm:prefix_cache_queries_total"].value == 80
        assert after["vllm:prefix_cache_hits_total"].value == 32
        assert after["vllm:num_preemptions_total"].value == 0
        assert after["vllm:kv_cache_usage_perc"].value == 0
        assert after["kvblock_pages"].value == 384
        assert after["kvblock_admissions_total"].value == 2
        assert after["kvblock_page_table_uploads_total"].value > 0
        assert "kvblock_kv_event_batches_published_total" in after
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
        assert refused.value.code == 404
    finally:
        sim.stdin.close()
        sim.stdout.read()
        sim.stderr.read()
        assert sim.wait(timeout=60) == 0


def test_metrics_port_needs_serve_and_a_port():
    for flags, message in (
            (["--metrics_port=0"], "--metrics_port needs --serve"),
            (["--serve", "--metrics_port=70000"],
             "--metrics_port must be in [0, 65535], got 70000")):
        run = subprocess.run([SIM] + flags, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=60)
        assert run.returncode == 2, run.stderr
        assert message in run.stderr
