# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""The package as a release: one version everywhere, and an import that
fails in the wrong interpreter names the one the module was built for."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import kvblock
from kvblock import _build_info


def test_version_is_meson_builds_and_the_libraries():
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvblock.__version__)
    assert kvblock.__version__ == kvblock._kvblock.__version__
    assert kvblock.__version__ == os.environ["KVBLOCK_EXPECTED_VERSION"]
    assert "__version__" in kvblock.__all__


TOOLS = pathlib.Path(__file__).resolve().parents[2] / "tools"


def test_the_tools_report_the_same_version(tmp_path):
    expected = os.environ["KVBLOCK_EXPECTED_VERSION"]
    commands = [([str(TOOLS / "plot"), "--version"], "tools/plot")]
    if "KVBLOCK_SIM" in os.environ:
        commands.append(([os.environ["KVBLOCK_SIM"], "--version"],
                         "kvblock-sim"))
    for command, name in commands:
        shown = subprocess.run(command, cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == f"{name} {expected}\n"


def test_a_module_that_does_not_load_names_both_interpreters(tmp_path):
    # The package's Python files beside an extension module that fails as
    # one built for another Python does (here: its numpy is missing).
    package = tmp_path / "kvblock"
    package.mkdir()
    source = pathlib.Path(kvblock.__file__).parent
    for name in ("__init__.py", "_build_info.py"):
        shutil.copy(source / name, package / name)
    (package / "_kvblock.py").write_text(
        "raise ImportError(\"No module named 'numpy'\")\n")
    run = subprocess.run([sys.executable, "-c", "import kvblock"],
                         capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert run.returncode == 1
    message = run.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: kvblock " + kvblock.__version__)
    assert f"does not load in {sys.executable}" in message
    assert f"it was built for {_build_info.built_for_python}" in message
    assert "No module named 'numpy'" in message
