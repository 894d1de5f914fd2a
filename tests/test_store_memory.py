"""InMemoryCheckpointStore passes the store conformance suite on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from conftest import BACKENDS

from runlet import InMemoryCheckpointStore
from runlet.testing import store_conformance_tests


@asynccontextmanager
async def memory_store(lease: float) -> AsyncIterator[InMemoryCheckpointStore]:
    yield InMemoryCheckpointStore(lease=lease)


async def age_leases(store: Any, seconds: float) -> None:
    """Move every live lease *seconds* nearer its end (the store counts in monotonic time)."""
    for entry in store._entries.values():
        if entry.status == "claimed" and entry.lease_until is not None:
            entry.lease_until -= seconds


TestInMemoryConformance = store_conformance_tests(
    memory_store, backends=BACKENDS, age_leases=age_leases
)


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


_SUITE_WITH_A_BROKEN_SHARED_STORE = """
from contextlib import asynccontextmanager
import attrs
from runlet import InMemoryCheckpointStore
from runlet.testing import store_conformance_tests

class CountingTokens(InMemoryCheckpointStore):
    # Shares the data, but tokens come from a counter kept in each object.
    def __init__(self, **kw):
        super().__init__(**kw)
        self._n = 0

    async def claim(self, checkpoint_id):
        claim = await super().claim(checkpoint_id)
        self._n += 1
        self._entries[checkpoint_id].token = token = f"t{{self._n}}"
        return attrs.evolve(claim, token=token)

class LocalClaims(InMemoryCheckpointStore):
    # Shares the data, but only its own claims hold a checkpoint.
    def __init__(self, **kw):
        super().__init__(**kw)
        self._mine = set()

    def _held_now(self, entry):
        return entry.token in self._mine and super()._held_now(entry)

    async def claim(self, checkpoint_id):
        claim = await super().claim(checkpoint_id)
        self._mine.add(claim.token)
        return claim

@asynccontextmanager
async def fresh(lease):
    yield {cls}(lease=lease)

@asynccontextmanager
async def same_storage(store):
    other = type(store)(lease=store.lease)
    other._entries, other._finished = store._entries, store._finished
    yield other

TestStore = store_conformance_tests(fresh, backends=({backends}), second_handle=same_storage)
"""


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        ("InMemoryCheckpointStore", []),
        (
            "CountingTokens",
            [
                "test_a_second_handle_sees_checkpoints_and_claims",
                "test_a_takeover_through_a_second_handle_fences_the_first",
            ],
        ),
        (
            "LocalClaims",
            ["test_a_second_handle_sees_checkpoints_and_claims"],
        ),
    ],
)
def test_the_second_handle_tests_catch_state_kept_in_the_object(
    pytester: pytest.Pytester, cls: str, names: list[str]
) -> None:
    suite = _SUITE_WITH_A_BROKEN_SHARED_STORE.format(cls=cls, backends=repr(BACKENDS)[1:-1])
    pytester.makepyfile(suite)
    outcome = pytester.runpytest_inprocess("-q", "-p", "anyio", "-p", "no:randomly")
    failed = sorted(
        report.nodeid.split("::")[-1]
        for report in outcome.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
        if report.failed
    )
    assert failed == [f"{name}[{backend}]" for name in names for backend in sorted(BACKENDS)]


_SUITE_WITH_A_STORE_THAT_IGNORES_AFTER = """
from contextlib import asynccontextmanager
from runlet import InMemoryCheckpointStore
from runlet.testing import store_conformance_tests

class IgnoresAfter(InMemoryCheckpointStore):
    async def list_pending(self, *, after=None, **filters):
        return await super().list_pending(**filters)

@asynccontextmanager
async def fresh(lease):
    yield IgnoresAfter(lease=lease)

TestStore = store_conformance_tests(fresh, backends=("asyncio",))
"""


def test_a_failed_check_of_the_suite_shows_what_it_compared(pytester: pytest.Pytester) -> None:
    # The suite's module is not a test module, so pytest shows the values of its failed
    # asserts only because runlet.testing asks it to rewrite them. In a fresh process:
    # one that imported runlet.testing already has it as it is.
    pytester.makepyfile(_SUITE_WITH_A_STORE_THAT_IGNORES_AFTER)
    outcome = pytester.runpytest_subprocess(
        "-q", "-p", "anyio", "-p", "no:randomly", "-k", "test_list_pending_pages_oldest_first"
    )
    outcome.assert_outcomes(failed=1)
    outcome.stdout.fnmatch_lines(["*At index 1 diff: [[]'cp_0', 'cp_1', 'cp_2'[]] != *"])
