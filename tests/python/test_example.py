# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""tools/examples/continuous_batching.py runs to the end: every request done,
pages shared through the prefix cache, and preemption under a small pool."""
import importlib.util
import os
import pathlib
import subprocess

import kvblock

EXAMPLE = (pathlib.Path(__file__).resolve().parents[2] / "tools" /
           "examples" / "continuous_batching.py")


def load_example():
    spec = importlib.util.spec_from_file_location("continuous_batching",
                                                  EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_completes_every_request():
    example = load_example()
    done, hit_rate, preemptions = example.run(count=40)
    assert done == 40 and hit_rate > 0.2 and preemptions == 0
    done, hit_rate, preemptions = example.run(count=60, pages=96)
    assert done == 60 and preemptions > 0


def test_the_example_runs_as_a_script_from_any_folder(tmp_path):
    # With the package where the suite found it (PYTHONPATH), from a folder
    # that is not the checkout's.
    ran = subprocess.run([str(EXAMPLE), "--requests", "10"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(
                             os.path.dirname(kvblock.__file__))))
    assert ran.returncode == 0, ran.stderr
    assert "hit rate" in ran.stdout
