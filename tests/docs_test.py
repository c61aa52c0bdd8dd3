#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
#
# Every fenced code block of the project's Markdown docs is compiled or run,
# so that no example goes stale. A block names its language:
#   cpp     compiled against the build's uninstalled kvblock.pc and run (a
#           block without main() is the body of one, its #includes first);
#   python  run by the build's Python with the build's package on
#           PYTHONPATH, in an empty folder;
#   sh      each command run in an empty folder where build/ and tools/ are
#           the build's and the checkout's, except tools/run's set-up
#           commands (CI runs `tools/run test` itself; each must name a
#           subcommand tools/run has) and `pip install --no-build-isolation
#           .` (the package_pip test runs exactly that);
#   cmake   every line is one of tests/package/cmake/CMakeLists.txt's, the
#           consumer the package_cmake test builds;
#   jsonl / json   parsed;
#   text    output and layouts, not code: left alone.
# Also every relative link of the docs names a file of the checkout.
#
# Usage: docs_test.py SOURCE_DIR BUILD_DIR PYTHON PKG_CONFIG CXX...
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

source_dir, build_dir, python, pkg_config = sys.argv[1:5]
cxx = sys.argv[5:]
FENCE = re.compile(r"^```(\S*)")
TOOLS_RUN = {"sim", "test", "fuzz", "bench"}
PIP = "pip install --no-build-isolation ."
failures = []


def docs():
    listed = subprocess.run(["git", "-C", source_dir, "ls-files", "*.md"],
                            capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        return sorted(listed.stdout.split())
    return sorted(os.path.relpath(os.path.join(d, f), source_dir)
                  for d, _, names in os.walk(source_dir) for f in names
                  if f.endswith(".md") and "/build" not in d)


def blocks(path):
    """(line number, language, text) of each fenced block of `path`."""
    found, language, start, lines = [], None, 0, []
    for number, line in enumerate(open(os.path.join(source_dir, path),
                                       encoding="utf-8"), 1):
        match = FENCE.match(line)
        if language is None and match:
            language, start, lines = match.group(1), number, []
        elif language is not None and line.startswith("```"):
            found.append((start, language, "".join(lines)))
            language = None
        elif language is not None:
            lines.append(line)
    if language is not None:
        failures.append(f"{path}:{start}: the block is never closed")
    return found


def run(where, cmd, **kwargs):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=180, **kwargs)
    except subprocess.TimeoutExpired:
        failures.append(f"{where}: {shlex.join(cmd)}: timed out")
        return False
    if proc.returncode != 0:
        failures.append(f"{where}: {shlex.join(cmd)}: exit "
                        f"{proc.returncode}\n{proc.stdout[-2000:]}"
                        f"{proc.stderr[-2000:]}")
        return False
    return True


def check_cpp(where, text, tmp):
    if "int main(" not in text:
        lines = text.splitlines()
        includes = [line for line in lines if line.startswith("#include")]
        body = [line for line in lines if not line.startswith("#include")]
        text = "\n".join(includes + ["int main() {"] + body +
                         ["  return 0;", "}", ""])
    source = os.path.join(tmp, "block.cc")
    with open(source, "w") as f:
        f.write(text)
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(
        build_dir, "meson-uninstalled"))
    flags = subprocess.run([pkg_config, "--cflags", "--libs", "kvblock"],
                           capture_output=True, text=True, env=env)
    if flags.returncode != 0:
        failures.append(f"{where}: pkg-config kvblock: {flags.stderr}")
        return
    exe = os.path.join(tmp, "block")
    if run(where, cxx + ["-std=c++20", "-w", source, "-o", exe] +
           shlex.split(flags.stdout)):
        run(where, [exe], cwd=tmp)


def check_python(where, text, tmp):
    env = dict(os.environ, PYTHONPATH=os.path.join(build_dir, "lib",
                                                   "python"))
    run(where, [python, "-c", text], cwd=tmp, env=env)


def check_sh(where, text, tmp):
    os.symlink(build_dir, os.path.join(tmp, "build"))
    os.symlink(os.path.join(source_dir, "tools"), os.path.join(tmp, "tools"))
    for line in text.splitlines():
        command = line.split(" #")[0].strip()
        if not command or command.startswith("#"):
            continue
        if command.startswith("tools/run"):
            words = command.split()
            if len(words) < 2 or words[1] not in TOOLS_RUN:
                failures.append(f"{where}: {command}: tools/run has no such "
                                f"subcommand (it has {sorted(TOOLS_RUN)})")
            continue
        if command.startswith("pip install"):
            if command != PIP:
                failures.append(f"{where}: {command}: the tested install is "
                                f"`{PIP}`")
            continue
        run(where, ["bash", "-euo", "pipefail", "-c", command], cwd=tmp)


def check_cmake(where, text):
    consumer = open(os.path.join(source_dir, "tests", "package", "cmake",
                                 "CMakeLists.txt")).read().splitlines()
    tested = {line.strip() for line in consumer}
    for line in text.splitlines():
        if line.strip() and line.strip() not in tested:
            failures.append(f"{where}: `{line.strip()}` is not in "
                            f"tests/package/cmake/CMakeLists.txt")


def check_json(where, language, text):
    pieces = text.splitlines() if language == "jsonl" else [text]
    for piece in pieces:
        if not piece.strip():
            continue
        try:
            json.loads(piece)
        except ValueError as error:
            failures.append(f"{where}: not JSON: {error}: {piece[:80]}")


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def check_links(path):
    text = open(os.path.join(source_dir, path), encoding="utf-8").read()
    for target, _ in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL.
        linked = os.path.normpath(os.path.join(os.path.dirname(path), target))
        if not os.path.exists(os.path.join(source_dir, linked)):
            failures.append(f"{path}: the link to {target} names no file")


checked = 0
for path in docs():
    check_links(path)
    for line, language, text in blocks(path):
        where = f"{path}:{line}"
        with tempfile.TemporaryDirectory() as tmp:
            if language == "cpp":
                check_cpp(where, text, tmp)
            elif language == "python":
                check_python(where, text, tmp)
            elif language == "sh":
                check_sh(where, text, tmp)
            elif language == "cmake":
                check_cmake(where, text)
            elif language in ("json", "jsonl"):
                check_json(where, language, text)
            elif language == "text":
                continue
            else:
                failures.append(f"{where}: a block must name its language "
                                f"(cpp, python, sh, cmake, json, jsonl or "
                                f"text), not {language!r}")
                continue
        checked += 1
        print(f"{where}: {language} ok" if not failures or
              not failures[-1].startswith(where) else f"{where}: FAILED")

for failure in failures:
    print("FAIL:", failure)
print(f"{checked} code blocks checked, {len(failures)} failures")
sys.exit(1 if failures or checked == 0 else 0)
