#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
#
# Every source file of the repository (C++, CUDA, Python, Meson, shell)
# names its license in an SPDX line within its first five lines, the license
# of LICENSE and of meson.build's project(): Apache-2.0. Documents and test
# data (Markdown, JSON, corpora) carry none.
#
# Usage: license_test.py SOURCE_ROOT
import os
import re
import subprocess
import sys

root = sys.argv[1]
files = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True,
                       text=True).stdout.split()
if not files:  # not a git checkout (a release tarball): walk the tree.
    files = [os.path.relpath(os.path.join(d, f), root)
             for d, _, names in os.walk(root) for f in names]
SOURCE = re.compile(r"\.(cc|h|cu|cuh|py|pyi|in)$|(^|/)(meson\.build|"
                    r"meson_options\.txt|run|plot|gpu-check)$")
SKIP = re.compile(r"^(subprojects|build[^/]*)/|/(corpus|regressions)/")
project_license = re.search(r"license: '([^']+)'",
                            open(os.path.join(root, "meson.build")).read())
failures = []
if not project_license or project_license.group(1) != "Apache-2.0":
    failures.append("meson.build: project() does not say license: 'Apache-2.0'")
if "Apache License" not in open(os.path.join(root, "LICENSE")).read(200):
    failures.append("LICENSE: not the Apache License")
checked = 0
for f in files:
    if not SOURCE.search(f) or SKIP.search(f):
        continue
    checked += 1
    with open(os.path.join(root, f), errors="replace") as source:
        head = [next(source, "") for _ in range(5)]
    if not any("SPDX-License-Identifier: Apache-2.0" in line for line in head):
        failures.append(f + ": no 'SPDX-License-Identifier: Apache-2.0' line "
                        "in its first five lines")
for failure in failures:
    print("FAIL:", failure)
print(f"{checked} source files, {len(failures)} failures")
sys.exit(1 if failures else 0)
