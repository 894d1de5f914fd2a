"""Shared fixtures: every async test runs once per backend (asyncio and trio).

Set ``RUNLET_TEST_BACKEND=asyncio`` (or ``trio``) to run one backend only; the nox matrix
does that to spread the backends over its sessions.
"""

from __future__ import annotations

import os

import pytest

_BACKENDS = ("asyncio", "trio")
_selected = os.environ.get("RUNLET_TEST_BACKEND")
if _selected is not None and _selected not in _BACKENDS:
    raise pytest.UsageError(f"RUNLET_TEST_BACKEND must be one of {_BACKENDS}, not {_selected!r}")


BACKENDS: tuple[str, ...] = (_selected,) if _selected else _BACKENDS
"""The backends this test run covers."""


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


from _postgres import postgres_server as postgres_server  # noqa: E402
