"""PostgresCheckpointStore: the store protocol, plus what is specific to PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from _postgres import postgres_store
from _store_semantics import semantics_tests

_server: list[str] = []


@pytest.fixture(autouse=True)
def _server_conninfo(postgres_server: str) -> None:
    _server[:] = [postgres_server]


@asynccontextmanager
async def pg_store(lease: float | None) -> AsyncIterator[Any]:
    async with postgres_store(_server[0], lease) as store:
        yield store


class TestSemantics(semantics_tests(pg_store)):  # type: ignore[misc]
    pass
