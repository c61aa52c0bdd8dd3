#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
#
# `pip install --no-build-isolation .` as a user runs it (pyproject.toml,
# meson-python): into a fresh virtual environment made with
# --system-site-packages by this Python (whose numpy, pybind11 and
# meson-python it finds there), with no package index. Then, from another
# folder, the installed kvblock imports, reports the project's version, runs
# a step, and its files are the Python package alone. It builds from a copy
# of the sources (git's files, else the tree less build folders), since
# meson-python writes a native file into the folder it builds. CUDA off (pip's
# --config-settings) and -O0 (CXXFLAGS): the kernels and the optimizer are
# the main build's concern, the packaging is this test's.
#
# Usage: pip_test.py SOURCE_DIR VERSION
import os
import shutil
import subprocess
import sys
import tempfile
import time

source_dir, version = sys.argv[1:3]

CHECK = """
import importlib.metadata, os, sys
import kvblock
config = kvblock.PagedKvConfig()
config.num_pages, config.max_batch, config.max_pages_per_seq = 16, 2, 4
manager = kvblock.BlockManager(config)
print("version", kvblock.__version__)
print("module", os.path.dirname(kvblock.__file__))
print("free", manager.num_free)
for f in importlib.metadata.files("kvblock"):
    print("file", f)
"""

def copy_sources(to):
    listed = subprocess.run(["git", "-C", source_dir, "ls-files"],
                            capture_output=True, text=True)
    if listed.returncode != 0 or not listed.stdout.strip():
        shutil.copytree(source_dir, to, ignore=shutil.ignore_patterns(
            "build*", ".git"))
        return
    for name in listed.stdout.splitlines():
        os.makedirs(os.path.join(to, os.path.dirname(name)), exist_ok=True)
        shutil.copy2(os.path.join(source_dir, name), os.path.join(to, name))


with tempfile.TemporaryDirectory() as tmp:
    sources = os.path.join(tmp, "src")
    copy_sources(sources)
    venv = os.path.join(tmp, "venv")
    python = os.path.join(venv, "bin", "python")
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                    venv], check=True)
    pip = subprocess.run(
        [python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q",
         "--config-settings=builddir=" + os.path.join(tmp, "build"),
         "--config-settings=setup-args=-Dcuda=disabled", sources],
        capture_output=True, text=True,
        # After meson-python's -O2 on each command line: -O0 wins.
        env=dict(os.environ, CXXFLAGS="-O0"))
    print(f"pip install: {time.monotonic() - start:.0f} s")
    if pip.returncode != 0:
        print(pip.stdout[-4000:], pip.stderr[-4000:])
        sys.exit("FAIL: pip install failed")
    check = subprocess.run([python, "-c", CHECK], capture_output=True,
                           text=True, cwd=tmp)
    print(check.stdout, check.stderr)
    lines = check.stdout.splitlines()
    failures = []
    if check.returncode != 0:
        failures.append("the installed kvblock does not run")
    if f"version {version}" not in lines:
        failures.append(f"kvblock.__version__ is not {version}")
    if not any(line.startswith("module " + venv + os.sep) for line in lines):
        failures.append("kvblock was not imported from the environment")
    if "free 16" not in lines:
        failures.append("a manager of 16 pages has not 16 free")
    files = [line[len("file "):] for line in lines if line.startswith("file ")]
    outside = [f for f in files if not (
        f.startswith("kvblock/") or f.startswith("kvblock-"))]
    if not any(f.startswith("kvblock/_kvblock") for f in files):
        failures.append("no extension module among the installed files")
    if outside:
        failures.append("installed outside the package: " + ", ".join(outside))
    print("FAILED: " + "; ".join(failures) if failures else "ok")
    sys.exit(1 if failures else 0)
