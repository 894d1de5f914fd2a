"""InMemoryCheckpointStore passes the store conformance suite on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from conftest import BACKENDS

from runlet import InMemoryCheckpointStore
from runlet.testing import store_conformance_tests


@asynccontextmanager
async def memory_store(lease: float) -> AsyncIterator[InMemoryCheckpointStore]:
    yield InMemoryCheckpointStore(lease=lease)


TestInMemoryConformance = store_conformance_tests(memory_store, backends=BACKENDS)


_SUITE_WITH_A_SECOND_HANDLE = """
from contextlib import asynccontextmanager
from runlet import InMemoryCheckpointStore
from runlet.testing import store_conformance_tests

@asynccontextmanager
async def fresh(lease):
    yield InMemoryCheckpointStore(lease=lease)

@asynccontextmanager
async def not_the_same_storage(store):
    yield InMemoryCheckpointStore(lease=store.lease)

TestStore = store_conformance_tests(
    fresh, backends=({backends}), second_handle=not_the_same_storage
)
"""


def test_a_second_handle_that_opens_other_storage_fails_the_suite(
    pytester: pytest.Pytester,
) -> None:
    # What the two-handle tests are for: a store whose state lives in the object (here,
    # wholly: a second object sees nothing) passes every other test.
    pytester.makepyfile(_SUITE_WITH_A_SECOND_HANDLE.format(backends=repr(BACKENDS)[1:-1]))
    outcome = pytester.runpytest_inprocess("-q", "-p", "anyio", "-p", "no:randomly")
    failed = sorted(
        report.nodeid.split("::")[-1]
        for report in outcome.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
        if report.failed
    )
    names = [
        "test_a_cancel_through_a_second_handle",
        "test_a_run_interrupted_on_one_handle_resumes_once_on_another",
        "test_a_second_handle_sees_checkpoints_and_claims",
        "test_a_takeover_through_a_second_handle_fences_the_first",
    ]
    assert failed == [f"{name}[{backend}]" for name in names for backend in sorted(BACKENDS)]
    assert outcome.parseoutcomes()["passed"] > 40 * len(BACKENDS)  # everything else holds
