#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
#
# kvblock as a program outside the project uses it: tests/package/consumer.cc
# compiled and linked with nothing but `pkg-config --cflags --libs kvblock`,
# once through the uninstalled kvblock.pc of the build folder and once
# through the installed one (`meson install --destdir` into a temporary
# folder), then run. Also checks that the install holds only the library,
# its public headers, kvblock.pc, kvblock-sim and the KV event publisher's
# library.
#
# Usage: link_test.py BUILD_DIR CONSUMER_CC PREFIX LIBDIR BINDIR INCLUDEDIR
#                     MESON PKG_CONFIG CXX... [-- EXTRA_FLAGS...]
import os
import shlex
import subprocess
import sys
import tempfile

(build_dir, consumer, prefix, libdir, bindir, includedir, meson,
 pkg_config) = sys.argv[1:9]
rest = sys.argv[9:]
split = rest.index("--") if "--" in rest else len(rest)
cxx, extra_flags = rest[:split], rest[split + 1:]
failures = []


def run(cmd, env=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(f"FAIL: {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}")
        return None
    return proc.stdout


def link_and_run(name, pkg_config_path, defines, out_dir):
    env = dict(os.environ, PKG_CONFIG_PATH=pkg_config_path)
    flags = run([pkg_config] + defines + ["--cflags", "--libs", "kvblock"],
                env)
    if flags is None:
        failures.append(name)
        return
    print(f"{name}: pkg-config --cflags --libs kvblock: {flags.strip()}")
    exe = os.path.join(out_dir, "consumer-" + name)
    if run(cxx + ["-std=c++20", consumer, "-o", exe] + extra_flags +
           shlex.split(flags)) is None:
        failures.append(name)
        return
    out = run([exe])
    if out is None or "consumer ok" not in out:
        failures.append(name)
        return
    print(f"{name}: {out.strip()}")


with tempfile.TemporaryDirectory() as tmp:
    link_and_run("uninstalled", os.path.join(build_dir, "meson-uninstalled"),
                 [], tmp)

    dest = os.path.join(tmp, "dest")
    if run([meson, "install", "-C", build_dir, "--no-rebuild", "--quiet",
            "--destdir", dest]) is None:
        failures.append("install")
    else:
        root = dest + prefix  # prefix is absolute.
        installed = sorted(
            os.path.relpath(os.path.join(d, f), root)
            for d, _, files in os.walk(root) for f in files)
        allowed_dirs = {os.path.join(includedir, "kvblock")}
        allowed = {os.path.join(libdir, "libkvblock.a"),
                   os.path.join(libdir, "libkvblock.so"),
                   # The KV event publisher (ZeroMQ), when built.
                   os.path.join(libdir, "libkvblock-events.a"),
                   os.path.join(libdir, "libkvblock-events.so"),
                   os.path.join(libdir, "pkgconfig", "kvblock.pc"),
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
                print(f"FAIL: installed {path}: not the library, a public "
                      f"header, kvblock.pc, kvblock-sim or the Python package")
        print(f"installed: {len(installed)} files")
        link_and_run("installed",
                     os.path.join(root, libdir, "pkgconfig"),
                     ["--define-variable=prefix=" + root], tmp)

print("FAILED: " + ", ".join(failures) if failures else "ok")
sys.exit(1 if failures else 0)
