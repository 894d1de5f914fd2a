"""Shared fixtures: every async test runs once per backend (asyncio and trio).

Set ``RUNLET_TEST_BACKEND=asyncio`` (or ``trio``) to run one backend only; the nox matrix
does that to spread the backends over its sessions.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

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


@pytest.fixture(autouse=True)
def _collect_after_property_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a Hypothesis test, collect its garbage before the next test starts.

    When Hypothesis stops an example from inside an async test (its data ran out), anyio's
    pytest runner task on asyncio ends with that exception, which nobody retrieves. The task
    is logged ("Task exception was never retrieved") whenever the collector happens to free
    it: without this, in some later test, where the log's traceback formatting can break an
    ``ast.parse`` under way on Python 3.11 (see ``_parsing.py``).
    """
    yield
    if hasattr(request.function, "hypothesis"):
        gc.collect()


from _postgres import postgres_server as postgres_server  # noqa: E402
