# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock's metrics for Prometheus, through prometheus_client.

    from prometheus_client import REGISTRY, start_http_server
    from kvblock.metrics import KvCacheCollector

    REGISTRY.register(KvCacheCollector(manager, page_table,
                                       labels={"model_name": "m",
                                               "engine": "0"}))
    start_http_server(8000)

The metrics are the C++ library's (kvblock/metrics.h), read at each scrape:
vLLM's names where vLLM has the metric (vllm:kv_cache_usage_perc,
vllm:prefix_cache_queries, vllm:prefix_cache_hits, vllm:num_preemptions,
with vLLM's labels model_name and engine when given), kvblock_* for the
rest. A scrape takes the manager's and the table's locks, as their calls do.
prometheus_client (Debian: python3-prometheus-client) is needed only here.
"""

import re

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvblock._kvblock import collect_metrics

__all__ = ["KvCacheCollector", "collect_metrics"]


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class KvCacheCollector:
    """A prometheus_client collector of one manager's metrics and, when
    given, its page table's; `labels` go on every sample. `add` adds another
    engine's (vLLM's `engine` label): one collector yields one family per
    name with a sample per engine, as the text format needs (two collectors
    of one name in a registry would write the name's HELP twice)."""

    def __init__(self, manager, page_table=None, labels=None):
        self._names = None
        self._engines = []
        self.add(manager, page_table, labels)

    def add(self, manager, page_table=None, labels=None):
        """Adds an engine: its labels have the first engine's names and
        values of their own."""
        labels = dict(labels or {})
        # Checked now, not at a scrape: the label names Prometheus takes
        # (the C++ FormatPrometheusText's rule), string values, one name
        # set and distinct values across engines, and the manager and table.
        for name, value in labels.items():
            if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) \
                    or name.startswith("__"):
                raise ValueError(
                    f"KvCacheCollector: label name {name!r} is not "
                    "[a-zA-Z_][a-zA-Z0-9_]* or starts with '__'")
            if not isinstance(value, str):
                raise TypeError(
                    f"KvCacheCollector: label {name!r} has the value "
                    f"{value!r}, not a str")
        if self._names is not None:
            if sorted(labels) != sorted(self._names):
                raise ValueError(
                    f"KvCacheCollector: an engine's labels are "
                    f"{sorted(labels)}, the first engine's {sorted(self._names)}")
            values = [labels[name] for name in self._names]
            if any(values == engine[2] for engine in self._engines):
                raise ValueError(
                    f"KvCacheCollector: an engine with the labels {labels} "
                    "is there already")
        collect_metrics(manager, page_table)
        if self._names is None:
            self._names = list(labels)
        self._engines.append((manager, page_table,
                              [labels[name] for name in self._names]))

    def collect(self):
        families = {}
        for manager, page_table, values in self._engines:
            for name, help_text, kind, value in collect_metrics(manager,
                                                                page_table):
                family = families.get(name)
                if family is None:
                    family = families[name] = (
                        CounterMetricFamily if kind == "counter"
                        else GaugeMetricFamily)(name, help_text,
                                                labels=self._names)
                family.add_metric(values, value)
        yield from families.values()

    def describe(self):
        # The families collect() yields, so that registering checks their
        # names against the registry's.
        return self.collect()
