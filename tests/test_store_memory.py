"""InMemoryCheckpointStore passes the store conformance suite on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from conftest import BACKENDS

from runlet import InMemoryCheckpointStore
from runlet.testing import store_conformance_tests


@asynccontextmanager
async def memory_store(lease: float) -> AsyncIterator[InMemoryCheckpointStore]:
    yield InMemoryCheckpointStore(lease=lease)


TestInMemoryConformance = store_conformance_tests(memory_store, backends=BACKENDS)
