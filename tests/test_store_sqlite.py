"""SQLiteCheckpointStore: the store protocol, plus what is specific to SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from _store_semantics import semantics_tests

from runlet import InMemoryCheckpointStore
from runlet.stores.sqlite import SQLiteCheckpointStore

_tmp: list[Path] = []


@pytest.fixture(autouse=True)
def _tmp_dir(tmp_path: Path) -> None:
    _tmp[:] = [tmp_path]


@asynccontextmanager
async def sqlite_store(lease: float | None) -> AsyncIterator[SQLiteCheckpointStore]:
    async with SQLiteCheckpointStore(_tmp[0] / "store.db", lease=lease) as store:
        yield store


@asynccontextmanager
async def memory_store(lease: float | None) -> AsyncIterator[InMemoryCheckpointStore]:
    yield InMemoryCheckpointStore(lease=lease)


class TestSemantics(semantics_tests(sqlite_store)):  # type: ignore[misc]
    pass


class TestReferenceSemantics(semantics_tests(memory_store)):  # type: ignore[misc]
    """The same tests on the in-memory reference store."""

    # runlet/_store.py InMemoryCheckpointStore.claim refuses an expired claim with
    # CheckpointResolvedError instead of taking it over (reported to the lead).
    @pytest.mark.xfail(reason="InMemoryCheckpointStore takeover bug", strict=False)
    async def test_expired_lease_is_taken_over_and_the_old_token_is_refused(self) -> None:
        await super().test_expired_lease_is_taken_over_and_the_old_token_is_refused()
