"""Running Triton kernels on this CPU through Triton's interpreter.

Triton picks interpreter or compiler when its language functions are decorated, at its first import,
so a test file's kernel checks run in a child pytest started with TRITON_INTERPRET=1; in the parent
run they are skipped (`interpreted_only`) and one parent test asserts the child's summary
(`assert_interpreted_child_passes`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreted_only = pytest.mark.skipif(not INTERPRETED, reason="runs in the child pytest under TRITON_INTERPRET=1")


def assert_interpreted_child_passes(test_file: str) -> None:
    """Run `test_file` in a child pytest under the interpreter; its kernel checks must pass (and this
    parent-only check skip there)."""
    if INTERPRETED:
        pytest.skip("this is the child run")
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else child.stderr[-2000:]
    assert child.returncode == 0 and " passed" in summary and "skipped" in summary, (
        child.stdout[-4000:] + child.stderr[-2000:]
    )
