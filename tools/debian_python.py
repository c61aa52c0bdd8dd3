# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""For the Python scripts under tools/: when the python3 that runs one lacks a
module it needs (a pyenv or venv interpreter), run it again with Debian's
/usr/bin/python3, where tools/run installs python3-numpy, -msgpack, -zmq and
-matplotlib; with no other to try, exit with what to install."""
import os
import sys

DEBIAN_PYTHON = "/usr/bin/python3"


def rerun_or_exit(script, missing, install):
    """Replaces this process with Debian's python3 running the same command
    line, or exits with "`script`: `missing` (`install`)"."""
    if os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON) \
            and os.access(DEBIAN_PYTHON, os.X_OK):
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON] + sys.argv)
    sys.exit(f"{script}: {missing} ({install})")
