# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""For the Python scripts under tools/: kvblock's version, the one line of
meson.build that every tool's --version, kvblock.__version__ and the .pc
files report, read from the checkout the script sits in."""
import os
import re

MESON_BUILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                           "meson.build")


def project_version():
    """The version: field of meson.build's project(), or "unknown" when the
    script runs outside a checkout."""
    try:
        with open(MESON_BUILD, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return "unknown"
    match = re.search(r"^project\(.*?\bversion:\s*'([^']+)'", text,
                      re.MULTILINE | re.DOTALL)
    return match.group(1) if match else "unknown"
