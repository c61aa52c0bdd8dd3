#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
#
# kvblock as a program outside the project uses it. In "pkg-config" mode:
# tests/package/consumer.cc compiled and linked with nothing but
# `pkg-config --cflags --libs kvblock` (and events_consumer.cc with
# kvblock-events, where the build has the KV event publisher), once through
# the uninstalled .pc files of the build folder and once through the
# installed ones (`meson install --destdir` into a temporary folder), the
# install moved elsewhere first (the .pc files are relocatable), then run.
# Also checks that the install holds only the libraries, their public
# headers, .pc files and CMake package files, kvblock-sim and the Python
# package, and that no .pc file names a folder outside the prefix. In
# "cmake=PATH" mode: the same install, moved, used by the CMake project
# tests/package/cmake through find_package(kvblock); exit code 77 (a
# skipped test) when PATH is empty (no CMake found).
#
# Usage: link_test.py MODE BUILD_DIR CONSUMER_DIR PREFIX LIBDIR BINDIR
#                     INCLUDEDIR MESON PKG_CONFIG CXX... [-- EXTRA_FLAGS...]
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

(mode, build_dir, consumer_dir, prefix, libdir, bindir, includedir, meson,
 pkg_config) = sys.argv[1:10]
rest = sys.argv[10:]
split = rest.index("--") if "--" in rest else len(rest)
cxx, extra_flags = rest[:split], rest[split + 1:]
cmake = mode.removeprefix("cmake=") if mode.startswith("cmake=") else None
if cmake == "":
    print("SKIP: no cmake found; the CMake consumer needs it")
    sys.exit(77)
have_events = os.path.exists(os.path.join(
    build_dir, "meson-uninstalled", "kvblock-events-uninstalled.pc"))
failures = []


def run(cmd, env=None, cwd=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          cwd=cwd)
    if proc.returncode != 0:
        print(f"FAIL: {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}")
        return None
    return proc.stdout


def check_output(name, out, want):
    if out is None or want not in out:
        failures.append(name)
        return
    print(f"{name}: {out.strip()}")


def link_and_run(name, pkg_config_path, out_dir):
    env = dict(os.environ, PKG_CONFIG_PATH=pkg_config_path)
    programs = [("kvblock", "consumer.cc", "consumer ok")]
    if have_events:
        programs.append(("kvblock-events", "events_consumer.cc",
                         "events consumer ok"))
    for package, source, want in programs:
        label = f"{name} {package}"
        flags = run([pkg_config, "--cflags", "--libs", package], env)
        if flags is None:
            failures.append(label)
            continue
        print(f"{label}: pkg-config --cflags --libs {package}: "
              f"{flags.strip()}")
        exe = os.path.join(out_dir, f"{name}-{package}")
        if run(cxx + ["-std=c++20", os.path.join(consumer_dir, source), "-o",
                      exe] + extra_flags + shlex.split(flags)) is None:
            failures.append(label)
            continue
        check_output(label, run([exe]), want)


def check_install(root):
    installed = sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, files in os.walk(root) for f in files)
    allowed_dirs = {os.path.join(includedir, "kvblock"),
                    os.path.join(libdir, "cmake", "kvblock")}
    allowed = {os.path.join(libdir, "libkvblock.a"),
               os.path.join(libdir, "libkvblock.so"),
               # The CUDA runtime, when the kernels are built.
               os.path.join(libdir, "libkvblock-cudart.a"),
               # The KV event publisher (ZeroMQ), when built.
               os.path.join(libdir, "libkvblock-events.a"),
               os.path.join(libdir, "libkvblock-events.so"),
               os.path.join(libdir, "pkgconfig", "kvblock.pc"),
               os.path.join(libdir, "pkgconfig", "kvblock-events.pc"),
               os.path.join(bindir, "kvblock-sim")}

    # The Python package, where Meson's python module puts it
    # (lib/python3/dist-packages/kvblock/ on Debian).
    def in_python_package(path):
        parts = path.split(os.sep)
        return len(parts) >= 2 and parts[-2] == "kvblock" and (
            "site-packages" in parts or "dist-packages" in parts)

    for path in installed:
        if (path not in allowed and not path.startswith(
                os.path.join(libdir, "libkvblock.so.")) and
                not path.startswith(
                    os.path.join(libdir, "libkvblock-events.so.")) and
                os.path.dirname(path) not in allowed_dirs and
                not in_python_package(path)):
            failures.append("install: " + path)
            print(f"FAIL: installed {path}: not a library, a public header, "
                  f"a .pc or CMake package file, kvblock-sim or the Python "
                  f"package")
        if path.endswith(".pc"):
            for line in open(os.path.join(root, path)):
                # An absolute path: a "/" that starts a value or a word.
                if re.search(r"(^|[\s=]|-[LI])/", line):
                    failures.append("relocatable: " + path)
                    print(f"FAIL: {path} names a folder outside the "
                          f"prefix: {line.strip()}")
    print(f"installed: {len(installed)} files")


def cmake_consumer(root, out_dir):
    build = os.path.join(out_dir, "cmake-build")
    flags = " ".join(extra_flags)
    configure = [cmake, "-S", os.path.join(consumer_dir, "cmake"), "-B",
                 build, "-DCMAKE_PREFIX_PATH=" + root,
                 "-DCMAKE_CXX_COMPILER=" + cxx[-1],
                 "-DCMAKE_CXX_FLAGS=" + flags,
                 "-DCMAKE_EXE_LINKER_FLAGS=" + flags]
    if len(cxx) > 1:
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=" + ";".join(cxx[:-1]))
    out = run(configure)
    if out is None or run([cmake, "--build", build]) is None:
        failures.append("cmake")
        return
    print("cmake: " + "; ".join(
        line.strip("- ") for line in out.splitlines() if "kvblock" in line))
    check_output("cmake consumer", run([os.path.join(build, "consumer")]),
                 "consumer ok")
    if have_events:
        check_output("cmake events_consumer",
                     run([os.path.join(build, "events_consumer")]),
                     "events consumer ok")


with tempfile.TemporaryDirectory() as tmp:
    if cmake is None:
        link_and_run("uninstalled",
                     os.path.join(build_dir, "meson-uninstalled"), tmp)
    dest = os.path.join(tmp, "dest")
    if run([meson, "install", "-C", build_dir, "--no-rebuild", "--quiet",
            "--destdir", dest]) is None:
        failures.append("install")
    else:
        # Moved away from the prefix it was installed for: what the .pc
        # files and the CMake package find must be relative.
        root = os.path.join(tmp, "moved")
        shutil.move(dest + prefix, root)  # prefix is absolute.
        shutil.rmtree(dest)
        if cmake is None:
            check_install(root)
            link_and_run("installed", os.path.join(root, libdir, "pkgconfig"),
                         tmp)
        else:
            cmake_consumer(root, tmp)

print("FAILED: " + ", ".join(failures) if failures else "ok")
sys.exit(1 if failures else 0)
