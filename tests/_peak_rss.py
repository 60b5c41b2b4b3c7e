"""Measuring a child process's peak RSS from the kernel, for the bounded-memory tests.

``PRELUDE`` defines ``status(key)`` (a /proc/self/status field in bytes) and
``reset_peak()`` (VmHWM := VmRSS through /proc/self/clear_refs, Linux >= 4.0) inside
the child; ``run_child`` runs a script that starts with it and returns its stdout.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PRELUDE = """
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith(key + ":"))

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS (Linux >= 4.0)
"""


def run_child(script: str, *args: str) -> str:
    """Run ``PRELUDE + script`` in a fresh interpreter; skip where the peak can't be reset."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip(reason="needs Linux /proc/self/clear_refs to reset the peak RSS")
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout
