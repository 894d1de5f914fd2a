"""Counting the files this process holds open, for tests that check nothing is left open
(Linux: ``/proc/self/fd``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

needs_proc = pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc"
)


def open_files_under(folder: Path) -> int:
    """How many of this process's open files lie under *folder*."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(str(folder))
    return count
