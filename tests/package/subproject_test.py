#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
#
# kvblock as a Meson subproject of another project: configured with the
# parent's defaults it defines the library and nothing else (no tests,
# benchmarks or tools), and asking for the tests brings them back. Only
# configures (meson setup + introspect), so it takes seconds.
#
# Usage: subproject_test.py SOURCE_DIR MESON
import json
import os
import subprocess
import sys
import tempfile

source_dir, meson = sys.argv[1:3]
failures = []

PARENT = """project('parent', 'cpp', default_options: ['cpp_std=c++20'])
kvblock = subproject('kvblock'{options})
executable('consumer', 'consumer.cc',
  dependencies: kvblock.get_variable('kvblock_dep'))
"""


def targets(tmp, name, options):
    parent = os.path.join(tmp, name)
    os.makedirs(os.path.join(parent, "subprojects"))
    os.symlink(source_dir, os.path.join(parent, "subprojects", "kvblock"))
    with open(os.path.join(parent, "meson.build"), "w") as f:
        f.write(PARENT.format(options=options))
    with open(os.path.join(parent, "consumer.cc"), "w") as f:
        f.write("int main() { return 0; }\n")
    build = os.path.join(parent, "build")
    proc = subprocess.run([meson, "setup", "-Dkvblock:cuda=disabled",
                           "--wrap-mode=nodownload", build, parent],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"FAIL: meson setup of {name}\n{proc.stdout}{proc.stderr}")
        failures.append(name)
        return set()
    proc = subprocess.run([meson, "introspect", "--targets", build],
                          capture_output=True, text=True, check=True)
    return {t["name"] for t in json.loads(proc.stdout)}


with tempfile.TemporaryDirectory() as tmp:
    plain = targets(tmp, "plain", "")
    print(f"as a subproject: {sorted(plain)}")
    if plain and plain != {"consumer", "kvblock"}:
        failures.append("plain")
        print("FAIL: a plain subproject defines more than the library")
    asked = targets(tmp, "asked",
                    ", default_options: ['tests=enabled', 'tools=enabled']")
    print(f"with tests=enabled tools=enabled: {len(asked)} targets")
    for name in ("unit_tests", "kvblock-sim"):
        if asked and name not in asked:
            failures.append("asked")
            print(f"FAIL: tests=enabled tools=enabled lacks {name}")
    if asked and "kvblock-bench" in asked:
        failures.append("asked")
        print("FAIL: benchmarks were not asked for")

print("FAILED: " + ", ".join(failures) if failures else "ok")
sys.exit(1 if failures else 0)
