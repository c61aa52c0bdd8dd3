#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
#
# The layers of ARCHITECTURE.md hold in the sources: a file of lib/LAYER/
# includes only its own layer's files and the layers above it, whether
# internal ("cache/prefix_index.h") or public ("kvblock/block_pool.h", each
# public header counted in the layer of the code behind it). Also: no two
# source files of the repository share a name.
#
# Usage: layering_test.py SOURCE_ROOT
import os
import re
import subprocess
import sys

LAYERS = ["base", "cache", "sequence", "manager", "device", "commit",
          "events", "metrics", "vllm", "python"]
# Each public header's layer.
PUBLIC = {
    "config.h": "base", "status_macros.h": "base", "types.h": "base",
    "version.h": "base", "kv_cache_groups.h": "base",
    "block_hash.h": "cache", "block_pool.h": "cache", "kv_events.h": "cache",
    "group_cache_hit.h": "cache",
    "sequence_table.h": "sequence",
    "admission.h": "manager", "block_manager.h": "manager",
    "block_manager_options.h": "manager", "block_manager_snapshot.h": "manager",
    "device.h": "device", "kernels.h": "device",
    "batch_commit.h": "commit", "identity.h": "commit",
    "page_table.h": "commit",
    "kv_event_publisher.h": "events", "metrics.h": "metrics",
    "vllm_block_hash.h": "vllm", "vllm_kv_cache_manager.h": "vllm",
}
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def layer_of_include(path):
    first, _, rest = path.partition("/")
    if first == "kvblock":
        return PUBLIC.get(rest, "unknown public header " + rest)
    if first in LAYERS:
        return first
    return None  # kernels/launchers.h, third-party headers.


def main():
    root = sys.argv[1]
    failures = []
    files = subprocess.run(["git", "-C", root, "ls-files"], check=True,
                           capture_output=True, text=True).stdout.split()
    if not files:  # not a git checkout: walk the tree.
        files = [os.path.relpath(os.path.join(d, f), root)
                 for d, _, names in os.walk(root) for f in names]
    # version.h is written by Meson from version.h.in.
    headers = {f.rpartition("/")[2].removesuffix(".in") for f in files
               if f.startswith("include/kvblock/") and
               f.removesuffix(".in").endswith(".h")}
    missing = headers.symmetric_difference(PUBLIC)
    if missing:
        failures.append(f"public headers without a layer here, or gone: "
                        f"{sorted(missing)}")
    sources = [f for f in files if re.search(r"\.(cc|h|cu|cuh)$", f)]
    names = {}
    for f in sources:
        names.setdefault(f.rpartition("/")[2], []).append(f)
    for name, paths in sorted(names.items()):
        if len(paths) > 1:
            failures.append(f"{name} is the name of {len(paths)} files: "
                            f"{', '.join(paths)}")
    checked = 0
    for f in sources:
        if f.startswith("lib/"):
            layer = f.split("/")[1]
        elif f.startswith("include/kvblock/"):
            layer = PUBLIC.get(f.rpartition("/")[2])
        else:
            continue
        if layer not in LAYERS:
            failures.append(f"{f} is in no layer of {LAYERS}")
            continue
        with open(os.path.join(root, f), encoding="utf-8") as source:
            text = source.read()
        for included in INCLUDE.findall(text):
            other = layer_of_include(included)
            if other is None:
                continue
            if other not in LAYERS:
                failures.append(f"{f}: {other}")
            elif LAYERS.index(other) > LAYERS.index(layer):
                failures.append(f"{f} ({layer}) includes {included} "
                                f"({other}, a higher layer)")
            checked += 1
    for failure in failures:
        print("FAIL:", failure)
    print(f"{checked} includes of {len(sources)} sources checked, "
          f"{len(failures)} failures")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
