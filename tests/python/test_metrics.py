# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock.metrics: the C++ library's metrics as prometheus_client families,
scraped in the Prometheus text format."""
import re

import numpy as np
import pytest

import kvblock

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kvblock.metrics import KvCacheCollector, collect_metrics  # noqa: E402


def make_manager():
    config = kvblock.PagedKvConfig()
    config.num_pages, config.max_batch = 16, 4
    config.max_pages_per_seq, config.page_size = 8, 4
    return config, kvblock.BlockManager(config)


def scrape(collector):
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    text = prometheus_client.generate_latest(registry).decode()
    return {s.name: s for f in text_string_to_metric_families(text)
            for s in f.samples}


def test_a_scrape_has_vllms_names_and_labels():
    config, manager = make_manager()
    manager.admit(1, np.arange(8, dtype=np.int32))
    manager.admit(2, np.array([0, 1, 2, 3, 100, 101, 102, 103],
                              dtype=np.int32))
    manager.preempt(2)
    table = kvblock.KVPageTable(config.max_batch, config.max_pages_per_seq,
                                config.num_pages, kvblock.Device.host())
    samples = scrape(KvCacheCollector(
        manager, table, labels={"model_name": "m", "engine": "0"}))
    usage = samples["vllm:kv_cache_usage_perc"]
    assert usage.value == 2 / 16
    assert usage.labels == {"model_name": "m", "engine": "0"}
    assert samples["vllm:prefix_cache_queries_total"].value == 16
    assert samples["vllm:prefix_cache_hits_total"].value == 4
    assert samples["vllm:num_preemptions_total"].value == 1
    assert samples["kvblock_pages_cached"].value == 3
    assert samples["kvblock_page_table_uploads_total"].value == 0


def test_the_collector_follows_the_manager():
    _, manager = make_manager()
    collector = KvCacheCollector(manager)
    assert scrape(collector)["kvblock_admissions_total"].value == 0
    manager.admit(5, np.arange(4, dtype=np.int32))
    samples = scrape(collector)
    assert samples["kvblock_admissions_total"].value == 1
    assert samples["vllm:kv_cache_usage_perc"].labels == {}
    assert not any(name.startswith("kvblock_page_table") for name in samples)


def test_collect_metrics_is_the_c_plus_plus_list():
    _, manager = make_manager()
    metrics = collect_metrics(manager)
    assert metrics[0] == ("vllm:kv_cache_usage_perc",
                          "KV-cache usage. 1 means 100 percent usage.",
                          "gauge", 0.0)
    assert {kind for _, _, kind, _ in metrics} == {"counter", "gauge"}
    with pytest.raises(TypeError):
        collect_metrics(None)


def test_bad_labels_are_refused_when_the_collector_is_made():
    """Not at every scrape: a label Prometheus does not take, or a value
    that is not a str, is refused by the constructor."""
    _, manager = make_manager()
    for labels, error, message in (
            ({"engine": 0}, TypeError, "'engine' has the value 0, not a str"),
            ({"bad-name": "x"}, ValueError, "'bad-name' is not"),
            ({"0a": "x"}, ValueError, "'0a' is not"),
            ({"__x": "x"}, ValueError, "starts with '__'")):
        with pytest.raises(error, match=re.escape(message)):
            KvCacheCollector(manager, labels=labels)
    assert kvblock.collect_metrics is collect_metrics


def test_one_collector_serves_several_engines():
    _, first = make_manager()
    _, second = make_manager()
    first.admit(1, np.arange(8, dtype=np.int32))
    second.admit(1, np.arange(4, dtype=np.int32))
    collector = KvCacheCollector(first, labels={"model_name": "m",
                                                "engine": "0"})
    collector.add(second, labels={"engine": "1", "model_name": "m"})
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    text = prometheus_client.generate_latest(registry).decode()
    assert text.count("# HELP vllm:prefix_cache_queries_total ") == 1
    samples = {(s.name, s.labels["engine"]): s.value
               for f in text_string_to_metric_families(text)
               for s in f.samples}
    assert samples["vllm:prefix_cache_queries_total", "0"] == 8
    assert samples["vllm:prefix_cache_queries_total", "1"] == 4
    for labels, message in (({"engine": "1", "model_name": "m"},
                             "is there already"),
                            ({"engine": "2"}, "the first engine's")):
        with pytest.raises(ValueError, match=message):
            collector.add(second, labels=labels)
    with pytest.raises(TypeError):
        collector.add(None, labels={"engine": "3", "model_name": "m"})
    assert len(list(collector.collect())) == len(collect_metrics(first))
    assert scrape(collector)  # the refused engines were not added.
