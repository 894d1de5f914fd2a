"""Shared fixtures: every async test runs once per backend (asyncio and trio).

Set ``RUNLET_TEST_BACKEND=asyncio`` (or ``trio``) to run one backend only; the nox matrix
does that to spread the backends over its sessions.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# No per-example time limit: on a busy CI machine one example of a property test can take
# longer than Hypothesis's default 200 ms, and a test here never fails for being slow
# (speed is measured in benchmarks/, against a baseline in the same run).
settings.register_profile("runlet", deadline=None)
settings.load_profile("runlet")

_BACKENDS = ("asyncio", "trio")
_selected = os.environ.get("RUNLET_TEST_BACKEND")
if _selected is not None and _selected not in _BACKENDS:
    raise pytest.UsageError(f"RUNLET_TEST_BACKEND must be one of {_BACKENDS}, not {_selected!r}")


pytest_plugins = ["pytester"]

BACKENDS: tuple[str, ...] = (_selected,) if _selected else _BACKENDS
"""The backends this test run covers."""


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


from _postgres import postgres_server as postgres_server  # noqa: E402
